"""Contiguous blocks of up to ``block_size`` tokens that never cross a document.

Each item of the wrapped dataset is one document (as ``spanbert-prepare``
writes them). Every document is cut into consecutive blocks of ``block_size``
tokens, wherever that falls (inside a word too); the last block of a document
may be shorter, nothing is dropped.
Blocks are framed with the begin/end tokens (SPEC §1.3: single contiguous
segments, no sentence pairs).
"""
import numpy as np
import torch
from fairseq.data.indexed_dataset import MMapIndexedDataset

from ..core.errors import UsageError
from ..core.datasets import SizedDataset


class DocumentBlockDataset(SizedDataset):
    """Framed blocks ``[bos] doc[s:s+block_size] [eos]`` over a dataset of documents."""

    def __init__(self, documents, doc_sizes, block_size: int, bos: int, eos: int):
        if block_size < 1:
            raise UsageError(f"block size must be at least 1 token, got {block_size}")
        self.documents = documents
        self.bos, self.eos = bos, eos
        doc_sizes = np.asarray(doc_sizes, dtype=np.int64)
        blocks_per_doc = -(-doc_sizes // block_size)  # ceil; empty documents give none
        self.block_doc = np.repeat(np.arange(len(doc_sizes)), blocks_per_doc)
        first_block = np.cumsum(blocks_per_doc) - blocks_per_doc
        self.block_start = (np.arange(len(self.block_doc)) - first_block[self.block_doc]) * block_size
        self.block_len = np.minimum(block_size, doc_sizes[self.block_doc] - self.block_start)
        self._sizes = self.block_len + 2

    def _slice(self, doc, start, length):
        if isinstance(self.documents, MMapIndexedDataset):
            # read just the block from the memory map instead of the whole document
            pointer, _ = self.documents._index[doc]
            dtype = self.documents._index.dtype
            return np.frombuffer(
                self.documents._bin_buffer, dtype=dtype, count=length,
                offset=pointer + start * np.dtype(dtype).itemsize,
            )
        return np.asarray(self.documents[doc][start : start + length])

    def __getitem__(self, index):
        doc, start, length = self.block_doc[index], self.block_start[index], self.block_len[index]
        block = np.empty(length + 2, dtype=np.int64)
        block[0], block[-1] = self.bos, self.eos
        block[1:-1] = self._slice(doc, start, length)
        return torch.from_numpy(block)

    def block_spans(self, index, document_spans):
        """The spans of ``document_spans`` (one flat [start, end, ...] item per document) wholly inside block
        ``index``, as (k, 2) positions in the framed block (the begin token is position 0)."""
        doc, start, length = self.block_doc[index], self.block_start[index], self.block_len[index]
        spans = np.asarray(document_spans[doc], dtype=np.int64).reshape(-1, 2)
        inside = (spans[:, 0] >= start) & (spans[:, 1] <= start + length)
        return spans[inside] - start + 1

    def __len__(self):
        return len(self.block_doc)

    @property
    def supports_prefetch(self):
        return False

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return True
