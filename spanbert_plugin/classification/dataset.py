"""Prepared classification examples: token ids, BERT token types and labels, batched without loss."""
import os

import numpy as np
import torch
from fairseq.data import data_utils

from ..core.errors import UsageError
from ..core.file_utils import damaged_file_error, load_arrays
from ..core.datasets import SizedDataset
from ..core.datasets import every_example_batched, load_token_items


class ClassificationDataset(SizedDataset):
    """Items of a ``spanbert-prepare-classification`` split; batches carry ``segment_labels`` (0 for A, 1 for B)."""

    def __init__(self, tokens, segment_a, labels, pad_index: int, shuffle: bool = False, seed: int = 1):
        if not len(tokens) == len(segment_a) == len(labels):
            raise ValueError(f"{len(tokens)} token items, {len(segment_a)} segment lengths and {len(labels)} labels")
        self.tokens, self.segment_a, self.labels = tokens, np.asarray(segment_a), np.asarray(labels)
        self.pad_index, self.shuffle, self.seed = pad_index, shuffle, seed
        self.regression = self.labels.dtype.kind == "f"
        self.epoch = 1
        self._sizes = np.asarray(tokens.sizes, dtype=np.int64)

    @classmethod
    def load(cls, folder: str, split: str, dictionary, shuffle: bool = False, seed: int = 1):
        """Read split ``split`` of a prepared folder; UsageError names a missing file."""
        prefix = os.path.join(folder, split)
        for suffix in (".idx", ".bin", ".segment_a.npy", ".labels.npy"):
            if not os.path.isfile(prefix + suffix):
                raise UsageError(f"{prefix + suffix}: no such file (split {split!r} of a spanbert-prepare-classification folder)")
        tokens = load_token_items(prefix, dictionary, split, check_ids=True)
        segment_a, labels = load_arrays(prefix + ".segment_a.npy"), load_arrays(prefix + ".labels.npy")
        for suffix, values in ((".segment_a.npy", segment_a), (".labels.npy", labels)):
            if len(values) != len(tokens):
                raise damaged_file_error(prefix + suffix, f"{len(values)} entries for the {len(tokens)} examples of "
                                                          f"{split}.idx")
        return cls(tokens, segment_a, labels, dictionary.pad(), shuffle, seed)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"id": index, "source": self.tokens[index].long(), "segment_a": int(self.segment_a[index]),
                "target": self.labels[index]}

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        """A training split orders its ties anew each epoch (below), so its batches are made anew each epoch: fairseq
        would otherwise keep epoch 1's, and a run resumed in a later epoch would make that epoch's instead."""
        return not self.shuffle

    def ordered_indices(self):
        """By length, as fairseq's sentence_prediction batches (few pad tokens; fairseq shuffles the batches);
        ties in a fresh seeded random order each training epoch."""
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(len(self))
            return order[np.argsort(self._sizes[order], kind="stable")]
        return np.argsort(self._sizes, kind="stable")

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        """fairseq's batching plus the trailing group it may drop, so every example is seen."""
        return every_example_batched(super().batch_by_size, indices, max_tokens, max_sentences,
                                     required_batch_size_multiple)

    def collater(self, samples):
        if not samples:
            return {}
        src_tokens = data_utils.collate_tokens([s["source"] for s in samples], self.pad_index)
        segment_a = torch.tensor([s["segment_a"] for s in samples]).unsqueeze(1)
        positions = torch.arange(src_tokens.size(1)).unsqueeze(0)
        segment_labels = ((positions >= segment_a) & src_tokens.ne(self.pad_index)).long()
        targets = np.array([s["target"] for s in samples])
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "net_input": {
                "src_tokens": src_tokens,
                "src_lengths": torch.LongTensor([len(s["source"]) for s in samples]),
                "segment_labels": segment_labels,
                "has_padding": bool(src_tokens.eq(self.pad_index).any()),  # known here: the model need not ask the device
            },
            "target": torch.from_numpy(targets.astype(np.float32 if self.regression else np.int64)),
            "nsentences": len(samples),
            "ntokens": sum(len(s["source"]) for s in samples),
            "split_size": len(self),  # regression validation sums per-index arrays over the split
        }
