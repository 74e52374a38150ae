"""spanbert-prepare-re: TACRED-style JSON -> a relation-extraction data folder.

Input: a JSON list of examples, or JSON Lines, with ``token`` (words),
``subj_start``/``subj_end``/``obj_start``/``obj_end`` (word indices, ends
inclusive), ``relation``, and optionally ``subj_type``/``obj_type`` (untyped
markers without them) and ``id`` (the example's 0-based position without it).
PTB bracket tokens (-LRB- ...) are turned back into brackets.

Output, for each split ``S`` (train, valid, test):

* ``S.bin``/``S.idx``: one item per example, ``[CLS] words with entity markers [SEP]``;
* ``S.npz``: ``labels`` [N] (label indices), ``entity_positions`` [N, 2]
  (token positions of the subject and object start markers) and
  ``entity_region_ends`` [N, 2] (the last token position of each entity's
  region: its markers and the mention between them);
* ``S.examples.jsonl``: ``id`` and ``relation`` of each example, in input order;

plus ``re_meta.json`` (mode, labels with the negative label first, marker ids),
``dict.txt`` and the tokenizer files of ``--tokenizer-from`` (``dict.txt`` gains
the marker symbols the vocabulary could not hold), and ``prepare_stats.json``.
"""
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..core.errors import UsageError
from ..core.file_utils import (
    atomic_directory, check_destination, is_json_integer, load_arrays, parse_json, read_jsonl, read_text,
)
from ..core.finetune_io import (
    copy_tokenizer_files, load_tokenizer_folder, read_prepared_json, register_finetuning_folder,
    warn_if_vocabulary_does_not_fit, write_json,
    write_token_items,
)
from .markers import OTHER_TYPE, ROLES, assign_marker_ids, end_marker, normalise_type, punct_marker_words, start_marker

COMMAND = "spanbert-prepare-re"
RE_META = register_finetuning_folder("re_meta.json", COMMAND, "relation_extraction")
STATS_FILE = "prepare_stats.json"
REQUIRED_KEYS = ("token", "subj_start", "subj_end", "obj_start", "obj_end", "relation")
PTB_BRACKETS = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}
ROLE_KEYS = {"SUBJ": ("subj_start", "subj_end", "subj_type"), "OBJ": ("obj_start", "obj_end", "obj_type")}


@dataclass
class RelationExample:
    """One example: words, inclusive word spans and raw types of subject and object, relation."""

    id: object
    words: List[str]
    spans: Dict[str, Tuple[int, int]]
    types: Dict[str, Optional[str]]
    relation: str


def _load_records(path: str) -> list:
    """The JSON objects of a JSON list or JSON Lines file."""
    text = read_text(path)
    if not text.strip():
        raise UsageError(f"{path}: file is empty")
    if text.lstrip().startswith("["):
        try:
            records = parse_json(text, path)
        except json.JSONDecodeError as err:
            raise UsageError(f"{path}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from None
    else:
        records = []
        for line_no, line in enumerate(text.split("\n"), 1):
            if line.strip():
                try:
                    records.append(parse_json(line, f"{path}:{line_no}"))
                except json.JSONDecodeError as err:
                    raise UsageError(
                        f"{path}:{line_no}: not valid JSON ({err.msg}); expected a JSON list of examples "
                        "or one JSON object per line"
                    ) from None
    if not records:
        raise UsageError(f"{path}: no examples")
    return records


def _check_example(record, position: int, path: str) -> RelationExample:
    if not isinstance(record, dict):
        raise UsageError(f"{path}: example at position {position}: expected a JSON object, got {type(record).__name__}")
    ex_id = record.get("id")
    ex_id = position if ex_id is None else ex_id
    where = f"{path}: example {ex_id}"
    missing = [key for key in REQUIRED_KEYS if key not in record]
    if missing:
        raise UsageError(f"{where}: missing key {', '.join(repr(k) for k in missing)}")
    words = record["token"]
    if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
        raise UsageError(f"{where}: 'token' must be a non-empty list of strings")
    if not isinstance(record["relation"], str) or not record["relation"]:
        raise UsageError(f"{where}: 'relation' must be a non-empty string")
    spans, types = {}, {}
    for role, (start_key, end_key, type_key) in ROLE_KEYS.items():
        start, end = record[start_key], record[end_key]
        if not (is_json_integer(start) and is_json_integer(end) and 0 <= start <= end < len(words)):
            raise UsageError(
                f"{where}: {start_key}={start!r}, {end_key}={end!r} is not an inclusive word span "
                f"inside its {len(words)} tokens"
            )
        entity_type = record.get(type_key)
        if entity_type is not None and not isinstance(entity_type, str):
            raise UsageError(f"{where}: '{type_key}' must be a string")
        spans[role], types[role] = (start, end), entity_type
    (s0, s1), (o0, o1) = spans["SUBJ"], spans["OBJ"]
    if s0 <= o1 and o0 <= s1:
        raise UsageError(f"{where}: subject tokens {s0}-{s1} overlap object tokens {o0}-{o1}")
    words = [PTB_BRACKETS.get(w.upper(), w) for w in words]  # -lrb- too, as SpanBERT's convert_token reads them
    return RelationExample(ex_id, words, spans, types, record["relation"])


def read_examples(path: str) -> List[RelationExample]:
    """Read and check every example of a TACRED JSON or JSON Lines file (UsageError names the example)."""
    records = _load_records(path)
    examples = [_check_example(record, i, path) for i, record in enumerate(records)]
    first = {}
    for position, example in enumerate(examples):
        # an example without an id is identified by its position, which may equal another example's explicit id
        key = str(example.id)  # predictions.jsonl is matched by id: 7 and "7" would be confused
        if key in first:
            implicit = any(records[at].get("id") is None for at in (first[key], position))
            note = "; an example without an id takes its position as id" if implicit else ""
            raise UsageError(f"{path}: example {example.id}: duplicate id (at positions {first[key]} and {position}{note})")
        first[key] = position
    return examples


def build_label_list(train: List[RelationExample], negative_label: str, labels_file: Optional[str] = None) -> List[str]:
    """The negative label first, then the others: from ``labels_file`` in its order, else sorted."""
    if labels_file is None:
        others = sorted({ex.relation for ex in train} - {negative_label})
    else:
        listed = [line.strip() for line in read_text(labels_file, "--labels").splitlines() if line.strip()]
        if len(set(listed)) != len(listed):
            dup = next(label for label, n in Counter(listed).items() if n > 1)
            raise UsageError(f"--labels {labels_file}: label {dup!r} listed twice")
        others = [label for label in listed if label != negative_label]
    return [negative_label, *others]


def check_labels(examples: List[RelationExample], labels: List[str], path: str, source: str) -> np.ndarray:
    """Label indices of the examples; a relation outside ``labels`` is an error naming the example."""
    index = {label: i for i, label in enumerate(labels)}
    for ex in examples:
        if ex.relation not in index:
            raise UsageError(f"{path}: example {ex.id}: relation {ex.relation!r} does not occur in {source}")
    return np.array([index[ex.relation] for ex in examples], dtype=np.int64)


class RelationEncoder:
    """Turns examples into ``[CLS] ... [SEP]`` token ids with entity markers, cut to ``max_seq_length``."""

    def __init__(self, tokenizer, dictionary, mode: str, max_seq_length: int):
        self.tokenizer, self.mode, self.max_seq_length = tokenizer, mode, max_seq_length
        self.markers = assign_marker_ids(dictionary.symbols, mode)
        self.bos, self.eos = dictionary.bos(), dictionary.eos()

    def _tokenize(self, words: List[str]):
        """Token ids and each token's word index for words joined by single spaces."""
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        word_starts = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
        enc = self.tokenizer.encode(" ".join(words))
        token_starts = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
        return np.asarray(enc.ids, dtype=np.int64), np.searchsorted(word_starts, token_starts, side="right") - 1

    def encode(self, ex: RelationExample, where: str):
        """(token ids, [subject, object] start-marker positions, [subject, object] region ends, tokens cut, the roles
        whose markers enclose no token of the mention: words the tokenizer drops, such as zero-width characters).

        A region is the start marker, the mention and its closing marker; its
        end is the position of its last token.
        """
        roles = sorted(ROLES, key=lambda r: ex.spans[r][0])  # left to right
        if self.mode == "typed_marker_punct":
            body, starts, regions, tokenless = self._encode_punct(ex, roles)
        else:
            body, starts, regions, tokenless = self._encode_symbols(ex, roles)
        budget = self.max_seq_length - 2  # [CLS] and [SEP]
        cut = max(0, len(body) - budget)
        if cut:
            lo, hi = regions[roles[0]][0], regions[roles[1]][1]
            if hi - lo > budget:
                raise UsageError(
                    f"{where}: subject and object with their markers span {hi - lo} tokens, more than the "
                    f"{budget} that --max-seq-length {self.max_seq_length} leaves; raise --max-seq-length "
                    f"to at least {hi - lo + 2}"
                )
            # centre the entities in the window: as much context on both sides as fits
            first = int(np.clip(lo - (budget - (hi - lo)) // 2, 0, len(body) - budget))
            body = body[first : first + budget]
            starts = {role: pos - first for role, pos in starts.items()}
            regions = {role: (lo - first, hi - first) for role, (lo, hi) in regions.items()}
        ids = np.concatenate([[self.bos], body, [self.eos]]).astype(np.int64)
        # + 1 for [CLS]; a region's end is half-open, so its last token is at end - 1 + 1
        return (ids, np.array([starts[role] + 1 for role in ROLES], dtype=np.int64),
                np.array([regions[role][1] for role in ROLES], dtype=np.int64), cut, tokenless)

    def _encode_symbols(self, ex, roles):
        """``ner``: each mention replaced by its marker; ``typed_marker``: wrapped in start/end markers."""
        ids, token_word = self._tokenize(ex.words)
        pieces, starts, regions, length, previous, tokenless = [], {}, {}, 0, 0, []
        for role in roles:
            first_word, last_word = ex.spans[role]
            lo, hi = np.searchsorted(token_word, [first_word, last_word + 1])
            if hi == lo and self.mode == "typed_marker":  # ner replaces the mention: its tokens never show
                tokenless.append(role)
            entity_type = normalise_type(ex.types[role])
            pieces.append(ids[previous:lo])
            length += lo - previous
            starts[role] = length
            inside = [self.markers.ids[start_marker(role, entity_type)]]
            if self.mode == "typed_marker":
                inside = [*inside, *ids[lo:hi], self.markers.ids[end_marker(role, entity_type)]]
            pieces.append(np.asarray(inside, dtype=np.int64))
            length += len(inside)
            regions[role] = (starts[role], length)
            previous = hi
        pieces.append(ids[previous:])
        return np.concatenate(pieces), starts, regions, tokenless

    def _encode_punct(self, ex, roles):
        """``typed_marker_punct``: ``@ * person * Bill Gates @`` and ``# ^ city ^ Seattle #`` as plain words."""
        words, marked, mentions, previous = [], {}, {}, 0
        for role in roles:
            first_word, last_word = ex.spans[role]
            before, after = punct_marker_words(role, _punct_type(ex.types[role]))
            words += ex.words[previous:first_word]
            begin = len(words)
            words += [*before, *ex.words[first_word : last_word + 1], *after]
            marked[role] = (begin, len(words))  # marker words, half-open
            mentions[role] = (begin + len(before), len(words) - len(after))
            previous = last_word + 1
        words += ex.words[previous:]
        ids, token_word = self._tokenize(words)
        regions = {role: tuple(int(t) for t in np.searchsorted(token_word, span)) for role, span in marked.items()}
        tokenless = [role for role in roles if np.ptp(np.searchsorted(token_word, mentions[role])) == 0]
        return ids, {role: lo for role, (lo, _) in regions.items()}, regions, tokenless


ROLE_NAMES = {"SUBJ": "subject", "OBJ": "object"}


def _punct_type(raw) -> Optional[str]:
    """The type written as words: the table's name (aliases resolved), else the raw type itself."""
    table_type = normalise_type(raw)
    return raw.strip() if table_type == OTHER_TYPE else table_type


def _split_stats(examples, lengths, cuts, tokenless):
    normalised = [(ex.types[role], normalise_type(ex.types[role])) for ex in examples for role in ROLES]
    untyped = sum(table_type is None for _, table_type in normalised)
    types = Counter(raw for raw, table_type in normalised if table_type == OTHER_TYPE)
    cuts = np.asarray(cuts)
    return {
        "examples": len(examples),
        "truncated": int((cuts > 0).sum()),
        "tokens_removed": int(cuts.sum()),
        "longest_before_truncation": int(max(lengths)),
        "mean_tokens": round(float(np.mean(lengths)), 2),
        "untyped_mentions": untyped,
        "mentions_without_tokens": len(tokenless),
        "types_outside_table": dict(sorted(types.items())),
        "relations": dict(sorted(Counter(ex.relation for ex in examples).items())),
    }


def encode_split(encoder: RelationEncoder, examples: List[RelationExample], path: str, progress=None):
    """Token items, entity positions and statistics of one split."""
    items, positions, region_ends, lengths, cuts, tokenless = [], [], [], [], [], []
    for ex in examples:
        ids, starts, ends, cut, roles = encoder.encode(ex, f"{path}: example {ex.id}")
        tokenless += [(ex, role) for role in roles]
        items.append(ids)
        positions.append(starts)
        region_ends.append(ends)
        lengths.append(len(ids) + cut)
        cuts.append(cut)
        if progress is not None:
            progress.update(1)
    if tokenless:  # the markers enclose nothing: the model sees the entity's type and place, not its words
        ex, role = tokenless[0]
        first, last = ex.spans[role]
        logging.getLogger("spanbert_plugin.prepare").warning(
            f"{path}: {len(tokenless)} entity mention(s) have no token the tokenizer keeps, so their markers enclose "
            f"nothing (the first: example {ex.id}'s {ROLE_NAMES[role]} {ex.words[first:last + 1]!r}); counted as "
            "mentions_without_tokens in prepare_stats.json")
    return items, np.stack(positions), np.stack(region_ends), _split_stats(examples, lengths, cuts, tokenless)


def prepare_relation_data(args, progress_factory=None) -> dict:
    """Read, check, encode and write every split of ``args``; return the statistics written."""
    splits = {"train": args.train, "valid": args.valid}
    if args.test:
        splits["test"] = args.test
    inputs = [p for p in [*splits.values(), args.tokenizer_from, args.labels] if p]
    check_destination(args.destdir, COMMAND, inputs, args.force)
    if args.max_seq_length < 4:
        raise UsageError(f"--max-seq-length {args.max_seq_length}: must be at least 4 ([CLS], two markers, [SEP])")
    tokenizer, dictionary = load_tokenizer_folder(args.tokenizer_from)
    examples = {split: read_examples(path) for split, path in splits.items()}
    labels = build_label_list(examples["train"], args.negative_label, args.labels)
    source = f"--labels {args.labels}" if args.labels else f"the training file {args.train} (list every label with --labels FILE)"
    targets = {split: check_labels(exs, labels, splits[split], source) for split, exs in examples.items()}
    if not any((t == 0).any() for t in targets.values()):  # else that relation would be scored as "no relation"
        raise UsageError(f"--negative-label {args.negative_label}: no example of {', '.join(splits.values())} has this "
                         "relation; give the label your data uses for 'no relation'")
    encoder = RelationEncoder(tokenizer, dictionary, args.entity_marker, args.max_seq_length)
    for marker in encoder.markers.appended:
        dictionary.add_symbol(marker, n=0)
    total = sum(len(exs) for exs in examples.values())
    progress = progress_factory(total) if progress_factory else None
    encoded = {split: encode_split(encoder, exs, splits[split], progress) for split, exs in examples.items()}
    if progress is not None:
        progress.close()
    stats = {split: split_stats for split, (*_, split_stats) in encoded.items()}
    stats["markers"] = {
        "mode": args.entity_marker,
        "from_vocabulary": len(encoder.markers.ids) - len(encoder.markers.appended),
        "from_unused": len(encoder.markers.from_unused),
        "appended": len(encoder.markers.appended),
    }
    meta = {
        "entity_marker": args.entity_marker,
        "max_seq_length": args.max_seq_length,
        "negative_label": args.negative_label,
        "labels": labels,
        "markers": encoder.markers.ids,
        "markers_from_unused": encoder.markers.from_unused,
        "appended_symbols": encoder.markers.appended,
        "splits": list(splits),
    }
    with atomic_directory(args.destdir, COMMAND, inputs, args.force) as work:
        copy_tokenizer_files(args.tokenizer_from, work)
        if encoder.markers.appended:
            dictionary.save(os.path.join(work, "dict.txt"))
        for split, (items, positions, region_ends, _) in encoded.items():
            prefix = os.path.join(work, split)
            write_token_items(items, prefix, len(dictionary))
            np.savez(prefix + ".npz", labels=targets[split], entity_positions=positions, entity_region_ends=region_ends)
            with open(prefix + ".examples.jsonl", "w", encoding="utf-8") as f:
                for ex in examples[split]:
                    f.write(json.dumps({"id": ex.id, "relation": ex.relation}, ensure_ascii=False) + "\n")
        write_json(os.path.join(work, RE_META), meta)
        write_json(os.path.join(work, STATS_FILE), stats)
    warn_if_vocabulary_does_not_fit(tokenizer, splits.values())
    return stats


def load_re_meta(folder: str) -> dict:
    """``re_meta.json`` of a spanbert-prepare-re folder (UsageError when it is not one)."""
    return read_prepared_json(folder, RE_META, "spanbert-prepare-re")


def load_split_arrays(folder: str, split: str):
    """(labels [N], entity_positions [N, 2], examples [{id, relation}]) of a prepared split."""
    prefix = os.path.join(folder, split)
    if not os.path.isfile(prefix + ".npz"):
        raise UsageError(f"{prefix}.npz: no such file (split {split!r} was not prepared in {folder})")
    arrays = load_arrays(prefix + ".npz")
    labels, positions = arrays["labels"], arrays["entity_positions"]
    return labels, positions, read_jsonl(prefix + ".examples.jsonl", expected=len(labels))


def load_region_ends(folder: str, split: str) -> Optional[np.ndarray]:
    """``entity_region_ends`` [N, 2] of a prepared split; None for a folder prepared before they were stored."""
    return load_arrays(os.path.join(folder, split) + ".npz").get("entity_region_ends")
