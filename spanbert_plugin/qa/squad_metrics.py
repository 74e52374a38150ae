"""Exact match and token F1 as the official SQuAD evaluation scripts define them.

Two rule sets:

* ``rules="v1"``: SQuAD 1.1 (also MRQA over its ``answers``). Gold answers are used
  as given (SQuAD 1.1 dev has three that normalise to ""); F1 is 0 without a common
  token, so two empty answers give 0; a question without a prediction scores 0 and
  is counted in ``missing``. Keys: ``exact_match`` (the v1.1 script's name),
  ``exact``, ``f1``, ``total``, ``missing``.
* ``rules="v2"``: SQuAD 2.0. Gold answers that normalise to "" are dropped, a
  question left without gold answers has gold ""; F1 of two empty answers is 1.
  Questions are split into HasAns (gold answers given) and NoAns; with a map of
  no-answer probabilities, a question whose probability exceeds the threshold is
  scored as predicting no answer, and the best threshold is searched as the
  official script does (``best_exact``/``best_f1`` and their thresholds). With
  every question predicted the two agree; a question without a prediction counts
  0 here, as in every other score, where the official search starts by counting
  every NoAns question right, missing ones too, and divides by the predicted ones
  only (so its best score can pass 100).

All scores returned by ``evaluate`` are percentages.
"""
import re
import string
from collections import Counter
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
RULES = ("v1", "v2")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse white space."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCTUATION)).split())


def exact_match(prediction: str, gold: str) -> int:
    """1 if the normalised texts are equal, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def _token_f1(pred_tokens: List[str], pred_counts: Counter, gold_tokens: List[str], rules: str) -> float:
    if rules == "v2" and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    remaining, common = dict(pred_counts), 0  # size of the multiset intersection
    for token in gold_tokens:
        if remaining.get(token, 0) > 0:
            remaining[token] -= 1
            common += 1
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, gold: str, rules: str = "v1") -> float:
    """Token F1 (in [0, 1]) between the normalised texts; empty answers follow ``rules``."""
    _check_rules(rules)
    pred_tokens = normalize_answer(prediction).split()
    return _token_f1(pred_tokens, Counter(pred_tokens), normalize_answer(gold).split(), rules)


def _check_rules(rules: str) -> None:
    if rules not in RULES:
        raise ValueError(f"rules must be one of {RULES}, got {rules!r}")


def gold_answers(answers: Sequence[str], rules: str) -> List[str]:
    """The gold texts a prediction is compared with under ``rules``."""
    if rules == "v1":
        return list(answers)
    kept = [a for a in answers if normalize_answer(a)]
    return kept or [""]


def question_scores(prediction: str, answers: Sequence[str], rules: str = "v1") -> Tuple[int, float]:
    """(exact match, F1) of one prediction: the maxima over the question's gold answers under ``rules``."""
    _check_rules(rules)
    golds = {normalize_answer(g) for g in answers}  # equal golds score alike
    if rules == "v2":  # as gold_answers: drop golds that normalise to "", none left: gold ""
        golds = (golds - {""}) or {""}
    elif not golds:
        raise ValueError("no gold answer (v1 rules need at least one)")
    normalized = normalize_answer(prediction)
    pred_tokens = normalized.split()
    pred_counts = Counter(pred_tokens)
    return int(normalized in golds), max(_token_f1(pred_tokens, pred_counts, g.split(), rules) for g in golds)


def raw_scores(questions: Sequence[Mapping], predictions: Mapping[str, str],
               rules: str = "v1") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per question: (exact, f1, predicted) arrays; exact/f1 in [0, 1], 0 where no prediction."""
    _check_rules(rules)
    exact = np.zeros(len(questions))
    token_f1 = np.zeros(len(questions))
    predicted = np.zeros(len(questions), dtype=bool)
    for i, question in enumerate(questions):
        if rules == "v1" and not question["answers"]:
            raise ValueError(f"question {question['id']}: no gold answer (v1 rules need at least one)")
        if question["id"] in predictions:
            predicted[i] = True
            exact[i], token_f1[i] = question_scores(predictions[question["id"]], question["answers"], rules)
    return exact, token_f1, predicted


def best_threshold(na_probs: np.ndarray, raw_scores: np.ndarray, has_answer: np.ndarray,
                   prediction_nonempty: np.ndarray) -> Tuple[float, float]:
    """The official no-answer threshold search: (best score in percent, its threshold).

    Start from predicting no answer everywhere (one point per NoAns question), then
    lower the bar question by question in ascending na_prob order (stable), adding the
    raw score of HasAns questions and -1 for NoAns questions answered with text; the
    best running score (first reached) and the na_prob where it is reached win.
    """
    na_probs = np.asarray(na_probs, dtype=np.float64)
    has_answer = np.asarray(has_answer, dtype=bool)
    total = len(na_probs)
    if total == 0:
        return 0.0, 0.0
    order = np.argsort(na_probs, kind="stable")
    gain = np.where(has_answer, np.asarray(raw_scores, dtype=np.float64),
                    -np.asarray(prediction_nonempty, dtype=np.float64))
    start = float(np.count_nonzero(~has_answer))
    # summed from the starting count one gain at a time, as the official script adds them: start + cumsum(gain)
    # rounds other prefixes otherwise, and a tie can then be won by a later threshold
    running = np.cumsum(np.concatenate([[start], gain[order]]))[1:]
    best = int(np.argmax(running))
    if running[best] > start:
        return 100.0 * float(running[best]) / total, float(na_probs[order[best]])
    return 100.0 * start / total, 0.0


def _percent_dict(prefix: str, exact: np.ndarray, token_f1: np.ndarray) -> Dict[str, float]:
    n = len(exact)
    return {f"{prefix}exact": 100.0 * float(exact.sum()) / n if n else 0.0,
            f"{prefix}f1": 100.0 * float(token_f1.sum()) / n if n else 0.0,
            f"{prefix}total": n}


def evaluate(questions: Sequence[Mapping], predictions: Mapping[str, str],
             na_probs: Optional[Mapping[str, float]] = None, na_prob_thresh: float = 1.0,
             rules: str = "v1") -> Dict[str, float]:
    """Official SQuAD metrics over ``questions`` (dicts with ``id`` and ``answers``), in percent."""
    _check_rules(rules)
    exact, token_f1, predicted = raw_scores(questions, predictions, rules)
    missing = int(np.count_nonzero(~predicted))
    if rules == "v1":
        if na_probs is not None:
            raise ValueError("no-answer probabilities need rules='v2'")
        result = _percent_dict("", exact, token_f1)
        result["exact_match"] = result["exact"]
        result["missing"] = missing
        return result

    has_answer = np.array([bool(q["answers"]) for q in questions], dtype=bool)
    if na_probs is not None:
        absent = [q["id"] for q, p in zip(questions, predicted) if p and q["id"] not in na_probs]
        if absent:
            raise ValueError(f"no no-answer probability for question {absent[0]} ({len(absent)} in all)")
        probs = np.array([na_probs[q["id"]] if p else 0.0 for q, p in zip(questions, predicted)])
        says_no_answer = predicted & (probs > na_prob_thresh)
        exact_thr = np.where(says_no_answer, ~has_answer, exact)
        f1_thr = np.where(says_no_answer, ~has_answer, token_f1)
    else:
        exact_thr, f1_thr = exact, token_f1

    result = _percent_dict("", exact_thr, f1_thr)
    for prefix, subset in (("HasAns_", has_answer), ("NoAns_", ~has_answer)):
        if subset.any():
            result.update(_percent_dict(prefix, exact_thr[subset], f1_thr[subset]))
    if na_probs is not None:
        # the search runs over answered questions; missing ones stay at 0 in the total
        nonempty = np.array([bool(predictions[q["id"]]) if p else False
                             for q, p in zip(questions, predicted)])
        share = np.count_nonzero(predicted) / len(questions)
        for key, scores in (("exact", exact), ("f1", token_f1)):
            best, thresh = best_threshold(probs[predicted], scores[predicted], has_answer[predicted],
                                          nonempty[predicted])
            result[f"best_{key}"] = best * share
            result[f"best_{key}_thresh"] = thresh
    result["missing"] = missing
    return result
