"""Windows of a prepared extractive-QA split as a fairseq dataset.

Each item is one window ``[CLS] question [SEP] passage [SEP]`` with token
types 0 up to and including the first ``[SEP]`` and 1 after, and its start/end
labels. For evaluation (``group_questions``) every batch holds whole
questions, so the answer of a question, which needs all its windows, can be
scored inside one batch and metrics stay exact over the split.
"""
import logging

import numpy as np
import torch
from fairseq.data import data_utils

from .windows import QASplit
from ..core.datasets import SizedDataset, every_example_batched
from ..core.errors import UsageError

logger = logging.getLogger(__name__)


class ExtractiveQADataset(SizedDataset):
    """Token windows (a fairseq indexed dataset) with their QASplit metadata."""

    def __init__(self, windows, qa: QASplit, split: str, pad_index: int, group_questions: bool = False, shuffle=False, seed=1):
        if len(windows) != qa.num_windows:
            raise ValueError(f"split {split!r}: {len(windows)} token windows but {qa.num_windows} windows of metadata")
        self.windows, self.qa, self.split = windows, qa, split
        self.pad_index = pad_index
        self.group_questions = group_questions
        self.shuffle, self.seed, self.epoch = shuffle, seed, 1
        self._sizes = np.asarray(windows.sizes, dtype=np.int64)

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, index):
        tokens = self.windows[index].long()
        segment = torch.zeros_like(tokens)
        segment[int(self.qa.passage_offset[index]):] = 1  # the first [SEP] sits just before the passage
        return {
            "id": index,
            "source": tokens,
            "segment": segment,
            "start": int(self.qa.start_positions[index]),
            "end": int(self.qa.end_positions[index]),
        }

    def collater(self, samples):
        if not samples:
            return {}
        src_tokens = data_utils.collate_tokens([s["source"] for s in samples], self.pad_index)
        return {
            "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
            "nsentences": len(samples),
            "ntokens": sum(len(s["source"]) for s in samples),
            "net_input": {
                "src_tokens": src_tokens,
                "segment_labels": data_utils.collate_tokens([s["segment"] for s in samples], 0),
                "has_padding": bool(src_tokens.eq(self.pad_index).any()),  # known here: the model need not ask the device
            },
            "start_positions": torch.tensor([s["start"] for s in samples], dtype=torch.long),
            "end_positions": torch.tensor([s["end"] for s in samples], dtype=torch.long),
            "qa_split": self.split,
        }

    def set_epoch(self, epoch):
        self.epoch = epoch

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return not self.shuffle

    def ordered_indices(self):
        if self.group_questions:
            return np.arange(len(self))  # question order; batch_by_size keeps questions whole
        if self.shuffle:
            with data_utils.numpy_seed(self.seed, self.epoch):
                order = np.random.permutation(len(self))
            return order[np.argsort(self._sizes[order], kind="stable")]
        return np.argsort(self._sizes, kind="stable")

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        """Training: fairseq's batching plus any trailing group it dropped; evaluation: whole questions."""
        if not self.group_questions:
            return every_example_batched(super().batch_by_size, indices, max_tokens, max_sentences,
                                         required_batch_size_multiple)
        return question_batches(self.qa.question_index, self._sizes, indices, max_tokens, max_sentences)

    def filter_indices_by_size(self, indices, max_sizes):
        too_long = self._sizes[indices] > max_sizes if max_sizes is not None else np.zeros(len(indices), bool)
        if too_long.any():
            raise UsageError(
                f"split {self.split!r}: {int(too_long.sum())} windows are longer than the model's {max_sizes} positions; "
                "prepare the data with a smaller --max-seq-length"
            )
        return indices, []


def question_batches(question_index, sizes, indices, max_tokens=None, max_sentences=None):
    """Batches of whole questions (all windows of a question together), within the size limits.

    A question whose windows alone exceed the limits forms a batch by itself.
    """
    indices = np.sort(np.asarray(indices, dtype=np.int64))
    if len(indices) == 0:
        return []
    q = question_index[indices]
    starts = np.concatenate(([0], (q[1:] != q[:-1]).nonzero()[0] + 1, [len(indices)]))
    batches, current, current_max, current_n = [], [], 0, 0
    oversize = 0
    for lo, hi in zip(starts[:-1], starts[1:]):
        group = indices[lo:hi]
        longest = int(sizes[group].max())
        n = current_n + len(group)
        width = max(current_max, longest)
        fits = (max_sentences is None or n <= max_sentences) and (max_tokens is None or n * width <= max_tokens)
        if current and not fits:
            batches.append(np.concatenate(current))
            current, current_max, current_n = [], 0, 0
            n, width = len(group), longest
        if (max_sentences is not None and len(group) > max_sentences) or (max_tokens is not None and len(group) * longest > max_tokens):
            oversize += 1
        current.append(group)
        current_max, current_n = width, n
    if current:
        batches.append(np.concatenate(current))
    if oversize:
        logger.warning(f"{oversize} questions have more windows than one batch allows; each is kept whole in its own batch")
    return batches
