"""``--optimizer torch_adamw``: PyTorch's multi-tensor AdamW behind fairseq's ``adam`` options.

Without NVIDIA apex, fairseq's ``adam`` updates each parameter tensor in a Python loop, about ten small
operations per tensor: on a GPU every one is a kernel launch, and for a small encoder these launches cost
more per update than the matrix products. ``torch.optim.AdamW`` updates all tensors with a few multi-tensor
kernels (``fused`` on CUDA and CPU), and it is the optimizer ``transformers``' ``Trainer``
uses, so a fine-tune moved from there runs the same update rule. Weight decay is decoupled in both. The one
numerical difference to fairseq's ``adam``: torch adds ``eps`` after the second-moment bias correction,
fairseq before it.

    fairseq-train ... --optimizer torch_adamw --adam-betas '(0.9,0.999)' --adam-eps 1e-6 --weight-decay 0.01
"""
import ast
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from .errors import UsageError


DECAY_EXEMPT = "decay_exempt"  # marks a parameter group that --no-weight-decay-on-biases-and-norms exempts


def _without_decay_on_one_dimension(params) -> list:
    """Parameter groups split in two: parameters of two or more dimensions keep the group's weight decay, those of
    one (biases and LayerNorm weights in BERT models: transformers' Trainer's and BERT's exemptions) get none."""
    plain = [t for t in params if not isinstance(t, dict)]
    groups = ([{"params": plain}] if plain else []) + [group for group in params if isinstance(group, dict)]
    tensors = [t for group in groups for t in group["params"]]
    if len(tensors) == 1 and tensors[0].dim() == 1:
        raise UsageError("--no-weight-decay-on-biases-and-norms: the optimizer was given one flat tensor (fairseq's "
                         "--fp16 copies every weight into one): add --fp16-no-flatten-grads")
    split = []
    for group in groups:
        matrices = [t for t in group["params"] if t.dim() >= 2]
        vectors = [t for t in group["params"] if t.dim() < 2]
        if matrices:
            split.append({**group, "params": matrices})
        if vectors:
            split.append({**group, "params": vectors, "weight_decay": 0.0, DECAY_EXEMPT: True})
    return split


def parse_betas(betas) -> tuple:
    """``--adam-betas`` as two floats in [0, 1); a UsageError names the flag otherwise (torch's AdamW would raise a
    ValueError traceback, and a malformed string a SyntaxError one)."""
    given = betas
    try:
        if isinstance(betas, str):  # "(0.9,0.999)" on the command line: a literal, never evaluated as code
            betas = ast.literal_eval(betas)
        elif OmegaConf.is_config(betas):
            betas = OmegaConf.to_container(betas)
        betas = tuple(float(b) for b in betas)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        betas = None
    if betas is None or len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise UsageError(f"--adam-betas {given}: expected two numbers in [0, 1), e.g. '(0.9,0.999)'")
    return betas


def checked_eps_and_decay(cfg) -> dict:
    """``--adam-eps`` and ``--weight-decay``, each a number of at least 0 (UsageError naming the flag otherwise)."""
    for flag, value in (("--adam-eps", cfg.adam_eps), ("--weight-decay", cfg.weight_decay)):
        if not value >= 0.0:  # NaN too
            raise UsageError(f"{flag} {value}: expected a number of at least 0")
    return {"eps": cfg.adam_eps, "weight_decay": cfg.weight_decay}


@dataclass
class TorchAdamWConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay (as AdamW)"})
    no_weight_decay_on_biases_and_norms: bool = field(
        default=False, metadata={"help": "no weight decay on parameters of one dimension (biases, LayerNorm "
                                         "weights), as transformers' Trainer and BERT's optimizer leave them out"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("torch_adamw", dataclass=TorchAdamWConfig)
class TorchAdamW(FairseqOptimizer):
    """torch.optim.AdamW (fused on CUDA and CPU, foreach elsewhere) with fairseq's adam options; gradient norms
    and clipping through torch's multi-tensor kernels too."""

    def __init__(self, cfg: TorchAdamWConfig, params):
        super().__init__(cfg)
        # a group's "params" may be one tensor or any iterable (read once here, so kept as a list)
        params = [{**group, "params": [group["params"]] if torch.is_tensor(group["params"]) else list(group["params"])}
                  if isinstance(group, dict) else group for group in params]
        tensors = [t for group in params for t in (group["params"] if isinstance(group, dict) else [group])]
        if any(t.dtype in (torch.float16, torch.bfloat16) for t in tensors):  # only memory-efficient modes pass these
            raise UsageError("--optimizer torch_adamw: the parameters are 16-bit (--memory-efficient-fp16/-bf16); "
                             "use --fp16 or --amp (fp32 master weights), or --optimizer adam")
        # fused: one kernel reads and writes each parameter and moment once (CUDA and CPU); foreach elsewhere
        fusable = bool(tensors) and all(t.device.type in ("cuda", "cpu") and t.is_floating_point() for t in tensors)
        kernel = {"fused": True} if fusable else {"foreach": True}
        if cfg.no_weight_decay_on_biases_and_norms:
            params = _without_decay_on_one_dimension(params)
        self._optimizer = torch.optim.AdamW(params, **self.optimizer_config, **kernel)
        self._grad_factor = None  # multiply_grads' factor, not yet applied

    @property
    def optimizer_config(self):
        """The options a checkpoint's optimizer state is overridden with (as fairseq's adam)."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        return {"lr": lr, "betas": parse_betas(self.cfg.adam_betas), **checked_eps_and_decay(self.cfg)}

    @property
    def supports_flat_params(self):
        return True

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        """fairseq's, which then sets every group's options to ``optimizer_config``: the groups exempt from weight
        decay keep 0."""
        try:
            super().load_state_dict(state_dict, optimizer_overrides)
        except ValueError as err:
            if "parameter group" not in str(err):
                raise
            raise UsageError(f"the checkpoint's optimizer state has other parameter groups ({err}); "
                             "--no-weight-decay-on-biases-and-norms changed since it was saved: resume with "
                             "--reset-optimizer, or as it was saved") from None
        for group in self.param_groups:
            if group.get(DECAY_EXEMPT):
                group["weight_decay"] = 0.0

    def multiply_grads(self, c):
        """Multiplies the gradients by a number ``c`` when they are next used: fairseq's trainer calls this right
        before ``clip_grad_norm``, which then scales the gradients once for both (one pass over them instead of
        two). A tensor ``c`` is applied now."""
        if torch.is_tensor(c):
            self._apply_grad_factor()
            super().multiply_grads(c)
        else:
            self._grad_factor = c if self._grad_factor is None else self._grad_factor * c

    def _apply_grad_factor(self):
        if self._grad_factor is not None:
            factor, self._grad_factor = self._grad_factor, None
            super().multiply_grads(factor)

    def step(self, closure=None, scale=1.0, groups=None):
        self._apply_grad_factor()
        super().step(closure, scale, groups)

    def zero_grad(self):
        self._grad_factor = None
        super().zero_grad()

    @torch.no_grad()
    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """The gradients' total L2 norm (fp32), then each scaled by min(1, max_norm / (norm + 1e-6)) when
        max_norm > 0: fairseq's clip_grad_norm_, with one multi-tensor norm instead of one per tensor, and
        ``multiply_grads``' factor f folded in (the norm of f·g is |f| times g's; the gradients are multiplied once,
        by min(f, f·max_norm / (norm + 1e-6)) with f > 0)."""
        factor, self._grad_factor = self._grad_factor, None
        params = list(self.params)  # fairseq's ``params`` is a generator
        grads = [p.grad.detach() for p in params if p.grad is not None and not hasattr(p, "expert")]
        experts = [p.grad.detach() for p in params if p.grad is not None and hasattr(p, "expert")]
        if factor is not None and (not grads or factor <= 0 or aggregate_norm_fn is not None):
            super().multiply_grads(factor)  # nothing to fold it into, or a norm aggregated across workers: as fairseq
            factor = None
        if not grads:
            return params[0].new_tensor(0.0) if params else torch.tensor(0.0)
        grads32 = [g.float() if g.dtype != torch.float32 else g for g in grads]
        foreach = all(g.device.type in ("cuda", "cpu") for g in grads32)  # one multi-tensor norm, not one per tensor
        total_norm = torch.nn.utils.get_total_norm(grads32, foreach=foreach)
        if factor is not None:
            total_norm = total_norm * factor
        if aggregate_norm_fn is not None:
            total_norm = aggregate_norm_fn(total_norm)
        if max_norm > 0:
            scale = 1.0 if factor is None else factor
            clip_coef = (float(max_norm) * scale / (total_norm + 1e-6)).clamp_(max=scale)
            torch._foreach_mul_(grads + experts, clip_coef)
        elif factor is not None:
            torch._foreach_mul_(grads + experts, factor)
        return total_norm
