"""Criteria of the plugin, and the logging helpers they share."""
import functools
import math
import operator

import torch
from fairseq import metrics
from fairseq.logging import meters as fairseq_meters
from fairseq.logging.meters import AverageMeter, SumMeter, type_as

from .source_hash import source_sha256


def total(logging_outputs, key):
    """The sum of ``key`` over the logging outputs (0 where none has it), without ``sum()``'s leading ``0 +``:
    on a device tensor that is an operator, a kernel launch on a GPU, per update and key."""
    values = [log[key] for log in logging_outputs if key in log]
    return functools.reduce(operator.add, values) if values else 0


def per_unit(value, count, bits: bool = False):
    """``value / count`` (in bits with ``bits``: divided by ln 2 as well), one operator on a tensor."""
    return value * (1.0 / (count * (math.log(2) if bits else 1.0)))


def log_sum_to_this_validation(key: str, value) -> None:
    """Add ``value`` to ``key`` in the temporary aggregators of the current validation only.

    fairseq also logs into a run-long "valid" aggregator that all validation
    subsets share and checkpoints save: arrays sized by a split (per-question or
    per-example records) would grow the checkpoint, and subsets of different
    sizes could not be summed there.
    """
    persistent = {id(agg) for agg in getattr(metrics, "_aggregators", {}).values()}
    for agg in metrics.get_active_aggregators():
        if id(agg) in persistent:
            continue
        if key not in agg:
            agg.add_meter(key, SumMeter(), 50)
        agg[key].update(value)


# ----------------------------------------------------------------------------- meters that add up on demand
# fairseq's AverageMeter/SumMeter add every tensor value into their sum as it is logged: a multiplication and an
# addition per meter and active aggregator (the run's, the epoch's and the log interval's), each a kernel launch on
# a GPU, every update. These keep the tensor values and add them up in one stacked operation when the sum is read
# (at --log-interval, validation, a checkpoint) or FOLD_EVERY values have gathered; the sums are the same up to
# the order of floating-point additions. Registered under fairseq's meters module, so a checkpoint's metrics state
# loads back into them (fairseq looks meter classes up there by name).
FOLD_EVERY = 32
# sha256 of the fairseq code these mirror (fairseq-fixed 0.12.3.1): AverageMeter, SumMeter, MetersDict's state_dict and
# load_state_dict, metrics.log_scalar and log_scalar_sum (``fairseq_meters_source_sha256``; a test fails on another)
FAIRSEQ_METERS_SHA256 = "9d9da30407fe4b9256869f55c204a270c66f35b631180394ce305fcecd0e45b1"


class _PendingSum:
    """The ``sum`` of a meter as a property: the values logged since the last read are added when it is read."""

    @property
    def sum(self):
        self._fold()
        return self._sum

    @sum.setter
    def sum(self, value):  # fairseq's reset and load_state_dict set the sum: pending values go with the old one
        self._sum, self._pending = value, []

    def _add(self, total):
        self._sum = total if isinstance(self._sum, (int, float)) and self._sum == 0 else type_as(self._sum, total) + total

    @classmethod
    def adopt(cls, meter):
        """Turn fairseq's meter (e.g. one loaded from an older checkpoint) into this kind, in place."""
        total = meter.__dict__.pop("sum")
        meter.__class__ = cls
        meter.sum = total
        return meter


class DeferredAverageMeter(_PendingSum, AverageMeter):
    """fairseq's ``AverageMeter`` (the same state, average and rounding) for per-update tensor values."""

    value_scale = 1.0  # what each value is multiplied by when added up, besides its weight

    def update(self, val, n=1):
        if val is None:
            return
        if not torch.is_tensor(val) or torch.is_tensor(n):
            super().update(val, n)
            return
        self.val = val
        if n > 0:
            self._pending.append((val, n))
            self.count = type_as(self.count, n) + n
            if len(self._pending) >= FOLD_EVERY:
                self._fold()

    def _fold(self):
        if self._pending:
            values, weights = zip(*self._pending)
            self._pending = []
            self._add(torch.stack(torch._foreach_mul(list(values), [self.value_scale * w for w in weights])).sum(0))


class DeferredPercentMeter(DeferredAverageMeter):
    """Per-update booleans (e.g. whether the gradients were clipped) averaged as a percentage: the booleans are
    logged as they are, and multiplied by 100 when added up."""

    value_scale = 100.0


class DeferredSumMeter(_PendingSum, SumMeter):
    """fairseq's ``SumMeter`` for per-update tensor values (of one shape, e.g. confusion counts)."""

    def update(self, val):
        if val is None:
            return
        if not torch.is_tensor(val):
            super().update(val)
            return
        self._pending.append(val)
        if len(self._pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self):
        if self._pending:
            values, self._pending = self._pending, []
            self._add(values[0] if len(values) == 1 else torch.stack(values).sum(0))


for _meter_class in (DeferredAverageMeter, DeferredPercentMeter, DeferredSumMeter):
    setattr(fairseq_meters, _meter_class.__name__, _meter_class)


def _log(key, value, priority, round, plain, deferred, update):
    """``update`` the meter of ``key`` in every active aggregator: a ``deferred`` one for tensor values (fairseq's
    ``plain`` kind, e.g. loaded from an older checkpoint, adopted), ``plain`` for numbers."""
    for aggregator in metrics.get_active_aggregators():
        if key not in aggregator:
            aggregator.add_meter(key, (deferred if torch.is_tensor(value) else plain)(round=round), priority)
        meter = aggregator[key]
        if torch.is_tensor(value) and type(meter) is plain:
            deferred.adopt(meter)
        update(meter)


def log_scalar(key, value, weight=1, priority=10, round=None):
    """fairseq's ``metrics.log_scalar``, with tensor values added up when read (see ``DeferredAverageMeter``)."""
    _log(key, value, priority, round, AverageMeter, DeferredAverageMeter, lambda meter: meter.update(value, weight))


def log_percent(key, flag, priority=10, round=None):
    """The percentage of updates for which ``flag`` (a boolean tensor) holds, e.g. of clipped updates, as fairseq
    logs it from values of 100 and 0, without making those values (``DeferredPercentMeter``)."""
    _log(key, flag, priority, round, AverageMeter, DeferredPercentMeter, lambda meter: meter.update(flag, 1))


def log_scalar_sum(key, value, priority=10, round=None):
    """fairseq's ``metrics.log_scalar_sum``, with tensor values added up when read (see ``DeferredSumMeter``)."""
    _log(key, value, priority, round, SumMeter, DeferredSumMeter, lambda meter: meter.update(value))


def fairseq_meters_source_sha256() -> str:
    mirrored = (AverageMeter, SumMeter, fairseq_meters.MetersDict.state_dict, fairseq_meters.MetersDict.load_state_dict,
                metrics.log_scalar, metrics.log_scalar_sum)
    return source_sha256(*mirrored)
