"""Start/end logits of QA windows -> answer texts and n-best lists (BERT/SpanBERT's procedure).

Per window, the ``n_best`` highest start and end positions are paired; a pair is a
candidate when both ends lie in the passage, ``start <= end``, it spans at most
``max_answer_length`` tokens and its start token has its maximum context in that
window. Its score is ``start_logit + end_logit`` and its text is cut from the
original context by character offsets. Candidates of a question's windows are
ranked by score and deduplicated by text; the first ``n_best`` form the n-best
list, whose probabilities are a softmax over their scores. With unanswerable
questions (``split.with_negative``) the null answer "" scores the least
``start[0] + end[0]`` ([CLS]) over the question's windows, joins the n-best list
at its place by score (unless an empty text is already there), and wins when
``null_odds = null_score - best_non_null_score > null_threshold`` (``null_odds``
is +inf when no span survived). A question without any candidate and without
negatives gets one empty answer with logits 0. Equal logits and scores (frequent under bfloat16) rank by
position: the earlier window, start and end first, so that a question's answers depend on its own windows
alone, not on which other questions or how much padding share the call (a validation batch, the whole split
of ``spanbert-predict-qa``, the one question of ``hub.answer``).

Candidate generation runs over all windows at once in numpy; Python only walks
each question's few best candidates to deduplicate them and builds the n-best dicts.
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


def _top_positions(logits, inside, k):
    """[B, k] the k highest positions of each row among ``inside`` ones (padding sorts last), in position order; of
    positions tied at the k-th value the earliest are taken (argpartition's choice among them depends on the row's
    width, so on the other windows of the batch)."""
    width = logits.shape[1]
    values = np.where(inside & (logits == logits), logits, -np.inf)  # a NaN logit ranks as padding does
    kth = np.partition(values, width - k, axis=1)[:, width - k, None]
    above = values > kth
    tied = values == kth
    tied &= np.cumsum(tied, axis=1) <= k - above.sum(axis=1, keepdims=True)
    return np.nonzero(above | tied)[1].reshape(len(values), k)


def _candidates(split, window_ids, start_logits, end_logits, n_best, max_answer_length):
    """Surviving pairs over the batch as flat arrays: row, start, end positions and passage token of each."""
    width = start_logits.shape[1]
    offset = split.passage_offset[window_ids][:, None]
    length = split.passage_lengths()[window_ids][:, None]
    first_token = (split.token_offsets[window_ids][:, None] - offset)  # passage token index of position 0
    # positions past the window's final [SEP] are padding: never among the top n
    inside = np.arange(width)[None, :] < offset + length + 1
    k = min(n_best, width)
    top_start, top_end = _top_positions(start_logits, inside, k), _top_positions(end_logits, inside, k)
    start_ok = (top_start >= offset) & (top_start < offset + length)
    start_ok[start_ok] = split.max_context[(first_token + top_start)[start_ok]]
    end_ok = (top_end >= offset) & (top_end < offset + length)
    # [B, k, k] end - start in [0, max_answer_length): one unsigned comparison (negatives wrap around)
    span = (top_end[:, None, :].astype(np.int32) - top_start[:, :, None].astype(np.int32)).view(np.uint32)
    keep = (span < max_answer_length) & start_ok[:, :, None] & end_ok[:, None, :]
    row, i, j = np.nonzero(keep)
    return row, top_start[row, i], top_end[row, j], first_token[row, 0]


def _text_ends(split, start_tokens, end_tokens):
    """The passage token each candidate's text ends on, and whether it has text at all.

    sentencepiece's standalone '▁' is a zero-width token (the space it stands for is not part of a word): a text
    does not end on one (it would end with the space before the next word), and a span of nothing else has no text,
    never an answer (BERT's non-null answers are never empty; an empty one would pass for the null answer). WordPiece
    tokens always have width: nothing changes there.
    """
    ends = np.array(end_tokens, dtype=np.int64)
    zero = split.char_end[ends] <= split.char_start[ends]
    while True:
        movable = zero & (ends > start_tokens)
        if not movable.any():
            return ends, ~zero
        ends[movable] -= 1
        zero[movable] = split.char_end[ends[movable]] <= split.char_start[ends[movable]]


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
    if needed.max() > start_logits.shape[1]:
        row = int(np.argmax(needed))
        raise ValueError(f"window {int(window_ids[row])} has {int(needed[row])} tokens but the logits only "
                         f"{start_logits.shape[1]} columns")

    row, start, end, first_token = _candidates(split, window_ids, start_logits, end_logits, n_best,
                                               max_answer_length)
    text_end, has_text = _text_ends(split, first_token + start, first_token + end)
    if not has_text.all():
        row, start, end, first_token, text_end = row[has_text], start[has_text], end[has_text], \
            first_token[has_text], text_end[has_text]
    row_question = split.question_index[window_ids]
    dense = np.searchsorted(questions, row_question).astype(np.uint16 if len(questions) < 2 ** 16 else np.int64)
    # by question, best first; equal scores by window, start and end (see the module doc)
    order = np.lexsort((end, start, window_ids[row], -(start_logits[row, start] + end_logits[row, end]), dense[row]))
    row, start, end, first_token, text_end = row[order], start[order], end[order], first_token[order], text_end[order]
    char_start, char_end = split.char_start[first_token + start], split.char_end[text_end]
    kept, texts, count, has_empty = _distinct_texts(split, questions, dense[row], char_start, char_end, n_best)
    start_logit, end_logit = start_logits[row[kept], start[kept]], end_logits[row[kept], end[kept]]
    score = start_logit + end_logit
    owner = np.repeat(np.arange(len(questions)), count)
    best = np.cumsum(count) - count  # index in ``kept`` of each question's best (non-null) answer
    answered = count > 0
    best_score = np.full(len(questions), -np.inf)
    best_score[answered] = score[best[answered]]

    result = QAPredictions(question_indices=questions, ids=[split.questions[q]["id"] for q in questions.tolist()])
    says_null = ~answered
    group_max = best_score  # entries are sorted: the first is each question's largest score
    if split.with_negative:
        null_rows = _null_rows(window_ids, row_question, start_logits, end_logits, questions)
        null_start, null_end = start_logits[null_rows, 0], end_logits[null_rows, 0]
        null_score = null_start + null_end
        null_odds = null_score - best_score
        says_null |= null_odds > null_threshold
        result.null_odds = dict(zip(result.ids, null_odds.tolist()))
        add_null = ~has_empty  # the null answer joins the n-best list unless an empty text is there
        group_max = np.where(add_null, np.maximum(best_score, null_score), best_score)
        null_weight = np.where(add_null, np.exp(null_score - group_max), 0.0)
        # its place: after the entries scoring at least as much
        null_at = np.bincount(owner, weights=score >= null_score[owner], minlength=len(questions)).astype(np.int64)
    weights = np.exp(score - group_max[owner])
    total = np.bincount(owner, weights=weights, minlength=len(questions))
    if split.with_negative:
        total = total + null_weight
        null_probability = (null_weight / total).tolist()
    probability = weights / total[owner]

    answers = np.where(says_null, -1, best).tolist()
    result.predictions = {qid: "" if a < 0 else texts[a] for qid, a in zip(result.ids, answers)}
    rows = list(zip(texts, probability.tolist(), start_logit.tolist(), end_logit.tolist(),
                    char_start[kept].tolist(), char_end[kept].tolist()))
    bounds = np.r_[0, np.cumsum(count)].tolist()
    for n, qid in enumerate(result.ids):
        nbest = [{"text": text, "probability": p, "start_logit": sl, "end_logit": el, "start": cs, "end": ce}
                 for text, p, sl, el, cs, ce in rows[bounds[n]:bounds[n + 1]]]
        if split.with_negative and add_null[n]:
            nbest.insert(int(null_at[n]), {"text": "", "probability": null_probability[n],
                                            "start_logit": float(null_start[n]), "end_logit": float(null_end[n]),
                                            "start": -1, "end": -1})
        elif not nbest:  # no candidate at all
            nbest = [{"text": "", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0, "start": -1, "end": -1}]
        result.nbest[qid] = nbest
    return result


def _distinct_texts(split, questions, candidate_question, char_start, char_end, n_best):
    """Each question's first ``n_best`` candidates of distinct text.

    Candidates are sorted by ``candidate_question`` (position in ``questions``), best first.
    Returns the kept candidates' indices, their texts, and per question how many were kept and
    whether one of them is the empty text.
    """
    bounds = np.searchsorted(candidate_question, np.arange(len(questions) + 1)).tolist()
    first, last = bounds[:-1], bounds[1:]
    char_start, char_end = char_start.tolist(), char_end.tolist()
    kept, texts, count, has_empty = [], [], [], []
    for q, lo, hi in zip(questions.tolist(), first, last):
        context = split.contexts[split.questions[q]["context_index"]]
        top = min(hi, lo + n_best)
        best_texts = [context[a:b] for a, b in zip(char_start[lo:top], char_end[lo:top])]
        seen = set(best_texts)
        if len(seen) == len(best_texts):  # the usual case: the first n_best texts are already distinct
            kept.extend(range(lo, top))
            texts.extend(best_texts)
        else:
            seen = set()
            for c in range(lo, hi):
                text = context[char_start[c]:char_end[c]]
                if text not in seen:
                    seen.add(text)
                    kept.append(c)
                    texts.append(text)
                    if len(seen) == n_best:
                        break
        count.append(len(seen))
        has_empty.append("" in seen)
    return np.array(kept, dtype=np.int64), texts, np.array(count, dtype=np.int64), np.array(has_empty, dtype=bool)


def _null_rows(window_ids, row_question, start_logits, end_logits, questions) -> np.ndarray:
    """Each question's null answer: the row of its window with the least [CLS] start + end score (of equal ones,
    the earliest window's)."""
    null_scores = start_logits[:, 0] + end_logits[:, 0]
    by_question = np.lexsort((window_ids, null_scores, row_question))
    return by_question[np.searchsorted(row_question[by_question], questions)]
