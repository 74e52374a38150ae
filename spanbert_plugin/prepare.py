"""spanbert-prepare: raw text -> a fairseq data directory for span_masked_lm.

Input: UTF-8 text, one sentence or paragraph per line, a blank line between
documents. Output (``--destdir``): ``dict.txt`` (every symbol in id order, with
a mask symbol), ``train``/``valid`` binarized with one item per document (so
document boundaries are kept), the tokenizer files and ``prepare_stats.json``.
The destination is written to a temporary folder and moved into place only
when everything succeeded.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from tqdm import tqdm

from .file_utils import OutputError, atomic_directory, check_destination
from .tokenization import (
    SentencePieceTokenizer,
    TokenizerError,
    WordPieceTokenizer,
    read_wordpiece_vocab,
)


class PrepareError(Exception):
    """Bad input for spanbert-prepare; the message names the file and the problem."""


def read_documents(path):
    """Read and validate a corpus file; return its documents as lists of lines."""
    if not os.path.exists(path):
        raise PrepareError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise PrepareError(f"{path}: not a regular file")
    if os.path.getsize(path) == 0:
        raise PrepareError(f"{path}: file is empty")
    documents, current, empty_documents = [], [], 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
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
    if args.tokenizer == "wordpiece":
        if not args.wordpiece_vocab:
            raise PrepareError("--tokenizer wordpiece needs --wordpiece-vocab FILE (a BERT vocab.txt)")
        read_wordpiece_vocab(args.wordpiece_vocab)  # validates the special tokens
        return WordPieceTokenizer(args.wordpiece_vocab, lowercase=args.lowercase)
    if args.vocab_size < 8:
        raise PrepareError(f"--vocab-size must be at least 8, got {args.vocab_size}")
    return SentencePieceTokenizer.train(
        args.train, workdir, args.vocab_size, character_coverage=args.character_coverage
    )


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
    """Run the whole preparation into ``args.destdir``; raise PrepareError on bad input."""
    from .data.dictionary import SpanBertDictionary

    destdir = os.path.abspath(args.destdir)
    inputs = [p for p in (args.train, args.valid, args.wordpiece_vocab) if p]
    check_destination(args.destdir, "spanbert-prepare", inputs, args.force)
    train_docs, train_empty = read_documents(args.train)
    if args.valid:
        valid_docs, valid_empty = read_documents(args.valid)
    else:
        if len(train_docs) < 2:
            raise PrepareError(f"{args.train}: a single document cannot be split into train and valid; pass --valid FILE")
        n_valid = max(1, int(round(len(train_docs) * args.valid_fraction)))
        train_docs, valid_docs, valid_empty = train_docs[:-n_valid], train_docs[-n_valid:], 0

    with atomic_directory(destdir, "spanbert-prepare", inputs, args.force) as workdir:
        tokenizer = build_tokenizer(args, workdir)
        tokenizer.save(workdir)
        vocab_size = len(tokenizer.vocab) + (tokenizer.special_symbols()["mask"] is None)
        stats = {"tokenizer": tokenizer.kind, "vocab_size": vocab_size}
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


def get_parser():
    parser = argparse.ArgumentParser(
        prog="spanbert-prepare",
        description="Tokenize and binarize a text corpus for span_masked_lm pre-training.",
    )
    parser.add_argument("--train", required=True, help="training text: one sentence/paragraph per line, blank line between documents")
    parser.add_argument("--valid", help="validation text (same format); default: hold out the last --valid-fraction of training documents")
    parser.add_argument("--valid-fraction", type=float, default=0.01, help="share of training documents held out when --valid is absent")
    parser.add_argument("--destdir", required=True, help="output fairseq data directory")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --destdir")
    parser.add_argument("--tokenizer", choices=["sentencepiece", "wordpiece"], default="sentencepiece", help="train a sentencepiece model, or use a BERT WordPiece vocab.txt")
    parser.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece vocabulary size")
    parser.add_argument("--character-coverage", type=float, default=0.9995, help="sentencepiece character coverage")
    parser.add_argument("--wordpiece-vocab", help="BERT-style vocab.txt for --tokenizer wordpiece")
    parser.add_argument("--lowercase", action="store_true", help="lower-case (uncased WordPiece vocabularies)")
    return parser


def cli_main(argv=None):
    """Console entry point: exit status 1 and a one-line error on bad input."""
    args = get_parser().parse_args(argv)
    try:
        stats = prepare(args)
    except (PrepareError, TokenizerError, OutputError) as err:
        print(f"spanbert-prepare: error: {err}", file=sys.stderr)
        return 1
    print(f"spanbert-prepare: wrote {args.destdir}: " + json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
