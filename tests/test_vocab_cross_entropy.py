"""The chunked vocabulary cross-entropy of the ``span_bert`` criterion equals ``F.cross_entropy`` on fp32 logits."""
import pytest
import torch
import torch.nn.functional as F

from spanbert_plugin.pretraining import vocab_cross_entropy as module
from spanbert_plugin.pretraining.vocab_cross_entropy import vocab_cross_entropy


def _reference(logits, targets):
    loss = F.cross_entropy(logits.float(), targets, reduction="sum")
    (grad,) = torch.autograd.grad(loss, logits)
    return loss, (logits.float().argmax(-1) == targets).sum(), grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_loss_gradient_and_argmax_equal_the_fp32_cross_entropy(dtype, monkeypatch):
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 7 * 1000)  # 7 rows a chunk: several chunks and a short last one
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(40, 1000, generator=generator) * 4).to(dtype).requires_grad_()
    targets = torch.randint(0, 1000, (40,), generator=generator)
    # half the rows predict their target, so the argmax count is not trivially 0
    with torch.no_grad():
        logits[::2].scatter_(1, targets[::2, None], 30.0)
    expected_loss, expected_correct, expected_grad = _reference(logits, targets)
    loss, correct = vocab_cross_entropy(logits, targets)
    (grad,) = torch.autograd.grad(loss, logits)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-3)
    assert correct.item() == expected_correct.item() == 20
    # softmax as exp(x - log-sum-exp) against F's exp(x - max) / sum: a few fp32 ulps of 1 apart, then rounded
    # once to the logits' dtype on both sides
    torch.testing.assert_close(grad.float(), expected_grad.float(), rtol=0,
                               atol=torch.finfo(dtype).eps + 8 * torch.finfo(torch.float32).eps)


def test_double_precision_gradient_and_an_upstream_scale():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 11, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=generator)
    assert torch.autograd.gradcheck(lambda x: vocab_cross_entropy(x, targets)[0] * 3.0, (logits,))


def test_no_rows_gives_a_zero_loss_and_gradient():
    logits = torch.zeros(0, 30, requires_grad=True)
    loss, correct = vocab_cross_entropy(logits, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and correct.item() == 0 and logits.grad.shape == (0, 30)


def test_without_gradients_the_loss_is_the_same():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(9, 50, generator=generator)
    targets = torch.randint(0, 50, (9,), generator=generator)
    with torch.no_grad():
        loss, correct = vocab_cross_entropy(logits, targets)
    torch.testing.assert_close(loss, F.cross_entropy(logits, targets, reduction="sum"))
    assert correct.item() == (logits.argmax(-1) == targets).sum().item()
