"""Criteria of the plugin, and the logging helpers they share."""
import functools
import math
import operator

from fairseq import metrics
from fairseq.logging.meters import SumMeter


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
