"""GLUE's classification and regression metrics, from confusion counts or (prediction, target) pairs.

Classification metrics are functions of the K x K confusion matrix (rows: gold
class, columns: predicted class) so that they stay exact when counts are summed
over batches and workers. Degenerate cases follow scikit-learn: MCC and F1 are
0 when their denominator is 0. Correlations of a constant series are undefined;
they are reported as 0 (no evidence of correlation) so that checkpoint selection
never compares NaNs.
"""
from typing import Dict, Sequence

import numpy as np


def confusion_matrix(gold, predicted, num_classes: int) -> np.ndarray:
    """K x K counts: ``[g, p]`` = examples of gold class g predicted as p."""
    gold = np.asarray(gold, dtype=np.int64)
    predicted = np.asarray(predicted, dtype=np.int64)
    counts = np.bincount(gold * num_classes + predicted, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def accuracy(confusion) -> float:
    """Share of examples on the diagonal (0 for an empty matrix)."""
    confusion = np.asarray(confusion, dtype=np.float64)
    total = confusion.sum()
    return float(np.trace(confusion) / total) if total else 0.0


def f1_per_class(confusion) -> np.ndarray:
    """F1 of each class against the rest (0 where precision + recall is 0)."""
    confusion = np.asarray(confusion, dtype=np.float64)
    true_positive = np.diag(confusion)
    denominator = confusion.sum(axis=0) + confusion.sum(axis=1)  # 2 TP + FP + FN
    return np.divide(2 * true_positive, denominator, out=np.zeros_like(true_positive), where=denominator > 0)


def matthews_corrcoef(confusion) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K), as scikit-learn computes it."""
    confusion = np.asarray(confusion, dtype=np.float64)
    total = confusion.sum()
    gold_totals, predicted_totals = confusion.sum(axis=1), confusion.sum(axis=0)
    covariance = np.trace(confusion) * total - gold_totals @ predicted_totals
    predicted_variance = total * total - predicted_totals @ predicted_totals
    gold_variance = total * total - gold_totals @ gold_totals
    if predicted_variance * gold_variance == 0:
        return 0.0
    return float(covariance / np.sqrt(predicted_variance * gold_variance))


def classification_metrics(confusion, positive_class: int = 1) -> Dict[str, float]:
    """GLUE metrics in percent: accuracy and MCC; F1 of ``positive_class`` and the mean of accuracy and F1 (binary),
    or macro F1."""
    confusion = np.asarray(confusion)
    out = {"accuracy": 100 * accuracy(confusion), "mcc": 100 * matthews_corrcoef(confusion)}
    f1 = f1_per_class(confusion)
    if len(confusion) == 2:
        out["f1"] = 100 * float(f1[positive_class])
        out["acc_and_f1"] = (out["accuracy"] + out["f1"]) / 2  # GLUE's score of MRPC and QQP
    else:
        out["macro_f1"] = 100 * float(f1.mean()) if len(f1) else 0.0
    return out


def average_ranks(values) -> np.ndarray:
    """Ranks from 1, ties given their average rank (``scipy.stats.rankdata``'s default)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    # each run of equal values shares the mean of its first and last 1-based positions
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    run_of = np.repeat(np.arange(len(starts)), ends - starts)
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = ((starts + 1 + ends) / 2.0)[run_of]
    return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation (0 when either series is constant or has fewer than 2 values)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return 0.0
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx @ dx) * (dy @ dy))
    return float(np.clip((dx @ dy) / denominator, -1.0, 1.0)) if denominator > 0 else 0.0


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson of the average ranks."""
    return pearson(average_ranks(x), average_ranks(y))


def regression_metrics(predicted, gold) -> Dict[str, float]:
    """Pearson and Spearman correlation in percent, their mean (GLUE's score of STS-B), and the mean squared error."""
    predicted = np.asarray(predicted, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    mse = float(np.mean((predicted - gold) ** 2)) if len(gold) else 0.0
    correlations = {"pearson": 100 * pearson(predicted, gold), "spearman": 100 * spearman(predicted, gold)}
    return {**correlations, "corr": (correlations["pearson"] + correlations["spearman"]) / 2, "mse": mse}
