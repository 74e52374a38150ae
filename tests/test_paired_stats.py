"""benchmarks/common/paired_stats.py: the paired interval and the TOST p-value agree with scipy's one-sample t-tests."""
import os
import sys

import numpy as np
from scipy import stats

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from paired_stats import paired_difference  # noqa: E402


def test_interval_and_tost_match_one_sample_t_tests():
    rng = np.random.default_rng(0)
    for _ in range(20):
        differences = list(rng.normal(rng.uniform(-2, 2), rng.uniform(0.2, 2), size=int(rng.integers(2, 8))))
        margin = float(rng.uniform(0.5, 3))
        paired = paired_difference(differences, margin)
        # TOST = two one-sided one-sample tests of the differences against -margin and +margin
        p_low = stats.ttest_1samp(differences, -margin, alternative="greater").pvalue
        p_high = stats.ttest_1samp(differences, margin, alternative="less").pvalue
        assert np.isclose(paired["tost_p"], max(p_low, p_high))
        interval = stats.ttest_1samp(differences, 0).confidence_interval(0.95)
        assert np.isclose(paired["low"], interval.low) and np.isclose(paired["high"], interval.high)
        assert np.isclose(paired["mean"], np.mean(differences))


def test_equal_within_the_margin_only_when_the_90_interval_is_inside_it():
    differences = [-0.295, -1.348, -0.586]  # span+sbo - subword on LitBank, seeds 1-3: 90% interval -1.66 to +0.17
    assert paired_difference(differences, 2.7)["tost_p"] < 0.05
    assert paired_difference(differences, 1.0)["tost_p"] > 0.05
    assert paired_difference(differences)["tost_p"] is None


def test_one_pair_and_identical_pairs():
    assert paired_difference([1.5], 2.0) == {"mean": 1.5, "low": None, "high": None, "tost_p": None}
    same = paired_difference([0.4, 0.4, 0.4], 0.5)
    assert same["low"] == same["high"] == 0.4 and same["tost_p"] == 0.0
    assert paired_difference([0.6, 0.6], 0.5)["tost_p"] == 1.0
