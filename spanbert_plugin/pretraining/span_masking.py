"""SpanBERT span masking (SPEC §1.1), vectorised with numpy.

``SpanMasker`` turns one block of token ids (framed by begin/end tokens) into a
training example: the masked input, MLM targets, and for every masked token its
span's left and right boundary positions and 1-based offset from the left
boundary, which the span boundary objective (SBO) needs.

Sampling follows the released SpanBERT code: an anchor is drawn uniformly over
maskable subword positions and moved left to the start of its word; the span
then extends over ``L`` whole words, ``L`` from the geometric distribution
renormalised over 1..max_span_len. An anchor that falls on a token already
masked is drawn again (the released code's ``if anchor in mask: continue``),
which keeps spans from growing by merging into earlier ones. Spans are drawn until the budget (mask_ratio
of the block's maskable tokens, rounded stochastically so its expectation is
exact) is spent. Unlike the released code, the last span is not cut mid-word:
the word that crosses the budget is kept with probability (budget left) /
(word length), so spans stay whole words and the expected masked count still
equals the budget. Overlapping or touching spans are merged, so each final
span has an unmasked token on either side; the block's first and last
positions and control symbols are never masked.

Every block with a maskable token gets at least one masked token (a block
masking nothing teaches nothing, and a validation split of such blocks would
report a loss of 0): when the first drawn word alone is longer than the
budget, it is masked whole. The budget's rounding is shifted to pay for those
extra tokens in expectation, so the expected masked count stays exactly
mask_ratio x maskable tokens wherever that is at least the expected size of
one forced word (``_budget``); below that (very short blocks, or a block that
is one long word) one word is the least there is to mask.

Replacement (80% mask / 10% random / 10% unchanged) is decided per final
(merged) span for the ``span`` scheme, and per drawn unit (whole word or
subword token) for the ``word`` and ``subword`` ablations, as BERT does.

The ``named_entity`` and ``noun_phrase`` ablations (the paper's appendix) take
the block's annotated spans (``units``, from ``spanbert-prepare --annotate``):
each draw is, with probability 1/2, a whole annotated span chosen uniformly
among the block's, otherwise a random whole word (anchor uniform over tokens,
as above), until the budget (mask_ratio of the maskable tokens, stochastically
rounded) is reached; the draw that would cross the budget is kept with
probability (budget left) / (its new tokens), so the expected masked count is
the budget, and the first draw is always kept. Replacement is decided per
merged span, and every merged span gets SBO targets. A block without
annotated spans gets whole words only.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..core.errors import UsageError

SCHEMES = ("span", "word", "subword", "named_entity", "noun_phrase")
LINGUISTIC_SCHEMES = ("named_entity", "noun_phrase")  # whole annotated spans (spanbert-prepare --annotate)
_PER_SPAN_SCHEMES = ("span", *LINGUISTIC_SCHEMES)  # 80/10/10 decided per merged span, not per unit
_UNIT_SHARE = 0.5  # the paper's appendix: half the draws are annotated spans, half random whole words
_MASK, _RANDOM = 0, 1  # 80% [MASK], 10% a random token; the rest (2) kept
_NONE = np.iinfo(np.int64).max


def geometric_span_probs(p: float, max_len: int) -> np.ndarray:
    """P(L = l) for l = 1..max_len: Geo(p) renormalised over 1..max_len."""
    lengths = np.arange(1, max_len + 1)
    weights = p * (1 - p) ** (lengths - 1)
    return weights / weights.sum()


@dataclass
class SpanMaskOutput:
    """One masked block; per-position arrays have the block's length."""

    source: np.ndarray  # input with replacements applied
    target: np.ndarray  # original token where masked, pad elsewhere
    span_left: np.ndarray  # left boundary position of the token's span (0 where unmasked)
    span_right: np.ndarray  # right boundary position (0 where unmasked)
    span_offset: np.ndarray  # 1-based offset from the left boundary (0 where unmasked)
    spans: Optional[np.ndarray] = None  # (k, 2) merged spans as [start, end); with return_spans
    # (j, 3) drawn spans: start position, words drawn, words covered; for the linguistic schemes
    # start, end, and 1 for an annotated span (0 for a whole word)
    drawn: Optional[np.ndarray] = None


class SpanMasker:
    """Samples SpanBERT masks for blocks of token ids; thread-safe, state-free."""

    def __init__(
        self,
        word_starts: np.ndarray,
        never_mask: np.ndarray,
        mask_index: int,
        pad_index: int,
        scheme: str = "span",
        mask_ratio: float = 0.15,
        geometric_p: float = 0.2,
        max_span_len: int = 10,
        mask_prob: float = 0.8,
        random_prob: float = 0.1,
        leave_prob: float = 0.1,
        replacement_weights: Optional[np.ndarray] = None,
    ):
        if scheme not in SCHEMES:
            raise UsageError(f"--mask-scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
        if not 0 < geometric_p <= 1:
            raise UsageError(f"--geometric-p: the geometric p of span lengths must be in (0, 1], got {geometric_p}")
        if max_span_len < 1:
            raise UsageError(f"--max-span-len must be at least 1 word, got {max_span_len}")
        if not 0 < mask_ratio < 1:
            raise UsageError(f"--mask-ratio (the masking budget) must be in (0, 1), got {mask_ratio}")
        probs = np.array([mask_prob, random_prob, leave_prob], dtype=float)
        if (probs < 0).any() or abs(probs.sum() - 1) > 1e-6:
            raise UsageError(
                f"--mask-prob/--random-prob/--leave-prob must be >= 0 and sum to 1, got {mask_prob}/{random_prob}/{leave_prob}"
            )
        self.word_starts = np.asarray(word_starts, dtype=bool)
        self.never_mask = np.asarray(never_mask, dtype=bool)
        if self.word_starts.shape != self.never_mask.shape:
            raise ValueError("word_starts and never_mask must both cover the whole vocabulary")
        self.mask_index, self.pad_index = mask_index, pad_index
        self.scheme, self.mask_ratio = scheme, mask_ratio
        self.max_span_len = 1 if scheme != "span" else max_span_len
        self.length_probs = geometric_span_probs(geometric_p, max_span_len) if scheme == "span" else np.ones(1)
        self.length_cdf = np.cumsum(self.length_probs)
        self.mean_span_words = float((np.arange(1, len(self.length_probs) + 1) * self.length_probs).sum())
        self.action_cdf = np.cumsum(probs)[:2]
        if replacement_weights is None:
            replacement_weights = (~self.never_mask).astype(float)
        weights = np.asarray(replacement_weights, dtype=float)
        if weights.shape != self.never_mask.shape or weights.sum() <= 0:
            raise ValueError("replacement weights must cover the vocabulary and have positive mass")
        self.replacement_cdf = np.cumsum(weights / weights.sum())

    def __call__(self, tokens: np.ndarray, rng: np.random.Generator, return_spans: bool = False,
                 units: Optional[np.ndarray] = None) -> SpanMaskOutput:
        """Mask one block; ``return_spans`` also reports merged and drawn spans (for analysis).

        ``units``: the block's annotated spans, (k, 2) [start, end) positions, for
        the ``named_entity``/``noun_phrase`` schemes (None or empty: whole words only).
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        maskable = ~self.never_mask[tokens]
        if n:
            maskable[0] = maskable[-1] = False  # the block's begin/end token
        owner, drawn = self._choose(tokens, maskable, rng, return_spans, units)
        return self._apply(tokens, owner, drawn if return_spans else None, rng, return_spans)

    def _words(self, tokens, maskable, positions):
        """Word starts and ends (positions) of the maskable tokens, each position's word, and whether they are one run."""
        n = len(tokens)
        num_maskable = len(positions)
        # word starts: vocabulary flag, or the first maskable token after an unmaskable one
        single_run = positions[-1] - positions[0] + 1 == num_maskable  # the usual framed block
        if self.scheme == "subword":
            starts_mask = maskable
        elif single_run:
            starts_mask = maskable & self.word_starts[tokens]
            starts_mask[positions[0]] = True
        else:
            after_gap = np.empty(n, dtype=bool)
            after_gap[0] = True
            after_gap[1:] = ~maskable[:-1]
            starts_mask = maskable & (after_gap | self.word_starts[tokens])
        word_start = starts_mask.nonzero()[0]
        if single_run:
            word_end = np.concatenate((word_start[1:], [positions[-1] + 1]))
        else:
            run_ends = (maskable[:-1] & ~maskable[1:]).nonzero()[0] + 1
            next_start = np.concatenate((word_start[1:], [n]))
            word_end = np.minimum(next_start, run_ends[np.searchsorted(run_ends, word_start, side="right")])
        word_of_pos = np.cumsum(starts_mask) - 1
        return word_start, word_end, word_of_pos, single_run

    def _choose_units(self, owner, maskable, positions, words, rng, units):
        """Annotated spans or whole words, half and half, until the budget (module docstring); owner and drawn units."""
        n, num_maskable = len(owner), len(positions)
        word_start, word_end, word_of_pos, _ = words
        units = np.zeros((0, 2), np.int64) if units is None else np.asarray(units, dtype=np.int64).reshape(-1, 2)
        if len(units):  # only spans wholly inside the block's maskable tokens
            unmaskable_before = np.concatenate(([0], np.cumsum(~maskable)))
            inside = (units[:, 0] >= 0) & (units[:, 1] <= n) & (units[:, 0] < units[:, 1])
            units = units[inside]
            units = units[unmaskable_before[units[:, 1]] == unmaskable_before[units[:, 0]]]
        budget = int(self.mask_ratio * num_maskable + rng.random())
        covered, drawn = 0, []
        for _ in range(10 * num_maskable + 100):  # bounded: late draws may hit masked tokens only
            if covered >= budget and covered:
                break
            from_units = len(units) > 0 and rng.random() < _UNIT_SHARE
            if from_units:
                start, end = units[rng.integers(len(units))]
            else:
                word = word_of_pos[positions[rng.integers(num_maskable)]]
                start, end = word_start[word], word_end[word]
            fresh = start + (owner[start:end] < 0).nonzero()[0]
            if len(fresh) == 0:
                continue
            if covered and covered + len(fresh) > budget and rng.random() >= (budget - covered) / len(fresh):
                break
            owner[fresh] = len(drawn)
            drawn.append((start, end, int(from_units)))
            covered += len(fresh)
        return owner, np.array(drawn, dtype=np.int64).reshape(-1, 3)

    def _choose(self, tokens, maskable, rng, return_spans, units=None):
        """Per position, the id of the drawn span that masks it (-1: unmasked); and the drawn spans."""
        n = len(tokens)
        owner = np.full(n, -1, dtype=np.int64)
        positions = maskable.nonzero()[0]
        num_maskable = len(positions)
        if num_maskable == 0:
            return owner, np.zeros((0, 3), dtype=np.int64) if return_spans else None
        words = self._words(tokens, maskable, positions)
        if self.scheme in LINGUISTIC_SCHEMES:
            return self._choose_units(owner, maskable, positions, words, rng, units)
        word_start, word_end, word_of_pos, single_run = words
        num_words = len(word_start)
        budget = self._budget(word_end - word_start, num_maskable, rng.random())

        tokens_per_word = num_maskable / num_words
        per_round = int(budget / (self.mean_span_words * tokens_per_word) * 1.3) + 2
        covered, base, drawn = 0, 0, []
        while True:
            anchors = positions[(rng.random(per_round) * num_maskable).astype(np.int64)]
            first_word = word_of_pos[anchors]
            if self.scheme == "span":
                lengths = np.searchsorted(self.length_cdf, rng.random(per_round), side="right") + 1
                lengths = np.minimum(lengths, len(self.length_cdf))  # guard float round-off
            else:
                lengths = np.ones(per_round, dtype=np.int64)
            last_word = np.minimum(first_word + lengths, num_words) - 1
            span_start, span_end = word_start[first_word], word_end[last_word]
            # expand spans to their positions, in draw order
            widths = span_end - span_start
            offsets = np.repeat(np.cumsum(widths) - widths, widths)
            pos = np.arange(widths.sum()) - offsets + np.repeat(span_start, widths)
            span_id = np.repeat(np.arange(base, base + per_round), widths)
            if base or not single_run:  # keep positions neither masked already nor unmaskable
                fresh = maskable[pos] & (owner[pos] < 0)
                pos, span_id = pos[fresh], span_id[fresh]
            kept, earliest = self._spans_with_free_anchors(anchors, owner[anchors] < 0, pos, span_id, base, n)
            if not kept.all():
                pos, span_id = pos[kept[span_id - base]], span_id[kept[span_id - base]]
            if return_spans:
                drawn.append((span_start, lengths, last_word - first_word + 1, kept))
            # the earliest span covering a position owns it
            uniq = (earliest != _NONE).nonzero()[0]
            span_of = earliest[uniq]
            cum = covered + np.cumsum(np.bincount(span_of - base, minlength=per_round))
            if cum[-1] < budget:
                owner[uniq] = span_of
                covered, base = int(cum[-1]), base + per_round
                continue
            crossing = int(np.searchsorted(cum, budget))
            full = span_of < base + crossing
            owner[uniq[full]] = span_of[full]
            already = int(cum[crossing - 1]) if crossing else covered
            cross_pos = uniq[span_of == base + crossing]
            take = self._whole_words_within(cross_pos, word_of_pos, budget - already, rng, at_least_one=already == 0)
            owner[cross_pos[:take]] = base + crossing
            if return_spans:
                drawn[-1] = tuple(column[: crossing + 1] for column in drawn[-1])
            break
        if not return_spans:
            return owner, None
        return owner, np.concatenate([np.stack(columns[:3], axis=1)[columns[3]] for columns in drawn])

    @staticmethod
    def _spans_with_free_anchors(anchors, free, pos, span_id, base, n):
        """Which of a round's spans (ids ``base``...) are kept, and per position the earliest kept span covering it.

        A span whose anchor an earlier span masks is dropped, as the released code draws again (``if anchor in
        mask: continue``): ``free`` says which anchors earlier rounds left unmasked; within the round, span j is
        dropped when a kept span i < j covers its anchor. Each pass settles the spans whose chain of such
        dependencies is one longer, so the passes reach the draw-by-draw result in a few steps.
        """
        ids = np.arange(base, base + len(anchors))
        kept = free
        while True:
            earliest = np.full(n, _NONE, dtype=np.int64)
            covering = kept[span_id - base]
            np.minimum.at(earliest, pos[covering], span_id[covering])
            settled = free & ~(earliest[anchors] < ids)
            if (settled == kept).all():
                return kept, earliest
            kept = settled

    def _budget(self, word_len: np.ndarray, num_maskable: int, u: float) -> int:
        """Tokens to mask, from one uniform draw ``u``: mask_ratio x num_maskable in expectation, counting forced words.

        With budget b, the first drawn word (word j with probability
        w_j / num_maskable, the anchor being uniform over tokens) is masked whole
        even when w_j > b, which adds sum_j w_j max(w_j - b, 0) / num_maskable
        tokens in expectation; ``expected`` is b plus that. The budget is k or
        k + 1 around the target, with the probability that makes the expectation
        exact. Blocks without a word longer than the rounded-down target (nearly
        all) take the plain stochastic rounding.
        """
        target = self.mask_ratio * num_maskable
        floor = int(target)
        if word_len.max() <= floor:
            return int(target + u)
        budgets = np.arange(floor + 2)
        excess = np.maximum(word_len[None, :] - budgets[:, None], 0)
        expected = budgets + (excess * word_len).sum(axis=1) / num_maskable  # non-decreasing, expected[b] >= b
        if target < expected[0]:
            return 0  # one forced word already exceeds the target: the least there is to mask
        k = int(np.searchsorted(expected, target, side="right")) - 1  # expected[k] <= target < expected[k + 1]
        p_up = (target - expected[k]) / (expected[k + 1] - expected[k])
        return k + int(u >= 1 - p_up)

    @staticmethod
    def _whole_words_within(cross_pos, word_of_pos, remaining, rng, at_least_one=False):
        """How many leading positions of the crossing span to mask: whole words, budget in expectation.

        ``at_least_one``: nothing is masked yet, so the span's first word is
        taken even when it is longer than the budget (``_budget`` accounts for it).
        """
        words = word_of_pos[cross_pos]  # ascending
        cum = np.concatenate(((words[1:] != words[:-1]).nonzero()[0] + 1, [len(words)]))  # tokens up to each word end
        whole = int(np.searchsorted(cum, remaining, side="right"))
        take = int(cum[whole - 1]) if whole else 0
        if whole < len(cum) and take < remaining:
            if rng.random() < (remaining - take) / (cum[whole] - take):
                take = int(cum[whole])
        if take == 0 and at_least_one:
            take = int(cum[0])
        return take

    def _apply(self, tokens, owner, drawn, rng, return_spans):
        n = len(tokens)
        masked = owner >= 0
        padded = np.zeros(n + 2, dtype=bool)
        padded[1:-1] = masked
        edges = (padded[1:] != padded[:-1]).nonzero()[0]  # run starts and ends alternate
        span_start, span_end = edges[0::2], edges[1::2]  # [start, end) of each merged span
        span_len = span_end - span_start
        masked_pos = masked.nonzero()[0]
        span_of_token = np.repeat(np.arange(len(span_start)), span_len)

        if self.scheme in _PER_SPAN_SCHEMES:
            actions = np.searchsorted(self.action_cdf, rng.random(len(span_start)), side="right")[span_of_token]
        else:
            unit_actions = np.searchsorted(self.action_cdf, rng.random(int(owner.max()) + 1 if n else 0), side="right")
            actions = unit_actions[owner[masked_pos]]
        source = tokens.copy()
        source[masked_pos[actions == _MASK]] = self.mask_index
        random_pos = masked_pos[actions == _RANDOM]
        source[random_pos] = np.searchsorted(self.replacement_cdf, rng.random(len(random_pos)), side="right")

        target = np.full(n, self.pad_index, dtype=np.int64)
        target[masked_pos] = tokens[masked_pos]
        left, right, offset = np.zeros((3, n), dtype=np.int64)
        left[masked_pos] = (span_start - 1)[span_of_token]
        right[masked_pos] = span_end[span_of_token]
        offset[masked_pos] = masked_pos - left[masked_pos]
        return SpanMaskOutput(
            source, target, left, right, offset,
            np.stack([span_start, span_end], axis=1) if return_spans else None, drawn
        )
