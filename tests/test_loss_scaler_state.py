"""fp16 checkpoints keep the loss scaler's counters, so a resume grows and backs off the scale at the same updates."""
import io

import pytest
import torch
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer

import spanbert_plugin.registry  # noqa: F401  (installs the wrappers)
from spanbert_plugin.core.loss_scaler_state import DYNAMIC_SCALER_FIELDS, DYNAMIC_SCALER_KEY


def build(cls, scale_window=5):
    """A real fairseq fp16 optimizer on the CPU (FP16Optimizer without flattening: flat fp32 copies need CUDA)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused_data", "--arch", "roberta_base", "--task", "masked_lm", "--cpu", "--fp16", "--fp16-no-flatten-grads",
        "--fp16-init-scale", "128", "--fp16-scale-window", str(scale_window), "--optimizer", "adam", "--lr", "0.1"])
    params = [torch.nn.Parameter(torch.ones(3, dtype=torch.half))]
    return cls.build_optimizer(convert_namespace_to_omegaconf(args), params)


def advance(opt, clean_updates):
    """What fairseq's trainer does to the scaler after each update without overflow."""
    for _ in range(clean_updates):
        opt.scaler.update()


@pytest.mark.parametrize("cls", [FP16Optimizer, MemoryEfficientFP16Optimizer])
def test_resume_restores_scaler_counters_through_safe_loading(cls):
    a = build(cls)
    advance(a, 3)
    with pytest.raises(OverflowError):
        a.scaler.check_overflow(float("inf"))  # backs off and records the overflow update
    advance(a, 4)
    saved = a.state_dict()
    assert saved["loss_scale"] == a.scaler.loss_scale and DYNAMIC_SCALER_KEY in saved
    buffer = io.BytesIO()
    torch.save({"last_optimizer_state": saved}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)["last_optimizer_state"]

    b = build(cls)
    b.load_state_dict(loaded)
    assert DYNAMIC_SCALER_KEY in loaded  # the checkpoint's dict is not consumed
    for name in DYNAMIC_SCALER_FIELDS + ("loss_scale",):
        assert getattr(b.scaler, name) == getattr(a.scaler, name), name
    # from here both grow the scale at the same update
    scales_a, scales_b = [], []
    for _ in range(12):
        a.scaler.update()
        b.scaler.update()
        scales_a.append(a.scaler.loss_scale)
        scales_b.append(b.scaler.loss_scale)
    assert scales_a == scales_b and max(scales_a) > saved["loss_scale"]


def test_checkpoint_without_counters_loads_as_before():
    a = build(FP16Optimizer)
    advance(a, 2)
    old_style = {k: v for k, v in a.state_dict().items() if k != DYNAMIC_SCALER_KEY}
    b = build(FP16Optimizer)
    b.load_state_dict(old_style)
    assert b.scaler.loss_scale == a.scaler.loss_scale and b.scaler._iter == 0


def test_a_resumed_scaler_is_the_saved_one_in_every_field():
    """Every field of fairseq's DynamicLossScaler, the overflow tolerance's _last_rescale_iter too, comes back."""
    a = build(FP16Optimizer)
    advance(a, 3)
    with pytest.raises(OverflowError):
        a.scaler.check_overflow(float("inf"))
    advance(a, 2)
    b = build(FP16Optimizer)
    b.load_state_dict(a.state_dict())
    assert vars(b.scaler) == vars(a.scaler) and a.scaler._last_rescale_iter == 3
