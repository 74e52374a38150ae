"""--compile: the encoder's transformer layers under torch.compile give eager mode's losses, gradients and
checkpoints."""
import os

import torch

from conftest import bin_path, run_cli
from test_update_cost import PRETRAIN, build

NO_DROPOUT = ("--dropout", "0", "--attention-dropout", "0")


def one_update(data, *extra):
    """Loss and gradients of one pre-training batch (dropout off), from a model built by the task as fairseq-train
    builds it."""
    torch.manual_seed(0)
    _, task, model, criterion = build(data, *NO_DROPOUT, *extra)
    task.load_dataset("train", training=True)
    dataset = task.dataset("train")
    sample = dataset.collater([dataset[i] for i in range(4)])
    model.train()
    loss, _, _ = criterion(model, sample)
    loss.backward()
    return model, loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def test_compiled_layers_give_eager_losses_and_gradients_with_padding_to_a_multiple(spm_data):
    """Inductor's kernels against eager mode on spanbert_tiny, blocks of 128 tokens padded to 144
    (--required-seq-len-multiple 48, so the padding path runs). Measured differences: loss 6e-8 relative;
    gradients at most 4e-7 of the model's largest gradient (relative to a tensor's own, the key biases differ most:
    their true gradient is 0, softmax ignores them, and both sides give rounding noise of 1e-10)."""
    eager, eager_loss, eager_grads = one_update(spm_data)
    compiled, loss, grads = one_update(spm_data, "--compile", "--required-seq-len-multiple", "48")
    assert compiled.encoder.length_multiple == 48
    assert all(hasattr(layer, "_compiled_call_impl") and layer._compiled_call_impl is not None
               for layer in compiled.encoder.encoder.layer)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their names
    assert torch.allclose(loss, eager_loss, rtol=1e-6, atol=0)
    assert grads.keys() == eager_grads.keys()
    largest = max(grad.abs().max() for grad in eager_grads.values())
    for name, grad in grads.items():
        assert (grad - eager_grads[name]).abs().max() <= 1e-5 * largest, name


def test_fairseq_train_with_compile_trains_and_saves_what_eager_mode_does(spm_data, tmp_path):
    """Through fairseq-train (the task's build_model, fairseq's Trainer and checkpoints), with PyTorch's own
    operators running the compiled graphs (--compile-backend aot_eager; the generated kernels are the test above):
    the same logged losses and a checkpoint with the same names and weights."""
    runs = {}
    for name, extra in (("eager", []), ("compiled", ["--compile", "--compile-backend", "aot_eager",
                                                     "--required-seq-len-multiple", "48"])):
        save_dir = tmp_path / name
        proc = run_cli([bin_path("fairseq-train"), spm_data, "--user-dir", "user_dir", *PRETRAIN, *NO_DROPOUT,
                       "--max-update", "3", "--save-dir", str(save_dir), "--log-format", "json", "--log-interval", "1",
                       "--disable-validation", *extra])
        out = proc.stdout + proc.stderr
        losses = [line.split('"loss": "')[1].split('"')[0] for line in out.splitlines() if "train_inner" in line]
        state = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=True)["model"]
        runs[name] = losses, state
    (eager_losses, eager_state), (losses, state) = runs["eager"], runs["compiled"]
    assert len(losses) == 3 and losses == eager_losses
    assert list(state) == list(eager_state)
    for key, value in state.items():
        assert torch.allclose(value, eager_state[key], rtol=0, atol=1e-5), key


def test_ad_drop_attribution_through_compiled_layers_equals_eager_mode():
    """--compile with --ad-drop-p: the attribution pass takes the gradient with respect to a chosen layer's attention
    probabilities; a compiled layer returns them beside its output (off the path to it), which stopped the first
    AD-DROP epoch with "the differentiated Tensor ... not used in the graph". The chosen layers run eagerly there."""
    from spanbert_plugin.model.layers import BertStack

    torch.manual_seed(0)
    stack = BertStack(2, hidden=16, heads=2, ffn=32, eps=1e-12, dropout=0.0, attention_dropout=0.0)
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])

    def attribution():
        probs = {0: None}
        objective = stack(x, padding, attention_probs_out=probs).square().sum()
        return torch.autograd.grad(objective, [probs[0]])[0]

    eager = attribution()
    for layer in stack.layer:
        layer.compile(backend="aot_eager")
    assert torch.allclose(attribution(), eager, rtol=1e-5, atol=1e-7)
