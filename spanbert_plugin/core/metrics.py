"""Logging helpers and deferred meters the criteria share."""
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


BITS = 1.0 / math.log(2)  # log_mean's scale for a loss in nats logged in bits, as fairseq's criteria log it
PERCENT = 100.0  # log_mean's scale for a count of correct units logged as an accuracy in percent


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
        state = {name: meter.__dict__.pop(name) for name in ("sum", "val") if name in meter.__dict__}
        meter.__class__ = cls
        for name, value in state.items():  # through the properties of this kind
            setattr(meter, name, value)
        return meter


def _mean(value_sum, count, scale):
    """fairseq's logged value of a mean: ``value_sum * scale / count`` (``value_sum * scale`` for a count of 0)."""
    return value_sum * (scale / max(count, 1))


def _percent_above(value, threshold):
    """fairseq's logged value of an update's flag: 100 where ``value`` is above ``threshold``, else 0."""
    return torch.where(value > threshold, PERCENT, 0.0)


class DeferredAverageMeter(_PendingSum, AverageMeter):
    """fairseq's ``AverageMeter`` (the same state, average and rounding) for per-update tensor values; a mean
    logged as a sum and a count (``log_mean``) is divided when read."""

    @property
    def val(self):  # the last value, which only a checkpoint reads: a deferred one is made then
        if isinstance(self._val, functools.partial):
            self._val = self._val()
        return self._val

    @val.setter
    def val(self, value):
        self._val = value

    def update(self, val, n=1):
        if val is None:
            return
        if not torch.is_tensor(val) or torch.is_tensor(n):
            super().update(val, n)
            return
        self.val = val
        if n > 0:
            self._append(val, n, n)

    def update_mean(self, value_sum, count, scale=1.0):
        """As ``update(value_sum * scale / count, count)``: the mean's division happens when the meter is read."""
        if value_sum is None:
            return
        if not torch.is_tensor(value_sum) or torch.is_tensor(count):
            super().update(_mean(value_sum, count, scale), count)
            return
        self.val = functools.partial(_mean, value_sum, count, scale)
        if count > 0:
            self._append(value_sum, scale, count)

    def _append(self, value, factor, count):
        """Add ``value * factor`` to the sum and ``count`` to the count, the former when read."""
        self._pending.append((value, factor))
        self.count = type_as(self.count, count) + count
        if len(self._pending) >= FOLD_EVERY:
            self._fold()

    def _fold(self):
        if self._pending:
            values, factors = zip(*self._pending)
            self._pending = []
            self._add(torch.stack(torch._foreach_mul(list(values), list(factors))).sum(0))


class DeferredPercentMeter(DeferredAverageMeter):
    """The percentage of updates whose value (e.g. the gradient norm) was above a threshold (e.g. --clip-norm), as
    fairseq's meter of values of 100 and 0: the values are kept as they are, compared and counted when added up."""

    update = AverageMeter.update  # a number of 100 or 0, as fairseq logs it (reading the sum adds the pending first)

    def update_above(self, value, threshold):
        self.val = functools.partial(_percent_above, value, threshold)
        self._append(value, threshold, 1)  # kept with its threshold, compared when folded

    def _fold(self):
        if self._pending:
            by_threshold = {}
            for value, threshold in self._pending:
                by_threshold.setdefault(threshold, []).append(value)
            self._pending = []
            for threshold, values in by_threshold.items():
                self._add(torch.stack(values).gt(threshold).sum().mul(PERCENT))


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


def log_mean(key, value_sum, count, scale=1.0, priority=10, round=None):
    """fairseq's ``metrics.log_scalar(key, value_sum * scale / count, count)`` (e.g. a summed loss per token, in bits
    with ``scale=BITS``), with a tensor's division made when read: no operator per update."""

    def update(meter):
        if isinstance(meter, DeferredAverageMeter):
            meter.update_mean(value_sum, count, scale)
        else:
            meter.update(_mean(value_sum, count, scale), count)

    _log(key, value_sum, priority, round, AverageMeter, DeferredAverageMeter, update)


def log_percent_above(key, value, threshold, priority=10, round=None):
    """The percentage of updates whose ``value`` (a tensor, e.g. the gradient norm) was above ``threshold``, as
    fairseq logs it from values of 100 and 0, compared when read (``DeferredPercentMeter``)."""
    _log(key, value, priority, round, AverageMeter, DeferredPercentMeter,
         lambda meter: meter.update_above(value, threshold))


def log_scalar_sum(key, value, priority=10, round=None):
    """fairseq's ``metrics.log_scalar_sum``, with tensor values added up when read (see ``DeferredSumMeter``)."""
    _log(key, value, priority, round, SumMeter, DeferredSumMeter, lambda meter: meter.update(value))


def fairseq_meters_source_sha256() -> str:
    mirrored = (AverageMeter, SumMeter, fairseq_meters.MetersDict.state_dict, fairseq_meters.MetersDict.load_state_dict,
                metrics.log_scalar, metrics.log_scalar_sum)
    return source_sha256(*mirrored)
