"""Relation extraction scores: micro precision, recall and F1 over every relation but the negative one.

TACRED's scoring (and SpanBERT's): a prediction counts as correct for P/R/F1
only when it equals the gold label and that label is not the negative label;
predicting the negative label is never a hit. All scores are functions of four
counts that sum exactly across batches and workers.
"""
from typing import Dict

import numpy as np
import torch

COUNT_KEYS = ("re_correct_positive", "re_predicted_positive", "re_gold_positive", "re_correct", "re_examples")


def relation_counts(predicted, gold, negative_index: int = 0) -> Dict[str, int]:
    """The counts behind the scores, for label indices ``predicted`` and ``gold``: ints for arrays or lists; for
    tensors, tensors on their device (a training step reads nothing back from the GPU)."""
    tensors = torch.is_tensor(predicted) and torch.is_tensor(gold)
    if not tensors:
        predicted, gold = np.asarray(predicted), np.asarray(gold)
    if predicted.shape != gold.shape:
        raise ValueError(f"{tuple(predicted.shape)} predictions for {tuple(gold.shape)} gold labels")
    correct = predicted == gold
    counts = {
        "re_correct_positive": (correct & (gold != negative_index)).sum(),
        "re_predicted_positive": (predicted != negative_index).sum(),
        "re_gold_positive": (gold != negative_index).sum(),
        "re_correct": correct.sum(),
    }
    counts = counts if tensors else {key: int(value) for key, value in counts.items()}
    return {**counts, "re_examples": int(gold.numel() if tensors else gold.size)}


def relation_scores(counts: Dict[str, float]) -> Dict[str, float]:
    """Precision, recall, F1 and accuracy in percent, as the TACRED scorer defines them.

    With no positive prediction precision is 100 (the scorer's definition: nothing claimed, nothing
    wrong); recall is 0 without gold positives, F1 0 when precision and recall are both 0.
    """
    hits = counts["re_correct_positive"]
    predicted, gold = counts["re_predicted_positive"], counts["re_gold_positive"]
    precision = hits / predicted if predicted else 1.0
    recall = hits / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = counts["re_correct"] / counts["re_examples"] if counts["re_examples"] else 0.0
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1, "accuracy": 100 * accuracy}
