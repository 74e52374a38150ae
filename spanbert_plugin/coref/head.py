"""The coarse-to-fine coreference head (Lee et al. 2018, "independent" segments as in Joshi et al. 2019).

Input: the encoder output of one document's segments, flattened to its T real
tokens ([CLS]/[SEP] included, padding removed), with each token's word,
sentence, segment and speaker. Steps:

1. candidate spans: start at a word's first token, end at a word's last token,
   at most ``max_span_width`` tokens, inside one sentence and one segment;
2. span embedding g = [x_start; x_end; attention-weighted head; width embedding],
   mention score = FFNN(g) + width prior;
3. the top ``top_span_ratio`` x words spans by mention score, greedily, without
   crossing brackets (a span partly overlapping a kept one is skipped);
4. coarse scores s_m(i) + s_m(j) + g_i' W g_j + distance prior keep the
   ``max_top_antecedents`` best earlier spans of each span;
5. fine scores FFNN([g_i; g_j; g_i * g_j; same speaker; genre; segment distance;
   antecedent distance]) are added; ``depth`` rounds of higher-order refinement
   replace g_i by a gated mix with its expected antecedent. As in c2f-coref, the
   coarse scores are computed once, from the embeddings before refinement, and
   only the fine scores use the refined ones; the segment distance is capped at
   the training window's segments less one (c2f-coref's clip at
   ``max_training_sentences - 1``), so prediction over whole documents never
   reads a distance training could not reach;
6. loss: marginal log-likelihood of the gold antecedents, the dummy antecedent
   (score 0) being gold for spans with none; with ``mention_loss_weight`` > 0,
   plus that weight times the binary cross-entropy of every kept span's mention
   score (a logit) against "is a gold mention" (coref-hoi's mention loss). It is
   what teaches the head singletons: a kept span with no antecedent is a
   one-mention cluster when its mention probability sigmoid(score) passes a
   threshold (``predicted_clusters``). Taken over every candidate span instead
   (mostly negatives), it drove all mention scores far below 0 within two epochs
   on LitBank fold 0, and with them every antecedent score below the dummy's:
   no links at all (two seeds, measured before settling on the kept spans).

Memory is linear in the document: candidates are capped by width, the head
attention and pair scoring run over row chunks (under activation checkpointing
when a document's pairs exceed CHECKPOINT_ELEMENTS), and antecedents are chosen
chunk by chunk (no span x span matrix).
Every parameter carries ``param_group = "coref_head"`` for fairseq's
``composite`` optimizer (a learning rate of its own).
"""
import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..model.dropout import Dropout

logger = logging.getLogger(__name__)
PARAM_GROUP = "coref_head"
DISTANCE_BUCKETS = 10
CHUNK_ELEMENTS = 1 << 23  # floats per chunk of gathered span tokens or pair features (32 MiB in fp32)
# While gradients are recorded, chunks whose rows hold up to this many floats in all (256 MiB in fp32) keep their
# activations for the backward pass; beyond it they are recomputed there (activation checkpointing), which bounds
# the memory of long documents. A training window of three 384-token segments stays below it: its head step takes 17% less time.
CHECKPOINT_ELEMENTS = 1 << 26


def bucket_distance(distance: torch.Tensor) -> torch.Tensor:
    """c2f-coref's buckets: 0, 1, 2, 3, 4, 5-7, 8-15, 16-31, 32-63, 64+."""
    log_index = torch.floor(torch.log2(distance.clamp(min=1).float())).long() + 3
    return torch.where(distance <= 4, distance, log_index).clamp(0, DISTANCE_BUCKETS - 1)


def _ffnn(d_in: int, hidden: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), Dropout(dropout), nn.Linear(hidden, 1))


def _chunked(fn, n: int, chunk: int, *tensors):
    """``fn`` over row chunks of ``tensors`` (``chunk`` rows hold CHUNK_ELEMENTS floats), concatenated; under
    activation checkpointing while gradients are recorded and all rows hold more than CHECKPOINT_ELEMENTS floats."""
    recompute = torch.is_grad_enabled() and n * CHUNK_ELEMENTS > chunk * CHECKPOINT_ELEMENTS
    outputs = []
    for start in range(0, n, chunk):
        parts = [t[start:start + chunk] for t in tensors]
        if recompute:
            outputs.append(checkpoint(fn, *parts, use_reentrant=False))
        else:
            outputs.append(fn(*parts))
    if not outputs:
        return fn(*[t[:0] for t in tensors])
    if isinstance(outputs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outputs))
    return torch.cat(outputs)


def select_non_crossing(starts: List[int], ends: List[int], order: List[int], k: int) -> List[int]:
    """Indices of up to ``k`` spans taken in ``order`` (best first), skipping spans that cross a taken one.

    Two spans cross when they overlap without one containing the other; this is
    c2f-coref's ``extract_spans``, with per-token records of the taken spans.
    """
    max_end_of_start: Dict[int, int] = {}
    min_start_of_end: Dict[int, int] = {}
    chosen = []
    for i in order:
        s, e = starts[i], ends[i]
        crossing = False
        for t in range(s, e + 1):
            if t > s and max_end_of_start.get(t, -1) > e:
                crossing = True
                break
            if t < e and min_start_of_end.get(t, e + 1) < s:
                crossing = True
                break
        if crossing:
            continue
        chosen.append(i)
        if max_end_of_start.get(s, -1) < e:
            max_end_of_start[s] = e
        if min_start_of_end.get(e, e + 1) > s:
            min_start_of_end[e] = s
        if len(chosen) == k:
            break
    return sorted(chosen, key=lambda i: (starts[i], ends[i]))


@dataclass
class SpanColumns:
    """Spans that can be antecedents, as columns of the antecedent scores: their embedding at each refinement round
    (``g[r]``), mention score, index among the document's top spans, speaker, segment, first word, and whether
    they stay allowed at any distance (an entity's latest mention)."""

    g: List[torch.Tensor]
    mention_scores: torch.Tensor
    index: torch.Tensor
    speaker: torch.Tensor
    segment: torch.Tensor
    start_word: torch.Tensor
    always: torch.Tensor

    def followed_by(self, other: "SpanColumns") -> "SpanColumns":
        """These columns, then ``other``'s (its rounds are filled in by ``rank_antecedents`` as it goes)."""
        return SpanColumns([], *(torch.cat([getattr(self, f), getattr(other, f)]) for f in
                                 ("mention_scores", "index", "speaker", "segment", "start_word", "always")))


class CorefHead(nn.Module):
    """Span scoring, antecedent ranking and the c2f-coref loss; see the module docstring."""

    def __init__(self, hidden: int, ffnn_size: int = 1000, max_span_width: int = 30, feature_size: int = 20,
                 num_genres: int = 8, depth: int = 1, dropout: float = 0.3, top_span_ratio: float = 0.4,
                 max_top_antecedents: int = 50, mention_loss_weight: float = 0.0, max_training_segments: int = 0):
        super().__init__()
        self.mention_loss_weight = mention_loss_weight
        # training windows of N segments never see a segment distance above N - 1 (0: whole documents, no cap)
        self.max_segment_distance = max_training_segments - 1 if max_training_segments > 0 else None
        # Saved with the weights: heads trained before coarse scores were taken from the unrefined embeddings
        # lack it, and keep the scores they were trained with (_load_from_state_dict)
        self.register_buffer("coarse_scores_once", torch.tensor(True))
        self._coarse_scores_once = True  # the buffer's value, read on the host once (no device sync per forward)
        self.max_span_width, self.depth = max_span_width, depth
        self.top_span_ratio, self.max_top_antecedents = top_span_ratio, max_top_antecedents
        span_dim = 3 * hidden + feature_size
        self.span_dim = span_dim
        self.dropout = Dropout(dropout)
        self.head_attention = nn.Linear(hidden, 1)
        self.width_embedding = nn.Embedding(max_span_width, feature_size)
        self.mention_scorer = _ffnn(span_dim, ffnn_size, dropout)
        self.width_prior_embedding = nn.Embedding(max_span_width, feature_size)
        self.width_prior = _ffnn(feature_size, ffnn_size, dropout)
        self.coarse_bilinear = nn.Linear(span_dim, span_dim)
        self.distance_prior_embedding = nn.Embedding(DISTANCE_BUCKETS, feature_size)
        self.distance_prior = nn.Linear(feature_size, 1)
        self.same_speaker_embedding = nn.Embedding(2, feature_size)
        self.genre_embedding = nn.Embedding(num_genres, feature_size)
        self.segment_distance_embedding = nn.Embedding(DISTANCE_BUCKETS, feature_size)
        self.antecedent_distance_embedding = nn.Embedding(DISTANCE_BUCKETS, feature_size)
        self.pair_scorer = _ffnn(3 * span_dim + 4 * feature_size, ffnn_size, dropout)
        self.refinement_gate = nn.Linear(2 * span_dim, span_dim)
        for p in self.parameters():
            p.param_group = PARAM_GROUP

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        keep_coarse_scores_of_a_head_saved_before(state_dict, prefix)
        self._coarse_scores_once = bool(state_dict[prefix + "coarse_scores_once"])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # -- spans ------------------------------------------------------------------------------------------
    def candidate_spans(self, token_word, token_sentence, token_segment,
                        outside=(-2, -2)) -> Tuple[torch.Tensor, torch.Tensor]:
        """(starts, ends) of every candidate span, in token positions, sorted by start then end. ``outside``: the
        words of the real tokens just before and after these tokens (a block of a longer document), -2 for none."""
        T = token_word.numel()
        real = token_word >= 0
        # a word's first and last token among the real tokens: a word cut by a segment end ([SEP] [CLS] inside it)
        # starts in one segment and ends in the next, so neither part is a span of its own (it would be the same
        # word span twice); like every mention crossing a segment end, it is no candidate
        positions = real.nonzero().squeeze(1)
        words = token_word[positions]
        before, after = outside
        first = words != torch.cat([words.new_full((1,), before), words])[:-1]
        last = words != torch.cat([words, words.new_full((1,), after)])[1:]
        word_start, word_end = torch.zeros_like(real), torch.zeros_like(real)
        word_start[positions], word_end[positions] = first, last
        starts = word_start.nonzero().squeeze(1)
        widths = torch.arange(self.max_span_width, device=token_word.device)
        ends = starts[:, None] + widths[None, :]
        inside = ends < T
        ends_c = ends.clamp(max=T - 1)
        valid = (inside & word_end[ends_c] & (token_sentence[ends_c] == token_sentence[starts][:, None])
                 & (token_segment[ends_c] == token_segment[starts][:, None]))
        start_index = starts[:, None].expand_as(ends)
        return start_index[valid], ends_c[valid]

    def span_embeddings(self, features, attention_logits, starts, ends):
        """g = [x_start; x_end; attention head; width embedding] of each span (rows of starts/ends)."""
        widths = ends - starts
        offsets = torch.arange(self.max_span_width, device=starts.device)
        positions = (starts[:, None] + offsets[None, :]).clamp(max=features.size(0) - 1)
        inside = offsets[None, :] <= widths[:, None]
        logits = attention_logits[positions].masked_fill(~inside, float("-inf"))
        weights = torch.softmax(logits.float(), dim=1).to(features.dtype)
        head = torch.einsum("nw,nwh->nh", weights, features[positions])
        # c2f-coref drops out the width embedding only (the coarse and pair scorers drop out their own inputs)
        return torch.cat([features[starts], features[ends], head, self.dropout(self.width_embedding(widths))], dim=-1)

    def _scored_spans(self, features, attention_logits, starts, ends):
        g = self.span_embeddings(features, attention_logits, starts, ends)
        width_prior = self.width_prior(self.width_prior_embedding(ends - starts)).squeeze(-1)
        return g, self.mention_scorer(g).squeeze(-1) + width_prior

    # -- antecedents ------------------------------------------------------------------------------------
    @staticmethod
    def _allowed(row_index, row_word, columns: "SpanColumns", max_distance: Optional[int]):
        """May each column be an antecedent of each row: earlier, and with ``max_distance`` (words between their
        starts) within it unless the column is an entity's latest mention (``columns.always``)."""
        allowed = columns.index[None, :] < row_index[:, None]
        if max_distance is not None:
            near = (row_word[:, None] - columns.start_word[None, :]) <= max_distance
            allowed &= near | columns.always[None, :]
        return allowed

    def _coarse_inputs(self, g, g_columns):
        """c2f-coref's fast antecedent score is m_i + m_j + dropout(W g_i) . dropout(g_j) + the distance prior (from
        a dropped-out distance embedding): those three, drawn once, so that choosing the K candidates and scoring
        them see the same dropout."""
        prior = self.distance_prior(self.dropout(self.distance_prior_embedding.weight)).squeeze(-1)
        return self.dropout(self.coarse_bilinear(g)), self.dropout(g_columns), prior

    def _coarse_candidates(self, coarse_rows, mention_scores, index, word, columns: "SpanColumns", coarse_columns,
                           prior, K: int, max_distance: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """Indices (rows x K) of each row's K best allowed columns by coarse score, chosen chunk by chunk, and
        whether each is allowed at all (fewer than K allowed columns leave disallowed ones in the top K)."""
        n_columns = columns.index.numel()
        chunk = max(1, CHUNK_ELEMENTS // max(n_columns, 1))
        chosen, valid = [], []
        with torch.no_grad():
            for start in range(0, coarse_rows.size(0), chunk):
                rows = slice(start, start + chunk)
                distance = (index[rows, None] - columns.index[None, :]).clamp(min=0)
                scores = (mention_scores[rows, None] + columns.mention_scores[None, :]
                          + coarse_rows[rows] @ coarse_columns.t()
                          + prior[bucket_distance(distance)])
                allowed = self._allowed(index[rows], word[rows] if word is not None else None, columns, max_distance)
                best = scores.masked_fill(~allowed, float("-inf")).topk(K, dim=1)
                chosen.append(best.indices)
                valid.append(torch.isfinite(best.values))
        if not chosen:  # no span to rank: every word of the document (or block) is cut by a segment end
            return index.new_zeros((0, K)), torch.zeros((0, K), dtype=torch.bool, device=index.device)
        return torch.cat(chosen), torch.cat(valid)

    def _pair_projections(self, g):
        """The pair scorer's first layer applied to each span once, as antecedent-to-be (with the bias) and as
        antecedent: its input [g_i; g_j; g_i * g_j; features] is a concatenation, so W [g_i; g_j; ...] splits
        into W_i g_i + W_j g_j + ..., and only the product and the features are left per pair (a third of the
        multiply-adds, and no pair tensor three spans wide)."""
        first = self.pair_scorer[0]
        D = self.span_dim
        return F.linear(g, first.weight[:, :D], first.bias), F.linear(g, first.weight[:, D:2 * D])

    @staticmethod
    def _chosen_coarse(coarse_rows, coarse_columns, prior, antecedents, mention_scores, index,
                       columns: "SpanColumns"):
        """The coarse scores (rows x K) of the rows' chosen antecedents (column indices), from ``_coarse_inputs``."""
        distance = bucket_distance((index[:, None] - columns.index[antecedents]).clamp(min=0))
        return (mention_scores[:, None] + columns.mention_scores[antecedents]
                + torch.einsum("rkd,rd->rk", coarse_columns[antecedents], coarse_rows.to(coarse_columns.dtype))
                + prior[distance])

    def _pair_scores(self, g_rows, as_span, g_columns, as_antecedent, antecedents, valid, index, speaker, segment,
                     columns: "SpanColumns", genre, coarse):
        """The coarse + fine scores (rows x K) of the rows' antecedents (column indices), -inf where not ``valid``.

        ``as_span``/``as_antecedent``: ``_pair_projections`` of the rows' and of the columns' embeddings; ``coarse``:
        the rows' coarse scores (``_chosen_coarse``)."""
        g_ant = g_columns[antecedents]
        distance = bucket_distance((index[:, None] - columns.index[antecedents]).clamp(min=0))
        same_speaker = (speaker[:, None] == columns.speaker[antecedents]).long()
        segments_apart = (segment[:, None] - columns.segment[antecedents]).clamp(min=0, max=self.max_segment_distance)
        segment_distance = bucket_distance(segments_apart)
        features = self.dropout(torch.cat([  # c2f drops out the pair features, not the span embeddings again
            self.same_speaker_embedding(same_speaker),
            self.genre_embedding(genre.expand_as(distance)),
            self.segment_distance_embedding(segment_distance),
            self.antecedent_distance_embedding(distance),
        ], dim=-1))
        first, D = self.pair_scorer[0], self.span_dim
        hidden = (as_span[:, None, :] + as_antecedent[antecedents]
                  + F.linear(g_rows[:, None, :] * g_ant, first.weight[:, 2 * D:3 * D])
                  + F.linear(features, first.weight[:, 3 * D:]))
        fine = self.pair_scorer[1:](hidden).squeeze(-1)  # ReLU, dropout, output layer
        return (coarse + fine).float().masked_fill(~valid, float("-inf"))

    def rank_antecedents(self, g, mention_scores, index, speaker, segment, genre, word=None,
                         earlier: Optional["SpanColumns"] = None, max_distance: Optional[int] = None):
        """Antecedent scores of spans (rows, in document order) over ``earlier`` spans and one another.

        ``index``: each span's position among the document's top spans (distances are counted in it); ``word``:
        its first word (for ``max_distance``). Returns (scores k x (K + 1), the dummy first and -inf where not
        allowed; antecedents k x K, indices into ``earlier`` then these spans; the spans' embeddings at each
        round, as ``SpanColumns.g`` keeps them)."""
        k = g.size(0)
        always = torch.zeros(k, dtype=torch.bool, device=g.device)
        start_word = word if word is not None else index
        these = SpanColumns([g], mention_scores, index, speaker, segment, start_word, always)
        columns = these if earlier is None else earlier.followed_by(these)
        K = max(1, min(self.max_top_antecedents, columns.index.numel() - 1))
        g_columns = g if earlier is None else torch.cat([earlier.g[0].to(g.dtype), g])
        coarse_rows, coarse_columns, prior = self._coarse_inputs(g, g_columns)
        antecedents, valid = self._coarse_candidates(coarse_rows, mention_scores, index, word, columns, coarse_columns,
                                                     prior, K, max_distance)
        pair_chunk = max(1, CHUNK_ELEMENTS // (K * self.span_dim))
        rounds, coarse = [], None
        for round_ in range(self.depth + 1):
            rounds.append(g)
            g_columns = g if earlier is None else torch.cat([earlier.g[round_].to(g.dtype), g])
            as_span, as_antecedent = self._pair_projections(g)
            as_antecedent = as_antecedent if earlier is None else self._pair_projections(g_columns)[1]
            # the first round's coarse scores (from the embeddings before refinement, as c2f-coref) serve every
            # round; a head saved before that computes them from each round's embeddings
            if coarse is None or not self._coarse_scores_once:
                if round_ > 0:
                    coarse_rows, coarse_columns, prior = self._coarse_inputs(g, g_columns)
                coarse = _chunked(
                    lambda r, a, m, i, t=coarse_columns, p=prior: self._chosen_coarse(r, t, p, a, m, i, columns),
                    k, pair_chunk, coarse_rows, antecedents, mention_scores, index)
            scores = _chunked(
                lambda g_rows, s, a, v, i, sp, se, c, g_all=g_columns, t=as_antecedent: self._pair_scores(
                    g_rows, s, g_all, t, a, v, i, sp, se, columns, genre, c),
                k, pair_chunk, g, as_span, antecedents, valid, index, speaker, segment, coarse)
            if round_ == self.depth:
                break
            # higher order: g_i <- f * g_i + (1 - f) * E[g_antecedent], the dummy standing for g_i itself
            probs = torch.softmax(torch.cat([scores.new_zeros(k, 1), scores], dim=1), dim=1).to(g.dtype)
            expected = probs[:, :1] * g + torch.einsum("ka,kad->kd", probs[:, 1:], g_columns[antecedents])
            gate = torch.sigmoid(self.refinement_gate(torch.cat([g, expected], dim=-1)))
            g = gate * g + (1 - gate) * expected
        return torch.cat([scores.new_zeros(k, 1), scores], dim=1), antecedents, rounds

    # -- forward ----------------------------------------------------------------------------------------
    def top_spans(self, features, token_word, token_sentence, token_segment, num_words: int, outside=(-2, -2)):
        """The ``top_span_ratio`` x ``num_words`` best candidate spans by mention score, non-crossing, in document
        order: (starts, ends) in token positions, their embeddings g and mention scores (``outside``: see
        :meth:`candidate_spans`)."""
        attention_logits = self.head_attention(features).squeeze(-1)
        starts, ends = self.candidate_spans(token_word, token_sentence, token_segment, outside)
        n = starts.numel()
        chunk = max(1, CHUNK_ELEMENTS // (self.max_span_width * features.size(-1)))
        with torch.no_grad():
            candidate_scores = _chunked(lambda s, e: self._scored_spans(features, attention_logits, s, e)[1],
                                        n, chunk, starts, ends)
        k = max(1, min(n, int(self.top_span_ratio * int(num_words))))
        order = torch.argsort(candidate_scores.float(), descending=True).tolist()
        top = torch.tensor(select_non_crossing(starts.tolist(), ends.tolist(), order, k), device=starts.device,
                           dtype=torch.long)
        top_starts, top_ends = starts[top], ends[top]
        g, mention_scores = _chunked(lambda s, e: self._scored_spans(features, attention_logits, s, e),
                                     top.numel(), chunk, top_starts, top_ends)
        return top_starts, top_ends, g, mention_scores

    def forward(self, features, token_word, token_sentence, token_segment, token_speaker, genre, num_words: int,
                target: Optional[torch.Tensor] = None, **unused):
        """Top spans, their antecedents and scores, and (with ``target``, rows (start, end, cluster)) the loss.

        Returns a dict: ``starts``/``ends`` (k top spans, token positions), ``antecedents`` (k x K),
        ``scores`` (k x (K + 1), the dummy first, -inf where not allowed) and ``loss`` when a target is given.
        """
        features = features.reshape(-1, features.size(-1))
        top_starts, top_ends, g, mention_scores = self.top_spans(features, token_word, token_sentence, token_segment,
                                                                 num_words)
        rows = torch.arange(top_starts.numel(), device=g.device)
        scores, antecedents, _ = self.rank_antecedents(g, mention_scores, rows, token_speaker[top_starts],
                                                       token_segment[top_starts], genre)
        out = {"starts": top_starts, "ends": top_ends, "antecedents": antecedents, "scores": scores,
               "mention_scores": mention_scores.detach().float()}
        if target is not None:
            out["antecedent_loss"] = self.loss(scores, antecedents, top_starts, top_ends, target, features.size(0))
            out["loss"] = out["antecedent_loss"]
            if self.mention_loss_weight > 0:
                out["mention_loss"] = self.mention_loss(mention_scores, top_starts, top_ends, target, features.size(0))
                out["loss"] = out["loss"] + self.mention_loss_weight * out["mention_loss"]
        return out

    @staticmethod
    def gold_clusters_of(starts, ends, target, num_tokens: int) -> torch.Tensor:
        """Gold cluster (1-based; 0: not a gold mention) of each span, from target rows (start, end, cluster)."""
        cluster = starts.new_zeros(starts.shape)
        if target.numel() == 0:
            return cluster
        keys = target[:, 0] * num_tokens + target[:, 1]
        order = torch.argsort(keys)
        sorted_keys = keys[order]
        span_keys = starts * num_tokens + ends
        at = torch.searchsorted(sorted_keys, span_keys).clamp(max=len(sorted_keys) - 1)
        found = sorted_keys[at] == span_keys
        return torch.where(found, target[order[at], 2] + 1, cluster)

    def mention_loss(self, mention_scores, starts, ends, target, num_tokens: int) -> torch.Tensor:
        """Summed binary cross-entropy of the spans' mention scores (logits) against "is a gold mention"."""
        is_gold = (self.gold_clusters_of(starts, ends, target, num_tokens) > 0).float()
        return F.binary_cross_entropy_with_logits(mention_scores.float(), is_gold, reduction="sum")

    def loss(self, scores, antecedents, starts, ends, target, num_tokens: int) -> torch.Tensor:
        """Summed -log sum over gold antecedents (the dummy when there is none) of the antecedent softmax."""
        cluster = self.gold_clusters_of(starts, ends, target, num_tokens)
        return antecedent_loss(scores, antecedents, cluster, cluster)

def keep_coarse_scores_of_a_head_saved_before(state_dict, prefix: str) -> None:
    """A head's saved state without ``coarse_scores_once`` (a checkpoint or export from before 2026-11-30) was trained
    with the coarse scores recomputed from the refined embeddings at each round: record that it keeps them."""
    key = prefix + "coarse_scores_once"
    if key not in state_dict:
        logger.warning("this coreference head was trained with coarse antecedent scores recomputed from the refined "
                       "span embeddings at each round (the plugin before 2026-11-30; c2f-coref computes them once, "
                       "before refinement): it keeps scoring as it was trained; train it again for c2f-coref's")
        state_dict[key] = torch.tensor(False)


def antecedent_loss(scores, antecedents, row_cluster, column_cluster) -> torch.Tensor:
    """Summed -log sum over gold antecedents (the dummy when there is none) of the antecedent softmax; clusters are
    1-based gold cluster ids of the rows and of the columns ``antecedents`` index (0: not a gold mention)."""
    gold = ((column_cluster[antecedents] == row_cluster[:, None]) & (row_cluster[:, None] > 0)
            & torch.isfinite(scores[:, 1:]))
    gold = torch.cat([~gold.any(dim=1, keepdim=True), gold], dim=1)
    gold_scores = scores.masked_fill(~gold, float("-inf"))
    return (torch.logsumexp(scores, dim=1) - torch.logsumexp(gold_scores, dim=1)).sum()


class ClusterBuilder:
    """Clusters built link by link over span ids in document order; each entity's latest mention is tracked (the
    bounded-memory prediction keeps those as antecedents)."""

    def __init__(self, singleton_threshold: Optional[float]):
        self.singleton_threshold = singleton_threshold
        self.cluster_of: Dict[int, int] = {}
        self.clusters: List[List[Tuple[int, int]]] = []
        self.latest: Dict[int, int] = {}  # entity (cluster number, or -1 - span for a likely singleton) -> span
        self.likely_singletons: List[Tuple[int, Tuple[int, int]]] = []

    def add(self, spans: List[int], words: List[Tuple[int, int]], best: List[int], antecedents: List[int],
            antecedent_words: List[Tuple[int, int]], mention_probabilities: List[float]) -> None:
        """Each span joins its chosen antecedent's cluster (``best`` > 0: the choice among the antecedent scores),
        else it may be a one-mention cluster."""
        for i, choice in enumerate(best):
            if choice > 0:
                self._link(spans[i], words[i], antecedents[i], antecedent_words[i])
            elif self.singleton_threshold is not None and mention_probabilities[i] > self.singleton_threshold:
                self.likely_singletons.append((spans[i], words[i]))
                self.latest[-1 - spans[i]] = spans[i]

    def _link(self, span: int, words: Tuple[int, int], antecedent: int, antecedent_words: Tuple[int, int]) -> None:
        cluster = self.cluster_of.get(antecedent)
        if cluster is None:
            cluster = self.cluster_of[antecedent] = len(self.clusters)
            self.clusters.append([antecedent_words])
            self.latest.pop(-1 - antecedent, None)  # a likely singleton becomes a cluster's first mention
        self.cluster_of[span] = cluster
        self.clusters[cluster].append(words)
        self.latest[cluster] = span

    def result(self) -> List[List[Tuple[int, int]]]:
        """Linked clusters in order of their first link, then the one-mention ones no later span linked to."""
        return self.clusters + [[words] for span, words in self.likely_singletons if span not in self.cluster_of]


def chosen_antecedents(scores: torch.Tensor, antecedents: torch.Tensor) -> Tuple[List[int], List[int]]:
    """(best choice per span, 0 for the dummy; the column index it names, any where the dummy won)."""
    best = scores.argmax(dim=1)
    return best.tolist(), antecedents.gather(1, (best[:, None] - 1).clamp(min=0)).squeeze(1).tolist()


def predicted_clusters(out: dict, token_word: torch.Tensor,
                       singleton_threshold: Optional[float] = None) -> List[List[Tuple[int, int]]]:
    """Clusters of word spans: each top span joins its best antecedent's cluster unless the dummy scores best.

    With ``singleton_threshold``, a top span left in no cluster whose mention probability
    (sigmoid of its mention score) is above the threshold becomes a one-mention cluster;
    ``None`` predicts none (the OntoNotes convention).
    """
    best, chosen = chosen_antecedents(out["scores"], out["antecedents"])
    words = list(zip(token_word[out["starts"]].tolist(), token_word[out["ends"]].tolist()))
    builder = ClusterBuilder(singleton_threshold)
    builder.add(list(range(len(words))), words, best, chosen, [words[j] for j in chosen],
                torch.sigmoid(out["mention_scores"].float()).tolist())
    return builder.result()
