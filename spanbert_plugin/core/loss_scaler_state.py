"""Resume mixed-precision training with its whole loss-scaler state, not only the current scale.

fairseq's fp16 optimizers save ``loss_scale`` alone: after a resume the scaler's counters
(updates since the last overflow or rescale) start from zero, so the scale grows at other
updates than in an uninterrupted run, other updates overflow and are skipped, and the losses
part ways (seen on a GPU with ``--fp16-scale-window 20``). ``--amp`` saves no scaler state at
all (the scale restarts at ``--amp-init-scale``). These wrappers add the missing state to the
optimizer's state dict, so ``checkpoint_last.pt`` resumes the scaler exactly; checkpoints
without it load as before.
"""
from fairseq.optim import amp_optimizer, fp16_optimizer

DYNAMIC_SCALER_KEY = "spanbert_loss_scaler"
AMP_SCALER_KEY = "spanbert_amp_grad_scaler"
# what DynamicLossScaler changes while training, besides loss_scale (saved by fairseq itself)
DYNAMIC_SCALER_FIELDS = ("_iter", "_last_overflow_iter", "_last_rescale_iter", "_overflows_since_rescale")


def _wrap_dynamic(mixin):
    save, load = mixin.state_dict, mixin.load_state_dict

    def state_dict(self):
        state = save(self)
        if self.scaler is not None:
            state[DYNAMIC_SCALER_KEY] = {name: int(getattr(self.scaler, name)) for name in DYNAMIC_SCALER_FIELDS}
        return state

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        state_dict = dict(state_dict)  # the caller's checkpoint stays as it was
        counters = state_dict.pop(DYNAMIC_SCALER_KEY, None)
        load(self, state_dict, optimizer_overrides)
        if counters is not None and self.scaler is not None:
            for name, value in counters.items():
                setattr(self.scaler, name, value)

    mixin.state_dict, mixin.load_state_dict = state_dict, load_state_dict


def _wrap_amp(cls):
    save, load = cls.state_dict, cls.load_state_dict

    def state_dict(self):
        state = save(self)
        state[AMP_SCALER_KEY] = self._grad_scaler.state_dict()
        return state

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        state_dict = dict(state_dict)
        scaler_state = state_dict.pop(AMP_SCALER_KEY, None)
        load(self, state_dict, optimizer_overrides)
        if scaler_state:
            self._grad_scaler.load_state_dict(scaler_state)

    cls.state_dict, cls.load_state_dict = state_dict, load_state_dict


def install():
    """Wrap fairseq's fp16 / memory-efficient fp16 / AMP optimizers once (idempotent)."""
    if getattr(fp16_optimizer, "_spanbert_scaler_state", False):
        return
    _wrap_dynamic(fp16_optimizer._FP16OptimizerMixin)
    _wrap_dynamic(fp16_optimizer._MemoryEfficientFP16OptimizerMixin)
    _wrap_amp(amp_optimizer.AMPOptimizer)
    fp16_optimizer._spanbert_scaler_state = True
