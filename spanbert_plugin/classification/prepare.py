"""Read TSV/CSV/JSON Lines classification files, featurise them as BERT inputs, write a prepared folder.

A prepared folder (``spanbert-prepare-classification --destdir CLS``) holds the
tokenizer folder's ``dict.txt`` and tokenizer files, and per split ``S``:

* ``S.bin``/``S.idx``: one fairseq item per example, ``[CLS] A [SEP]`` or
  ``[CLS] A [SEP] B [SEP]``, in input order;
* ``S.segment_a.npy``: length of ``[CLS] A [SEP]`` per example; later tokens
  have token type 1 (BERT's segment B);
* ``S.labels.npy``: int64 class indices into ``labels``, or float64 targets
  with ``--regression`` (-1 / NaN in an unlabelled ``test`` split);
* ``S.ids.json``: the ``--id-column`` values, when given;

and ``classification.json`` (labels, regression, max_seq_length, the columns
and the splits) and ``prepare_stats.json`` (examples, truncations, lengths,
label counts per split).

Pairs longer than ``--max-seq-length`` are truncated longest-first exactly as
HuggingFace fast tokenizers do (``truncation="longest_first"``).
"""
import csv
import io
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ..core.progress import progress_bar
from ..core.errors import UsageError
from ..core.file_utils import atomic_directory, check_destination, is_json_integer, parse_json, read_text
from ..core.finetune_io import (
    copy_tokenizer_files, load_tokenizer_folder, read_prepared_json, register_finetuning_folder,
    warn_if_vocabulary_does_not_fit, write_json,
    write_token_items,
)

COMMAND = "spanbert-prepare-classification"
META_FILE = register_finetuning_folder("classification.json", COMMAND, "sentence_classification")
STATS_FILE = "prepare_stats.json"
FORMATS = ("tsv", "csv", "jsonl")
EXTENSION_FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
DEFAULT_MAX_SEQ_LENGTH = 128  # BERT's and SpanBERT's GLUE setting
ENCODE_CHUNK = 4096  # texts per tokenizer call: progress updates without per-text overhead

Column = Union[int, str]


def parse_columns(spec: str, flag: str, most: int = 2) -> List[Column]:
    """``"sentence1,sentence2"`` or ``"3"`` -> names or 0-based indices (all-digit entries are indices)."""
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in parts) or len(parts) > most:
        wanted = "one column name or 0-based index" if most == 1 else "one or two column names or 0-based indices, comma-separated"
        raise UsageError(f"{flag} {spec!r}: expected {wanted}")
    return [int(p) if p.isdigit() else p for p in parts]


@dataclass
class Table:
    """The columns of one input file that prepare needs, row by row."""

    path: str
    texts: List[List[str]]  # one list per text column
    labels: Optional[List[str]]  # None: the file has no label column (unlabelled test split)
    ids: Optional[List[str]]
    lines: List[int]  # line number of each row, for error messages
    malformed_rows_skipped: int = 0  # rows of another field count (--skip-malformed-rows)

    def __len__(self):
        return len(self.lines)


@dataclass
class ReadOptions:
    """How to find the columns of an input file."""

    text_columns: List[Column]
    label_column: Optional[Column]  # None: the file is read without labels (a test file of its own layout)
    id_column: Optional[Column] = None
    file_format: str = "auto"
    header: str = "auto"  # auto: a header line iff some column is given by name
    skip_malformed: bool = False  # drop rows of another field count (QQP's split lines), as run_glue.py does
    by_name: bool = field(init=False)

    def __post_init__(self):
        columns = [*self.text_columns, self.label_column, self.id_column]
        self.by_name = any(isinstance(c, str) for c in columns)
        if self.label_column is not None and self.label_column in self.text_columns:
            raise UsageError(f"--label-column {self.label_column}: also given in --text-columns; the model "
                             "would read the answer in its input")


def detect_format(path: str, file_format: str) -> str:
    if file_format != "auto":
        return file_format
    kind = EXTENSION_FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise UsageError(f"{path}: cannot tell the format from the extension; pass --format tsv, csv or jsonl")
    return kind


def _read_text(path: str) -> str:
    text = read_text(path)
    if not text.strip():
        raise UsageError(f"{path}: file is empty")
    return text


def _delimited_rows(path: str, text: str, kind: str):
    """(line number, fields) per row; TSV without quoting, as GLUE files need."""
    if kind == "tsv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
    start = 1
    try:
        for row in reader:
            yield start, row if row else [""]  # a blank line is one empty field
            start = reader.line_num + 1
    except csv.Error as err:
        raise UsageError(f"{path}:{reader.line_num}: {err}") from None


def _column_index(path: str, column: Column, header: Optional[List[str]], width: int, flag: str) -> int:
    if isinstance(column, int):
        if column >= width:
            raise UsageError(f"{path}: {flag} {column} does not exist (rows have {width} fields, indices 0..{width - 1})")
        return column
    if header is None:
        raise UsageError(f"{path}: {flag} {column!r} is a name, but the file is read without a header line")
    if column not in header:
        raise UsageError(f"{path}:1: {flag} {column!r} is not a column (header: {', '.join(header)})")
    return header.index(column)


def _read_delimited(path: str, text: str, kind: str, options: ReadOptions, label_required: bool) -> Table:
    rows = list(_delimited_rows(path, text, kind))
    header = None
    if options.header == "yes" or (options.header == "auto" and options.by_name):
        header = [h.strip() for h in rows.pop(0)[1]]
        if not rows:
            raise UsageError(f"{path}: no data rows after the header line")
    materialised = rows
    if header is not None:
        width = len(header)
    elif options.skip_malformed:  # the rows' usual width: the first row may be one of those to skip
        width = Counter(len(row) for _, row in materialised).most_common(1)[0][0]
    else:
        width = len(materialised[0][1])

    def index_of(column, flag):
        return _column_index(path, column, header, width, flag)

    text_index = [index_of(c, "--text-columns") for c in options.text_columns]
    label_index = None
    if options.label_column is not None and (label_required or _column_exists(options.label_column, header, width)):
        label_index = index_of(options.label_column, "--label-column")
        if label_index in text_index:  # one given by name, the other by index
            raise UsageError(f"{path}: --label-column {options.label_column} is the column {label_index} that "
                             "--text-columns also reads; the model would read the answer in its input")
    id_index = index_of(options.id_column, "--id-column") if options.id_column is not None else None
    malformed = [line for line, row in materialised if len(row) != width]
    if malformed and options.skip_malformed:
        print(f"{COMMAND}: warning: {path}: skipped {len(malformed)} row(s) without {width} fields (lines "
              f"{', '.join(map(str, malformed[:5]))}{' ...' if len(malformed) > 5 else ''}), as run_glue.py skips them",
              file=sys.stderr)
        materialised = [(line, row) for line, row in materialised if len(row) == width]
        if not materialised:
            raise UsageError(f"{path}: every data row has another number of fields than the header's {width} "
                             "(--skip-malformed-rows would leave none)")
    elif malformed:
        line, row = next((line, row) for line, row in materialised if len(row) != width)
        raise UsageError(f"{path}:{line}: {len(row)} fields, expected {width} "
                         "(--skip-malformed-rows drops such rows from train and valid)")
    lines = [line for line, _ in materialised]
    texts = [[row[i] for _, row in materialised] for i in text_index]
    labels = None if label_index is None else [row[label_index].strip() for _, row in materialised]
    ids = None if id_index is None else [row[id_index] for _, row in materialised]
    return Table(path, texts, labels, ids, lines, len(malformed) if options.skip_malformed else 0)


def _column_exists(column: Column, header, width: int) -> bool:
    return column < width if isinstance(column, int) else header is not None and column in header


def _read_jsonl(path: str, text: str, options: ReadOptions, label_required: bool) -> Table:
    for flag, column in (("--text-columns", options.text_columns),
                         ("--label-column", [options.label_column] if options.label_column is not None else []),
                         ("--id-column", [options.id_column] if options.id_column is not None else [])):
        indices = [c for c in column if isinstance(c, int)]
        if indices:
            raise UsageError(f"{path}: {flag} {indices[0]} is an index; JSON Lines columns are named by key")
    records, lines = [], []
    for line, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue  # blank lines hold no record
        try:
            record = parse_json(raw, f"{path}:{line}")
        except json.JSONDecodeError as err:
            raise UsageError(f"{path}:{line}: not a JSON object ({err})") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path}:{line}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
        lines.append(line)
    with_labels = options.label_column is not None and (label_required or _labelled(path, records, lines,
                                                                                     options.label_column))

    def column(key, flag, as_text):
        values = []
        for line, record in zip(lines, records):
            if key not in record:
                raise UsageError(f"{path}:{line}: {flag} {key!r} is not a key of this record (keys: {', '.join(record)})")
            value = record[key]
            if as_text and not isinstance(value, str):
                raise UsageError(f"{path}:{line}: {key!r} must be a string, got {json.dumps(value)[:40]}")
            if isinstance(value, (dict, list)) or value is None:
                raise UsageError(f"{path}:{line}: {key!r} must be a string or number, got {json.dumps(value)[:40]}")
            values.append(value if isinstance(value, str) else json.dumps(value))
        return values

    texts = [column(c, "--text-columns", True) for c in options.text_columns]
    labels = [v.strip() for v in column(options.label_column, "--label-column", False)] if with_labels else None
    ids = column(options.id_column, "--id-column", False) if options.id_column is not None else None
    return Table(path, texts, labels, ids, lines)


def _labelled(path: str, records: List[dict], lines: List[int], key: str) -> bool:
    """Does every record of a file whose labels are optional (a test file) hold the label ``key``? None does: False;
    some do: UsageError naming the first record that differs from the file's first."""
    has_label = [key in record for record in records]
    if any(has_label) and not all(has_label):
        line = lines[has_label.index(not has_label[0])]
        differs = (f"no label key {key!r}, but line {lines[0]} has one" if has_label[0] else
                   f"has the label key {key!r}, but line {lines[0]} has none")
        raise UsageError(f"{path}:{line}: {differs}; give every record a label, or none")
    return all(has_label)


def read_table(path: str, options: ReadOptions, label_required: bool = True) -> Table:
    """Read the text, label and id columns of a TSV, CSV or JSON Lines file; UsageError names file and line."""
    kind = detect_format(path, options.file_format)
    text = _read_text(path)
    if kind == "jsonl":
        return _read_jsonl(path, text, options, label_required)
    return _read_delimited(path, text, kind, options, label_required)


def _is_number(label: str) -> bool:
    try:
        float(label)
    except ValueError:
        return False
    return True


def check_for_a_header_read_as_a_row(tables: Sequence[Table], read: ReadOptions) -> None:
    """A first row whose label occurs in no other row of ``tables`` (training and validation) may be a header line.

    With ``--header auto`` and every column given by index, the first line is data; a GLUE file's header line would
    then make its column name ('label') a class. Every file's first row is left out of the comparison: each of
    GLUE's train and dev files starts with that same line. Refused where the evidence is a header's (two files
    start with the same row and go on differently, or the only word among numeric labels), else a warning: a rare
    class may come first.
    """
    if read.header != "auto" or read.by_name:
        return
    labelled = [table for table in tables if table.labels]
    later_labels = {label for table in labelled for label in table.labels[1:]}

    def row(table, i):
        return (tuple(column[i] for column in table.texts), table.labels[i]) if i < len(table) else None

    files = {os.path.realpath(t.path): t for t in labelled}
    # files that start with one row and go on differently (GLUE's train and dev): a header's evidence, where a copy
    # of a file, or its first lines, would share that row with it whatever it is
    shared_first_row = (len(files) > 1 and len({row(t, 0) for t in files.values()}) == 1
                        and len({row(t, 1) for t in files.values()}) == len(files))
    only_word_among_numbers = bool(later_labels) and all(_is_number(label) for label in later_labels)
    for table in files.values():  # a file given twice is checked once
        first = table.labels[0]
        if first in later_labels:
            continue
        where = f"{table.path}:{table.lines[0]}: label {first!r} occurs in no other row of the training and validation files"
        if shared_first_row or (only_word_among_numbers and not _is_number(first)):
            raise UsageError(f"{where}: a header line? Pass --header yes to skip each file's first line, or --header "
                             "no to keep it as data")
        print(f"{COMMAND}: warning: {where}; if it is a header line, pass --header yes", file=sys.stderr)


def label_order(labels: Sequence[str]) -> List[str]:
    """Distinct labels, sorted numerically when all are integers ("0" < "1" < "10"), else as strings."""
    distinct = set(labels)
    try:
        return sorted(distinct, key=int)
    except ValueError:
        return sorted(distinct)


def _marked_unlabelled(labels: Optional[List[str]], label_list: Optional[List[str]]) -> bool:
    """Every label -1 where -1 is no class of the training file (for regression: -1 is a possible target, but a
    whole split of it is no test set)."""
    return bool(labels) and all(label.strip() == "-1" for label in labels) and (
        label_list is None or "-1" not in label_list)


def encode_labels(table: Table, label_list: Optional[List[str]], training_path: str) -> np.ndarray:
    """Class indices (int64) or, with ``label_list`` None, float targets; -1 / NaN when unlabelled."""
    if table.labels is None:
        return np.full(len(table), -1 if label_list is not None else np.nan,
                       dtype=np.int64 if label_list is not None else np.float64)
    for line, label in zip(table.lines, table.labels):
        if not label:
            raise UsageError(f"{table.path}:{line}: empty label")
    if label_list is None:
        targets = np.empty(len(table), dtype=np.float64)
        for i, (line, label) in enumerate(zip(table.lines, table.labels)):
            try:
                targets[i] = float(label)
            except ValueError:
                raise UsageError(f"{table.path}:{line}: --regression needs a number as label, got {label!r}") from None
            if not np.isfinite(targets[i]):
                raise UsageError(f"{table.path}:{line}: label {label!r} is not a finite number")
        return targets
    index = {label: i for i, label in enumerate(label_list)}
    unseen = next(((line, label) for line, label in zip(table.lines, table.labels) if label not in index), None)
    if unseen is not None:
        shown = ", ".join(label_list[:10]) + (" ..." if len(label_list) > 10 else "")
        raise UsageError(f"{table.path}:{unseen[0]}: label {unseen[1]!r} does not occur in the training file "
                         f"{training_path} (its labels: {shown})")
    return np.array([index[label] for label in table.labels], dtype=np.int64)


def truncated_lengths(len_a: np.ndarray, len_b: Optional[np.ndarray], budget: int):
    """Tokens kept of A (and B): longest-first, as HuggingFace fast tokenizers truncate pairs.

    When both must be cut, the shorter one (A when tied) keeps ``budget // 2``
    and the other the rest.
    """
    len_a = np.asarray(len_a, dtype=np.int64)
    if len_b is None:
        return np.minimum(len_a, budget), None
    len_b = np.asarray(len_b, dtype=np.int64)
    a_shorter = len_a <= len_b
    short = np.where(a_shorter, len_a, len_b)
    # the longer one gives up tokens first; both are cut once the shorter exceeds half the budget
    keep_short = np.where(short > budget - short, budget // 2, short)
    keep_long = budget - keep_short
    fits = len_a + len_b <= budget
    keep_a = np.where(fits, len_a, np.where(a_shorter, keep_short, keep_long))
    keep_b = np.where(fits, len_b, np.where(a_shorter, keep_long, keep_short))
    return keep_a, keep_b


def encode_texts(tokenizer, texts: List[str], desc: str) -> List[List[int]]:
    """Token ids of every text, in chunks (one tokenizer call each) with a progress bar."""
    ids = []
    for start in progress_bar(range(0, len(texts), ENCODE_CHUNK), desc=desc, unit="chunk", leave=False):
        ids.extend(tokenizer.encode_ids(texts[start:start + ENCODE_CHUNK]))
    return ids


@dataclass
class Features:
    """Token ids of each example and the length of its ``[CLS] A [SEP]`` part."""

    items: List[np.ndarray]
    segment_a: np.ndarray
    stats: dict


def featurise(table: Table, tokenizer, dictionary, max_seq_length: int, split: str) -> Features:
    """``[CLS] A [SEP] (B [SEP])`` per row, truncated longest-first to ``max_seq_length`` tokens."""
    pair = len(table.texts) == 2
    encoded = [encode_texts(tokenizer, texts, f"tokenize {split}") for texts in table.texts]
    lengths = [np.fromiter(map(len, ids), np.int64, len(ids)) for ids in encoded]
    budget = max_seq_length - (3 if pair else 2)
    keep = truncated_lengths(lengths[0], lengths[1] if pair else None, budget)
    cls, sep = np.array([dictionary.bos()]), np.array([dictionary.eos()])
    items = []
    for i in range(len(table)):
        parts = [cls, np.asarray(encoded[0][i][: keep[0][i]]), sep]
        if pair:
            parts += [np.asarray(encoded[1][i][: keep[1][i]]), sep]
        items.append(np.concatenate(parts).astype(np.int64))
    full = sum(lengths) + (3 if pair else 2)
    kept = sum(k for k in keep if k is not None) + (3 if pair else 2)
    unk = dictionary.unk()
    stats = {
        "examples": len(table),
        "truncated": int((kept < full).sum()),
        "tokens_removed": int((full - kept).sum()),
        "longest_before_truncation": int(full.max()),
        "mean_tokens": round(float(kept.mean()), 2),
        "unk_tokens": sum(ids.count(unk) for column in encoded for ids in column),
        "empty_texts": int(sum((length == 0).sum() for length in lengths)),
    }
    return Features(items, (keep[0] + 2).astype(np.int32), stats)


@dataclass
class PrepareOptions:
    """Everything spanbert-prepare-classification needs besides the input files."""

    tokenizer_from: str
    destdir: str
    read: ReadOptions
    regression: bool = False
    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    force: bool = False


def _label_counts(labels: np.ndarray, label_list: Optional[List[str]]) -> dict:
    if label_list is None:
        finite = labels[np.isfinite(labels)]
        return {"min": float(finite.min()), "max": float(finite.max()), "mean": round(float(finite.mean()), 4)} if len(finite) else {}
    counts = np.bincount(labels[labels >= 0], minlength=len(label_list))
    return {label: int(c) for label, c in zip(label_list, counts)}


def numbered_splits(name: str, files) -> List[Tuple[str, str]]:
    """(split, file) of one or several files of a kind: ``name``, then ``name_1``, ``name_2``, ... (not fairseq's
    ``valid1``: fairseq-train takes a file ``valid1.labels.npy`` for a validation subset ``valid1.labels`` left
    out of ``--valid-subset``, and stops). A file given twice is refused."""
    files = [files] if isinstance(files, str) else list(files or [])
    for i, path in enumerate(files):
        if os.path.abspath(path) in map(os.path.abspath, files[:i]):
            raise UsageError(f"--{name} {path}: given twice (each file is a split of its own)")
    return [(name if i == 0 else f"{name}_{i}", path) for i, path in enumerate(files)]


def prepare_classification(train: str, valid, options: PrepareOptions, test=None,
                           test_read: Optional[ReadOptions] = None) -> dict:
    """Write the prepared folder ``options.destdir``; return its statistics. UsageError on bad input.

    ``valid`` and ``test``: a file or a list of files, the splits ``valid``, ``valid_1``, ... and ``test``,
    ``test_1``, ... (MNLI's matched and mismatched sets, its diagnostic set). ``test_read``: the test files' own
    columns and header (GLUE's test files have another layout than train and dev, and no labels); by default a test
    file is read as the others, its label column optional."""
    valid_splits, test_splits = numbered_splits("valid", valid), numbered_splits("test", test)
    pair = len(options.read.text_columns) == 2
    if len(options.read.text_columns) not in (1, 2):
        raise UsageError(f"--text-columns: expected one or two columns, got {len(options.read.text_columns)}")
    if options.max_seq_length < (4 if pair else 3):
        raise UsageError(f"--max-seq-length {options.max_seq_length}: too short for any text "
                         f"(at least {4 if pair else 3} for {'pairs' if pair else 'single texts'})")
    inputs = [train, *(path for _, path in valid_splits + test_splits), options.tokenizer_from]
    check_destination(options.destdir, COMMAND, inputs, options.force)
    tokenizer, dictionary = load_tokenizer_folder(options.tokenizer_from)
    tables = {"train": read_table(train, options.read)}
    tables.update((split, read_table(path, options.read)) for split, path in valid_splits)
    if not options.regression:
        check_for_a_header_read_as_a_row(list(tables.values()), options.read)
    test_read = replace(test_read or options.read, skip_malformed=False)  # test rows stay aligned with their index
    if test_splits and len(test_read.text_columns) != len(options.read.text_columns):
        raise UsageError(f"--test-text-columns: {len(test_read.text_columns)} column(s), but --text-columns "
                         f"gives {len(options.read.text_columns)}; a test file has the same texts as the others")
    tables.update((split, read_table(path, test_read, label_required=False)) for split, path in test_splits)
    label_list = None if options.regression else label_order(tables["train"].labels)
    if label_list is not None and len(label_list) < 2:
        raise UsageError(f"{train}: every example has the label {label_list[0]!r}; a classifier needs at least two "
                         "classes in the training file (or --regression for numeric targets)")
    for split, path in test_splits:
        if _marked_unlabelled(tables[split].labels, label_list):
            # HuggingFace datasets export a test split without labels as label -1
            print(f"{COMMAND}: warning: {path}: every label is -1 (how HuggingFace datasets mark a split without "
                  "labels): read as unlabelled", file=sys.stderr)
            tables[split] = replace(tables[split], labels=None)
    labels = {split: encode_labels(table, label_list, train) for split, table in tables.items()}
    meta = {
        "format_version": 1,
        "regression": options.regression,
        "num_classes": 1 if options.regression else len(label_list),
        "labels": label_list,
        "positive_label": label_list[1] if label_list is not None and len(label_list) == 2 else None,
        "pair": pair,
        "max_seq_length": options.max_seq_length,
        "text_columns": options.read.text_columns,
        "label_column": options.read.label_column,
        "id_column": options.read.id_column,
        "splits": {},
    }
    stats = {"tokenizer": tokenizer.kind, "max_seq_length": options.max_seq_length}
    with atomic_directory(options.destdir, COMMAND, inputs, options.force) as work:
        copy_tokenizer_files(options.tokenizer_from, work)
        for split, table in tables.items():
            features = featurise(table, tokenizer, dictionary, options.max_seq_length, split)
            prefix = os.path.join(work, split)
            write_token_items(features.items, prefix, len(dictionary))
            np.save(prefix + ".segment_a.npy", features.segment_a)
            np.save(prefix + ".labels.npy", labels[split])
            if table.ids is not None:
                with open(prefix + ".ids.json", "w", encoding="utf-8") as f:
                    json.dump(table.ids, f, ensure_ascii=False)
            labelled = table.labels is not None
            meta["splits"][split] = {"source": os.path.abspath(table.path), "examples": len(table), "labelled": labelled}
            stats[split] = {**features.stats, "labels": _label_counts(labels[split], label_list) if labelled else None,
                            "malformed_rows_skipped": table.malformed_rows_skipped}
        write_json(os.path.join(work, META_FILE), meta)
        write_json(os.path.join(work, STATS_FILE), stats)
    warn_if_vocabulary_does_not_fit(tokenizer, inputs[:-1])
    return stats


def read_meta(folder: str) -> dict:
    """``classification.json`` of a prepared folder; UsageError when it is not one, or when its head's size and its
    labels disagree (a hand-edited file: the head would be trained with classes no label names)."""
    meta = read_prepared_json(folder, META_FILE, COMMAND)
    path = os.path.join(folder, META_FILE)
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: expected a JSON object, found {type(meta).__name__}")
    if not isinstance(meta.get("regression"), bool):
        raise UsageError(f"{path}: regression must be true or false, found {meta.get('regression')!r}")
    labels, classes = meta.get("labels"), meta.get("num_classes")
    expected = 1 if meta["regression"] else len(labels) if isinstance(labels, list) else None
    if not meta["regression"] and (not isinstance(labels, list) or not labels
                                   or not all(isinstance(label, str) for label in labels)):
        raise UsageError(f"{path}: labels must list the class names, found {labels!r}")
    if classes != expected or not is_json_integer(classes):
        raise UsageError(f"{path}: num_classes {classes!r} does not match its "
                         + ("regression (1)" if meta["regression"] else f"{len(labels)} labels"))
    return meta
