"""SpanDrop / Beta-SpanDrop sampling against the theory (SPEC §2), and the dataset wrapper."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from spanbert_plugin.spandrop.sampler import SpanDropDataset, sample_keep_mask, segment
from spanbert_plugin.core.errors import UsageError


def _draws(num_spans, p, gamma, trials, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([sample_keep_mask(num_spans, p, gamma, rng) for _ in range(trials)])


def _within(observed, expected, se, k=4.0):
    assert abs(observed - expected) < k * se, (observed, expected, se)


@pytest.mark.parametrize("gamma", [None, 1.0, 5.0])
def test_kept_count_mean_and_variance(gamma):
    n, p, trials = 50, 0.2, 20000
    kept = _draws(n, p, gamma, trials).sum(axis=1)
    if gamma is None:
        law = stats.binom(n, 1 - p)
    else:  # kept spans: beta-binomial with (beta, alpha) swapped, since keep prob is 1 - pi
        alpha, beta = gamma, gamma * (1 - p) / p
        law = stats.betabinom(n, beta, alpha)
    mean, var = law.mean(), law.var()
    _within(kept.mean(), mean, math.sqrt(var / trials))
    # variance of the sample variance: (mu4 - var^2 (n-3)/(n-1)) / trials
    mu4 = law.expect(lambda x: (x - mean) ** 4)
    _within(kept.var(ddof=1), var, math.sqrt((mu4 - var ** 2 * (trials - 3) / (trials - 1)) / trials))


@pytest.mark.parametrize("gamma, expected", [(None, 0.349), (1.0, 0.474)])
def test_all_supporting_spans_survive(gamma, expected):
    # P(all m = 10 supporting spans kept) at p = 0.1 (SPEC §2: 34.9% vs 47.4%)
    trials = 20000
    all_kept = _draws(10, 0.1, gamma, trials, seed=1).all(axis=1).mean()
    exact = 0.9 ** 10 if gamma is None else stats.betabinom(10, 9.0, 1.0).pmf(10)
    assert exact == pytest.approx(expected, abs=5e-4)
    _within(all_kept, exact, math.sqrt(exact * (1 - exact) / trials))


def test_no_drop_probability_gamma_one():
    n, p, trials = 30, 0.1, 20000
    beta = (1 - p) / p
    none_dropped = _draws(n, p, 1.0, trials, seed=2).all(axis=1).mean()
    exact = beta / (n + beta)
    _within(none_dropped, exact, math.sqrt(exact * (1 - exact) / trials))


def test_large_gamma_approaches_bernoulli():
    n, p, trials = 40, 0.2, 20000
    kept = _draws(n, p, 1e6, trials, seed=3).sum(axis=1)
    binom_var = n * p * (1 - p)
    _within(kept.mean(), n * (1 - p), math.sqrt(binom_var / trials))
    # beta-binomial variance with gamma = 1e6 exceeds the binomial's by a factor 1 + (n-1)/(2 gamma + 1) ~ 1
    assert abs(kept.var() / binom_var - 1) < 4 * math.sqrt(2 / trials)


def test_protected_never_dropped_and_invalid_settings():
    rng = np.random.default_rng(4)
    for _ in range(2000):
        assert sample_keep_mask(20, 0.9, 1.0, rng, protected=[0, 7, 19])[[0, 7, 19]].all()
    cases = ((1.0, None, "span-drop-p"), (-0.1, None, "span-drop-p"), (0.1, 0.0, "span-drop-gamma"), (0.1, -1.0, "span-drop-gamma"))
    for p, gamma, match in cases:
        with pytest.raises(UsageError, match=match):
            sample_keep_mask(5, p, gamma, rng)
    with pytest.raises(UsageError, match="span-drop-chunk-size"):
        SpanDropDataset([], 0.1, unit="chunk", chunk_size=0)


def _items(n=40):
    # [CLS] 10..10+n [SEP]; label position at token 25; supporting evidence at 12 and 30
    return [{"id": 0, "source": torch.arange(10, 10 + n).index_fill(0, torch.tensor([0, n - 1]), 0),
             "target": 1, "label_positions": np.array([25]), "supporting": np.array([12, 30])}]


def test_wrapper_order_remapping_and_determinism():
    base = _items()
    ds = SpanDropDataset(base, 0.3, gamma=None, seed=5)
    ds.set_epoch(1)
    item = ds[0]
    src = item["source"].numpy()
    original = base[0]["source"].numpy()
    assert src[0] == 0 and src[-1] == 0 and len(src) < len(original)
    assert (np.diff(src[1:-1]) > 0).all(), "kept spans keep their order"
    assert src[item["label_positions"][0]] == original[25], "label position remapped, never removed"
    assert torch.equal(SpanDropDataset(base, 0.3, seed=5).__getitem__(0)["source"], SpanDropDataset(base, 0.3, seed=5)[0]["source"])
    again = SpanDropDataset(base, 0.3, seed=5)
    again.set_epoch(1)
    assert torch.equal(again[0]["source"], item["source"])
    again.set_epoch(2)
    assert not torch.equal(again[0]["source"], item["source"])


def test_mask_mode_keeps_length():
    ds = SpanDropDataset(_items(), 0.3, mode="mask", mask_index=4, seed=6)
    ds.set_epoch(1)
    src = ds[0]["source"]
    assert len(src) == 40 and (src == 4).any() and src[25] == 35


def test_validation_resamples_until_supporting_spans_survive():
    ds = SpanDropDataset(_items(), 0.5, require_supporting=True, seed=7)
    original = _items()[0]["source"].numpy()
    for epoch in range(1, 40):
        ds.set_epoch(epoch)
        item = ds[0]
        src = item["source"].numpy()
        assert original[12] in src and original[30] in src
        assert (src[np.asarray(item["supporting"])] == original[[12, 30]]).all()


@pytest.mark.parametrize("gamma", [None, 1.0, 0.3])
def test_required_spans_give_the_rejection_samplers_distribution(gamma):
    """Conditioning on the supporting spans' survival equals drawing again until they survive (unbounded), in the
    distribution of the number of other spans kept: chi-square over 20,000 draws each (critical value at p = 0.001).
    It gave up after 10 tries before and kept everything (at p = 0.5, gamma = 1 on 3 of 20 spans, 5.6% of draws)."""
    n, required, p = 20, np.array([2, 9, 15]), 0.5
    rng = np.random.default_rng(0)
    conditioned = [int(sample_keep_mask(n, p, gamma, rng, required=required).sum()) for _ in range(20000)]
    rejected = []
    while len(rejected) < 20000:
        keep = sample_keep_mask(n, p, gamma, rng)
        if keep[required].all():
            rejected.append(int(keep.sum()))
    a, b = np.bincount(conditioned, minlength=n + 1), np.bincount(rejected, minlength=n + 1)
    cells = (a + b) >= 10
    expected = (a + b)[cells] / 2
    statistic = (((a[cells] - expected) ** 2 + (b[cells] - expected) ** 2) / expected).sum()
    assert statistic < stats.chi2.ppf(0.999, cells.sum() - 1), (statistic, a, b)
    assert all(sample_keep_mask(n, p, gamma, rng, required=required)[required].all() for _ in range(200))


def test_segmentation_units():
    tokens = np.array([0, 5, 6, 9, 7, 9, 8, 0])
    droppable = np.array([0, 1, 1, 1, 1, 1, 1, 0], dtype=bool)
    assert segment(tokens, droppable, "token").tolist() == [-1, 0, 1, 2, 3, 4, 5, -1]
    assert segment(tokens, droppable, "chunk", chunk_size=4).tolist() == [-1, 0, 0, 0, 0, 1, 1, -1]
    assert segment(tokens, droppable, "separator", separator=9).tolist() == [-1, 0, 0, 0, 1, 1, 2, -1]


@pytest.mark.parametrize("options, message", [
    ({"unit": "word"}, "--span-drop-unit must be one of token, chunk, separator, explicit, got 'word'"),
    ({"mode": "hide"}, "--span-drop-mode must be drop or mask, got 'hide'"),
    ({"unit": "separator"}, "--span-drop-unit separator needs a separator token"),
    ({"mode": "mask"}, "--span-drop-mode mask needs a mask symbol"),
])
def test_wrapper_settings_it_cannot_apply_are_refused(options, message):
    with pytest.raises(UsageError) as error:
        SpanDropDataset([], 0.1, **options)
    assert str(error.value) == message


def test_explicit_units_need_items_carrying_span_ids():
    ds = SpanDropDataset(_items(), 0.3, unit="explicit", seed=1)
    with pytest.raises(UsageError) as error:
        ds[0]
    assert str(error.value) == "--span-drop-unit explicit: this task's items carry no span_ids; use token, chunk or separator"


def test_p_zero_returns_the_item_untouched():
    item = _items()[0]
    out = SpanDropDataset([item], 0.0, seed=1)[0]
    assert out.keys() == item.keys() and torch.equal(out["source"], item["source"])
    assert out["label_positions"].tolist() == [25] and out["supporting"].tolist() == [12, 30]


def test_explicit_span_ids_drop_whole_spans_and_keep_the_fixed_tokens():
    """span_ids carried by the items are the units: a span's tokens go or stay together, -1 tokens always stay, the
    label's span is kept and its position follows."""
    span_ids = np.array([-1, 0, 0, 0, 1, 1, 2, -1, 3, 3, 3, 3, 4, 5, 5, -1])
    source = torch.arange(100, 116)
    ds = SpanDropDataset([{"id": 0, "source": source, "span_ids": span_ids, "label_positions": np.array([9])}], 0.5,
                         unit="explicit", seed=3)
    kept_spans = set()
    for epoch in range(1, 30):
        ds.set_epoch(epoch)
        item = ds[0]
        kept = np.isin(source.numpy(), item["source"].numpy())
        assert "span_ids" not in item and kept[span_ids == -1].all()
        for span in range(6):
            assert kept[span_ids == span].all() or not kept[span_ids == span].any()
        assert kept[span_ids == 3].all() and item["source"][item["label_positions"][0]] == 109
        kept_spans.add(tuple(span for span in range(6) if kept[span_ids == span].all()))
    assert len(kept_spans) > 5  # the draws differ between epochs: whole spans were dropped, not nothing


def test_protected_supporting_spans_are_never_dropped_and_their_positions_follow():
    base = _items()
    original = base[0]["source"].numpy()
    lost = 0
    protected = SpanDropDataset(base, 0.9, protect_supporting=True, seed=8)
    plain = SpanDropDataset(base, 0.9, seed=8)
    for epoch in range(1, 20):
        protected.set_epoch(epoch)
        plain.set_epoch(epoch)
        item = protected[0]
        src = item["source"].numpy()
        assert (src[item["supporting"].numpy()] == original[[12, 30]]).all() and len(src) < len(original)
        lost += 2 - len(plain[0]["supporting"])
    assert lost > 0  # without the protection p = 0.9 drops them


def test_wrapper_sizes_are_those_of_the_wrapped_dataset():
    """Upper bounds for fairseq's batching: dropping only shortens an item."""
    from fairseq.data import ListDataset

    items = [torch.arange(n) for n in (5, 9, 7)]
    ds = SpanDropDataset(ListDataset(items, sizes=np.array([5, 9, 7])), 0.5, seed=2)
    assert ds.sizes.tolist() == [5, 9, 7]
    assert [ds.size(i) for i in range(3)] == [ds.num_tokens(i) for i in range(3)] == [5, 9, 7]
