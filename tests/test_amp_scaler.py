"""fairseq's --amp optimizer: gradients unscaled once, the scaler from --amp-init-scale and --amp-scale-window."""
import pytest
import torch
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.optim.amp_optimizer import AMPOptimizer

import spanbert_plugin.registry  # noqa: F401  (installs the correction and registers torch_adamw)

# fairseq's own constructor makes a CUDA scaler first, which warns on a CPU-only host
pytestmark = pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled")


def test_the_fairseq_code_under_the_shim_is_the_code_it_was_written_against():
    from spanbert_plugin.core import amp_scaler

    assert amp_scaler.fairseq_source_sha256() == amp_scaler.FAIRSEQ_SOURCE_SHA256


def _amp(params, *extra):
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused_data", "--arch", "roberta_base", "--task", "masked_lm", "--cpu", "--amp", "--optimizer", "torch_adamw",
        "--adam-eps", "1e-6", "--lr", "0.01", *extra])
    return AMPOptimizer.build_optimizer(convert_namespace_to_omegaconf(args), params)


def test_the_scaler_takes_the_amp_options():
    """fairseq started at --fp16-init-scale and grew every --amp-init-scale updates under --amp-scale-window."""
    amp = _amp([torch.nn.Parameter(torch.zeros(3))], "--amp-init-scale", "64", "--fp16-init-scale", "4",
               "--amp-scale-window", "50")
    assert amp.scaler.get_scale() == 64 and amp.scaler.get_growth_interval() == 50
    assert _amp([torch.nn.Parameter(torch.zeros(3))]).scaler.get_growth_interval() == 2000  # PyTorch's default


def test_the_optimizer_steps_on_the_true_gradients():
    """fairseq unscaled through the torch optimizer in clip_grad_norm and through its wrapper in step: GradScaler,
    which keeps its state per object, divided the gradients by the scale twice (the optimizer saw 1/128 of them).
    A CPU scaler stands in for the CUDA one; three updates must move the weights as AdamW on the true gradients."""
    torch.manual_seed(0)
    start = torch.randn(4, 3)
    weight, reference = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    amp = _amp([weight])
    amp._grad_scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    adamw = torch.optim.AdamW([reference], lr=0.01, eps=1e-6, weight_decay=0.0)
    for step in range(3):
        grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(step)) * 1e-4  # below eps x scale
        amp.zero_grad()
        amp.backward((weight * grad).sum())
        amp.clip_grad_norm(0.0)
        amp.step()
        reference.grad = grad
        adamw.step()
    torch.testing.assert_close(weight.detach(), reference.detach(), rtol=0, atol=1e-6)


def test_a_resumed_scaler_grows_at_the_command_lines_interval():
    """The checkpoint's scaler state (scale, counters) is resumed, its growth interval is the command line's: one
    saved with fairseq's interval (--amp-init-scale) followed it before."""
    saved = _amp([torch.nn.Parameter(torch.zeros(3))])
    saved.scaler.set_growth_interval(128)  # what fairseq made of --amp-scale-window
    resumed = _amp([torch.nn.Parameter(torch.zeros(3))], "--amp-scale-window", "50")
    resumed.load_state_dict(saved.state_dict())
    assert resumed.scaler.get_growth_interval() == 50 and resumed.scaler.get_scale() == saved.scaler.get_scale()


def test_an_overflow_that_brings_the_scale_down_to_the_minimum_stops_training():
    """fairseq's rule: an overflow whose backed-off scale (half the scale) is at or below --min-loss-scale raises."""
    for init_scale, stops in ((2.0, True), (4.0, False)):
        weight = torch.nn.Parameter(torch.zeros(3))
        amp = _amp([weight], "--min-loss-scale", "1")
        amp._grad_scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        amp.backward((weight * torch.tensor([1.0, float("inf"), 0.0])).sum())  # an overflow in the gradients
        if stops:
            with pytest.raises(FloatingPointError, match=r"Minimum loss scale reached \(1.0\)"):
                amp.clip_grad_norm(0.0)
        else:
            assert not torch.isfinite(amp.clip_grad_norm(0.0))


def test_a_resumed_amp_scaler_has_the_saved_scale_and_growth_tracker():
    saved = _amp([torch.nn.Parameter(torch.zeros(3))])
    state = dict(saved.scaler.state_dict(), scale=32.0, _growth_tracker=7)
    saved.scaler.load_state_dict(state)
    resumed = _amp([torch.nn.Parameter(torch.zeros(3))])
    resumed.load_state_dict(saved.state_dict())
    assert resumed.scaler.get_scale() == 32.0 and resumed.scaler.state_dict()["_growth_tracker"] == 7
