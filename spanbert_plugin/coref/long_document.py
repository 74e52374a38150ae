"""Coreference of documents of any length in bounded memory and linear time (whole novels).

The exact head (``CorefHead.forward``) holds every candidate span of a document and
ranks each top span's antecedents among all earlier ones: memory and time grow
faster than the length. Here the document streams through the head in blocks of
``BLOCK_SEGMENTS`` segments (the encoder's segments are independent anyway):

1. the block's segments are encoded, its candidate spans scored and its top
   ``top_span_ratio`` x words spans kept (pruning per block instead of per
   document; the only other difference from the exact head);
2. each top span ranks as antecedents (coarse-to-fine, with the higher-order
   refinement, exactly as the head does) the spans that start at most
   ``max_antecedent_distance`` words before it, and beyond that the **latest
   mention of every entity** held in an entity cache: predicted clusters, and
   spans likely enough to be one-mention clusters, at most ``entity_cache_size``
   of them, the least recently mentioned evicted first;
3. links join clusters across blocks by the spans' positions in the document, as
   the exact head's ``predicted_clusters`` does.

This follows the bounded-memory coreference literature with the head trained
here, untouched: Toshniwal et al. (EMNLP 2020, "Learning to Ignore: Long Document
Coreference with Bounded Memory Neural Networks") keep a fixed number of entity
cells, evicting the least recently used (their LRU memory); Xia et al. (EMNLP
2020, "Incremental Neural Coreference Resolution in Constant Memory") process
segments one after another, each entity standing for its mentions, and forget
entities unseen for long. Neither learned entity representation applies to a
pairwise c2f head, so an entity is scored through its latest mention (what the
head ranks best: the nearest mention of a chain, with the distance features it
was trained on). The BookCoref authors (Martinelli et al., ACL 2025) found that
systems trained on short documents lose accuracy on whole books; the distance
window here keeps each span's candidates what they were in training.

Memory holds one block, the spans of the last ``max_antecedent_distance`` words
and ``entity_cache_size`` entities (their embedding at each refinement round);
the clusters themselves (the output) grow with the book, as word positions.
"""
import logging
from typing import Callable, List, Optional, Tuple

import torch

from .head import ClusterBuilder, SpanColumns, antecedent_loss, chosen_antecedents
from .prediction_modes import DEFAULT_ENTITY_CACHE_SIZE, DEFAULT_EXACT_MAX_WORDS, DEFAULT_MAX_ANTECEDENT_DISTANCE

logger = logging.getLogger(__name__)

BLOCK_SEGMENTS = 8  # segments encoded and pruned together: LitBank's 2,000-word excerpts fit in one block of 384
_FIELDS = ("mention_scores", "index", "speaker", "segment", "start_word", "always", "end_word", "cluster")


class _Earlier:
    """The spans earlier blocks left as possible antecedents (the recent window and the entity cache)."""

    def __init__(self):
        self.rounds: List[torch.Tensor] = []
        self.columns = {name: None for name in _FIELDS}

    @property
    def empty(self) -> bool:
        return not self.rounds or self.rounds[0].size(0) == 0

    def as_columns(self) -> Optional[SpanColumns]:
        if self.empty:
            return None
        c = self.columns
        return SpanColumns(self.rounds, c["mention_scores"], c["index"], c["speaker"], c["segment"], c["start_word"],
                           c["always"])

    def add(self, rounds: List[torch.Tensor], **columns) -> None:
        if self.empty:
            self.rounds = [g.detach() for g in rounds]
            self.columns = dict(columns)
            return
        self.rounds = [torch.cat([old, new.detach().to(old.dtype)]) for old, new in zip(self.rounds, rounds)]
        self.columns = {name: torch.cat([self.columns[name], columns[name]]) for name in _FIELDS}

    def keep(self, mask: torch.Tensor) -> None:
        self.rounds = [g[mask] for g in self.rounds]
        self.columns = {name: value[mask] for name, value in self.columns.items()}


def bounded_document_clusters(model, sample: dict, singleton_threshold: Optional[float],
                              max_antecedent_distance: Optional[int], entity_cache_size: Optional[int],
                              block_segments: int = BLOCK_SEGMENTS,
                              progress: Optional[Callable[[int], None]] = None) -> Tuple[list, Optional[torch.Tensor]]:
    """(clusters of word spans, the loss or None) of one collated document, block by block.

    ``max_antecedent_distance``/``entity_cache_size`` None: no limit (every earlier span stays an antecedent
    candidate; memory then grows with the document). With ``sample["coref"]["target"]`` non-empty the loss is the
    head's (antecedent + weighted mention loss) over each block's candidates. ``progress(words)`` is called after
    each block with the words it covered.
    """
    head = model.coref_head
    src_tokens = sample["net_input"]["src_tokens"]
    coref = sample["coref"]
    pad = model.encoder.padding_idx
    real = src_tokens.ne(pad)
    token_offsets = [0] + real.sum(dim=1).cumsum(0).tolist()
    num_tokens = token_offsets[-1]
    target = coref.get("target")
    with_loss = target is not None and target.numel() > 0
    earlier, clusters = _Earlier(), ClusterBuilder(singleton_threshold)
    next_index, loss = 0, None
    for first in range(0, src_tokens.size(0), block_segments):
        last = min(first + block_segments, src_tokens.size(0))
        t0, t1 = token_offsets[first], token_offsets[last]
        x = model.encoder(src_tokens[first:last])
        features = x[real[first:last]]
        word, sentence = coref["token_word"][t0:t1], coref["token_sentence"][t0:t1]
        segment, speaker = coref["token_segment"][t0:t1], coref["token_speaker"][t0:t1]
        words_here = word[word >= 0]
        num_words = int(words_here.max() - words_here.min()) + 1
        # a word cut at the block's edge continues beyond it: neither of its parts may be a span
        starts, ends, g, mention_scores = head.top_spans(features, word, sentence, segment, num_words,
                                                         _words_beside(coref["token_word"], t0, t1))
        k = starts.numel()
        index = torch.arange(next_index, next_index + k, device=g.device)
        next_index += k
        start_word, end_word = word[starts], word[ends]
        columns_before = earlier.as_columns()
        scores, antecedents, rounds = head.rank_antecedents(
            g, mention_scores, index, speaker[starts], segment[starts], coref["genre"], word=start_word,
            earlier=columns_before, max_distance=max_antecedent_distance)
        row_cluster = None
        if with_loss:
            row_cluster = head.gold_clusters_of(starts + t0, ends + t0, target, num_tokens)
            column_cluster = row_cluster if earlier.empty else torch.cat([earlier.columns["cluster"], row_cluster])
            block_loss = antecedent_loss(scores, antecedents, row_cluster, column_cluster)
            if head.mention_loss_weight > 0:
                block_loss = block_loss + head.mention_loss_weight * head.mention_loss(
                    mention_scores, starts + t0, ends + t0, target, num_tokens)
            loss = block_loss if loss is None else loss + block_loss
        _link(clusters, scores, antecedents, earlier, index, start_word, end_word, mention_scores)
        earlier.add(rounds, mention_scores=mention_scores.detach().float(), index=index, speaker=speaker[starts],
                    segment=segment[starts], start_word=start_word,
                    always=torch.zeros(k, dtype=torch.bool, device=g.device),
                    end_word=end_word,
                    cluster=row_cluster if row_cluster is not None else torch.zeros_like(index))
        _forget(earlier, clusters, int(words_here.max()) + 1, max_antecedent_distance, entity_cache_size)
        if progress is not None:
            progress(num_words)
    return clusters.result(), loss


def _link(clusters: ClusterBuilder, scores, antecedents, earlier: _Earlier, index, start_word, end_word,
          mention_scores) -> None:
    """Each span of the block joins its best antecedent's cluster unless the dummy scores best."""
    if earlier.empty:
        column_index, column_start, column_end = index, start_word, end_word
    else:
        column_index = torch.cat([earlier.columns["index"], index])
        column_start = torch.cat([earlier.columns["start_word"], start_word])
        column_end = torch.cat([earlier.columns["end_word"], end_word])
    best, chosen = chosen_antecedents(scores, antecedents)
    clusters.add(index.tolist(), list(zip(start_word.tolist(), end_word.tolist())), best,
                 column_index[chosen].tolist(), list(zip(column_start[chosen].tolist(), column_end[chosen].tolist())),
                 torch.sigmoid(mention_scores.float()).tolist())


def _forget(earlier: _Earlier, clusters: ClusterBuilder, next_word: int, max_distance: Optional[int],
            cache_size: Optional[int]) -> None:
    """Keep the spans the next block may link to: those within ``max_distance`` words of it, and the latest mention of
    the ``cache_size`` most recently mentioned entities."""
    if max_distance is None and cache_size is None:
        return
    index = earlier.columns["index"]
    latest = torch.tensor(sorted(clusters.latest.values()), dtype=index.dtype, device=index.device)
    always = torch.isin(index, latest)
    recent = (next_word - earlier.columns["start_word"] <= max_distance) if max_distance is not None else \
        torch.ones_like(always)
    cached = always & ~recent
    if cache_size is not None and int(cached.sum()) > cache_size:
        # the entities whose latest mention is oldest leave the cache (and can no longer be linked to)
        threshold = index[cached].sort(descending=True).values[cache_size - 1]
        cached &= index >= threshold
        evicted = set(clusters.latest.values()) - set(index[always & (recent | cached)].tolist())
        clusters.latest = {entity: span for entity, span in clusters.latest.items() if span not in evicted}
        latest = torch.tensor(sorted(clusters.latest.values()), dtype=index.dtype, device=index.device)
        always = torch.isin(index, latest)
    earlier.columns["always"] = always
    earlier.keep(recent | cached)


def predicts_bounded(cfg, num_words: int) -> bool:
    """Whether the task's settings (``--coref-prediction``) predict a document of ``num_words`` in bounded memory;
    checkpoints trained before the option existed get its defaults."""
    mode = str(getattr(cfg, "coref_prediction", "auto"))
    return mode == "bounded" or (mode == "auto" and
                                 num_words > getattr(cfg, "exact_prediction_max_words", DEFAULT_EXACT_MAX_WORDS))


def bounded_limits(cfg) -> Tuple[int, int]:
    """(max_antecedent_distance, entity_cache_size) of the task's settings."""
    return (int(getattr(cfg, "max_antecedent_distance", DEFAULT_MAX_ANTECEDENT_DISTANCE)),
            int(getattr(cfg, "entity_cache_size", DEFAULT_ENTITY_CACHE_SIZE)))


def bounded_notice(cfg, num_words: int) -> str:
    """The one line that says a document is predicted in bounded memory, and how."""
    distance, cache = bounded_limits(cfg)
    why = ("--coref-prediction bounded" if str(getattr(cfg, "coref_prediction", "auto")) == "bounded" else
           f"more than --exact-prediction-max-words "
           f"{getattr(cfg, 'exact_prediction_max_words', DEFAULT_EXACT_MAX_WORDS):,}")
    return (f"a document of {num_words:,} words ({why}): bounded-memory prediction, antecedents within {distance:,} "
            f"words or an entity's latest mention ({cache:,} entities kept)")


def _words_beside(token_word, t0: int, t1: int):
    """The words of the real tokens just before ``t0`` and from ``t1`` on (a segment's [SEP] [CLS] lie between),
    -2 where there is none."""
    before, after = token_word[max(0, t0 - 3):t0], token_word[t1:t1 + 3]
    before, after = before[before >= 0], after[after >= 0]
    return (int(before[-1]) if before.numel() else -2, int(after[0]) if after.numel() else -2)


def bounded_prediction(model, cfg, sample: dict, singleton_threshold: Optional[float],
                       progress: Optional[Callable[[int], None]] = None) -> Tuple[list, Optional[torch.Tensor]]:
    """``bounded_document_clusters`` with the task's limits."""
    distance, cache = bounded_limits(cfg)
    return bounded_document_clusters(model, sample, singleton_threshold, distance, cache, progress=progress)
