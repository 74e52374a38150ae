"""Dropout whose mask comes from numpy's PCG64 on CPUs: several times faster than torch's CPU ``bernoulli_``.

torch draws a CPU dropout mask one element at a time from its Mersenne twister
(MKL's vectorised generator is used on Intel CPUs only): on an AMD EPYC that is
about 10 ns per element, a fifth of a MiniLM training update on LitBank. Here
the mask takes 16 random bits per element from numpy's PCG64, in bulk, seeded
by one draw from torch's generator, so runs stay reproducible from the seed and
fairseq's per-update seeding keeps resumed runs exact. The drop probability is
rounded to a multiple of 1/65,536 (0.1 becomes 0.1000061) and the kept values
are scaled by 1 / (1 - that probability): the expectation is unchanged.
Off the CPU, and inside a ``torch.compile``d region (``--compile``: the compiler
fuses torch's dropout into the kernels around it), torch's own dropout runs.
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..core.cpu_paths import cpu_path

_LEVELS = 1 << 16


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``, with the CPU mask drawn as above."""
    if not training or p == 0.0:
        return x
    dropped_levels = round(p * _LEVELS)
    # off the CPU, where p does not round to a level strictly between 0 and 1, and compiled: torch's dropout
    if not cpu_path(x) or not 0 < dropped_levels < _LEVELS or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, _keep_mask(x.shape, dropped_levels), _LEVELS / (_LEVELS - dropped_levels))


def _keep_mask(shape, dropped_levels: int) -> torch.Tensor:
    """A bool tensor of ``shape``, each element False with probability dropped_levels / 65,536, independently."""
    count = int(np.prod(shape))
    seed = int(torch.randint(0, 2**62, ()))
    raw = np.random.PCG64(seed).random_raw((count + 3) // 4)  # four 16-bit fields per 64-bit draw
    fields = torch.from_numpy(raw.view(np.int16)[:count])
    return (fields >= dropped_levels - _LEVELS // 2).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x * keep * scale in one pass each way (torch's own dropout kernel, ``native_dropout_backward``)."""

    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.ops.aten.native_dropout_backward(x, keep, scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, keep, ctx.scale), None, None


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same attributes and state) whose CPU mask comes from :func:`dropout`."""

    def forward(self, x):
        return dropout(x, self.p, self.training)
