"""spanbert-prepare: raw text -> a fairseq data directory for spanbert_pretraining.

Input: UTF-8 files, folders and glob patterns, plain or gzip; by default one
sentence or paragraph per line and a blank line between documents, or one
document per file (``--document-per-file``), or hard-wrapped paragraphs joined
(``--join-wrapped-lines``). Output (``--destdir``): ``dict.txt`` (every symbol
in id order, with a mask symbol), ``train``/``valid`` binarized with one item
per document (so document boundaries are kept), the tokenizer files,
``prepare_stats.json``, and with ``--annotate`` the entity and noun-phrase spans
(``annotate.py``). The destination is written to a temporary folder and moved
into place only when everything succeeded.

The corpus is never held in memory: documents are streamed from the files,
encoded in chunks of about ``DEFAULT_CHUNK_CHARS`` characters (on ``--workers``
processes, at most two chunks each in flight, results taken in order so the
output does not depend on the number of workers) and appended to fairseq's
``MMapIndexedDatasetBuilder`` one document at a time. The files are read twice:
once for sentencepiece training (or, for WordPiece with a held-out valid split,
to count documents), once for encoding.

The command-line interface is ``spanbert_plugin.cli.prepare``; this module
holds the work (``prepare(args)``), so that it can be called with any object
carrying the same attributes.
"""
import codecs
import fnmatch
import glob
import gzip
import json
import logging
import os
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Iterator, List

import numpy as np

from ..core.progress import heartbeat, progress_bar
from ..core.errors import UsageError
from ..core.file_utils import FolderReadWhole, atomic_directory, check_destination
from ..core.tokenization import (
    SentencePieceTokenizer, TokenizerError, VocabSizeTooLarge, VocabularyFit, WordPieceTokenizer, read_wordpiece_vocab,
)
from .annotate import SPAN_KINDS, annotator_for, document_spans, span_file

logger = logging.getLogger(__name__)
COMMAND = "spanbert-prepare"
DEFAULT_VOCAB_SIZE = 8000
DEFAULT_VALID_FRACTION = 0.01
DEFAULT_CHUNK_CHARS = 1 << 20  # characters encoded per task: big enough to amortise, small enough to bound memory
GZIP_MAGIC = b"\x1f\x8b"
SPM_TRAINING_TEXT = ".spm_training_text.txt"


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


def folders_read_whole(specs) -> List[FolderReadWhole]:
    """The folders ``specs`` read with everything under them: folders given, and the fixed part of a pattern whose
    first wildcard is a recursive ``**`` ('corpus/**/*.txt' reads all of corpus/). No destination may lie inside."""
    folders = []
    for spec in specs:
        if os.path.isdir(spec):
            folders.append(FolderReadWhole(spec))
        elif not os.path.lexists(spec) and glob.has_magic(spec):
            parts = spec.split(os.sep)
            first = next(i for i, part in enumerate(parts) if glob.has_magic(part))
            if parts[first] == "**":
                folders.append(FolderReadWhole(os.sep.join(parts[:first]) or "."))
    return folders


# files a spanbert-prepare folder holds (a sample of each kind: what a corpus pattern must not match)
OUTPUT_NAMES = ("dict.txt", "vocab.txt", "prepare_stats.json", "spanbert_tokenizer.json", "tokenizer.json",
                "train.bin", "train.idx", "valid.bin", "valid.idx", "spm.model", "spm.vocab")


def _pattern_matches(pattern_parts, path_parts) -> bool:
    """glob's rule, component by component: ``*`` and ``?`` stay inside one name, ``**`` spans any number."""
    if not pattern_parts:
        return not path_parts
    head, rest = pattern_parts[0], pattern_parts[1:]
    if head == "**":
        return _pattern_matches(rest, path_parts) or (bool(path_parts) and _pattern_matches(pattern_parts, path_parts[1:]))
    return bool(path_parts) and fnmatch.fnmatchcase(path_parts[0], head) and _pattern_matches(rest, path_parts[1:])


def check_patterns_miss_destination(specs, destination: str) -> None:
    """PrepareError when a corpus pattern would match files of the output (``'corpus/*/*.txt'`` and ``--destdir
    corpus/out``: the next run with the same pattern would read its dict.txt as text)."""
    def parts(path):
        return os.path.normpath(os.path.join(os.getcwd(), path)).split(os.sep)

    for spec in specs:
        if os.path.lexists(spec) or not glob.has_magic(spec):
            continue
        # a folder the pattern matches is read whole: the destination or a folder above it too
        above = parts(destination)
        holding = [os.sep.join(above[:k]) for k in range(2, len(above) + 1) if _pattern_matches(parts(spec), above[:k])]
        if holding:
            raise PrepareError(f"--destdir {destination}: the pattern {spec} matches the folder {holding[0]}, which "
                               "is read whole, output included, by a later run with that pattern; choose a "
                               "destination outside what the pattern matches")
        matched = [name for name in OUTPUT_NAMES if _pattern_matches(parts(spec), parts(os.path.join(destination, name)))]
        if matched:
            raise PrepareError(f"--destdir {destination}: the pattern {spec} matches its output ({matched[0]}), "
                               "which a later run with that pattern would read as text; choose a destination "
                               "outside what the pattern matches")


def expand_inputs(specs, flag):
    """The files named by ``specs``: files, folders (every file under them, sorted) and glob patterns.

    Order is the order given, each folder and pattern sorted, so a corpus always
    reads in the same order. A name that matches nothing, or that is not a
    regular file (a pipe: the text is read twice), is a one-line error.
    """
    specs = [specs] if isinstance(specs, str) else list(specs)
    files, named_by = [], {}
    for spec in specs:
        if os.path.isdir(spec):
            found = _files_under(spec)
            if not found:
                raise PrepareError(f"{flag} {spec}: folder holds no files")
        elif os.path.lexists(spec) or not glob.has_magic(spec):
            found = [spec]
        else:
            matched = sorted(glob.glob(spec, recursive=True))
            if not matched:
                raise PrepareError(f"{flag} {spec}: no file matches this pattern")
            # '**' matches a folder and the files under it: each file once
            found = list(dict.fromkeys(
                path for match in matched for path in (_files_under(match) if os.path.isdir(match) else [match])))
            if not found:
                raise PrepareError(f"{flag} {spec}: the folders this pattern matches hold no files")
        for path in found:
            if not os.path.exists(path):
                raise PrepareError(f"{path}: no such file")
            if not os.path.isfile(path):
                raise PrepareError(f"{path}: not a regular file (the text is read twice, so pipes cannot be used)")
            if os.path.getsize(path) == 0:
                raise PrepareError(f"{path}: file is empty")
            key = os.path.realpath(path)
            if key in named_by:  # on purpose (a corpus weighted up) or by overlapping paths: said, and read again
                logger.warning(f"{path}: named twice ({named_by[key]} and {spec}): its documents are read twice")
            named_by[key] = spec
        files.extend(found)
    return files


def _files_under(folder):
    """Every file under ``folder``, sorted; hidden files and hidden folders (.git, .ipynb_checkpoints) skipped."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(os.path.join(root, name) for name in names if not name.startswith("."))
    return sorted(found)


def _open_binary(path):
    """``path`` opened for reading bytes; gzip files (by their magic number) decompressed on the fly."""
    try:
        f = open(path, "rb")
        if f.peek(2)[:2] == GZIP_MAGIC:
            return gzip.GzipFile(fileobj=f, mode="rb")
        return f
    except OSError as err:
        raise PrepareError(f"{path}: cannot read ({err.strerror})") from None


def _decoded_lines(path):
    """(line number, stripped text) of every line of a plain or gzip UTF-8 file; errors name the line."""
    try:
        with _open_binary(path) as f:
            for line_no, raw in enumerate(f, 1):
                if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8):]  # a byte-order mark is not text
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise PrepareError(
                        f"{path}:{line_no}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at byte column {err.start + 1})"
                    ) from None
                yield line_no, line.strip()
    except (OSError, EOFError, zlib.error) as err:  # damaged gzip data (a valid header, garbage after), or a read error
        raise PrepareError(f"{path}: cannot read ({getattr(err, 'strerror', None) or err})") from None


@dataclass
class CorpusReader:
    """Streams the documents of a list of files, one list of lines (paragraphs) per document.

    Layouts: by default a blank line ends a document (a file's end too);
    ``document_per_file`` makes each file one document (blank lines are only
    paragraph breaks); ``join_wrapped_lines`` joins the hard-wrapped lines of a
    paragraph with a space (a blank line ends the paragraph) and implies one
    document per file, as Project Gutenberg books need. Only one document is held
    at a time. ``empty_documents`` counts the extra blank lines of the default
    layout (empty documents, skipped), after a full pass.
    """

    files: List[str]
    document_per_file: bool = False
    join_wrapped_lines: bool = False
    empty_documents: int = 0

    def __iter__(self) -> Iterator[List[str]]:
        self.empty_documents = 0
        for path in self.files:
            any_text = False
            for document in self._file_documents(path):
                any_text = True
                yield document
            if not any_text:  # blank lines only, or a compressed file of nothing
                raise PrepareError(f"{path}: no non-blank line")

    def _file_documents(self, path):
        whole_file = self.document_per_file or self.join_wrapped_lines
        current, paragraph = [], []
        for line_no, line in _decoded_lines(path):
            if self.join_wrapped_lines:
                if line:
                    paragraph.append(line)
                elif paragraph:
                    current.append(" ".join(paragraph))
                    paragraph = []
            elif line:
                current.append(line)
            elif current and not whole_file:
                yield current
                current = []
            elif line_no > 1 and not whole_file:
                self.empty_documents += 1  # a second blank line in a row: an empty document
        if paragraph:
            current.append(" ".join(paragraph))
        if current:
            yield current


def read_documents(path, document_per_file=False, join_wrapped_lines=False):
    """All documents of the files ``path`` names (lists of lines) and the count of empty ones skipped."""
    reader = CorpusReader(expand_inputs(path, "--train"), document_per_file, join_wrapped_lines)
    documents = list(reader)
    return documents, reader.empty_documents


def build_tokenizer(args, workdir, reader):
    """The WordPiece tokenizer of ``--wordpiece-vocab``, or a sentencepiece model trained into ``workdir``.

    The corpus is streamed once (checked and its documents counted) into a
    temporary text file in ``workdir`` of its paragraphs, one per line, which
    sentencepiece trains on (a seeded sample of ``core.tokenization.SPM_TRAINING_LINES`` paragraphs where it holds
    more); it is deleted after
    training. Returns the tokenizer and the number of training documents
    (None when the corpus was not read). Without ``--vocab-size``, a text too small
    for the default vocabulary gets the largest one it supports, with a warning.
    """
    if args.tokenizer == "wordpiece":
        return WordPieceTokenizer(args.wordpiece_vocab, lowercase=args.lowercase), None
    shown = ", ".join(reader.files)
    text_file = os.path.join(workdir, SPM_TRAINING_TEXT)
    num_documents = 0
    with open(text_file, "w", encoding="utf-8") as out, progress_bar(desc="read", unit="doc") as bar:
        for document in reader:
            out.write("\n".join(document) + "\n")
            num_documents += 1
            bar.update(1)
    try:
        with heartbeat(f"{COMMAND}: training the sentencepiece model"):
            return _train_sentencepiece(args, workdir, text_file, shown), num_documents
    except TokenizerError as err:
        raise TokenizerError(str(err).replace(text_file, shown)) from None
    finally:
        os.remove(text_file)


def _train_sentencepiece(args, workdir, text_file, shown):
    coverage = 0.9995 if args.character_coverage is None else args.character_coverage
    vocab_size = DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size
    for attempt in range(3):  # sentencepiece's bound can shrink a little on the retry
        try:
            return SentencePieceTokenizer.train(text_file, workdir, vocab_size, character_coverage=coverage,
                                                lowercase=args.lowercase)
        except VocabSizeTooLarge as err:
            if args.vocab_size is not None or err.largest < 8:
                raise
            if attempt == 2:
                break  # no retry left: no warning announcing a size that is not tried
            logger.warning(f"{shown}: too small for the default vocabulary of {DEFAULT_VOCAB_SIZE} pieces; "
                           f"using {err.largest}, the largest it supports (set --vocab-size to choose)")
            vocab_size = err.largest
    raise PrepareError(f"{shown}: could not fit a sentencepiece vocabulary to this text; pass --vocab-size")


def held_out_count(num_documents, path, fraction=None):
    """How many trailing documents form the valid split: ``fraction`` of them, at least one, leaving one for train."""
    fraction = DEFAULT_VALID_FRACTION if fraction is None else fraction
    if num_documents < 2:
        raise PrepareError(f"{path}: a single document cannot be split into train and valid; pass --valid FILE")
    return min(num_documents - 1, max(1, int(round(num_documents * fraction))))


def _chunks(documents, chunk_chars):
    """Consecutive lists of documents of about ``chunk_chars`` characters (a long document is one chunk)."""
    chunk, size = [], 0
    for document in documents:
        chunk.append(document)
        size += sum(len(line) for line in document)
        if size >= chunk_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


_WORKER = {}


def _start_worker(tokenizer_dir, annotator):
    from ..core.tokenization import load_tokenizer

    _WORKER["tokenizer"] = load_tokenizer(tokenizer_dir)
    _WORKER["annotator"] = annotator.load() if annotator is not None else None


def _start_pool_worker(tokenizer_dir, annotator):
    # Ctrl-C in a terminal (and a hang-up) signals the whole process group: a worker that died of it while holding
    # the pool's queue lock left the parent's pool.terminate() waiting for ever; the parent alone stops the pool
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _start_worker(tokenizer_dir, annotator)


def _encode_chunk(documents):
    """Token ids per document (int32), and with an annotator its span arrays; runs in a worker or in-process."""
    tokenizer, annotator = _WORKER["tokenizer"], _WORKER["annotator"]
    lines = [line for document in documents for line in document]
    if annotator is None:
        ids, spans = tokenizer.encode_ids(lines), None
    else:
        encodings = [tokenizer.encode(line) for line in lines]
        ids = [e.ids for e in encodings]
        spans = annotator.spans(lines, encodings)
    out, line = [], 0
    for document in documents:
        pieces = ids[line : line + len(document)]
        tokens = np.concatenate([np.asarray(p, dtype=np.int32) for p in pieces]) if pieces else np.zeros(0, np.int32)
        if spans is None:
            out.append((tokens, None))
        else:
            lengths = np.array([len(p) for p in pieces], dtype=np.int64)
            out.append((tokens, document_spans(spans[line : line + len(document)], lengths)))
        line += len(document)
    return out


def _encoded_documents(documents, tokenizer_dir, workers, annotator, chunk_chars):
    """(tokens, spans) per document, in corpus order, encoding chunks on ``workers`` processes.

    The worker processes start when this is called (so they load while the caller
    does other work); the result is a generator. At most two chunks per worker
    are in flight, so memory stays bounded whatever the corpus size; results are
    taken in the order of the chunks, so the output does not depend on the number
    of workers.
    """
    chunks = _chunks(documents, chunk_chars)
    if workers <= 1:
        return _encoded_in_process(chunks, tokenizer_dir, annotator)
    return _encoded_on_pool(encoding_pool(workers, tokenizer_dir, annotator), chunks, workers)


def encoding_pool(workers, tokenizer_dir, annotator):
    """The worker processes that encode chunks, each with the tokenizer (and annotator) loaded."""
    import multiprocessing

    # spawn, not fork: the tokenizers' and torch's thread pools do not survive a fork
    return multiprocessing.get_context("spawn").Pool(workers, initializer=_start_pool_worker,
                                                     initargs=(tokenizer_dir, annotator))


def _encoded_in_process(chunks, tokenizer_dir, annotator):
    _start_worker(tokenizer_dir, annotator)
    for chunk in chunks:
        yield from _encode_chunk(chunk)


def _encoded_on_pool(pool, chunks, workers):
    try:
        pending = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                yield from pending.popleft().get()
        while pending:
            yield from pending.popleft().get()
        pool.close()
    finally:
        # on an error or a signal the workers are stopped at once, not after their current chunk
        pool.terminate()
        pool.join()


class SplitWriter:
    """One split's binaries, written item by item: tokens, and with annotations one span file per kind."""

    def __init__(self, prefix, vocab_size, span_kinds=()):
        from fairseq.data import indexed_dataset

        self.prefix = prefix
        self.builder = indexed_dataset.MMapIndexedDatasetBuilder(
            prefix + ".bin", dtype=indexed_dataset.best_fitting_int_dtype(vocab_size))
        self.span_builders = {
            kind: indexed_dataset.MMapIndexedDatasetBuilder(span_file(prefix, kind) + ".bin", dtype=np.int32)
            for kind in span_kinds
        }
        self.counts = np.zeros(vocab_size, dtype=np.int64)
        self.documents = self.tokens = self.lines = self.documents_without_tokens = 0
        self.spans = {kind: 0 for kind in span_kinds}

    def add(self, tokens, spans, num_lines):
        import torch

        if not len(tokens):  # only characters the tokenizer drops (control characters, say): skipped, and counted
            self.documents_without_tokens += 1
            return
        self.builder.add_item(torch.from_numpy(tokens.astype(np.int64)))
        self.counts += np.bincount(tokens, minlength=len(self.counts))[: len(self.counts)]
        self.documents += 1
        self.tokens += len(tokens)
        self.lines += num_lines
        for kind, builder in self.span_builders.items():
            builder.add_item(torch.from_numpy(spans[kind].reshape(-1)))
            self.spans[kind] += len(spans[kind])

    def finalize(self):
        self.builder.finalize(self.prefix + ".idx")
        for kind, builder in self.span_builders.items():
            builder.finalize(span_file(self.prefix, kind) + ".idx")


def _line_counting(documents, counter, fit=None):
    """The documents, each one's line count appended to ``counter``; ``fit.upper_case_seen`` set on the way."""
    for document in documents:
        counter.append(len(document))
        if fit is not None and not fit.upper_case_seen:
            fit.upper_case_seen = any(line != line.lower() for line in document)
        yield document


def binarize(documents, split_of, writers, tokenizer_dir, workers=1, annotator=None, chunk_chars=None, fit=None):
    """Encode ``documents`` (streamed) and write each to ``writers()[split_of(index)]``, one item per document.

    ``writers`` is called once the encoding processes are starting, so that fairseq's import (the writers
    need it) overlaps their start.
    """
    chunk_chars = chunk_chars or DEFAULT_CHUNK_CHARS
    line_counts = deque()
    encoded = _encoded_documents(_line_counting(documents, line_counts, fit), tokenizer_dir, workers, annotator,
                                 chunk_chars)
    try:
        outputs = writers()
        with progress_bar(desc="binarize", unit="doc") as bar:
            for index, (tokens, spans) in enumerate(encoded):
                outputs[split_of(index)].add(tokens, spans, line_counts.popleft())
                bar.update(1)
    finally:
        encoded.close()  # a pool that has not started yielding is stopped too


def check_nothing_changed_while_read(stats, counted, train_files, valid_files):
    """A corpus read twice (counted, then encoded) must give the same documents both times, and each split one at
    least: a file emptied or rewritten meanwhile would otherwise leave a folder training cannot use."""
    named = lambda files: files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more)"  # noqa: E731
    read = sum(stats[split]["documents"] + stats[split]["documents_without_tokens"]
               for split in (("train",) if valid_files else ("train", "valid")))
    if counted is not None and read != counted:
        raise PrepareError(f"--train {named(train_files)}: changed while it was read ({counted} documents counted, "
                           f"{read} encoded); prepare again once it is complete")
    for split, files in (("train", train_files), ("valid", valid_files or train_files)):
        if not stats[split]["documents"] and stats[split]["documents_without_tokens"]:
            raise PrepareError(f"--{split if valid_files else 'train'} {named(files)}: the {split} split's "
                               f"{stats[split]['documents_without_tokens']} documents hold no token the tokenizer "
                               "keeps; nothing written")
        if not stats[split]["documents"]:
            raise PrepareError(f"--{split if valid_files else 'train'} {named(files)}: no {split} document was read "
                               "(the input was emptied while it was read?); nothing written")


def _import_in_background(module):
    """Import ``module`` on a thread: fairseq and torch take seconds, which then overlap reading and training."""
    import importlib
    import threading

    threading.Thread(target=importlib.import_module, args=(module,), daemon=True).start()


def prepare(args):
    """Run the whole preparation into ``args.destdir``; raise a UsageError (one line) on bad input.

    ``args`` carries the command's options (see ``spanbert_plugin.cli.prepare``).
    """
    resolve_options(args)
    _import_in_background("fairseq.data.indexed_dataset")
    workers = getattr(args, "workers", None)
    workers = 1 if workers is None else workers
    if workers < 1:
        raise PrepareError(f"--workers must be at least 1, got {workers}")
    layout = dict(document_per_file=getattr(args, "document_per_file", False),
                  join_wrapped_lines=getattr(args, "join_wrapped_lines", False))
    annotator = annotator_for(args)
    train_files = expand_inputs(args.train, "--train")
    valid_files = expand_inputs(args.valid, "--valid") if args.valid else None
    given = [args.train] if isinstance(args.train, str) else list(args.train or [])
    given += [args.valid] if isinstance(args.valid, str) else list(args.valid or [])
    inputs = [*train_files, *(valid_files or []), *([args.wordpiece_vocab] if args.wordpiece_vocab else []),
              *folders_read_whole(given)]
    check_destination(args.destdir, COMMAND, inputs, args.force)
    check_patterns_miss_destination(given, args.destdir)
    if args.wordpiece_vocab:
        read_wordpiece_vocab(args.wordpiece_vocab)  # bad vocabularies fail before the corpus is read
    if annotator is not None:
        annotator.check()  # a missing spaCy or pipeline fails before the corpus is read
    train_reader = CorpusReader(train_files, **layout)
    valid_reader = CorpusReader(valid_files, **layout) if valid_files else None

    with atomic_directory(args.destdir, COMMAND, inputs, args.force) as workdir:
        tokenizer, num_train = build_tokenizer(args, workdir, train_reader)
        tokenizer.save(workdir)
        if valid_reader is None and num_train is None:
            num_train = sum(1 for _ in progress_bar(train_reader, desc="count", unit="doc"))  # the last are held out
        n_valid = 0 if valid_reader else held_out_count(num_train, ", ".join(train_files), args.valid_fraction)
        vocab_size = len(tokenizer.vocab) + (tokenizer.special_symbols()["mask"] is None)
        kinds = SPAN_KINDS if annotator is not None else ()
        made = {}

        def writers():
            if not made:
                made.update({split: SplitWriter(os.path.join(workdir, split), vocab_size, kinds) for split in ("train", "valid")})
            return made

        # the split of the training files' document ``index``: the last n_valid are held out without --valid
        split_of_train_document = ((lambda index: "train") if valid_reader else
                                   (lambda index: "train" if index < num_train - n_valid else "valid"))
        fit = VocabularyFit()  # tokens are counted by the writers; the text's case is seen here (encoding runs in workers)
        binarize(train_reader, split_of_train_document, writers, workdir, workers, annotator, fit=fit)
        train_empty = train_reader.empty_documents
        valid_empty = 0
        if valid_reader:
            binarize(valid_reader, lambda index: "valid", writers, workdir, workers, annotator, fit=fit)
            valid_empty = valid_reader.empty_documents
        from ..core.dictionary import SpanBertDictionary

        stats = {"tokenizer": tokenizer.kind, "vocab_size": vocab_size, "lowercase": bool(tokenizer.lowercase)}
        unk = tokenizer.vocab.index(tokenizer.special_symbols()["unk"])
        for split, empty in (("train", train_empty), ("valid", valid_empty)):
            writer = writers()[split]
            writer.finalize()
            stats[split] = {
                "documents": writer.documents,
                "lines": writer.lines,
                "tokens": writer.tokens,
                "empty_documents_skipped": empty,
                "documents_without_tokens": writer.documents_without_tokens,
                "unk_tokens": int(writer.counts[unk]),
            }
            if annotator is not None:
                stats[split]["annotations"] = dict(writer.spans)
        check_nothing_changed_while_read(stats, num_train if valid_reader is None else None, train_files, valid_files)
        if annotator is not None:
            stats["annotator"] = annotator.describe()
        fit.tokens = sum(stats[split]["tokens"] for split in ("train", "valid"))
        fit.unk_tokens = sum(stats[split]["unk_tokens"] for split in ("train", "valid"))
        shown = train_files[0] if len(train_files) == 1 else f"--train {train_files[0]} (and {len(train_files) - 1} more)"
        for line in fit.warnings(tokenizer, shown):
            logger.warning(line)
        SpanBertDictionary.from_tokenizer(tokenizer, writers()["train"].counts).save(os.path.join(workdir, "dict.txt"))
        with open(os.path.join(workdir, "prepare_stats.json"), "w") as f:
            json.dump(stats, f, indent=2)
    return stats
