"""fairseq's ``--amp`` optimizer (``AMPOptimizer``) with its gradient scaler used as PyTorch means it.

Two defects of fairseq 0.12's code, corrected here:

* ``clip_grad_norm`` unscales the gradients through the torch optimizer (``scaler.unscale_(self.optimizer)``) and
  ``step`` hands the scaler fairseq's wrapper (``scaler.step(self.fp32_optimizer)``). ``GradScaler`` keeps its
  state per optimizer object, so ``step`` found the wrapper not yet unscaled and divided the gradients by the
  loss scale a second time: the optimizer saw them 128 times too small at the start, and smaller as the scale
  grew, until ``eps`` outweighed them. Here ``clip_grad_norm`` unscales through the object ``step`` uses.
* The scaler started at ``--fp16-init-scale`` and, with ``--amp-scale-window``, grew every ``--amp-init-scale``
  updates: it takes ``--amp-init-scale`` and ``--amp-scale-window`` (2,000 when unset, PyTorch's default). A
  resumed run keeps the checkpoint's scale and counters (``core.loss_scaler_state``) but its own growth interval,
  so a checkpoint saved with fairseq's interval, or another ``--amp-scale-window``, follows the command line.

Installed only over the code it was written against (``FAIRSEQ_SOURCE_SHA256``; a test fails on another).
"""
import logging

import torch
from fairseq.optim.amp_optimizer import AMPOptimizer

from .source_hash import source_sha256

logger = logging.getLogger(__name__)

# sha256 of AMPOptimizer.__init__, step and clip_grad_norm (fairseq-fixed 0.12.3.1)
FAIRSEQ_SOURCE_SHA256 = "843dcda77d29f47e9c608212b7a2539b987faf38975883ef7f550af50b82b03e"
_ORIGINAL = {name: getattr(AMPOptimizer, name) for name in ("__init__", "step", "clip_grad_norm")}


def fairseq_source_sha256() -> str:
    return source_sha256(*_ORIGINAL.values())


def _device_type(params) -> str:
    """The parameters' device type: ``cuda`` in every run fairseq allows ``--amp`` (the plugin refuses it on a CPU)."""
    for group in params:
        for p in (group["params"] if isinstance(group, dict) else [group]):
            return p.device.type
    return "cuda"


def __init__(self, cfg, params, fp32_optimizer, **kwargs):
    params = list(params)
    _ORIGINAL["__init__"](self, cfg, params, fp32_optimizer, **kwargs)
    window = getattr(cfg.common, "amp_scale_window", None)
    self._growth_interval = window if window is not None else 2000
    self._grad_scaler = torch.amp.GradScaler(_device_type(params), init_scale=cfg.common.amp_init_scale,
                                             growth_interval=self._growth_interval)


def _growth_interval_of_the_command_line(load_state_dict):
    def load_state_dict_keeping_the_interval(self, state_dict, optimizer_overrides=None):
        load_state_dict(self, state_dict, optimizer_overrides)
        if self._grad_scaler.is_enabled():
            self._grad_scaler.set_growth_interval(self._growth_interval)

    return load_state_dict_keeping_the_interval


def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
    """fairseq's, unscaling through ``self.fp32_optimizer``: the object ``step`` hands the scaler."""
    self.scaler.unscale_(self.fp32_optimizer)
    grad_norm = self.fp32_optimizer.clip_grad_norm(max_norm, aggregate_norm_fn)
    if not torch.isfinite(grad_norm).all():
        new_loss_scale = self.next_loss_scale
        if new_loss_scale <= self.min_loss_scale:
            raise FloatingPointError(
                f"AMP: Minimum loss scale reached ({self.min_loss_scale}). Your loss is probably exploding. "
                f"Try restarting training or use fp32. {new_loss_scale}")
        logger.info(f"AMP: overflow detected, setting scale to to {new_loss_scale}")
    return grad_norm


def install() -> None:
    if getattr(AMPOptimizer, "_spanbert_scaler", False):
        return
    if fairseq_source_sha256() != FAIRSEQ_SOURCE_SHA256:
        logger.warning("fairseq's AMPOptimizer is not the code the plugin was written against: --amp is left as it is")
        return
    AMPOptimizer.__init__, AMPOptimizer.clip_grad_norm = __init__, clip_grad_norm
    AMPOptimizer.load_state_dict = _growth_interval_of_the_command_line(AMPOptimizer.load_state_dict)
    AMPOptimizer._spanbert_scaler = True
