"""Criteria of the plugin, and one logging helper they share."""
from fairseq import metrics
from fairseq.logging.meters import SumMeter


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
