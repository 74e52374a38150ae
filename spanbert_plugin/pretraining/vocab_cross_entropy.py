"""Cross-entropy over the vocabulary, computed in cache-sized row chunks.

``F.cross_entropy(logits.float(), ...)`` on N masked tokens x a 30,522-word
vocabulary materialises several N x V fp32 tensors (the cast, the log-softmax,
its gradient, the cast back), each larger than the CPU's caches; under bf16
autocast those passes cost more than the encoder's matrix products. Here each
chunk of rows is cast, log-softmaxed and turned into its gradient (softmax minus
one-hot, stored in the logits' dtype) while it is in cache; the backward pass
only scales that gradient. The values are those of ``F.cross_entropy`` on the
fp32 logits, and the argmax comes from the same pass.

On a GPU there are no such caches to fit, and every chunk costs about eight kernel launches: one chunk of up
to ``GPU_CHUNK_ELEMENTS`` takes the whole batch of a pre-training update (2,450 masked tokens of 32 x 512 are
75 M elements), where CPU-sized chunks would be about 145 of them.
"""
import torch

from ..core.cpu_paths import cpu_path

# about 2 MiB of fp32 per chunk: in L2/L3 on current CPUs
CHUNK_ELEMENTS = 1 << 19
# elsewhere (GPUs) 1 GiB of fp32 per chunk, a bound on the extra memory rather than a cache size
GPU_CHUNK_ELEMENTS = 1 << 28


def vocab_cross_entropy(logits: torch.Tensor, targets: torch.Tensor):
    """Summed cross-entropy of ``logits`` (N x V, any float dtype) against ``targets`` (N), and the correct argmaxes.

    Returns ``(loss, correct)``: the sum over rows in fp32 (fp64 for fp64 logits), differentiable with respect to
    ``logits``, and the number of rows whose argmax is the target (an int tensor, ties resolved as ``argmax`` does).
    """
    return _VocabCrossEntropy.apply(logits, targets)


def _reduction_dtype(logits):
    return torch.promote_types(logits.dtype, torch.float32)


def _row_chunks(logits):
    elements = CHUNK_ELEMENTS if cpu_path(logits) else GPU_CHUNK_ELEMENTS
    rows = max(1, elements // max(1, logits.shape[-1]))
    return range(0, logits.shape[0], rows), rows


class _VocabCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):
        dtype = _reduction_dtype(logits)
        losses = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        argmax = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        # the gradient (softmax - one-hot) is written here while each chunk is in cache; backward only scales it
        grad = torch.empty_like(logits) if ctx.needs_input_grad[0] else None
        starts, rows = _row_chunks(logits)
        for start in starts:
            end = min(start + rows, logits.shape[0])
            log_probs = torch.log_softmax(logits[start:end].to(dtype), dim=-1)
            chunk_targets = targets[start:end, None]
            torch.neg(log_probs.gather(1, chunk_targets).squeeze(1), out=losses[start:end])
            torch.argmax(log_probs, dim=-1, out=argmax[start:end])
            if grad is not None:
                probs = log_probs.exp_()
                probs.scatter_add_(1, chunk_targets, probs.new_full(chunk_targets.shape, -1.0))
                grad[start:end] = probs
        ctx.save_for_backward(grad)
        correct = (argmax == targets).sum()
        ctx.mark_non_differentiable(correct)
        return losses.sum(), correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None
