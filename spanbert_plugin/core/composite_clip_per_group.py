"""``optimizer: composite_clip_per_group``: fairseq's ``composite`` optimizer, each group's gradients clipped alone.

c2f-coref (SpanBERT's coreference) clips the encoder's gradients and the coreference head's to global norm 1.0
each (``tf.clip_by_global_norm`` per group); fairseq's ``--clip-norm`` clips all of them together, so a large head
gradient shrinks the encoder's update. Here every group's gradients are clipped to ``clip_norm_per_group`` right
before its optimizer steps, once fairseq's loss scaling and averaging are undone (under ``--fp16``, bf16 and in
fp32 alike; fairseq's ``--amp`` does not work with composite optimizers, refused in one line); leave
``optimization.clip_norm`` at 0 to clip per group only (the logged ``gnorm`` stays the norm of all gradients,
before clipping).
"""
from dataclasses import dataclass, field

import torch
from fairseq.optim import register_optimizer
from fairseq.optim.composite import CompositeOptimizerConfig, FairseqCompositeOptimizer


@dataclass
class CompositeClipPerGroupConfig(CompositeOptimizerConfig):
    clip_norm_per_group: float = field(
        default=1.0, metadata={"help": "clip each group's gradients to this L2 norm before its step (0: no clipping)"})


@register_optimizer("composite_clip_per_group", dataclass=CompositeClipPerGroupConfig)
class CompositeClipPerGroup(FairseqCompositeOptimizer):
    def __init__(self, cfg: CompositeClipPerGroupConfig, params):
        super().__init__(cfg, params)
        self.clip_norm_per_group = float(cfg.clip_norm_per_group)

    def step(self, closure=None, scale=1.0, groups=None):
        if scale != 1.0:  # the gradients as the groups step on them, before they are clipped
            self.multiply_grads(1.0 / scale)
            scale = 1.0
        if self.clip_norm_per_group > 0:
            for name, optimizer in self.optimizers.items():
                if groups is None or name in groups:
                    clip_group(optimizer.params, self.clip_norm_per_group)
        super().step(closure, scale, groups)


@torch.no_grad()
def clip_group(params, max_norm: float) -> None:
    """Scale the gradients of ``params`` by min(1, max_norm / (their L2 norm + 1e-6)): fairseq's rule, per group."""
    grads = [p.grad for p in params if p.grad is not None]
    if grads:
        # in fp32, as fairseq's clip: a 16-bit norm overflows past 65,504 and would zero the gradients instead
        grads32 = [g.float() if g.dtype != torch.float32 else g for g in grads]
        norm = torch.nn.utils.get_total_norm(grads32, foreach=all(g.device.type in ("cuda", "cpu") for g in grads32))
        torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp_(max=1.0))
