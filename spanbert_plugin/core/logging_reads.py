"""fairseq's trainer reads every logged value on the host after every update; for the plugin's tasks it reads
them only when someone looks.

``Trainer._reduce_and_log_stats`` (fairseq 0.12) checks ``torch.isfinite(grad_norm)`` before it logs the norm, and
ends with ``get_smoothed_values()`` of the update's own aggregator, which turns every tensor meter into a Python
number: on a GPU each is a read that makes the host wait until the device has finished the update, so the next
update cannot be queued behind it. ``fairseq-train`` only checks that the returned dict is not None; the values it
prints are read from the ``train_inner`` aggregator at ``--log-interval``. The replacement logs the same meters
into the run's aggregators (tensor values added up when read: ``core.metrics.log_scalar``), returns the update's
own values as a mapping that reduces and reads them on first access (reducing repeats the criterion's operations on
the logged tensors), and skips the finiteness check, which cannot fail there: fairseq has raised
``FloatingPointError`` for a non-finite norm before (or, with ``--amp``/``--fp16`` overflows, not logged the update
at all). It does not warn about a criterion that logs no ``loss``: every plugin criterion logs one.

Only plugin tasks get it (fairseq's own tasks keep fairseq's method), and only over the fairseq code it was
written against: ``FAIRSEQ_SOURCE_SHA256`` is the hash of that method's source, and another one leaves
fairseq's method in place with a warning (``tests/test_update_cost.py`` fails then).
"""
import logging
from collections.abc import Mapping

import torch
from fairseq import metrics
from fairseq.trainer import Trainer

from .metrics import log_percent_above, log_scalar
from .source_hash import source_sha256

logger = logging.getLogger(__name__)
# inspect.getsource(fairseq.trainer.Trainer._reduce_and_log_stats) of fairseq-fixed 0.12.3.1
FAIRSEQ_SOURCE_SHA256 = "6fc951a5f2cdd544e97015950756074d0fecfe6dac303f09b29fe8adfbb8e06e"
DROPPED_KEYS = ("ppl", "wps", "wpb", "bsz")  # as fairseq's method drops them


class UpdateValuesOnDemand(Mapping):
    """One update's logged values, reduced on first access into an aggregator of their own.

    fairseq reduces every update's logging outputs once more into a fresh aggregator, only to return its values;
    here that happens when someone reads them (``new_root``: nothing reaches the run's aggregators twice), so an
    update that nobody reads pays for the run's meters alone.
    """

    def __init__(self, trainer, logging_outputs, sample_size):
        self._arguments, self._values = (trainer, logging_outputs, sample_size), None

    def _read(self):
        if self._values is None:
            trainer, logging_outputs, sample_size = self._arguments
            with metrics.aggregate(new_root=True) as aggregator:  # as fairseq's: without ups, gnorm and clip
                if logging_outputs is not None:
                    trainer.task.reduce_metrics(logging_outputs, trainer.get_criterion())
                values = aggregator.get_smoothed_values()
            values["sample_size"] = sample_size
            for key in DROPPED_KEYS:
                values.pop(key, None)
            self._values, self._arguments = values, None
        return self._values

    def __getitem__(self, key):
        return self._read()[key]

    def __iter__(self):
        return iter(self._read())

    def __len__(self):
        return len(self._read())


def _log_grad_norm(trainer, grad_norm):
    if grad_norm is None:
        return
    metrics.log_speed("ups", 1.0, priority=100, round=2)
    log_scalar("gnorm", grad_norm, priority=400, round=3)
    clip_norm = trainer.cfg.optimization.clip_norm
    if clip_norm > 0:
        if torch.is_tensor(grad_norm):  # the percentage of clipped updates, counted when read
            log_percent_above("clip", grad_norm, clip_norm, priority=500, round=1)
        else:
            log_scalar("clip", 100 if grad_norm > clip_norm else 0, priority=500, round=1)


def reduce_and_log_stats_without_reads(trainer, logging_outputs, sample_size, grad_norm=None):
    """``Trainer._reduce_and_log_stats`` less its host reads and its per-update aggregator (see the module's
    docstring)."""
    _log_grad_norm(trainer, grad_norm)
    if logging_outputs is not None:
        trainer.task.reduce_metrics(logging_outputs, trainer.get_criterion())
    return UpdateValuesOnDemand(trainer, logging_outputs, sample_size)


def fairseq_source_sha256():
    original = getattr(Trainer._reduce_and_log_stats, "__wrapped__", Trainer._reduce_and_log_stats)
    return source_sha256(original)


def install(is_plugin_task):
    """Route ``Trainer._reduce_and_log_stats`` of tasks for which ``is_plugin_task(task)`` holds (idempotent)."""
    original = Trainer._reduce_and_log_stats
    if hasattr(original, "__wrapped__"):
        return
    if fairseq_source_sha256() != FAIRSEQ_SOURCE_SHA256:
        logger.warning("fairseq's Trainer._reduce_and_log_stats is not the one the plugin was written against: "
                       "it keeps reading every logged value on the host after each update")
        return

    def _reduce_and_log_stats(self, logging_outputs, sample_size, grad_norm=None):
        if self.tpu or not is_plugin_task(self.task):
            return original(self, logging_outputs, sample_size, grad_norm)
        return reduce_and_log_stats_without_reads(self, logging_outputs, sample_size, grad_norm)

    _reduce_and_log_stats.__wrapped__ = original
    Trainer._reduce_and_log_stats = _reduce_and_log_stats
