"""Shared input/output of the fine-tuning data commands (QA, relation extraction, classification).

A fine-tuning data folder starts from a tokenizer folder (``--tokenizer-from``:
a ``spanbert-prepare`` or ``spanbert-import-hf`` output), whose ``dict.txt``
and tokenizer files are copied unchanged, so token ids stay the checkpoint's.
"""
import os
import shutil

from .data.dictionary import SpanBertDictionary
from .tokenization import META_FILE, SPM_FILE, WORDPIECE_FILE, SpanTokenizer, TokenizerError, load_tokenizer

TOKENIZER_FILES = ("dict.txt", META_FILE, SPM_FILE, WORDPIECE_FILE)


def load_tokenizer_folder(folder: str, flag: str = "--tokenizer-from"):
    """(tokenizer, dictionary) of a tokenizer folder; TokenizerError names what is missing."""
    if not os.path.isdir(folder):
        raise TokenizerError(f"{flag} {folder}: no such folder")
    dict_path = os.path.join(folder, "dict.txt")
    if not os.path.isfile(dict_path):
        raise TokenizerError(f"{flag} {folder}: no dict.txt (expected a spanbert-prepare or spanbert-import-hf output)")
    if not os.path.isfile(os.path.join(folder, META_FILE)):
        raise TokenizerError(f"{flag} {folder}: no {META_FILE} (expected a spanbert-prepare or spanbert-import-hf output)")
    tokenizer = load_tokenizer(folder)
    try:
        dictionary = SpanBertDictionary.load(dict_path)
    except ValueError as err:
        raise TokenizerError(str(err)) from None
    if dictionary.symbols[: len(tokenizer.vocab)] != list(tokenizer.vocab):
        raise TokenizerError(f"{dict_path}: does not list the tokenizer's vocabulary in id order")
    return tokenizer, dictionary


def copy_tokenizer_files(src: str, dst: str) -> None:
    """Copy dict.txt and the tokenizer files of ``src`` into ``dst``."""
    for name in TOKENIZER_FILES:
        path = os.path.join(src, name)
        if os.path.isfile(path):
            shutil.copyfile(path, os.path.join(dst, name))


def write_token_items(items, prefix: str, vocab_size: int) -> None:
    """Write sequences of token ids as one fairseq mmap item each (``prefix``.bin/.idx)."""
    import numpy as np
    import torch
    from fairseq.data import indexed_dataset

    dtype = indexed_dataset.best_fitting_int_dtype(vocab_size)
    builder = indexed_dataset.MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for ids in items:
        builder.add_item(torch.from_numpy(np.asarray(ids, dtype=np.int64)))
    builder.finalize(prefix + ".idx")


__all__ = ["SpanTokenizer", "TokenizerError", "copy_tokenizer_files", "load_tokenizer_folder", "write_token_items"]
