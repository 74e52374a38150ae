"""``--bf16-autocast``: training (and validation) forward passes under bfloat16 autocast, fp32 everywhere else.

The forward pass and the loss run under ``torch.autocast(<device>, dtype=torch.bfloat16)``
(matrix products in bfloat16, reductions and losses as autocast chooses); the
backward pass runs outside the context, as autocast recommends, so gradients
land on the fp32 parameters. Weights, gradients, optimizer state and
checkpoints stay fp32, and bfloat16 has fp32's exponent range, so no loss
scaler is needed. It is what ``transformers``' Trainer ``--bf16`` does, on CPU
and GPU alike. fairseq's own ``--bf16`` (a TPU flag in its command line) and its
fp16 modes keep half-precision weights with a loss scaler: they are refused
beside it.
"""
import contextlib
import logging
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import FairseqDataclass

from .errors import UsageError
from .run_config import run_section

logger = logging.getLogger(__name__)

# the memory-efficient modes first: fairseq turns --fp16/--bf16 on with them
HALF_PRECISION_FLAGS = (("memory_efficient_fp16", "--memory-efficient-fp16"), ("fp16", "--fp16"),
                        ("memory_efficient_bf16", "--memory-efficient-bf16"), ("bf16", "--bf16"), ("amp", "--amp"))


@dataclass
class SharedTrainingConfig(FairseqDataclass):
    """The training options every plugin task shares: precision and the speed it reports."""

    bf16_autocast: bool = field(
        default=False, metadata={"help": "run training and validation forward passes under bfloat16 autocast (fp32 "
                                         "weights, gradients, optimizer state and checkpoints; no loss scaler); about "
                                         "2x faster on CPUs with AVX512-BF16/AMX and on recent GPUs"})
    tf32: bool = field(
        default=False, metadata={"help": "fp32 matrix products and convolutions on TF32 tensor cores (NVIDIA Ampere or "
                                         "later; fairseq leaves them in full fp32); elsewhere a note and no effect"})
    compile: bool = field(
        default=False, metadata={"help": "torch.compile the encoder's transformer layers for training (their forward and "
                                         "backward; checkpoints unchanged); pads sequences to a multiple of "
                                         "--required-seq-len-multiple, e.g. 64, so that few shapes compile"})
    compile_backend: str = field(
        default="inductor", metadata={"help": "torch.compile's backend for --compile (inductor: generated kernels; "
                                              "aot_eager: the same graphs run by PyTorch's own operators)"})
    peak_tflops: float = field(
        default=0.0, metadata={"help": "the device's dense peak TFLOP/s at the run's precision, for the logged mfu "
                                       "(default: a table of current NVIDIA GPUs; on CPUs mfu is logged only with it)"})


def enable_tf32(cfg) -> None:
    """With ``--tf32``: TF32 for fp32 matrix products where the GPU has it; else one note, nothing changed."""
    if not getattr(cfg, "tf32", False):
        return
    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return
    where = torch.cuda.get_device_name() if torch.cuda.is_available() else "this CPU"
    logger.info(f"--tf32 has no effect on {where}: TF32 needs an NVIDIA GPU of compute capability 8.0 or later")


def run_precision(cfg) -> str:
    """'half' (fp16/bf16 modes or --bf16-autocast), 'tf32' (--tf32 on a GPU that has it) or 'fp32'."""
    if bf16_autocast_enabled(cfg):
        return "half"
    common = run_section(cfg, "common")
    if common is not None and any(common.get(key) for key, _ in HALF_PRECISION_FLAGS):
        return "half"
    return "tf32" if getattr(cfg, "tf32", False) and torch.backends.cuda.matmul.allow_tf32 else "fp32"


def bf16_autocast_enabled(cfg) -> bool:
    return bool(getattr(cfg, "bf16_autocast", False))


def check_bf16_autocast(cfg) -> None:
    """Refuse ``--bf16-autocast`` beside fairseq's half-precision modes (read from the run, the task config's parent)."""
    common = run_section(cfg, "common")
    if not bf16_autocast_enabled(cfg) or common is None:
        return
    for key, flag in HALF_PRECISION_FLAGS:
        if common.get(key):
            raise UsageError(f"--bf16-autocast cannot be combined with {flag}: it keeps fp32 weights and needs no "
                             f"loss scaler; use one of them")
    warn_if_bf16_is_emulated("--bf16-autocast", "cpu" if common.get("cpu") or not torch.cuda.is_available() else "cuda")


def refuse_half_precision_a_cpu_cannot_run(cfg) -> None:
    """On a CPU, fairseq's ``--amp`` silently trains in fp32 and ``--fp16`` stops in an assertion (its flat fp32
    copy of the weights is made on CUDA): one line naming what runs there instead."""
    common = run_section(cfg, "common")
    if common is None or not (common.get("cpu") or not torch.cuda.is_available()):
        return
    if common.get("amp"):
        raise UsageError("--amp needs a CUDA GPU (on a CPU it would train in plain fp32): on a CPU use --bf16-autocast")
    if common.get("fp16") and not common.get("memory_efficient_fp16") and not common.get("fp16_no_flatten_grads"):
        raise UsageError("--fp16 on a CPU needs --fp16-no-flatten-grads (hydra: common.fp16_no_flatten_grads=true; "
                         "fairseq keeps its flat fp32 copy of the weights on CUDA), or use --bf16-autocast or "
                         "--memory-efficient-fp16, or train in fp32 (hydra: common.fp16=false)")


def refuse_flat_fp16_copies_of_grouped_parameters(cfg) -> None:
    """fairseq's ``--fp16`` copies every weight into one flat fp32 tensor, which carries no ``param_group``: the
    ``composite`` optimizer (coreference's two learning rates) then stops in an assertion. fairseq's ``--amp``
    wrapper reaches the optimizer's ``param_groups``, which the composite one does not have (an AttributeError at the
    first update). One line for each instead."""
    common, optimizer = run_section(cfg, "common"), run_section(cfg, "optimizer")
    if common is None or optimizer is None or optimizer.get("_name") not in ("composite", "composite_clip_per_group"):
        return
    if common.get("amp"):
        raise UsageError(f"--amp does not work with the {optimizer.get('_name')} optimizer (fairseq's AMP wrapper "
                         "cannot reach its groups): use --fp16 (hydra: common.fp16=true)")
    if common.get("fp16") and not common.get("memory_efficient_fp16") and not common.get("fp16_no_flatten_grads"):
        raise UsageError("--fp16 with the composite optimizer needs --fp16-no-flatten-grads "
                         "(hydra: common.fp16_no_flatten_grads=true): fairseq's flat fp32 copy of the weights "
                         "loses their parameter groups")


def amp_autocast(optimizer):
    """fairseq's ``--amp`` forward pass: CUDA autocast where the optimizer is fairseq's AMP one, else nothing.

    Never an autocast with ``enabled=False``: around ``forward_precision``'s CUDA bfloat16 autocast it would switch
    that off (the inner of two contexts of one device type wins), and ``--bf16-autocast`` would train in fp32."""
    from fairseq.optim.amp_optimizer import AMPOptimizer

    return torch.autocast(device_type="cuda") if isinstance(optimizer, AMPOptimizer) else contextlib.nullcontext()


def forward_precision(cfg, model):
    """The context a forward pass runs in: bfloat16 autocast on the model's device with ``--bf16-autocast``."""
    if not bf16_autocast_enabled(cfg):
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device_type=device, dtype=torch.bfloat16)


def warn_if_bf16_is_emulated(flag: str, device: str) -> None:
    """One warning line where ``flag`` asks for bfloat16 on a CPU that only emulates it (no AVX512-BF16 or AMX)."""
    if device == "cpu" and not cpu_supports_bf16():
        logger.warning(f"{flag} on a CPU without native bfloat16 (no AVX512-BF16 or AMX): bfloat16 is emulated here, "
                       "and the model runs several times slower than in fp32")


def cpu_supports_bf16() -> bool:
    """Whether this CPU computes bfloat16 matrix products natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False
