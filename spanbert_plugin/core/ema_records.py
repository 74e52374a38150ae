"""fairseq's ``--store-ema`` over a model that keeps integer buffers (the vocabulary record).

fairseq's EMA decays every entry of the model's state dict (``ema_param.mul_(decay)``) except its ``skip_keys``,
which fairseq's trainer never sets: the vocabulary record's int64 hashes stop the first update with "result type
Float can't be cast to the desired output type Long". Integer and boolean entries are records, not weights, and a
mean of them means nothing: here they join ``skip_keys``, so the EMA model copies them from the trained one.

A run with ``--store-ema`` that starts from a checkpoint without an EMA (``--finetune-from-model``, or a resume of a
run saved without it) stopped with ``KeyError: 'model'``: fairseq's ``Trainer.load_checkpoint`` deletes
``state["model"]`` after loading it, then reads it again to start the EMA from it. The checkpoint's model is handed
to that load as its EMA instead, which starts the EMA from the same weights. So does a run that starts a new training
from a checkpoint with an EMA (``--finetune-from-model``): that EMA is another run's, whose heads may predict other
labels or the same in another order. ``--ema-fp32``'s copies of the weights come back without the records, which
the EMA takes from the model it is built from (the record of a data folder moved since has another length).

Installed only over the code it was written against (``FAIRSEQ_SOURCE_SHA256``; a test fails on another).
"""
import functools
import logging

import torch
from fairseq import checkpoint_utils
from fairseq.models.ema.ema import EMA
from fairseq.trainer import Trainer

from .checkpoint_loading import starts_anew_from
from .source_hash import source_sha256

logger = logging.getLogger(__name__)

# sha256 of EMA.__init__, EMA._step_internal and Trainer.load_checkpoint (fairseq-fixed 0.12.3.1)
FAIRSEQ_SOURCE_SHA256 = "6eb368f5a6250d19e77ce0aa2acb7d8c31bbfda9284149ad4a22e0ab8762b900"


def fairseq_source_sha256() -> str:
    return source_sha256(*(getattr(code, "__wrapped__", code) for code in
                           (EMA.__init__, EMA._step_internal, Trainer.load_checkpoint)))


def record_keys(model) -> set:
    """The state-dict keys of ``model`` that hold integer or boolean tensors."""
    return {key for key, value in model.state_dict().items() if torch.is_tensor(value) and not value.is_floating_point()}


def install() -> None:
    original = EMA.__init__
    if getattr(original, "spanbert", False):
        return
    if fairseq_source_sha256() != FAIRSEQ_SOURCE_SHA256:
        logger.warning("fairseq's EMA is not the code the plugin was written against: --store-ema is left as it is")
        return

    @functools.wraps(original)
    def __init__(self, model, config, device=None, skip_keys=None):
        original(self, model, config, device, skip_keys)
        self.skip_keys = set(self.skip_keys) | record_keys(self.model)

    __init__.spanbert = True
    EMA.__init__ = __init__
    Trainer.load_checkpoint = _ema_from_the_checkpoints_model(Trainer.load_checkpoint)


def _ema_from_the_checkpoints_model(load_checkpoint):
    @functools.wraps(load_checkpoint)
    def load_checkpoint_with_an_ema(self, filename, *args, **kwargs):
        if not self.cfg.ema.store_ema:
            return load_checkpoint(self, filename, *args, **kwargs)
        read = checkpoint_utils.load_checkpoint_to_cpu

        starts_anew = starts_anew_from(self.cfg.checkpoint, filename)

        def read_with_an_ema(path, *read_args, **read_kwargs):
            state = read(path, *read_args, **read_kwargs)
            extra = state.get("extra_state")
            if isinstance(extra, dict) and "model" in state and ("ema" not in extra or starts_anew):
                # a new run's EMA starts from the model it trains: another run's EMA has that run's heads (other
                # labels, or rows in another order, which the model's loading adapts for the model alone)
                logger.info(f"{path} holds no EMA: the EMA starts from its model" if "ema" not in extra else
                            f"{path}: a new training starts from it, and its EMA from its model (not its EMA)")
                extra["ema"] = state["model"]
                extra.pop("ema_fp32_params", None)  # --ema-fp32: fairseq builds them from that EMA then
            elif isinstance(extra, dict) and isinstance(extra.get("ema_fp32_params"), dict):
                # --ema-fp32's copies hold the records too, as they were when the EMA was built: a vocabulary record
                # of another length (the data folder moved since) stopped the resume. Records are copied from the
                # trained model at every step, so the EMA keeps those of the model it is built from
                extra["ema_fp32_params"] = {key: value for key, value in extra["ema_fp32_params"].items()
                                            if not torch.is_tensor(value) or value.is_floating_point()}
            return state

        checkpoint_utils.load_checkpoint_to_cpu = read_with_an_ema
        try:
            return load_checkpoint(self, filename, *args, **kwargs)
        finally:
            checkpoint_utils.load_checkpoint_to_cpu = read

    return load_checkpoint_with_an_ema
