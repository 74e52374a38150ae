"""Start/end logits of QA windows -> answer texts and n-best lists (BERT/SpanBERT's procedure).

Per window, the ``n_best`` highest start and end positions are paired; a pair is a
candidate when both ends lie in the passage, ``start <= end``, it spans at most
``max_answer_length`` tokens and its start token has its maximum context in that
window. Its score is ``start_logit + end_logit`` and its text is cut from the
original context by character offsets. Candidates of a question's windows are
ranked by score and deduplicated by text; the first ``n_best`` form the n-best
list, whose probabilities are a softmax over their scores. With unanswerable
questions (``split.with_negative``) the null answer "" scores the least
``start[0] + end[0]`` ([CLS]) over the question's windows, joins the n-best list,
and wins when ``null_score - best_non_null_score > null_threshold``.

Candidate generation runs over all windows at once in numpy; Python only walks
each question's few best candidates to deduplicate them.
"""
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from .windows import QASplit


@dataclass
class QAPredictions:
    """Answers of the questions covered by one ``postprocess`` call, keyed by question id."""

    question_indices: np.ndarray  # [Q'] covered question indices of the split, ascending
    ids: List[str] = field(default_factory=list)  # their ids, same order
    predictions: Dict[str, str] = field(default_factory=dict)  # id -> answer text ("" = no answer)
    nbest: Dict[str, List[dict]] = field(default_factory=dict)  # id -> n-best entries, best first
    null_odds: Dict[str, float] = field(default_factory=dict)  # id -> null minus best non-null score

    def __len__(self) -> int:
        return len(self.ids)

    def prediction_of(self, question_index: int) -> str:
        """The answer text of question ``question_index`` of the split."""
        pos = int(np.searchsorted(self.question_indices, question_index))
        if pos == len(self.ids) or self.question_indices[pos] != question_index:
            raise KeyError(f"question {question_index} is not covered by these predictions")
        return self.predictions[self.ids[pos]]

    def update(self, other: "QAPredictions") -> None:
        """Add the questions of ``other`` (from another batch of windows of the same split)."""
        if np.intersect1d(self.question_indices, other.question_indices).size:
            raise ValueError("the two predictions cover the same question")
        order = np.argsort(np.concatenate([self.question_indices, other.question_indices]), kind="stable")
        ids = self.ids + other.ids
        self.question_indices = np.concatenate([self.question_indices, other.question_indices])[order]
        self.ids = [ids[i] for i in order]
        self.predictions.update(other.predictions)
        self.nbest.update(other.nbest)
        self.null_odds.update(other.null_odds)


def _covered_questions(split: QASplit, window_ids: np.ndarray) -> np.ndarray:
    """The questions ``window_ids`` touch; ValueError unless it holds each of their windows once."""
    if window_ids.size and (window_ids.min() < 0 or window_ids.max() >= split.num_windows):
        raise ValueError(f"window ids must lie in [0, {split.num_windows})")
    questions = np.unique(split.question_index[window_ids])
    expected = np.flatnonzero(np.isin(split.question_index, questions))  # windows are grouped by question
    if not np.array_equal(np.sort(window_ids), expected):
        counts = np.bincount(window_ids, minlength=split.num_windows)
        missing = expected[counts[expected] == 0]
        window = int(missing[0]) if missing.size else int(np.flatnonzero(counts > 1)[0])
        raise ValueError(f"window_ids must hold every window of each question they touch exactly once: "
                         f"window {window} (question {int(split.question_index[window])}) is "
                         f"{'missing' if missing.size else 'repeated'}")
    return questions


def _candidates(split, window_ids, start_logits, end_logits, n_best, max_answer_length):
    """All surviving (row, start, end, score) pairs over the batch, as flat arrays."""
    rows, width = start_logits.shape
    offset = split.passage_offset[window_ids]
    length = split.passage_lengths()[window_ids]
    # positions past the window's final [SEP] are padding: never among the top n
    inside = np.arange(width)[None, :] < (offset + length + 1)[:, None]
    start_masked = np.where(inside, start_logits, -np.inf)
    end_masked = np.where(inside, end_logits, -np.inf)
    k = min(n_best, width)
    top_start = np.argpartition(-start_masked, k - 1, axis=1)[:, :k]  # [B, k]
    top_end = np.argpartition(-end_masked, k - 1, axis=1)[:, :k]
    starts = np.broadcast_to(top_start[:, :, None], (rows, k, k))
    ends = np.broadcast_to(top_end[:, None, :], (rows, k, k))
    lo, hi = offset[:, None, None], (offset + length)[:, None, None]
    keep = ((starts >= lo) & (starts < hi) & (ends >= lo) & (ends < hi)
            & (ends >= starts) & (ends - starts + 1 <= max_answer_length))
    row, i, j = np.nonzero(keep)
    start, end = top_start[row, i], top_end[row, j]
    first_token = split.token_offsets[window_ids[row]] - offset[row]  # passage token index of position 0
    max_context = split.max_context[first_token + start]
    row, start, end, first_token = row[max_context], start[max_context], end[max_context], first_token[max_context]
    score = start_logits[row, start] + end_logits[row, end]
    return row, start, end, score, first_token


def postprocess(split: QASplit, window_ids: np.ndarray, start_logits: np.ndarray, end_logits: np.ndarray,
                n_best: int = 20, max_answer_length: int = 30, null_threshold: float = 0.0) -> QAPredictions:
    """Answers and n-best lists of every question whose windows are ``window_ids`` (see the module doc)."""
    window_ids = np.asarray(window_ids, dtype=np.int64)
    start_logits = np.asarray(start_logits, dtype=np.float64)
    end_logits = np.asarray(end_logits, dtype=np.float64)
    if start_logits.shape != end_logits.shape or start_logits.ndim != 2 or len(start_logits) != len(window_ids):
        raise ValueError(f"start/end logits must both be [len(window_ids)={len(window_ids)}, T], got "
                         f"{start_logits.shape} and {end_logits.shape}")
    if n_best < 1 or max_answer_length < 1:
        raise ValueError("n_best and max_answer_length must be positive")
    questions = _covered_questions(split, window_ids)
    if not questions.size:
        return QAPredictions(question_indices=questions)
    needed = split.passage_offset[window_ids] + split.passage_lengths()[window_ids] + 1
    if window_ids.size and needed.max() > start_logits.shape[1]:
        row = int(np.argmax(needed))
        raise ValueError(f"window {int(window_ids[row])} has {int(needed[row])} tokens but the logits only "
                         f"{start_logits.shape[1]} columns")

    row, start, end, score, first_token = _candidates(split, window_ids, start_logits, end_logits,
                                                      n_best, max_answer_length)
    row_question = split.question_index[window_ids]
    question = row_question[row]
    order = np.lexsort((end, start, window_ids[row], -score, question))  # by question, best first
    row, start, end, question = row[order], start[order], end[order], question[order]
    char_start = split.char_start[first_token[order] + start]
    char_end = split.char_end[first_token[order] + end]
    first = np.searchsorted(question, questions, side="left")
    last = np.searchsorted(question, questions, side="right")
    if split.with_negative:
        # the null answer of a question comes from its window with the least [CLS] score
        null_scores = start_logits[:, 0] + end_logits[:, 0]
        by_question = np.lexsort((null_scores, row_question))
        null_rows = by_question[np.searchsorted(row_question[by_question], questions)]

    result = QAPredictions(question_indices=questions)
    for n, q in enumerate(questions):
        context = split.contexts[split.questions[q]["context_index"]]
        entries = []
        seen = set()
        for c in range(first[n], last[n]):
            text = context[char_start[c]:char_end[c]]
            if text in seen:
                continue
            seen.add(text)
            entries.append(_entry(text, start_logits[row[c], start[c]], end_logits[row[c], end[c]],
                                  char_start[c], char_end[c]))
            if len(entries) == n_best:
                break
        qid = split.questions[q]["id"]
        if split.with_negative:
            null_row = null_rows[n]
            null = _entry("", start_logits[null_row, 0], end_logits[null_row, 0], -1, -1)
            answer, result.null_odds[qid] = _null_decision(entries, null, "" in seen, null_threshold)
        else:
            answer = entries[0]["text"] if entries else ""
        if not entries:
            entries = [_entry("", 0.0, 0.0, -1, -1)]
        scores = np.array([e["score"] for e in entries])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        for e, p in zip(entries, probs):
            e["probability"] = float(p)
            del e["score"]
        result.ids.append(qid)
        result.predictions[qid] = answer
        result.nbest[qid] = entries
    return result


def _entry(text, start_logit, end_logit, start, end):
    start_logit, end_logit = float(start_logit), float(end_logit)
    return {"text": text, "probability": 0.0, "start_logit": start_logit, "end_logit": end_logit,
            "start": int(start), "end": int(end), "score": start_logit + end_logit}


def _null_decision(entries, null, empty_text_seen, null_threshold):
    """Insert the null answer into the n-best list (by score); return (answer, null_odds)."""
    if not empty_text_seen:
        entries.insert(sum(e["score"] >= null["score"] for e in entries), null)
    best_non_null = next((e for e in entries if e is not null), None)
    if best_non_null is None:
        return "", float("inf")
    score_diff = null["score"] - best_non_null["score"]
    return ("" if score_diff > null_threshold else best_non_null["text"]), float(score_diff)
