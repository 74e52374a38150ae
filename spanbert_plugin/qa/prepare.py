"""spanbert-prepare-qa: SQuAD / MRQA files -> sliding-window features in the ``QASplit`` format.

Reading (``read_qa_file``) detects the format from the content: SQuAD 1.1/2.0
JSON (``data[].paragraphs[].qas[]``) or MRQA JSONL (plain or gzip; a header
line, then one context per line, ``detected_answers[].char_spans`` with
inclusive ends). Featurisation (``featurize``) follows BERT's / SpanBERT's
released procedure: ``[CLS] question [SEP] passage window [SEP]``, the question
cut to ``max_query_length`` tokens, windows every ``doc_stride`` passage tokens
until one reaches the passage end, the max-context rule, and labels from the
tokenizer's character offsets. Every distinct context is tokenized once, and
everything after tokenization is numpy over flat arrays.
"""
import json
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from .span_drop import token_sentence_ids
from ..core.errors import UsageError
from ..core.file_utils import atomic_directory, check_destination, is_json_integer, parse_json, read_text
from ..core.progress import progress_bar
from ..core.finetune_io import (
    copy_tokenizer_files, load_tokenizer_folder, warn_if_vocabulary_does_not_fit, write_json, write_token_items,
)
from ..core.tokenization import WordPieceTokenizer, cover_dropped_marks
from .windows import QASplit

COMMAND = "spanbert-prepare-qa"
# The max-context score min(left, right) + 0.01 * window length, times 100 so that it is exact.
_CONTEXT_SCALE = 100
_WARN_EXAMPLES = 3
_BATCH = 1000  # texts per tokenizer call (progress granularity)


@dataclass
class QAFile:
    """The questions of one input file, with the training answer chosen for each (if any)."""

    path: str
    format: str  # squad1, squad2 or mrqa
    with_negative: bool
    contexts: List[str]
    questions: List[dict]  # QASplit question records: id, question, context_index, answers, is_impossible
    where: List[str]  # per question: "path: question id X" or "path:LINE: question id X", for messages
    answer_start: np.ndarray  # [Q] character start of the training answer, -1 when there is none
    answer_end: np.ndarray  # [Q] character end (exclusive)
    mismatches: List[str] = field(default_factory=list)  # messages for gold answers that do not match the context
    contexts_without_questions: int = 0


@dataclass
class QAConfig:
    """Window settings (written to ``qa_config.json``)."""

    max_seq_length: int = 512
    doc_stride: int = 128
    max_query_length: int = 64

    def window_capacity(self, question_lengths):
        """Passage tokens a window holds beside a question of this many tokens."""
        return self.max_seq_length - np.asarray(question_lengths) - 3

    def check(self) -> None:
        """UsageError for settings that leave no room for the passage or skip passage tokens."""
        if self.max_query_length < 1:
            raise UsageError(f"--max-query-length must be at least 1, got {self.max_query_length}")
        if self.max_seq_length <= self.max_query_length + 3:
            raise UsageError(
                f"--max-seq-length {self.max_seq_length} must be above --max-query-length + 3 "
                f"= {self.max_query_length + 3} ([CLS], two [SEP] and at least one passage token)"
            )
        full = int(self.window_capacity(self.max_query_length))
        if not 1 <= self.doc_stride <= full:
            raise UsageError(
                f"--doc-stride must be between 1 and {full} (the passage tokens a window holds beside a "
                f"{self.max_query_length}-token question), got {self.doc_stride}"
            )


# ----------------------------------------------------------------------------- reading


def _parse(path: str, text: str):
    """('json', object) or ('jsonl', [(line_no, object)]); UsageError for anything else."""
    if not text.strip():
        raise UsageError(f"{path}: file is empty")
    try:
        return "json", parse_json(text, path)
    except json.JSONDecodeError as whole_error:
        lines = [(no, line) for no, line in enumerate(text.split("\n"), 1) if line.strip()]
        records = []
        for no, line in lines:
            try:
                records.append((no, parse_json(line, f"{path}:{no}")))
            except json.JSONDecodeError as err:
                if not records:  # not even the first line is JSON: report the file as broken JSON
                    raise UsageError(f"{path}:{whole_error.lineno}: not JSON or JSON lines ({whole_error.msg})") from None
                raise UsageError(f"{path}:{no}: not a JSON line ({err.msg} at column {err.colno})") from None
        return "jsonl", records


def read_qa_file(path: str) -> QAFile:
    """Read a SQuAD 1.1/2.0 JSON or MRQA JSONL(.gz) file; UsageError names the file, line or question."""
    kind, content = _parse(path, read_text(path, allow_gzip=True))
    if kind == "json" and isinstance(content, dict) and isinstance(content.get("data"), list):
        return _read_squad(path, content)
    if kind == "json" and isinstance(content, dict) and "header" in content:
        raise UsageError(f"{path}: MRQA header line but no context lines")
    if kind == "jsonl":
        return _read_mrqa(path, content)
    raise UsageError(f"{path}: neither SQuAD JSON (an object with data[].paragraphs[].qas[]) "
                     "nor MRQA JSON lines (a header line, then objects with context and qas[])")


class _Collector:
    """Accumulates questions and contexts while reading; checks ids and answers."""

    def __init__(self, path: str):
        self.path = path
        self.contexts, self.questions, self.where = [], [], []
        self.answer_start, self.answer_end, self.mismatches = [], [], []
        self.first_seen: Dict[str, str] = {}
        self.unused_contexts = 0

    def context(self, text, where: str) -> int:
        if not isinstance(text, str):
            raise UsageError(f"{where}: context is not a string")
        if not text.strip():
            raise UsageError(f"{where}: empty context")
        self.contexts.append(text)
        return len(self.contexts) - 1

    def question(self, qa, qid_key: str, location: str, line: Optional[int] = None):
        """Check a question's id and text; return its id and the location used in messages."""
        number = len(self.questions) + 1
        if not isinstance(qa, dict):
            raise UsageError(f"{location}: question {number} of the file is not a JSON object")
        qid = qa.get(qid_key)
        if qid is None or (isinstance(qid, str) and not qid.strip()):
            raise UsageError(f"{location}: question {number} of the file has no {qid_key!r}")
        if not isinstance(qid, str):
            # predictions.json is keyed by id strings: 7 and "7" would be one question there
            raise UsageError(f"{location}: question {number} of the file: {qid_key!r} must be a string, "
                             f"got {json.dumps(qid)[:40]}")
        where = f"{location}: question id {qid}"
        if qid in self.first_seen:
            raise UsageError(f"{where}: duplicate question id (first seen {self.first_seen[qid]})")
        self.first_seen[qid] = f"on line {line}" if line else f"as question {number} of the file"
        if not isinstance(qa.get("question"), str):
            raise UsageError(f"{where}: 'question' is missing or not a string")
        if not qa["question"].strip():
            raise UsageError(f"{where}: empty question")
        return qid, where

    def add(self, qid, qa, where, context_index, answers, impossible, spans):
        """Record a question; ``spans`` are (start, end exclusive, gold text, matches) candidates in order."""
        self.questions.append({"id": qid, "question": qa["question"], "context_index": context_index,
                               "answers": answers, "is_impossible": impossible})
        self.where.append(where)
        chosen = (-1, -1)
        if not impossible:
            context = self.contexts[context_index]
            for start, end, text, matches in spans:
                if matches:
                    chosen = (start, end) if chosen[0] < 0 else chosen
                else:
                    found = context[max(start, 0): max(end, 0)]
                    self.mismatches.append(f"{where}: answer {text!r} does not match the context at "
                                           f"character {start} (found {found!r}){_normal_form_hint(context, start, text)}")
        self.answer_start.append(chosen[0])
        self.answer_end.append(chosen[1])

    def result(self, fmt: str, with_negative: bool) -> QAFile:
        if not self.questions:
            raise UsageError(f"{self.path}: no questions")
        return QAFile(self.path, fmt, with_negative, self.contexts, self.questions, self.where,
                      np.array(self.answer_start, np.int64), np.array(self.answer_end, np.int64),
                      self.mismatches, self.unused_contexts)


def _normal_form_hint(context: str, start: int, text: str) -> str:
    """Where the context holds the answer in another Unicode normal form (a decomposed "e" + U+0301 against a
    precomposed "é"), a note that says so: the two look the same when printed."""
    for form in ("NFC", "NFD"):
        other = unicodedata.normalize(form, text)
        if other != text and context[max(start, 0): max(start, 0) + len(other)] == other:
            return (f"; the context holds it in Unicode {form} form, the answer in another: normalise the file's "
                    "contexts and answers to one form (e.g. NFC) and recount answer_start")
    return ""


def _candidate(context: str, start: int, end: int, text: str, ignore_case: bool):
    """(start, end, text, whether the context holds ``text`` there) for one gold answer."""
    found = context[start:end] if 0 <= start <= end <= len(context) else None
    same = found is not None and (found.casefold() == text.casefold() if ignore_case else found == text)
    return start, end, text, same


def _read_squad(path: str, content: dict) -> QAFile:
    version = str(content.get("version", ""))
    collector = _Collector(path)
    any_unanswerable, unflagged = False, 0
    for a, article in enumerate(content["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise UsageError(f"{path}: data[{a}] has no paragraphs list (not SQuAD)")
        for p, paragraph in enumerate(paragraphs):
            location = f"{path}: data[{a}].paragraphs[{p}]"
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise UsageError(f"{location}: no qas list (not SQuAD)")
            if not paragraph["qas"]:
                collector.unused_contexts += 1
                continue
            first_id = paragraph["qas"][0].get("id") if isinstance(paragraph["qas"][0], dict) else None
            c = collector.context(paragraph.get("context"), f"{path}: question id {first_id}" if first_id else location)
            context = collector.contexts[c]
            for qa in paragraph["qas"]:
                qid, where = collector.question(qa, "id", path)
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise UsageError(f"{where}: 'is_impossible' must be true or false, got {json.dumps(impossible)[:40]}")
                gold = qa.get("answers", [])
                if not isinstance(gold, list) or not all(
                        isinstance(g, dict) and isinstance(g.get("text"), str) and is_json_integer(g.get("answer_start"))
                        for g in gold):
                    raise UsageError(f"{where}: 'answers' must be a list of {{text, answer_start}} objects")
                unflagged += not impossible and not gold
                spans = [_candidate(context, g["answer_start"], g["answer_start"] + len(g["text"]), g["text"], False)
                         for g in gold]
                # as the official v2.0 script: the answers decide (is_impossible: true with answers is answerable),
                # and a file follows 2.0 rules when it says so or holds an unanswerable question
                any_unanswerable |= not gold
                collector.add(qid, qa, where, c, [g["text"] for g in gold], not gold, spans)
    if unflagged:  # the official v2.0 script never reads is_impossible: no answers is unanswerable
        _warn(f"{path}: {unflagged} question(s) have no answers and no 'is_impossible: true'; read as unanswerable, "
              "and the file by SQuAD 2.0 rules, as the official v2.0 script reads them")
    squad2 = version.lstrip("v").startswith("2") or any_unanswerable
    return collector.result("squad2" if squad2 else "squad1", squad2)


def _is_detected_answer(d) -> bool:
    """An MRQA detected answer: text and [[start, inclusive end], ...] character spans."""
    return (isinstance(d, dict) and isinstance(d.get("text"), str) and isinstance(d.get("char_spans"), list)
            and all(isinstance(s, list) and len(s) == 2 and all(is_json_integer(v) for v in s) for s in d["char_spans"]))


# MRQA's markers of titles, documents and paragraphs (and a separator): a span that is one of them is no answer,
# though "[DOC]" normalises to "doc"
_MRQA_MARKER = re.compile(r"\s*\[(?:DOC|TLE|PAR|SEP)\]\s*")


def _squashed(text: str) -> str:
    """``text`` lower-cased, without articles, punctuation or spaces: equal for an MRQA detected answer's text
    (normalised, as TriviaQA's normaliser writes it: "st margaret s bay", "dr no") and the context it points at
    ("St. Margaret's Bay", "Dr. No")."""
    words = re.sub(r"[^\w\s]|_", " ", text.lower()).split()
    return "".join(w for w in words if w not in ("a", "an", "the"))


def _mrqa_candidate(context: str, start: int, end: int, text: str):
    """``_candidate`` for a detected span, whose ``text`` is normalised: the span matches when the context there
    equals it up to that normalisation."""
    start, end, text, same = _candidate(context, start, end, text, True)
    if not same and 0 <= start <= end <= len(context):
        found = context[start:end]
        same = not _MRQA_MARKER.fullmatch(found) and _squashed(found) == _squashed(text) != ""
    return start, end, text, same


def _read_mrqa(path: str, records) -> QAFile:
    collector = _Collector(path)
    for i, (line_no, record) in enumerate(records):
        location = f"{path}:{line_no}"
        if i == 0 and isinstance(record, dict) and "header" in record:
            continue
        if not isinstance(record, dict) or "context" not in record or not isinstance(record.get("qas"), list):
            raise UsageError(f"{location}: neither an MRQA header nor an object with context and qas[] (not MRQA)")
        if not record["qas"]:
            collector.unused_contexts += 1
            continue
        c = collector.context(record["context"], location)
        context = collector.contexts[c]
        for qa in record["qas"]:
            qid, where = collector.question(qa, "qid", location, line_no)
            answers = qa.get("answers", [])
            detected = qa.get("detected_answers")
            if not isinstance(answers, list) or not all(isinstance(t, str) for t in answers):
                raise UsageError(f"{where}: 'answers' must be a list of strings")
            if not isinstance(detected, list) or not detected:
                raise UsageError(f"{where}: 'detected_answers' is missing or empty")
            spans = []
            for d in detected:
                if not _is_detected_answer(d):
                    raise UsageError(f"{where}: detected_answers need 'text' and 'char_spans' [[start, end], ...]")
                spans.extend(_mrqa_candidate(context, start, last + 1, d["text"]) for start, last in d["char_spans"])
            # SpanBERT trains on the earliest detected span
            spans.sort(key=lambda s: (s[0], s[1]))
            collector.add(qid, qa, where, c, answers or [d["text"] for d in detected], False, spans)
    return collector.result("mrqa", False)


# ----------------------------------------------------------------------------- tokenization


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for every (s, n), without a Python loop."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    segment_begin = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(starts - segment_begin, lengths)


def _offsets_of(lengths) -> np.ndarray:
    """[len + 1] cumulative offsets of consecutive segments."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def encode_passages(tokenizer, texts: Sequence[str], desc: str):
    """Token ids and character spans of each text: (ids, char_start, char_end) flat, and [len + 1] offsets."""
    ids, starts, ends, lengths = [], [], [], []
    with progress_bar(total=len(texts), desc=desc, unit="context") as bar:
        for b in range(0, len(texts), _BATCH):
            batch = list(texts[b: b + _BATCH])
            if isinstance(tokenizer, WordPieceTokenizer):
                encodings = tokenizer.tok.encode_batch(batch, add_special_tokens=False)
                pairs = [(e.ids, cover_dropped_marks(text, e.offsets)) for text, e in zip(batch, encodings)]
            else:
                pairs = [(e.ids, e.offsets) for e in map(tokenizer.encode, batch)]
            for token_ids, offsets in pairs:
                span = np.array(offsets, dtype=np.int64).reshape(-1, 2)
                ids.append(np.asarray(token_ids, dtype=np.int64))
                starts.append(span[:, 0])
                ends.append(span[:, 1])
                lengths.append(len(span))
            bar.update(len(batch))
    flat = [np.concatenate(a) if a else np.zeros(0, np.int64) for a in (ids, starts, ends)]
    return (*flat, _offsets_of(lengths))


def encode_questions(tokenizer, texts: Sequence[str], max_query_length: int, desc: str):
    """Question token ids cut to ``max_query_length``: (flat ids, [Q + 1] offsets, number truncated)."""
    pieces = []
    with progress_bar(total=len(texts), desc=desc, unit="question") as bar:
        for b in range(0, len(texts), _BATCH):
            batch = [t.strip() for t in texts[b: b + _BATCH]]
            pieces.extend(np.asarray(ids, dtype=np.int64) for ids in tokenizer.encode_ids(batch))
            bar.update(len(batch))
    full = np.array([len(p) for p in pieces], dtype=np.int64)
    lengths = np.minimum(full, max_query_length)
    flat = np.concatenate([p[:max_query_length] for p in pieces]) if pieces else np.zeros(0, np.int64)
    return flat, _offsets_of(lengths), int((full > max_query_length).sum())


# ----------------------------------------------------------------------------- featurisation


def window_layout(passage_lengths, capacities, doc_stride: int):
    """Windows of every question, flat: (question_index, window rank, passage start, passage length), and the
    number of windows of each question.

    Window k of a question starts at k * doc_stride and holds up to the question's capacity;
    the window that reaches the passage end is the last. An empty passage gets one empty window.
    """
    n, cap = np.asarray(passage_lengths, np.int64), np.asarray(capacities, np.int64)
    count = np.where(n <= cap, 1, 1 + -(-(n - cap) // doc_stride))
    question_index = np.repeat(np.arange(len(n), dtype=np.int64), count)
    rank = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    start = rank * doc_stride
    length = np.minimum(start + cap[question_index], n[question_index]) - start
    return question_index, rank, start, length, count


def max_context_windows(passage_lengths, capacities, counts, doc_stride: int) -> np.ndarray:
    """For every passage token of every question (flat, question-major): the rank of its max-context window.

    The score of a token in a window is min(tokens to its left, tokens to its right) + 0.01 x window
    length (BERT's rule); the highest wins, ties go to the earlier window. Only windows that hold
    the token compete: ranks ceil((p - capacity + 1) / stride) .. min(count - 1, p // stride).
    """
    n = np.asarray(passage_lengths, np.int64)
    owner = np.repeat(np.arange(len(n), dtype=np.int64), n)
    position = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    cap, length, last = np.asarray(capacities, np.int64)[owner], n[owner], np.asarray(counts, np.int64)[owner] - 1
    first = np.maximum(0, -(-(position - cap + 1) // doc_stride))
    top = np.minimum(last, position // doc_stride)

    def score(rank, p, c, size):
        start = rank * doc_stride
        end = np.minimum(start + c, size)  # exclusive
        return _CONTEXT_SCALE * np.minimum(p - start, end - 1 - p) + (end - start)

    best, best_score = first.copy(), score(first, position, cap, length)
    active = np.flatnonzero(top > first)
    step = 1
    while active.size:
        rank = first[active] + step
        candidate = score(rank, position[active], cap[active], length[active])
        better = candidate > best_score[active]  # strict: ties stay with the earlier window
        best[active[better]] = rank[better]
        best_score[active[better]] = candidate[better]
        step += 1
        active = active[top[active] >= first[active] + step]
    return best


def max_context_flags(passage_lengths, capacities, counts, question_index, rank, start, length, doc_stride: int):
    """[sum(length)] per passage token of every window: is this its max-context window?

    A question with a single window needs no scoring; the rest go through ``max_context_windows``.
    """
    flags = np.ones(int(np.sum(length)), dtype=bool)
    multi = np.asarray(counts) > 1
    if not multi.any():
        return flags
    subset = np.flatnonzero(multi)
    n = np.asarray(passage_lengths, np.int64)
    best = max_context_windows(n[subset], np.asarray(capacities)[subset], np.asarray(counts)[subset], doc_stride)
    subset_base = np.zeros(len(n), dtype=np.int64)
    subset_base[subset] = _offsets_of(n[subset])[:-1]
    windows = np.flatnonzero(multi[question_index])
    entries = concat_ranges(_offsets_of(length)[windows], length[windows])
    best_entries = concat_ranges(subset_base[question_index[windows]] + start[windows], length[windows])
    flags[entries] = best[best_entries] == np.repeat(rank[windows], length[windows])
    return flags


def align_answers(answer_start, answer_end, context_index, char_start, char_end, token_offsets, contexts):
    """Passage-token span (first, last) of each character answer; -1 where it cannot be aligned.

    First token: the first whose character end is after the answer start; last token: the last
    whose character start is before the answer end. Per-context offsets are shifted onto one
    increasing axis so that a single searchsorted serves every question.
    """
    char_base = _offsets_of([len(c) + 1 for c in contexts])[:-1]
    token_context = np.repeat(np.arange(len(contexts), dtype=np.int64), np.diff(token_offsets))
    axis_start, axis_end = char_start + char_base[token_context], char_end + char_base[token_context]
    has = answer_start >= 0
    shift = char_base[context_index]
    first = np.searchsorted(axis_end, answer_start + shift, side="right")
    last = np.searchsorted(axis_start, answer_end + shift, side="left") - 1
    lo, hi = token_offsets[context_index], token_offsets[context_index + 1]
    ok = has & (first < hi) & (last >= lo) & (first <= last) & (answer_end > answer_start)
    return np.where(ok, first - lo, -1), np.where(ok, last - lo, -1), has & ~ok


@dataclass
class Features:
    """The windows of one file: a QASplit (labels, offsets, flags) and the token ids of each window."""

    split: QASplit
    tokens: np.ndarray  # flat token ids of every window
    window_offsets: np.ndarray  # [W + 1]
    stats: dict
    unaligned: np.ndarray  # indices of questions whose training answer covers no token


def featurize(qa: QAFile, tokenizer, bos: int, eos: int, config: QAConfig, training: bool, name: str = "") -> Features:
    """Tokenize and cut ``qa`` into windows; in a training split, questions without a usable answer are left out."""
    passage_ids, char_start, char_end, token_offsets = encode_passages(tokenizer, qa.contexts, f"{name} contexts")
    question_ids, question_offsets, truncated = encode_questions(
        tokenizer, [q["question"] for q in qa.questions], config.max_query_length, f"{name} questions")
    context_index = np.array([q["context_index"] for q in qa.questions], dtype=np.int64)
    first, last, unaligned = align_answers(qa.answer_start, qa.answer_end, context_index, char_start, char_end,
                                           token_offsets, qa.contexts)
    impossible = np.array([q["is_impossible"] for q in qa.questions], dtype=bool)
    unlabelled = ~impossible & (first < 0)
    keep = ~unlabelled if training else np.ones(len(qa.questions), dtype=bool)
    kept = np.flatnonzero(keep)

    q_len = np.diff(question_offsets)[kept]
    n = np.diff(token_offsets)[context_index[kept]]
    capacity = config.window_capacity(q_len)
    local_question, rank, start, length, counts = window_layout(n, capacity, config.doc_stride)
    question_index = local_question  # questions renumbered to the kept ones
    ctx = context_index[kept][local_question]
    passage_offset = q_len[local_question] + 2

    # labels: the window must hold the whole answer, otherwise [CLS]
    a_first, a_last = first[kept][local_question], last[kept][local_question]
    inside = (a_first >= start) & (a_first >= 0) & (a_last < start + length)
    start_positions = np.where(inside, passage_offset + a_first - start, 0)
    end_positions = np.where(inside, passage_offset + a_last - start, 0)

    # per passage token of every window: characters and the max-context flag
    window_token_offsets = _offsets_of(length)
    token_pos = concat_ranges(token_offsets[ctx] + start, length)
    # one value per passage token per window (tens of millions for SQuAD's training set): int32, as stored
    window_char_start, window_char_end = char_start[token_pos].astype(np.int32), char_end[token_pos].astype(np.int32)
    del token_pos
    max_context = max_context_flags(n, capacity, counts, local_question, rank, start, length, config.doc_stride)

    # token ids: [CLS] question [SEP] passage [SEP] gathered from one pool
    pool = np.concatenate([[bos, eos], question_ids, passage_ids]).astype(np.int64)
    q_from = 2 + question_offsets[kept][local_question]
    p_from = 2 + len(question_ids) + token_offsets[ctx] + start
    one = np.ones_like(start)
    segment_start = np.stack([0 * one, q_from, one, p_from, one], axis=1).ravel()
    segment_length = np.stack([one, q_len[local_question], one, length, one], axis=1).ravel()
    tokens = pool[concat_ranges(segment_start, segment_length)]
    window_offsets = _offsets_of(q_len[local_question] + 3 + length)

    questions = [qa.questions[i] for i in kept]  # context_index stays valid: every context is kept
    split = QASplit(question_index=question_index, start_positions=start_positions.astype(np.int64),
                    end_positions=end_positions.astype(np.int64), passage_offset=passage_offset.astype(np.int64),
                    token_offsets=window_token_offsets, char_start=window_char_start, char_end=window_char_end,
                    max_context=max_context, questions=questions, contexts=list(qa.contexts), format=qa.format,
                    with_negative=qa.with_negative,
                    sentence_ids=token_sentence_ids(qa.contexts, np.repeat(ctx.astype(np.int32), length),
                                                    window_char_start))
    stats = {
        "format": qa.format,
        "contexts": len(qa.contexts),
        "contexts_without_questions": qa.contexts_without_questions,
        "questions": len(qa.questions),
        "windows": int(len(question_index)),
        "max_windows_per_question": int(counts.max()) if len(counts) else 0,
        "unanswerable_questions": int(impossible.sum()),
        "truncated_questions": truncated,
        "answers_not_matching_context": len(qa.mismatches),
        "answers_not_aligned": int(unaligned.sum()),
        "questions_without_label": int(unlabelled.sum()),
        "questions_left_out": int(len(qa.questions) - len(kept)),
        "windows_with_answer": int(inside.sum()),
    }
    return Features(split, tokens, window_offsets, stats, np.flatnonzero(unaligned))


# ----------------------------------------------------------------------------- the command


def _warn(message: str) -> None:
    print(f"{COMMAND}: warning: {message}", file=sys.stderr)


def answer_problems(qa: QAFile, unaligned=()) -> List[str]:
    """Messages for gold answers that do not match the context and training answers that fit no token."""
    problems = list(qa.mismatches)
    for i in unaligned:
        start, end = int(qa.answer_start[i]), int(qa.answer_end[i])
        problems.append(f"{qa.where[i]}: answer {qa.contexts[qa.questions[i]['context_index']][start:end]!r} "
                        f"at character {start} covers no token (e.g. only white space)")
    return problems


def refuse_problems(problems: List[str]) -> None:
    """--strict: the first problem as a UsageError."""
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UsageError(f"{problems[0]}{more}; without --strict such answers are counted and left out of training")


def warn_problems(qa: QAFile, features: "Features", training: bool) -> None:
    """Say how many gold answers could not be used, and what happened to their questions."""
    problems = answer_problems(qa, features.unaligned)
    if not problems:
        return
    stats = features.stats
    outcome = ("are left out of training" if training
               else "keep [CLS] labels (evaluation still uses all their gold texts)")
    shown = "; ".join(problems[:_WARN_EXAMPLES])
    _warn(f"{qa.path}: {stats['answers_not_matching_context']} gold answer(s) do not match the context and "
          f"{stats['answers_not_aligned']} cover no token; {stats['questions_without_label']} question(s) without a "
          f"usable answer {outcome}. First: {shown}")


def prepare_qa(inputs: Dict[str, str], tokenizer_from: str, destdir: str, config: QAConfig,
               force: bool = False, strict: bool = False) -> dict:
    """Write a spanbert-prepare-qa folder from ``{split: file}``; return the stats; UsageError on bad input."""
    config.check()
    inputs = {split: path for split, path in inputs.items() if path}
    if not inputs:
        raise UsageError("give --train FILE and/or --valid FILE")
    read_paths = list(inputs.values()) + [tokenizer_from]
    check_destination(destdir, COMMAND, read_paths, force, "--destdir")
    tokenizer, dictionary = load_tokenizer_folder(tokenizer_from)
    files = {split: read_qa_file(path) for split, path in inputs.items()}
    if strict:
        for qa in files.values():
            refuse_problems(answer_problems(qa))
    with atomic_directory(destdir, COMMAND, read_paths, force, "--destdir") as work:
        stats = {}
        for split, qa in files.items():
            features = featurize(qa, tokenizer, dictionary.bos_index, dictionary.eos_index, config,
                                 training=split == "train", name=split)
            if strict:
                refuse_problems(answer_problems(qa, features.unaligned))
            warn_problems(qa, features, split == "train")
            if not features.stats["windows"]:  # fairseq cannot read a split of no window
                raise UsageError(f"--{split} {inputs[split]}: no usable question ({features.stats['questions_left_out']} "
                                 "left out: answers that do not match their context or cover no token); nothing written")
            prefix = os.path.join(work, split)
            offsets = features.window_offsets
            items = (features.tokens[offsets[i]: offsets[i + 1]] for i in range(len(offsets) - 1))
            write_token_items(progress_bar(items, total=len(offsets) - 1, desc=f"{split} write", unit="window"),
                              prefix, len(dictionary))
            features.split.save(work, split)
            stats[split] = features.stats
        copy_tokenizer_files(tokenizer_from, work)
        qa_config = {"max_seq_length": config.max_seq_length, "doc_stride": config.doc_stride,
                     "max_query_length": config.max_query_length, "tokenizer": tokenizer.kind,
                     "lowercase": bool(getattr(tokenizer, "lowercase", False)),
                     "splits": {split: {"file": os.path.abspath(path), "format": files[split].format}
                                for split, path in inputs.items()}}
        write_json(os.path.join(work, "qa_config.json"), qa_config)
        write_json(os.path.join(work, "prepare_stats.json"), stats)
    warn_if_vocabulary_does_not_fit(tokenizer, inputs.values())
    return stats
