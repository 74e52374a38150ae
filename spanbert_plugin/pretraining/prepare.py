"""spanbert-prepare: raw text -> a fairseq data directory for spanbert_pretraining.

Input: UTF-8 text, one sentence or paragraph per line, a blank line between
documents. Output (``--destdir``): ``dict.txt`` (every symbol in id order, with
a mask symbol), ``train``/``valid`` binarized with one item per document (so
document boundaries are kept), the tokenizer files and ``prepare_stats.json``.
The destination is written to a temporary folder and moved into place only
when everything succeeded.

The command-line interface is ``spanbert_plugin.cli.prepare``; this module
holds the work (``prepare(args)``), so that it can be called with any object
carrying the same attributes.
"""
import codecs
import json
import logging
import os

import numpy as np
import torch
from tqdm import tqdm

from ..core.errors import UsageError
from ..core.file_utils import atomic_directory, check_destination
from ..core.tokenization import SentencePieceTokenizer, VocabSizeTooLarge, WordPieceTokenizer, read_wordpiece_vocab

logger = logging.getLogger(__name__)
COMMAND = "spanbert-prepare"
DEFAULT_VOCAB_SIZE = 8000
DEFAULT_VALID_FRACTION = 0.01


class PrepareError(UsageError):
    """Bad input for spanbert-prepare; the message names the file and the problem."""


def resolve_options(args):
    """Check option combinations and fill in implied values; raise PrepareError naming the flag."""
    if args.tokenizer is None:  # a WordPiece vocabulary implies the WordPiece tokenizer
        args.tokenizer = "wordpiece" if args.wordpiece_vocab else "sentencepiece"
    if args.tokenizer == "wordpiece":
        if not args.wordpiece_vocab:
            raise PrepareError("--tokenizer wordpiece needs --wordpiece-vocab FILE (a BERT vocab.txt)")
        for flag, value in (("--vocab-size", args.vocab_size), ("--character-coverage", args.character_coverage)):
            if value is not None:
                raise PrepareError(f"{flag} applies to sentencepiece only; a WordPiece vocabulary is fixed by --wordpiece-vocab")
    elif args.wordpiece_vocab:
        raise PrepareError("--wordpiece-vocab needs --tokenizer wordpiece (or leave --tokenizer out)")
    if args.vocab_size is not None and args.vocab_size < 8:
        raise PrepareError(f"--vocab-size must be at least 8, got {args.vocab_size}")
    if args.character_coverage is not None and not 0 < args.character_coverage <= 1:
        raise PrepareError(f"--character-coverage must be in (0, 1], got {args.character_coverage}")
    if args.valid_fraction is not None:
        if args.valid:
            raise PrepareError("--valid-fraction and --valid exclude each other: the valid split is either held out or given")
        if not 0 < args.valid_fraction < 1:  # also false for nan
            raise PrepareError(
                f"--valid-fraction must be in (0, 1), got {args.valid_fraction}; spanbert_pretraining needs a valid "
                "split, so pass --valid FILE or a fraction in (0, 1)"
            )
    return args


def read_documents(path):
    """Read and validate a corpus file; return its documents as lists of lines."""
    if not os.path.exists(path):
        raise PrepareError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise PrepareError(f"{path}: not a regular file (the text is read twice, so pipes cannot be used)")
    if os.path.getsize(path) == 0:
        raise PrepareError(f"{path}: file is empty")
    try:
        with open(path, "rb") as f:
            return _split_documents(path, f)
    except OSError as err:
        raise PrepareError(f"{path}: cannot read ({err.strerror})") from None


def _split_documents(path, f):
    documents, current, empty_documents = [], [], 0
    for line_no, raw in enumerate(f, 1):
        if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
            raw = raw[len(codecs.BOM_UTF8):]  # a byte-order mark is not text
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise PrepareError(
                f"{path}:{line_no}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte column {err.start + 1})"
            ) from None
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            documents.append(current)
            current = []
        elif line_no > 1:
            empty_documents += 1  # a second blank line in a row: an empty document
    if current:
        documents.append(current)
    if not documents:
        raise PrepareError(f"{path}: no non-blank line")
    return documents, empty_documents


def build_tokenizer(args, workdir):
    """The WordPiece tokenizer of ``--wordpiece-vocab``, or a sentencepiece model trained into ``workdir``.

    Without ``--vocab-size``, a text too small for the default vocabulary gets
    the largest one it supports, with a warning.
    """
    if args.tokenizer == "wordpiece":
        return WordPieceTokenizer(args.wordpiece_vocab, lowercase=args.lowercase)
    coverage = 0.9995 if args.character_coverage is None else args.character_coverage
    vocab_size = DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
    for _ in range(3):  # sentencepiece's bound can shrink a little on the retry
        try:
            return SentencePieceTokenizer.train(args.train, workdir, vocab_size, character_coverage=coverage,
                                                lowercase=args.lowercase)
        except VocabSizeTooLarge as err:
            if args.vocab_size is not None or err.largest < 8:
                raise
            logger.warning(f"{args.train}: too small for the default vocabulary of {DEFAULT_VOCAB_SIZE} pieces; "
                           f"using {err.largest}, the largest it supports (set --vocab-size to choose)")
            vocab_size = err.largest
    raise PrepareError(f"{args.train}: could not fit a sentencepiece vocabulary to this text; pass --vocab-size")


def hold_out(documents, path, fraction=None):
    """Split the last ``fraction`` of the documents (at least one) off as the valid split."""
    fraction = DEFAULT_VALID_FRACTION if fraction is None else fraction
    if len(documents) < 2:
        raise PrepareError(f"{path}: a single document cannot be split into train and valid; pass --valid FILE")
    n_valid = min(len(documents) - 1, max(1, int(round(len(documents) * fraction))))
    return documents[:-n_valid], documents[-n_valid:]


def binarize(documents, tokenizer, prefix, vocab_size, desc, batch_lines=2048):
    """Tokenize documents and write them as one fairseq mmap item each; return token counts."""
    from fairseq.data import indexed_dataset

    dtype = indexed_dataset.best_fitting_int_dtype(vocab_size)
    builder = indexed_dataset.MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    counts = np.zeros(vocab_size, dtype=np.int64)
    lines = [line for doc in documents for line in doc]
    doc_of_line = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
    pending, pending_doc, num_tokens = [], 0, 0
    with tqdm(total=len(lines), desc=desc, unit="line", disable=None) as bar:
        for start in range(0, len(lines), batch_lines):
            batch_ids = tokenizer.encode_ids(lines[start : start + batch_lines])
            for doc, ids in zip(doc_of_line[start : start + batch_lines], batch_ids):
                if doc != pending_doc:
                    num_tokens += _flush(builder, pending, counts)
                    pending, pending_doc = [], doc
                pending.append(ids)
            bar.update(len(batch_ids))
    num_tokens += _flush(builder, pending, counts)
    builder.finalize(prefix + ".idx")
    return counts, num_tokens


def _flush(builder, pieces, counts):
    # one conversion per line, not per token
    tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces]) if pieces else np.zeros(0, np.int64)
    builder.add_item(torch.from_numpy(tokens))
    counts += np.bincount(tokens, minlength=len(counts))[: len(counts)]
    return len(tokens)


def prepare(args):
    """Run the whole preparation into ``args.destdir``; raise a UsageError (one line) on bad input.

    ``args`` carries the command's options (see ``spanbert_plugin.cli.prepare``).
    """
    from ..core.dictionary import SpanBertDictionary

    resolve_options(args)
    inputs = [p for p in (args.train, args.valid, args.wordpiece_vocab) if p]
    check_destination(args.destdir, COMMAND, inputs, args.force)
    if args.wordpiece_vocab:
        read_wordpiece_vocab(args.wordpiece_vocab)  # bad vocabularies fail before the corpus is read
    train_docs, train_empty = read_documents(args.train)
    if args.valid:
        valid_docs, valid_empty = read_documents(args.valid)
    else:
        train_docs, valid_docs = hold_out(train_docs, args.train, args.valid_fraction)
        valid_empty = 0

    with atomic_directory(args.destdir, COMMAND, inputs, args.force) as workdir:
        tokenizer = build_tokenizer(args, workdir)
        tokenizer.save(workdir)
        vocab_size = len(tokenizer.vocab) + (tokenizer.special_symbols()["mask"] is None)
        stats = {"tokenizer": tokenizer.kind, "vocab_size": vocab_size, "lowercase": bool(tokenizer.lowercase)}
        counts = np.zeros(vocab_size, dtype=np.int64)
        for split, docs, empty in (("train", train_docs, train_empty), ("valid", valid_docs, valid_empty)):
            split_counts, n_tokens = binarize(docs, tokenizer, os.path.join(workdir, split), vocab_size, f"binarize {split}")
            if split == "train":
                counts += split_counts
            stats[split] = {
                "documents": len(docs),
                "lines": sum(len(d) for d in docs),
                "tokens": n_tokens,
                "empty_documents_skipped": empty,
                "unk_tokens": int(split_counts[tokenizer.vocab.index(tokenizer.special_symbols()["unk"])]),
            }
        SpanBertDictionary.from_tokenizer(tokenizer, counts).save(os.path.join(workdir, "dict.txt"))
        with open(os.path.join(workdir, "prepare_stats.json"), "w") as f:
            json.dump(stats, f, indent=2)
    return stats

