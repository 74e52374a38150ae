"""fairseq's ``--fp16`` optimizer with its two copies per update done by multi-tensor operators.

``FP16Optimizer`` keeps fp32 master weights beside the model's fp16 ones. Every update it copies each fp16 gradient
into the master gradients (``_sync_fp16_grads_to_fp32``) and, after the step, each master weight back into the model
(``_sync_fp32_params_to_fp16``): a Python loop over the parameter tensors, one ``copy_`` each, so about two kernel
launches and their Python per parameter tensor (about 200 for all-MiniLM-L6-v2, 400 for ``spanbert_base``) on a GPU.
Here each of the two is one ``torch._foreach_copy_`` over views of the same tensors (CUDA converts fp16 and fp32 in
the same multi-tensor kernels): the same values land in the same places. The views of the flat master tensor
(fairseq's default on a GPU) are made once and kept while that tensor is the same.

The plugin's tasks switch this on for their optimizer at the first update (``use_multi_tensor_copies``), only where
the two methods are the code they were written against (``FAIRSEQ_SOURCE_SHA256``; with another fairseq the loops
stay, and a test fails). A case the fast copies do not cover (a parameter without a gradient) runs fairseq's code.
"""
import logging

import torch
from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

from .source_hash import source_sha256

logger = logging.getLogger(__name__)

# sha256 of _FP16OptimizerMixin._sync_fp16_grads_to_fp32 and _sync_fp32_params_to_fp16 (fairseq-fixed 0.12.3.1)
FAIRSEQ_SOURCE_SHA256 = "f5be3619f08b3ceb6034b052294b7d0ec2a8d7eee68becff18d146510ce4d014"
REPLACED = ("_sync_fp16_grads_to_fp32", "_sync_fp32_params_to_fp16")


def fairseq_source_sha256() -> str:
    return source_sha256(*(getattr(_FP16OptimizerMixin, name) for name in REPLACED))


def use_multi_tensor_copies(optimizer) -> bool:
    """Give fairseq's ``FP16Optimizer`` instance ``optimizer`` the multi-tensor copies (once; True if it has them)."""
    if not isinstance(optimizer, _FP16OptimizerMixin):
        return False
    if getattr(optimizer, "_multi_tensor_copies", None) is None:
        if fairseq_source_sha256() != FAIRSEQ_SOURCE_SHA256:
            logger.warning("fairseq's FP16Optimizer copies are not the code the plugin was written against: "
                           "they stay one copy per parameter tensor")
            optimizer._multi_tensor_copies = False
        else:
            copies = optimizer._multi_tensor_copies = _MultiTensorCopies(optimizer)
            optimizer._sync_fp16_grads_to_fp32 = copies.grads_to_fp32
            optimizer._sync_fp32_params_to_fp16 = copies.params_to_fp16
    return bool(optimizer._multi_tensor_copies)


class _MultiTensorCopies:
    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._views = {}  # (device, "grad" or "data") -> (flat tensor, its views shaped as the parameters)

    def _flat_views(self, device, kind, flat, params):
        kept = self._views.get((device, kind))
        if kept is None or kept[0] is not flat:
            views, offset = [], 0
            for p in params:
                views.append(flat[offset:offset + p.numel()].view(p.shape))
                offset += p.numel()
            kept = self._views[(device, kind)] = (flat, views)
        return kept[1]

    @torch.no_grad()
    def grads_to_fp32(self):
        optimizer = self.optimizer
        if not optimizer._needs_sync:
            return
        if optimizer.has_flat_params:
            trained = [p for p in optimizer.fp16_params if p.requires_grad]
            if any(p.grad is None for p in trained):
                return _FP16OptimizerMixin._sync_fp16_grads_to_fp32(optimizer)
            for device, master in optimizer.fp32_params.items():
                params = [p for p in trained if p.device.index == device]
                if params:
                    torch._foreach_copy_(self._flat_views(device, "grad", master.grad, params), [p.grad for p in params])
        else:
            pairs = [(p, p32) for p, p32 in zip(optimizer.fp16_params, optimizer.fp32_params) if p.requires_grad]
            if any(p.grad is None or p32.grad is None for p, p32 in pairs):
                return _FP16OptimizerMixin._sync_fp16_grads_to_fp32(optimizer)
            if pairs:
                torch._foreach_copy_([p32.grad for _, p32 in pairs], [p.grad for p, _ in pairs])
        optimizer._needs_sync = False

    @torch.no_grad()
    def params_to_fp16(self):
        optimizer = self.optimizer
        if optimizer.has_flat_params:
            for device, master in optimizer.fp32_params.items():
                params = [p for p in optimizer.fp16_params if p.device.index == device]
                if params:
                    torch._foreach_copy_(params, self._flat_views(device, "data", master, params))
        else:
            pairs = [(p, p32) for p, p32 in zip(optimizer.fp16_params, optimizer.fp32_params) if p.requires_grad]
            if pairs:
                torch._foreach_copy_([p for p, _ in pairs], [p32 for _, p32 in pairs])
