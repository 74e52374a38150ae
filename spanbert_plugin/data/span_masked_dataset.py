"""Dynamic SpanBERT masking over a dataset of framed blocks, fairseq style.

Like fairseq's ``MaskTokensDataset``, masks change every epoch and are
reproducible from (seed, epoch, index); unlike it, one item carries everything
the SpanBERT criterion needs, and ``collater`` builds the whole batch.
"""
from functools import lru_cache

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, data_utils

from .span_masking import SpanMasker


def complete_batches(indices, batches):
    """Append the indices missing from ``batches`` (in their order) as one more batch."""
    batched = sum(len(b) for b in batches)
    if batched == len(indices):
        return batches
    seen = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    missing = np.asarray(indices)[~np.isin(indices, seen)]
    return list(batches) + [missing.astype(np.int64)]


class SpanMaskedDataset(BaseWrapperDataset):
    """Items: masked ``source``, ``target`` (pad where unmasked), span boundaries and offsets."""

    def __init__(self, dataset, masker: SpanMasker, pad_index: int, seed: int = 1):
        super().__init__(dataset)
        self.masker, self.pad_index, self.seed = masker, pad_index, seed
        self.epoch = 0

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True  # masks depend on the epoch, batches do not

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index):
        return self._masked(self.seed, self.epoch, index)

    @lru_cache(maxsize=8)
    def _masked(self, seed, epoch, index):
        tokens = self.dataset[index]
        out = self.masker(tokens.numpy(), np.random.default_rng((seed, epoch, index)))
        return {
            "id": index,
            "source": torch.from_numpy(out.source),
            "target": torch.from_numpy(out.target),
            "span_left": torch.from_numpy(out.span_left),
            "span_right": torch.from_numpy(out.span_right),
            "span_offset": torch.from_numpy(out.span_offset),
        }

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        """fairseq's batching, plus any trailing indices it leaves out as one last batch.

        fairseq-fixed's ``batch_by_size`` drops a final group smaller than
        ``required_batch_size_multiple`` (e.g. a 1-block validation set gives no
        batch at all); a run must never silently drop data.
        """
        batches = super().batch_by_size(indices, max_tokens, max_sentences, required_batch_size_multiple)
        return complete_batches(indices, batches)

    def collater(self, samples):
        if len(samples) == 0:
            return {}

        def merge(key, pad):
            return data_utils.collate_tokens([s[key] for s in samples], pad)

        src_tokens = merge("source", self.pad_index)
        target = merge("target", self.pad_index)
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "net_input": {
                "src_tokens": src_tokens,
                "src_lengths": torch.LongTensor([len(s["source"]) for s in samples]),
            },
            "target": target,
            "span_left": merge("span_left", 0),
            "span_right": merge("span_right", 0),
            "span_offset": merge("span_offset", 0),
            "nsentences": len(samples),
            "ntokens": sum(len(s["source"]) for s in samples),
        }
