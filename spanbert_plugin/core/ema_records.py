"""fairseq's ``--store-ema`` over a model that keeps integer buffers (the vocabulary record).

fairseq's EMA decays every entry of the model's state dict (``ema_param.mul_(decay)``) except its ``skip_keys``,
which fairseq's trainer never sets: the vocabulary record's int64 hashes stop the first update with "result type
Float can't be cast to the desired output type Long". Integer and boolean entries are records, not weights, and a
mean of them means nothing: here they join ``skip_keys``, so the EMA model copies them from the trained one.
Installed only over the code it was written against (``FAIRSEQ_SOURCE_SHA256``; a test fails on another).
"""
import functools
import logging

import torch
from fairseq.models.ema.ema import EMA

from .source_hash import source_sha256

logger = logging.getLogger(__name__)

# sha256 of EMA.__init__ and EMA._step_internal (fairseq-fixed 0.12.3.1)
FAIRSEQ_SOURCE_SHA256 = "76a9353dd578613626b98bd192688b8257cafb338588d907899518fbced53a29"


def fairseq_source_sha256() -> str:
    return source_sha256(EMA.__init__.__wrapped__ if hasattr(EMA.__init__, "__wrapped__") else EMA.__init__,
                         EMA._step_internal)


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
