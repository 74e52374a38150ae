"""Answer every question of a prepared split with a fine-tuned checkpoint; write the official files.

Batches are built exactly as at validation (whole questions per batch, the
checkpoint's validation batch size unless overridden), so the EM/F1 written
here equal the ones fairseq-train logged for the same checkpoint.
"""
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..core.errors import UsageError
from ..core.file_utils import atomic_directory, check_destination, checkpoint_inputs
from ..core.finetune_io import load_finetuned_checkpoint, predict_split_outputs
from .scoring import answer_options_of, rules_of

COMMAND = "spanbert-predict-qa"


def load_qa_checkpoint(checkpoint: str, data: Optional[str] = None, cpu: bool = False):
    """(model, task, cfg) of an extractive_qa checkpoint; ``data`` overrides the prepared folder."""
    return load_finetuned_checkpoint(checkpoint, "extractive_qa", data, cpu)


@dataclass
class SplitLogits:
    """Start/end logits of every window of a split, padded to the longest window."""

    window_ids: np.ndarray
    start: np.ndarray
    end: np.ndarray


def split_logits(model, task, cfg, split: str, batch_size=None, max_tokens=None) -> SplitLogits:
    """Run the model over every window of ``split`` in validation batches (whole questions)."""
    from .criterion import qa_logits

    logits = predict_split_outputs(
        model, task, cfg, split, lambda sample: torch.stack(qa_logits(model, sample), dim=1),
        lambda dataset: (2, int(dataset.sizes.max()) if len(dataset) else 0), fill=np.finfo(np.float32).min,
        batch_size=batch_size, max_tokens=max_tokens,
    )
    return SplitLogits(np.arange(len(logits)), logits[:, 0], logits[:, 1])


def near_ties(result, margin: float, null_threshold: float = 0.0) -> np.ndarray:
    """Indices of the questions whose answer a change of less than ``margin`` in a span score could flip.

    That is: the best span leads the next distinct one by less than ``margin`` (start + end logits), or, with
    unanswerable questions, the null odds lie within ``margin`` of ``null_threshold``."""
    close = []
    for index, qid in zip(result.question_indices.tolist(), result.ids):
        odds = result.null_odds.get(qid)
        if answer_lead(result.nbest[qid]) < margin or (odds is not None and abs(odds - null_threshold) < margin):
            close.append(index)
    return np.asarray(close, dtype=np.int64)


def answer_lead(nbest) -> float:
    """How far the best span's score (start + end logits) leads the next distinct span's (inf with fewer than 2)."""
    spans = [e["start_logit"] + e["end_logit"] for e in nbest[:3] if e["start"] >= 0][:2]  # the null entry aside
    return spans[0] - spans[1] if len(spans) == 2 else float("inf")


def window_logits_fp32(model, dataset, windows: np.ndarray, width: int, batch_size: int = 32) -> SplitLogits:
    """Start/end logits of ``windows`` computed in fp32 whatever autocast is active, batched by length."""
    from .criterion import qa_logits

    windows = windows[np.argsort(dataset.sizes[windows], kind="stable")]
    fill = np.finfo(np.float32).min
    start, end = np.full((len(windows), width), fill, np.float32), np.full((len(windows), width), fill, np.float32)
    device = next(model.parameters()).device
    with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
        for lo in range(0, len(windows), batch_size):
            sample = dataset.collater([dataset[int(i)] for i in windows[lo:lo + batch_size]])
            net_input = {k: v.to(device) if torch.is_tensor(v) else v for k, v in sample["net_input"].items()}
            s, e = qa_logits(model, {"net_input": net_input})
            start[lo:lo + len(s), : s.shape[1]], end[lo:lo + len(e), : e.shape[1]] = s.cpu().numpy(), e.cpu().numpy()
    return SplitLogits(windows, start, end)


def predict_split(checkpoint, data, split, out, options: Optional[dict] = None, force=False, batch_size=None,
                  max_tokens=None, cpu=False, fp32_recheck_margin: float = 0.0):
    """Write predictions.json, null_odds.json (SQuAD 2.0), nbest_predictions.json and eval.json to ``out``.

    ``options``: ``n_best``, ``max_answer_length``, ``null_threshold``; those not given (or None) are the
    checkpoint's criterion settings, so that the scores equal the ones validation logged.

    With ``fp32_recheck_margin`` > 0 (meant for bfloat16 autocast), the windows of every question that is a near
    tie (:func:`near_ties`) are computed again in fp32 and those questions answered from the fp32 logits."""
    from .squad_metrics import evaluate
    from .postprocess import postprocess

    inputs = checkpoint_inputs(checkpoint, data)  # the data folder the checkpoint names counts too
    check_destination(out, COMMAND, inputs, force, "--out")
    model, task, cfg = load_qa_checkpoint(checkpoint, data, cpu)
    qa = task.qa_split(split)
    options = dict(options or {})
    if options.pop("null_threshold_from_validation", False):
        options["null_threshold"] = task.validated_null_threshold()
        if options["null_threshold"] is None:
            raise UsageError(f"--null-threshold-from-validation: {checkpoint} holds no validated threshold (saved "
                             "before a validation with unanswerable questions, or by an older version); give "
                             "--null-threshold")
        print(f"{COMMAND}: null threshold {options['null_threshold']:g}, the best of the validation before "
              f"{checkpoint} was saved", file=sys.stderr)
    given_threshold = options.get("null_threshold") is not None
    options = answer_options_of(cfg, **options)
    if given_threshold and not qa.with_negative:
        print(f"{COMMAND}: warning: --null-threshold has no effect: split {split!r} has no unanswerable question "
              "(SQuAD 1.1 rules; every question gets a span)", file=sys.stderr)
    logits = split_logits(model, task, cfg, split, batch_size, max_tokens)

    def answer():
        return postprocess(qa, logits.window_ids, logits.start, logits.end, n_best=options.n_best,
                           max_answer_length=options.max_answer_length, null_threshold=options.null_threshold)

    result = answer()
    if fp32_recheck_margin > 0:
        close = near_ties(result, fp32_recheck_margin, options.null_threshold)
        windows = np.flatnonzero(np.isin(qa.question_index, close))
        fp32 = window_logits_fp32(model, task.dataset(split), windows, logits.start.shape[1])
        logits.start[fp32.window_ids], logits.end[fp32.window_ids] = fp32.start, fp32.end
        result = answer()
        print(f"{COMMAND}: {len(close)} of {len(qa.questions)} questions were near ties (margin "
              f"{fp32_recheck_margin:g}); their {len(windows)} windows were computed again in fp32", file=sys.stderr)
    missing = [q["id"] for q in qa.questions if q["id"] not in result.predictions]
    if missing:
        raise RuntimeError(f"split {split!r}: {len(missing)} questions got no prediction (first: {missing[0]})")
    predictions = {q["id"]: result.predictions[q["id"]] for q in qa.questions}
    # no surviving span gives infinite odds; JSON has no infinity, so the largest finite float stands in
    null_odds = ({q["id"]: min(float(result.null_odds[q["id"]]), sys.float_info.max) for q in qa.questions}
                 if qa.with_negative else None)
    # -t --null-threshold, as the official v2.0 script would be run: exact/f1 then score predictions.json as written
    scores = evaluate(qa.questions, predictions, na_probs=null_odds, na_prob_thresh=options.null_threshold,
                      rules=rules_of(qa))
    with atomic_directory(out, COMMAND, inputs, force, "--out") as work:
        _dump(os.path.join(work, "predictions.json"), predictions)
        if null_odds is not None:
            _dump(os.path.join(work, "null_odds.json"), null_odds)
        _dump(os.path.join(work, "nbest_predictions.json"), {q["id"]: result.nbest[q["id"]] for q in qa.questions})
        _dump(os.path.join(work, "eval.json"), scores)
    return scores


def _dump(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=2, default=_plain)


def _plain(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
