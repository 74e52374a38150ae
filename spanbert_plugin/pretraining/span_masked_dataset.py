"""Dynamic SpanBERT masking over a dataset of framed blocks, fairseq style.

Like fairseq's ``MaskTokensDataset``, masks change every epoch and are
reproducible from (seed, epoch, index); unlike it, one item carries everything
the SpanBERT criterion needs, and ``collater`` builds the whole batch.
"""
from functools import lru_cache

import torch
from fairseq.data import data_utils

from ..core.datasets import BatchesEveryExample, EpochKeyedWrapper, ItemRandom
from .span_masking import SpanMasker


class SpanMaskedDataset(BatchesEveryExample, EpochKeyedWrapper):
    """Items: masked ``source``, ``target`` (pad where unmasked), span boundaries and offsets."""

    def __init__(self, dataset, masker: SpanMasker, pad_index: int, seed: int = 1, unit_spans=None,
                 sbo_position_slots=None):
        """``unit_spans``: index -> the item's annotated spans ((k, 2) positions), for the linguistic schemes;
        ``sbo_position_slots``: the model's SBO position slots, when known (see ``collater``)."""
        super().__init__(dataset)
        self.masker, self.pad_index, self.seed = masker, pad_index, seed
        self.sbo_position_slots = sbo_position_slots
        self.unit_spans = unit_spans
        self.epoch = 0
        self.item_random = ItemRandom()

    def __getitem__(self, index):
        return self._masked(self.seed, self.epoch, index)

    @lru_cache(maxsize=8)
    def _masked(self, seed, epoch, index):
        tokens = self.dataset[index]
        units = self.unit_spans(index) if self.unit_spans is not None else None
        out = self.masker(tokens.numpy(), self.item_random(seed, epoch, index), units=units)
        return {
            "id": index,
            "source": torch.from_numpy(out.source),
            "target": torch.from_numpy(out.target),
            "span_left": torch.from_numpy(out.span_left),
            "span_right": torch.from_numpy(out.span_right),
            "span_offset": torch.from_numpy(out.span_offset),
        }

    def collater(self, samples):
        if len(samples) == 0:
            return {}

        def merge(key, pad):
            return data_utils.collate_tokens([s[key] for s in samples], pad)

        src_tokens = merge("source", self.pad_index)
        target = merge("target", self.pad_index)
        span_offset = merge("span_offset", 0)
        # The masked positions (flat, row-major) and, with the model's slot count, those that get an SBO
        # prediction: selected here on the host, the model and criterion need no device-side nonzero.
        masked_index = target.reshape(-1).ne(self.pad_index).nonzero().squeeze(1)
        selections = {"masked_index": masked_index}
        if self.sbo_position_slots is not None:
            in_table = span_offset.reshape(-1)[masked_index] <= self.sbo_position_slots
            selections["sbo_index"] = in_table.nonzero().squeeze(1)
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "net_input": {
                "src_tokens": src_tokens,
                "src_lengths": torch.LongTensor([len(s["source"]) for s in samples]),
                "has_padding": bool(src_tokens.eq(self.pad_index).any()),  # known here: the model need not ask the device
            },
            "target": target,
            "span_left": merge("span_left", 0),
            "span_right": merge("span_right", 0),
            "span_offset": span_offset,
            **selections,
            "nsentences": len(samples),
            "ntokens": sum(len(s["source"]) for s in samples),
        }
