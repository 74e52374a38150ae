"""MUC, B-cubed and CEAF-phi4 from their definitions (Pradhan et al. 2014), as the CoNLL-2012 scorer v8.01 counts them.

Each metric (and mention identification) is four counts per document (recall numerator and denominator,
precision numerator and denominator); the reference scorer sums them over the
documents of a corpus and only then divides, so ``coref_counts`` of several
documents add up (``add_counts``) and ``coref_scores`` turns any sum into
precision/recall/F1 in percent and the CoNLL F1 (the mean of the three F1s).

Clusters are lists of hashable mentions (e.g. inclusive word spans). As the
scorer does, a response mention that repeats an earlier one (in the same or
another cluster) is dropped, and mentions present on one side only ("twinless")
are scored as they are, without Cai and Strube's additions.
"""
from collections import Counter
from typing import Dict, Hashable, Iterable, List, Sequence

import numpy as np

METRICS = ("muc", "bcub", "ceafe")
SCORED = METRICS + ("mentions",)  # "mentions": the scorer's "Identification of Mentions" line
COUNT_KEYS = tuple(f"{m}_{part}" for m in SCORED for part in ("r_num", "r_den", "p_num", "p_den"))
# with_singletons: the files as they are (LitBank, PreCo, GUM); without_singletons: one-mention clusters removed
# from key and response before scoring (OntoNotes, whose files hold none)
CONVENTIONS = ("with_singletons", "without_singletons")


def without_singletons(clusters: Iterable[Sequence[Hashable]]) -> List[List[Hashable]]:
    """The clusters of two or more mentions (a one-mention cluster removed as if it were not in the file)."""
    return [list(c) for c in clusters if len(c) > 1]


def convention_counts(key, response) -> Dict[str, Dict[str, float]]:
    """{convention: counts} of one document under both conventions."""
    return {CONVENTIONS[0]: coref_counts(key, response),
            CONVENTIONS[1]: coref_counts(without_singletons(key), without_singletons(response))}


def _deduplicated(response: Iterable[Iterable[Hashable]]) -> List[List[Hashable]]:
    seen, clusters = set(), []
    for cluster in response:
        kept = []
        for mention in cluster:
            if mention not in seen:
                seen.add(mention)
                kept.append(mention)
        if kept:
            clusters.append(kept)
    return clusters


def coref_counts(key: Sequence[Sequence[Hashable]], response: Sequence[Sequence[Hashable]]) -> Dict[str, float]:
    """The twelve counts of one document (``COUNT_KEYS``)."""
    key = [list(c) for c in key if len(c)]
    response = _deduplicated(response)
    key_of = {m: i for i, cluster in enumerate(key) for m in cluster}
    overlap = Counter()  # (key cluster, response cluster) -> common mentions
    for j, cluster in enumerate(response):
        for m in cluster:
            if m in key_of:
                overlap[key_of[m], j] += 1
    key_sizes = np.array([len(c) for c in key], dtype=np.float64)
    response_sizes = np.array([len(c) for c in response], dtype=np.float64)
    pairs = np.array(list(overlap.keys()), dtype=np.int64).reshape(-1, 2)
    common = np.array(list(overlap.values()), dtype=np.float64)
    counts = {}
    # MUC: links kept; a group of c common mentions keeps c - 1 of them
    correct_links = float(np.sum(common - 1))
    counts.update(muc_r_num=correct_links, muc_r_den=float(np.sum(key_sizes - 1)),
                  muc_p_num=correct_links, muc_p_den=float(np.sum(response_sizes - 1)))
    # B-cubed: every common mention contributes c / |cluster| on each side
    counts.update(bcub_r_num=float(np.sum(common ** 2 / key_sizes[pairs[:, 0]])) if len(common) else 0.0,
                  bcub_r_den=float(key_sizes.sum()),
                  bcub_p_num=float(np.sum(common ** 2 / response_sizes[pairs[:, 1]])) if len(common) else 0.0,
                  bcub_p_den=float(response_sizes.sum()))
    # CEAF-phi4: the best one-to-one alignment of key and response clusters, phi4 = 2 |K & R| / (|K| + |R|)
    similarity = 0.0
    if len(common):
        from scipy.optimize import linear_sum_assignment

        phi = np.zeros((len(key), len(response)))
        phi[pairs[:, 0], pairs[:, 1]] = 2 * common / (key_sizes[pairs[:, 0]] + response_sizes[pairs[:, 1]])
        rows, cols = linear_sum_assignment(phi, maximize=True)
        similarity = float(phi[rows, cols].sum())
    counts.update(ceafe_r_num=similarity, ceafe_r_den=float(len(key)),
                  ceafe_p_num=similarity, ceafe_p_den=float(len(response)))
    # mention identification: exact-match mentions found in both
    found = float(common.sum())
    counts.update(mentions_r_num=found, mentions_r_den=float(key_sizes.sum()),
                  mentions_p_num=found, mentions_p_den=float(response_sizes.sum()))
    return counts


def add_counts(total: Dict[str, float], counts: Dict[str, float]) -> Dict[str, float]:
    """``total`` + ``counts``, key by key (a new dict)."""
    return {key: total.get(key, 0.0) + counts.get(key, 0.0) for key in COUNT_KEYS}


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def coref_scores(counts: Dict[str, float]) -> Dict[str, float]:
    """``{metric}_p``, ``{metric}_r``, ``{metric}_f1`` (percent, also for ``mentions``) and ``conll_f1``, the mean
    of the MUC, B-cubed and CEAF-e F1s."""
    scores = {}
    for metric in SCORED:
        recall = _ratio(counts.get(f"{metric}_r_num", 0.0), counts.get(f"{metric}_r_den", 0.0))
        precision = _ratio(counts.get(f"{metric}_p_num", 0.0), counts.get(f"{metric}_p_den", 0.0))
        f1 = _ratio(2 * precision * recall, precision + recall)
        scores.update({f"{metric}_p": 100 * precision, f"{metric}_r": 100 * recall, f"{metric}_f1": 100 * f1})
    scores["conll_f1"] = sum(scores[f"{m}_f1"] for m in METRICS) / len(METRICS)
    return scores


def corpus_scores(keys: Sequence, responses: Sequence) -> Dict[str, float]:
    """Scores of a corpus: per-document counts summed, as the reference scorer does."""
    total = {}
    for key, response in zip(keys, responses):
        total = add_counts(total, coref_counts(key, response))
    return coref_scores(total or {k: 0.0 for k in COUNT_KEYS})
