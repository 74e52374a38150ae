"""SpanDrop on relation-extraction items: the mentions with their markers always stay, entity positions follow."""

import logging

import numpy as np
import torch
from fairseq.data import FairseqDataset

from ..core.tokenization import load_tokenizer
from ..spandrop.finetune import SpanDropper, SpanDropWrapper
from .prepare import load_region_ends

logger = logging.getLogger(__name__)


class RelationSpanDrop(SpanDropWrapper):
    """Token items of a relation split with SpanDrop; ``entity_positions`` gives the matching marker positions.

    The subject and object regions (start marker to the end of the mention and
    its closing marker) are protected: ``region_ends(index, tokens, starts)``
    gives their last positions.
    """

    def __init__(self, tokens, entity_positions, dropper: SpanDropper, region_ends):
        super().__init__(tokens, dropper)
        self.positions = np.asarray(entity_positions, dtype=np.int64)
        self.region_ends = region_ends

    def __getitem__(self, index):
        return super().__getitem__(index)[0]

    def drop(self, item, index, rng):
        tokens = item.numpy()
        protected = np.zeros(len(tokens), dtype=bool)
        starts = self.positions[index]
        for start, end in zip(starts, self.region_ends(index, tokens, starts)):
            protected[start: end + 1] = True
        keep = self.dropper.token_keep(tokens, ~self.dropper.special[tokens], protected, rng)
        out = self.dropper.apply(item.long(), keep)
        return out.source, out.new_position[self.positions[index]].tolist()

    @property
    def entity_positions(self) -> "EntityPositions":
        """The companion dataset of remapped (subject, object) marker positions."""
        return EntityPositions(self)


class EntityPositions(FairseqDataset):
    """(subject, object) start-marker positions of ``RelationSpanDrop`` items, batched as B x 2."""

    def __init__(self, tokens: RelationSpanDrop):
        self.tokens = tokens

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return self.tokens._dropped(self.tokens.epoch, index)[1]

    def collater(self, samples):
        return torch.tensor(samples, dtype=torch.long)


def marker_region_end(meta: dict, tokenizer):
    """``f(tokens, start, role) -> last position`` of the entity region opened by the marker at ``start``.

    For folders prepared before the region ends were stored. ``ner``: the
    marker replaces the mention; ``typed_marker``: up to the first end marker
    after it; ``typed_marker_punct``: up to the closing ``@``/``#`` word (the
    first occurrence of the opening word's tokens after it: wrong when the
    mention holds that word, or the vocabulary has no token for it).
    """
    mode = meta["entity_marker"]
    if mode == "ner":
        return lambda tokens, start, role: start
    if mode == "typed_marker":
        end_ids = np.array([i for symbol, i in meta["markers"].items() if symbol.startswith("[/")], dtype=np.int64)

        def typed_end(tokens, start, role):
            after = np.flatnonzero(np.isin(tokens[start + 1:], end_ids))
            return start + 1 + int(after[0]) if len(after) else len(tokens) - 1
        return typed_end
    from .markers import PUNCT_MARKERS, ROLES

    openers = [np.asarray(tokenizer.encode(PUNCT_MARKERS[role][0]).ids, dtype=np.int64) for role in ROLES]

    def punct_end(tokens, start, role):
        opener = openers[role]
        if len(tokens) - start < 2 * len(opener):
            return len(tokens) - 1
        windows = np.lib.stride_tricks.sliding_window_view(tokens[start + len(opener):], len(opener))
        after = np.flatnonzero((windows == opener).all(axis=1))
        return start + len(opener) + int(after[0]) + len(opener) - 1 if len(after) else len(tokens) - 1
    return punct_end


def relation_span_drop(dropper: SpanDropper, meta: dict, folder: str, split: str):
    """``RelationDataset.load``'s transform: (tokens, entity positions) -> their SpanDrop views."""
    stored = load_region_ends(folder, split)
    if stored is not None:
        def region_ends(index, tokens, starts):
            return stored[index]
    else:
        punct = meta["entity_marker"] == "typed_marker_punct"
        if punct:
            logger.warning(f"{folder}: prepared without the entities' region ends; SpanDrop finds each mention's "
                           "closing '@'/'#' by search (wrong for mentions holding one); prepare the data again")
        region_end = marker_region_end(meta, load_tokenizer(folder) if punct else None)

        def region_ends(index, tokens, starts):
            return [region_end(tokens, int(start), role) for role, start in enumerate(starts)]

    def transform(tokens, entity_positions):
        dropped = RelationSpanDrop(tokens, entity_positions, dropper, region_ends)
        return dropped, dropped.entity_positions
    return transform
