"""Span masking against SPEC §1.1, with tolerances derived from the distributions."""
import numpy as np
import pytest
import torch

from spanbert_plugin.pretraining.span_masked_dataset import SpanMaskedDataset
from spanbert_plugin.pretraining.span_masking import SpanMasker, geometric_span_probs
from spanbert_plugin.core.errors import UsageError

V, BOS, PAD, EOS, UNK, MASK = 30000, 0, 1, 2, 3, 4
NEVER = np.zeros(V, bool)
NEVER[[BOS, PAD, EOS, MASK]] = True
CHI2_9DOF_P001 = 27.877  # chi-square critical value, 9 degrees of freedom, p = 0.001


def make_vocab(word_start_share=0.7, seed=0):
    word_starts = np.random.default_rng(seed).random(V) < word_start_share
    word_starts[:5] = True
    return word_starts


def make_block(rng, word_starts, n_words, max_word_len=2):
    """[bos] + words of 1..max_word_len tokens + [eos], with consistent word-start flags."""
    starters = np.flatnonzero(word_starts[5:]) + 5
    inner = np.flatnonzero(~word_starts[5:]) + 5
    lengths = rng.integers(1, max_word_len + 1, n_words)
    tokens = rng.choice(inner, lengths.sum() + 2)
    first = np.cumsum(lengths) - lengths + 1
    tokens[first] = rng.choice(starters, n_words)
    tokens[0], tokens[-1] = BOS, EOS
    return tokens


def masker(word_starts, **kw):
    return SpanMasker(word_starts, NEVER, MASK, PAD, **kw)


def word_start_positions(tokens, word_starts):
    ws = word_starts[tokens].copy()
    ws[1] = True  # first real token starts the first word
    return ws


def test_geometric_mean_matches_paper():
    probs = geometric_span_probs(0.2, 10)
    assert probs.sum() == pytest.approx(1.0)
    assert (np.arange(1, 11) * probs).sum() == pytest.approx(3.797, abs=5e-4)


def test_span_length_histogram_in_words():
    word_starts = make_vocab()
    m = masker(word_starts)
    rng = np.random.default_rng(1)
    probs = geometric_span_probs(0.2, 10)
    observed = []
    for _ in range(8000):
        tokens = make_block(rng, word_starts, 300)
        out = m(tokens, rng, return_spans=True)
        word_index = np.cumsum(word_start_positions(tokens, word_starts)) - 1
        # the first three spans are always kept whole (budget ~ 67 tokens > 3 x 10 words x 2 tokens);
        # condition on starts >= 10 words before the end, which is independent of the length
        for start, drawn, covered in out.drawn[:3]:
            if word_index[start] <= word_index[-2] - 10:
                assert covered == drawn
                observed.append(covered)
    observed = np.array(observed)
    counts = np.bincount(observed, minlength=11)[1:]
    expected = probs * len(observed)
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < CHI2_9DOF_P001, (counts, expected.round())
    mean, sd = (np.arange(1, 11) * probs).sum(), np.sqrt((np.arange(1, 11) ** 2 * probs).sum() - 3.797 ** 2)
    assert abs(observed.mean() - mean) < 4 * sd / np.sqrt(len(observed))


def _many_blocks(m, word_starts, n_blocks, seed, n_words_range=(20, 400)):
    rng = np.random.default_rng(seed)
    for _ in range(n_blocks):
        tokens = make_block(rng, word_starts, int(rng.integers(*n_words_range)), max_word_len=3)
        yield tokens, m(tokens, rng, return_spans=True)


@pytest.mark.parametrize("scheme", ["span", "word", "subword"])
def test_masked_fraction_is_budget(scheme):
    word_starts = make_vocab()
    fractions = []
    for tokens, out in _many_blocks(masker(word_starts, scheme=scheme), word_starts, 3000, seed=2):
        fractions.append((out.target != PAD).sum() / (len(tokens) - 2))
    fractions = np.array(fractions)
    se = fractions.std(ddof=1) / np.sqrt(len(fractions))
    assert abs(fractions.mean() - 0.15) < 4 * se + 1e-9


def test_replacement_80_10_10_per_span():
    word_starts = make_vocab()
    span_actions, span_lengths, mixed = [], [], 0
    for tokens, out in _many_blocks(masker(word_starts), word_starts, 1500, seed=3):
        for start, end in out.spans:
            src, orig = out.source[start:end], tokens[start:end]
            is_mask = src == MASK
            assert is_mask.all() or not is_mask.any(), "mask decision must be per span"
            if is_mask.all():
                action = 0
            else:
                changed = src != orig
                mixed += 0 < changed.sum() < len(src)
                action = 1 if changed.any() else 2
            span_actions.append(action)
            span_lengths.append(end - start)
    actions, lengths = np.array(span_actions), np.array(span_lengths)
    # a random span looks mixed only where a random token hits the original (p = 1/V per token):
    # expected count ~ 0.1 * tokens / V (about 0.31 here); Poisson P(4 or more) < 4e-4
    assert lengths.sum() * 0.1 / (V - 4) < 0.35 and mixed <= 3, mixed
    for action, p in ((0, 0.8), (1, 0.1), (2, 0.1)):
        # token share, with the span-cluster standard error
        share = lengths[actions == action].sum() / lengths.sum()
        se = np.sqrt(p * (1 - p) * (lengths ** 2).sum()) / lengths.sum()
        assert abs(share - p) < 4 * se, (action, share)


def test_whole_words_and_boundaries():
    word_starts = make_vocab()
    for scheme in ("span", "word"):
        for tokens, out in _many_blocks(masker(word_starts, scheme=scheme), word_starts, 400, seed=4):
            ws = word_start_positions(tokens, word_starts)
            masked = out.target != PAD
            assert not masked[0] and not masked[-1]
            for start, end in out.spans:
                assert ws[start], "spans start at a word start"
                assert end == len(tokens) - 1 or ws[end], "spans end at a word end"
                assert masked[start:end].all() and not masked[start - 1] and not masked[end]
            pos = np.flatnonzero(masked)
            assert (out.span_left[pos] < pos).all() and (out.span_right[pos] > pos).all()
            assert not masked[out.span_left[pos]].any() and not masked[out.span_right[pos]].any()
            assert (out.span_offset[pos] == pos - out.span_left[pos]).all()
            assert (out.target[pos] == tokens[pos]).all()


def test_subword_scheme_ignores_word_boundaries():
    word_starts = make_vocab()
    starts_mid_word = 0
    for tokens, out in _many_blocks(masker(word_starts, scheme="subword"), word_starts, 200, seed=5):
        ws = word_start_positions(tokens, word_starts)
        starts_mid_word += (~ws[out.spans[:, 0]]).sum()
    assert starts_mid_word > 0


def test_dataset_determinism_per_seed_epoch_index():
    word_starts = make_vocab()
    rng = np.random.default_rng(6)
    blocks = [torch.from_numpy(make_block(rng, word_starts, 200)) for _ in range(4)]
    ds = SpanMaskedDataset(blocks, masker(word_starts), PAD, seed=7)
    ds.set_epoch(1)
    first = [ds[i]["source"].clone() for i in range(4)]
    again = SpanMaskedDataset(blocks, masker(word_starts), PAD, seed=7)
    again.set_epoch(1)
    assert all(torch.equal(a, again[i]["source"]) for i, a in enumerate(first))
    assert torch.equal(first[1], again[np.int64(1)]["source"])  # fairseq passes numpy indices
    again.set_epoch(2)
    assert not any(torch.equal(a, again[i]["source"]) for i, a in enumerate(first))
    batch = ds.collater([ds[0], ds[1]])
    assert batch["net_input"]["src_tokens"].shape == batch["target"].shape == batch["span_left"].shape


def test_edge_cases():
    word_starts = make_vocab()
    m = masker(word_starts)
    rng = np.random.default_rng(8)
    # only special tokens: nothing can be masked
    for tokens in ([BOS, EOS], [BOS, PAD, PAD, EOS], [BOS], []):
        out = m(np.array(tokens, dtype=np.int64), rng, return_spans=True)
        assert (out.target == PAD).all() and len(out.spans) == 0
    # one-word block: its only word is always masked (at least one token), never its frame
    for _ in range(200):
        out = m(np.array([BOS, 10, EOS]), rng)
        assert out.target.tolist() == [PAD, 10, PAD]
    # a block shorter than one span
    out = m(make_block(rng, word_starts, 3), rng)
    assert len(out.source) == len(out.target)
    # one word longer than the budget: masked whole every time (the least there is to mask)
    inner = np.flatnonzero(~word_starts[5:]) + 5
    long_word = np.concatenate([[BOS, np.flatnonzero(word_starts[5:])[0] + 5], inner[:19], [EOS]])
    sizes = np.array([(m(long_word, rng).target != PAD).sum() for _ in range(500)])
    assert (sizes == 20).all()


def _block_of_words(rng, word_starts, word_lengths):
    """[bos] + words of the given token lengths + [eos]."""
    starters = np.flatnonzero(word_starts[5:]) + 5
    inner = np.flatnonzero(~word_starts[5:]) + 5
    tokens = rng.choice(inner, word_lengths.sum() + 2)
    tokens[np.cumsum(word_lengths) - word_lengths + 1] = rng.choice(starters, len(word_lengths))
    tokens[0], tokens[-1] = BOS, EOS
    return tokens


@pytest.mark.parametrize("scheme", ["span", "word"])
@pytest.mark.parametrize("word_lengths", [
    [10] + [1] * 30,
    [2, 9, 1, 3, 1, 1, 1, 2, 1, 1, 5, 1, 1, 2, 1, 1, 3, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 12, 1, 1, 1, 2, 1],
    [4] * 12,
    [2, 9, 1, 3, 1, 1, 14, 1, 2, 1, 1, 5],  # budget 6.15 below one forced word's expected 7.9 tokens
])
def test_long_words_keep_the_expected_budget(scheme, word_lengths):
    """A word longer than the budget is masked whole when drawn first; the budget's rounding pays for it.

    The expectation is the budget wherever one forced word (sum w^2 / sum w tokens
    in expectation) fits in it, else that forced word. (Without the compensation
    the first block masks 7.05 tokens on average instead of 6.)
    """
    word_starts = make_vocab()
    m = masker(word_starts, scheme=scheme)
    rng = np.random.default_rng(9)
    lengths = np.array(word_lengths)
    tokens = _block_of_words(rng, word_starts, lengths)
    masked = np.array([(m(tokens, rng).target != PAD).sum() for _ in range(4000)])
    assert masked.min() >= 1
    target = max(0.15 * lengths.sum(), (lengths ** 2).sum() / lengths.sum())
    assert abs(masked.mean() - target) < 4 * masked.std(ddof=1) / np.sqrt(len(masked)), (masked.mean(), target)


def test_short_blocks_with_long_words_always_mask_something():
    word_starts = make_vocab()
    m = masker(word_starts)
    rng = np.random.default_rng(11)
    for _ in range(3000):
        tokens = _block_of_words(rng, word_starts, rng.integers(1, 13, int(rng.integers(1, 30))))
        assert (m(tokens, rng).target != PAD).any()


def test_128_token_blocks_never_mask_nothing():
    """The issue's case: 1-block validation splits of 128 tokens masked nothing about 0.7% of the time."""
    word_starts = make_vocab()
    m = masker(word_starts)
    rng = np.random.default_rng(10)
    for _ in range(3000):
        # mostly short words, now and then a long one (code, URLs, numbers in real text)
        lengths = np.where(rng.random(80) < 0.05, rng.integers(20, 60, 80), rng.integers(1, 4, 80))
        lengths = lengths[np.cumsum(lengths) <= 126]
        tokens = _block_of_words(rng, word_starts, lengths)
        assert (m(tokens, rng).target != PAD).any()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"geometric_p": 0.0}, "--geometric-p"),
        ({"geometric_p": 1.5}, "--geometric-p"),
        ({"max_span_len": 0}, "--max-span-len"),
        ({"mask_ratio": 0.0}, "--mask-ratio"),
        ({"mask_ratio": 1.0}, "--mask-ratio"),
        ({"mask_prob": 0.8, "random_prob": 0.2, "leave_prob": 0.1}, "sum to 1"),
        ({"scheme": "entity"}, "--mask-scheme 'entity'"),
    ],
)
def test_invalid_parameters(kwargs, message):
    with pytest.raises(UsageError, match=message):
        masker(make_vocab(), **kwargs)


@pytest.mark.parametrize("data", ["spm_data", "wordpiece_data"])
@pytest.mark.parametrize("source", ["uniform", "unigram"])
def test_random_replacements_follow_the_chosen_distribution(request, data, source):
    """--random-token-source through the task: random replacements are i.i.d. draws from the uniform
    distribution over real tokens, or from the tokens' frequencies in the training split (counted here from
    train.bin); never a control symbol. Chi-square over 10 groups of about equal expected mass."""
    from fairseq import options, tasks
    from fairseq.data import data_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import spanbert_plugin.registry  # noqa: F401  (registers the plugin, safe-loading allowlist)

    folder = request.getfixturevalue(data)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        folder, "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch", "spanbert_tiny", "--cpu",
        "--tokens-per-sample", "128", "--random-token-source", source,
        "--mask-prob", "0", "--random-prob", "1", "--leave-prob", "0"])  # every masked token is a random draw
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    d = task.dictionary
    control = [d.bos(), d.pad(), d.eos(), d.unk(), d.mask_index]
    train = data_utils.load_indexed_dataset(f"{folder}/train", d, "mmap")
    corpus_tokens = np.concatenate([train[i].numpy() for i in range(len(train))])
    expected = np.bincount(corpus_tokens, minlength=len(d)).astype(float) if source == "unigram" else np.ones(len(d))
    expected[control] = 0
    expected /= expected.sum()

    rng = np.random.default_rng(0)
    block = corpus_tokens[:126]
    draws = []
    while sum(len(x) for x in draws) < 20000:
        out = task.masker(np.concatenate([[d.bos()], block, [d.eos()]]), rng)
        draws.append(out.source[out.target != d.pad()])
    draws = np.concatenate(draws)
    observed = np.bincount(draws, minlength=len(d))
    assert observed[control].sum() == 0 and observed[expected == 0].sum() == 0
    # 10 groups of tokens, contiguous in order of expected probability, each about a tenth of the mass
    order = np.argsort(expected, kind="stable")
    group = np.minimum((np.cumsum(expected[order]) * 10).astype(int), 9)
    expected_counts = np.bincount(group, weights=expected[order], minlength=10) * len(draws)
    observed_counts = np.bincount(group, weights=observed[order], minlength=10)
    assert expected_counts.min() > 0.05 * len(draws)
    chi2 = ((observed_counts - expected_counts) ** 2 / expected_counts).sum()
    # four parametrised cases: at p = 1e-4 each, a false alarm somewhere has probability below 4e-4
    assert chi2 < 33.720, (chi2, observed_counts, expected_counts)  # 9 degrees of freedom, p = 1e-4
    if source == "unigram":  # and the frequent tokens are drawn more than uniformly would
        frequent = order[-len(d) // 20:]
        assert observed[frequent].sum() > 3 * len(draws) * len(frequent) / (len(d) - len(control))
