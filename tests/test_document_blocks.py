"""Document blocks: contiguous, framed, never crossing a document, nothing dropped (docs/pretraining.md: the task)."""
import os

import numpy as np
import pytest
import torch

from spanbert_plugin.pretraining.document_blocks import DocumentBlockDataset
from spanbert_plugin.core.errors import UsageError

BOS, EOS = 1, 2


def check_blocks(blocks, documents, block_size, bos=BOS, eos=EOS):
    """Blocks are [bos] doc[s:s+n] [eos], in document order, each within one document; concatenated per document
    they give the document back exactly (nothing dropped, nothing repeated)."""
    rebuilt = [[] for _ in documents]
    previous_doc = -1
    for i in range(len(blocks)):
        block = blocks[i].numpy()
        assert block[0] == bos and block[-1] == eos and 3 <= len(block) <= block_size + 2
        assert len(block) == blocks.sizes[i]
        doc = int(blocks.block_doc[i])
        assert doc >= previous_doc  # documents in order, each document's blocks together
        previous_doc = doc
        rebuilt[doc].extend(block[1:-1].tolist())
        # only the last block of a document may be short
        if len(rebuilt[doc]) < len(documents[doc]):
            assert len(block) == block_size + 2
    assert rebuilt == [list(map(int, d)) for d in documents]
    expected_blocks = sum(-(-len(d) // block_size) for d in documents)
    assert len(blocks) == expected_blocks


@pytest.mark.parametrize("block_size", [1, 3, 7, 64])
def test_random_documents_round_trip(block_size):
    rng = np.random.default_rng(block_size)
    sizes = np.concatenate([[0, 1, block_size, block_size + 1, 2 * block_size], rng.integers(0, 200, size=40)])
    rng.shuffle(sizes)
    documents = [torch.from_numpy(rng.integers(5, 1000, size=n)) for n in sizes]
    check_blocks(DocumentBlockDataset(documents, sizes, block_size, BOS, EOS), documents, block_size)


def test_prepared_corpus_through_the_memory_map(spm_data):
    """The real path: spanbert-prepare's one-item-per-document binary, read block by block from the memory map."""
    from fairseq.data import data_utils
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from spanbert_plugin.core.dictionary import SpanBertDictionary

    dictionary = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    documents = data_utils.load_indexed_dataset(os.path.join(spm_data, "train"), dictionary, "mmap")
    assert isinstance(documents, MMapIndexedDataset) and len(documents) == 54  # the corpus fixture's train documents
    blocks = DocumentBlockDataset(documents, documents.sizes, 126, dictionary.bos(), dictionary.eos())
    check_blocks(blocks, [documents[i].numpy() for i in range(len(documents))], 126, dictionary.bos(), dictionary.eos())
    assert int(blocks.sizes.sum()) - 2 * len(blocks) == int(documents.sizes.sum())  # every token, once


def test_block_size_below_one_is_refused():
    with pytest.raises(UsageError, match="block size must be at least 1 token, got 0"):
        DocumentBlockDataset([], np.array([], dtype=np.int64), 0, BOS, EOS)


def test_annotated_spans_of_a_block_are_those_wholly_inside_it_at_framed_positions():
    """Document spans [start, end) in document tokens, blocks of 4: block 0 holds tokens 0-3, block 1 tokens 4-7. A
    span is the block's when it lies wholly inside, ending at the block's end included; its positions shift by the
    block's start and the begin token (position 0)."""
    document = torch.arange(10, 19)  # 9 tokens: blocks of 4, 4 and 1
    blocks = DocumentBlockDataset([document], [9], 4, BOS, EOS)
    spans = [[0, 2, 2, 4, 3, 5, 4, 8, 5, 6, 8, 9]]  # 3-5 crosses blocks 0 and 1
    inside = {0: [(0, 2), (2, 4)], 1: [(4, 8), (5, 6)], 2: [(8, 9)]}  # by hand, in document positions
    for index, document_spans in inside.items():
        framed = blocks.block_spans(index, spans).tolist()
        assert framed == [[start - 4 * index + 1, end - 4 * index + 1] for start, end in document_spans]
        for (start, end), (doc_start, doc_end) in zip(framed, document_spans):
            assert blocks[index][start:end].tolist() == document[doc_start:doc_end].tolist()
