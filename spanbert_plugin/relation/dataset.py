"""Prepared relation-extraction examples as a fairseq dataset that never drops an example."""
import functools
import os

import numpy as np
from fairseq.data import (
    BaseWrapperDataset,
    FairseqDataset,
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RawLabelDataset,
    RightPadDataset,
)

from ..core.errors import UsageError
from ..core.file_utils import damaged_file_error
from .prepare import load_split_arrays
from ..core.datasets import every_example_batched, load_token_items


class RelationDataset(BaseWrapperDataset):
    """Batches: ``net_input`` (src_tokens, src_lengths, entity_positions B x 2) and ``target`` label indices."""

    def __init__(self, tokens, labels, entity_positions, pad_index: int, shuffle: bool = False, seed: int = 1):
        if not len(tokens) == len(labels) == len(entity_positions):
            raise ValueError(f"{len(tokens)} token items, {len(labels)} labels, {len(entity_positions)} entity positions")
        super().__init__(NestedDictionaryDataset({
            "id": IdDataset(),
            "net_input": {
                "src_tokens": RightPadDataset(tokens, pad_idx=pad_index),
                "src_lengths": NumelDataset(tokens, reduce=False),
                "entity_positions": entity_positions if isinstance(entity_positions, FairseqDataset)
                else RawLabelDataset(np.asarray(entity_positions).tolist()),
            },
            "target": RawLabelDataset(np.asarray(labels).tolist()),
            "nsentences": NumSamplesDataset(),
            "ntokens": NumelDataset(tokens, reduce=True),
        }, sizes=[tokens.sizes]))
        self.shuffle, self.seed, self.epoch = shuffle, seed, 1
        self._sizes = np.asarray(tokens.sizes, dtype=np.int64)

    @classmethod
    def load(cls, folder: str, split: str, dictionary, shuffle: bool = False, seed: int = 1, transform=None):
        """Split ``split`` of a spanbert-prepare-re folder; UsageError names a missing file.

        ``transform(tokens, entity_positions) -> (tokens, entity_positions)`` (datasets) changes
        both together, e.g. SpanDrop on training data.
        """
        prefix = os.path.join(folder, split)
        if not (os.path.isfile(prefix + ".bin") and os.path.isfile(prefix + ".idx")):
            raise UsageError(f"{prefix}.bin/.idx: no such file (split {split!r} was not prepared in {folder})")
        tokens = load_token_items(prefix, dictionary, split, check_ids=True)
        labels, positions, _ = load_split_arrays(folder, split)
        for name, values in (("labels", labels), ("entity positions", positions)):
            if len(values) != len(tokens):  # an .npz copied from another preparation
                raise damaged_file_error(prefix + ".npz", f"{len(values)} {name} for the {len(tokens)} examples of "
                                                          f"{split}.idx")
        if transform is not None:
            tokens, positions = transform(tokens, positions)
        return cls(tokens, labels, positions, dictionary.pad(), shuffle, seed)

    @property
    def sizes(self):
        return self._sizes

    def num_tokens(self, index):
        return self._sizes[index]

    def num_tokens_vec(self, indices):
        return self._sizes[indices]

    def size(self, index):
        return self._sizes[index]

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return not self.shuffle

    def ordered_indices(self):
        """By length (few pad tokens); ties in a fresh seeded random order each training epoch."""
        sizes = self._sizes
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(len(sizes))
            return order[np.argsort(sizes[order], kind="stable")]
        return np.argsort(sizes, kind="stable")

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        """fairseq's batching plus the trailing group it may drop, so every example is seen."""
        # FairseqDataset's, on this dataset's sizes (BaseWrapperDataset's would batch the wrapped tokens)
        return every_example_batched(functools.partial(FairseqDataset.batch_by_size, self), indices, max_tokens,
                                     max_sentences, required_batch_size_multiple)

    def filter_indices_by_size(self, indices, max_sizes):
        """Keep every example: one longer than the model takes is an error, never silently skipped."""
        too_long = self._sizes[indices] > max_sizes if max_sizes is not None else np.zeros(len(indices), bool)
        if too_long.any():
            raise UsageError(
                f"{int(too_long.sum())} examples are longer than the model's {max_sizes} positions; "
                "prepare the data again with a smaller --max-seq-length"
            )
        return indices, []
