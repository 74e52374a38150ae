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

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of x."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class ItemRandom:
    """A numpy Generator re-seeded from (seed, epoch, index), for one dataset in one process.

    Setting a PCG64 state from a hash of the triple costs ~2 us, against ~12 us
    for building ``default_rng((seed, epoch, index))``: it matters at tens of
    thousands of blocks per second. DataLoader workers are separate processes,
    each with its own copy.
    """

    def __init__(self):
        self.bit_generator = np.random.PCG64()
        self.generator = np.random.Generator(self.bit_generator)

    def __call__(self, seed: int, epoch: int, index: int) -> np.random.Generator:
        high = _mix64(_mix64(_mix64(int(seed)) ^ int(epoch)) ^ int(index))
        low = _mix64(high ^ 0x5851F42D4C957F2D)
        self.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": (high << 64) | low, "inc": ((low << 64) | high) | 1},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self.generator


def complete_batches(indices, batches):
    """Append the indices missing from ``batches`` (in their order) as one more batch."""
    batched = sum(len(b) for b in batches)
    if batched == len(indices):
        return batches
    seen = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    missing = np.asarray(indices)[~np.isin(indices, seen)]
    return list(batches) + [missing.astype(np.int64)]


class BatchesEveryExample:
    """Mixin for a FairseqDataset: fairseq's batching, plus any trailing indices it leaves out as one last batch.

    fairseq-fixed's ``batch_by_size`` drops a final group smaller than
    ``required_batch_size_multiple`` (8 by default: a 50-example test set is
    evaluated on 48, a 1-block validation set gets no batch at all); a run
    must never silently drop data. Put it before the dataset's base class.
    """

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        batches = super().batch_by_size(indices, max_tokens, max_sentences, required_batch_size_multiple)
        return complete_batches(indices, batches)


class SpanMaskedDataset(BatchesEveryExample, BaseWrapperDataset):
    """Items: masked ``source``, ``target`` (pad where unmasked), span boundaries and offsets."""

    def __init__(self, dataset, masker: SpanMasker, pad_index: int, seed: int = 1):
        super().__init__(dataset)
        self.masker, self.pad_index, self.seed = masker, pad_index, seed
        self.epoch = 0
        self.item_random = ItemRandom()

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        # masks depend on the epoch: a reused iterator keeps its persistent DataLoader workers, whose copy of
        # this dataset never sees set_epoch again (epoch-2 masks drawn as epoch 1's, unlike a resumed run)
        return False

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index):
        return self._masked(self.seed, self.epoch, index)

    @lru_cache(maxsize=8)
    def _masked(self, seed, epoch, index):
        tokens = self.dataset[index]
        out = self.masker(tokens.numpy(), self.item_random(seed, epoch, index))
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
