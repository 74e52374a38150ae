"""Per-question answers and scores, shared by validation and ``spanbert-predict-qa``.

Validation scores a batch of whole questions at a time and keeps one record
per question (its index, exact match, F1, null odds, ...); the summary of all
records equals the official evaluation of the whole split, which
``spanbert-predict-qa`` runs on the same predictions.
"""
from dataclasses import dataclass

import numpy as np

from .squad_metrics import best_threshold, question_scores
from .postprocess import postprocess
from .windows import QASplit

# ``says_null``: null_odds > --null-threshold, the official v2.0 script's "no answer" override when it is run
# with ``-n null_odds.json -t <null threshold>``, so that em/f1 score the predictions as written.
RECORD_FIELDS = ("question", "exact", "f1", "has_answer", "null_odds", "nonempty", "says_null")


@dataclass
class AnswerOptions:
    n_best: int = 20
    max_answer_length: int = 30
    null_threshold: float = 0.0


def answer_options_of(cfg, n_best=None, max_answer_length=None, null_threshold=None) -> AnswerOptions:
    """The options given, the others as the checkpoint's ``extractive_qa`` criterion validated with (``cfg`` its run
    config), else the defaults."""
    from omegaconf import OmegaConf

    given = {"n_best": n_best, "max_answer_length": max_answer_length, "null_threshold": null_threshold}
    stored = cfg.get("criterion") if cfg is not None else None
    stored = stored if OmegaConf.is_dict(stored) or isinstance(stored, dict) else {}
    chosen = {}
    for key, value in given.items():
        value = stored.get(key) if value is None else value
        chosen[key] = getattr(AnswerOptions, key) if value is None else value
    return AnswerOptions(**chosen)


def rules_of(split: QASplit) -> str:
    """SQuAD 2.0 rules where unanswerable questions exist, v1.1 rules otherwise (SQuAD 1.1, MRQA)."""
    return "v2" if split.with_negative else "v1"


def score_windows(split: QASplit, window_ids, start_logits, end_logits, options: AnswerOptions):
    """Answer the questions whose windows are given; return (QAPredictions, records array [n, len(RECORD_FIELDS)])."""
    result = postprocess(split, np.asarray(window_ids), start_logits, end_logits, n_best=options.n_best,
                         max_answer_length=options.max_answer_length, null_threshold=options.null_threshold)
    rules = rules_of(split)
    questions = np.unique(split.question_index[np.asarray(window_ids)])
    records = np.zeros((len(questions), len(RECORD_FIELDS)), dtype=np.float64)
    for row, q in enumerate(questions):
        question = split.questions[q]
        prediction = result.predictions[question["id"]]
        exact, token_f1 = question_scores(prediction, question["answers"], rules)
        null_odds = result.null_odds.get(question["id"], 0.0) if split.with_negative else 0.0
        records[row] = (
            q,
            exact,
            token_f1,
            bool(question["answers"]),  # the official v2 script's HasAns: any gold answer given
            null_odds,
            bool(prediction),
            split.with_negative and null_odds > options.null_threshold,
        )
    return result, records


def summarize(records: np.ndarray, with_negative: bool) -> dict:
    """Validation metrics (percent) from the records of every question of a split.

    ``em``/``f1`` (and ``has_ans_f1``/``no_ans_f1``) score the answers as predicted, with the
    official v2.0 script's threshold at --null-threshold; ``best_*`` come from its threshold search.
    """
    if len(records) == 0:
        return {}
    records = records[np.argsort(records[:, 0], kind="stable")]  # question order, as the official search
    exact, raw_f1, has_answer, null_odds, nonempty, says_null = records[:, 1:].T  # RECORD_FIELDS after the question
    if not with_negative:
        return {"em": 100 * exact.mean(), "f1": 100 * raw_f1.mean()}
    has_answer = has_answer.astype(bool)
    as_null = says_null.astype(bool)
    exact = np.where(as_null, ~has_answer, exact).astype(float)
    f1_ = np.where(as_null, ~has_answer, raw_f1).astype(float)  # at --null-threshold
    out = {"em": 100 * exact.mean(), "f1": 100 * f1_.mean()}
    if has_answer.any():
        out["has_ans_f1"] = 100 * f1_[has_answer].mean()
    if (~has_answer).any():
        out["no_ans_f1"] = 100 * f1_[~has_answer].mean()
    out["best_f1"], out["best_f1_thresh"] = best_threshold(null_odds, raw_f1, has_answer, nonempty.astype(bool))
    return out
