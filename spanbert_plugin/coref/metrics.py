"""The CoNLL-2012 reference scorer's metrics (v8.01) from their definitions: MUC, B-cubed, CEAF-phi4 (the
CoNLL average's three; Pradhan et al. 2014), CEAF-phi3 ("ceafm"), BLANC for predicted mentions (Luo et al. 2014)
and LEA (Moosavi and Strube 2016, the scorer's ``lea``).

Each metric (and mention identification) is four counts per document (recall numerator and denominator,
precision numerator and denominator; BLANC is two such metrics, its coreference and non-coreference links);
the reference scorer sums them over the documents of a corpus and only then divides, so ``coref_counts`` of
several documents add up (``add_counts``) and ``coref_scores`` turns any sum into precision/recall/F1 in
percent and the CoNLL F1 (the mean of the MUC, B-cubed and CEAF-e F1s).

Clusters are lists of hashable mentions (e.g. inclusive word spans). As the
scorer does, a response mention that repeats an earlier one (in the same or
another cluster) is dropped, and mentions present on one side only ("twinless")
are scored as they are, without Cai and Strube's additions.
"""
from collections import Counter
from typing import Dict, Hashable, Iterable, List, Sequence

import numpy as np

METRICS = ("muc", "bcub", "ceafe")  # the CoNLL F1 averages these three
OTHER_METRICS = ("ceafm", "blanc", "lea")
SCORED = METRICS + OTHER_METRICS + ("mentions",)  # "mentions": the scorer's "Identification of Mentions" line
BLANC_PARTS = ("blanc_coref", "blanc_noncoref")  # coreference links, non-coreference links
COUNTED = tuple(name for m in SCORED for name in (BLANC_PARTS if m == "blanc" else (m,)))
COUNT_KEYS = tuple(f"{m}_{part}" for m in COUNTED for part in ("r_num", "r_den", "p_num", "p_den"))
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


def _links(n):
    """The links among ``n`` mentions, n (n - 1) / 2 (elementwise for arrays)."""
    return n * (n - 1) / 2


def _lea(sizes, other_sizes, common, rows, cols) -> float:
    """LEA's numerator on one side: each entity's size times the share of its links found in one entity of the
    other side; a one-mention entity has one (self-)link, found when the other side has its mention alone too."""
    found = np.zeros(len(sizes))
    np.add.at(found, rows, _links(common))
    alone = (sizes[rows] == 1) & (other_sizes[cols] == 1)
    np.add.at(found, rows[alone], 1.0)
    return float(np.sum(sizes * found / np.where(sizes > 1, _links(sizes), 1.0)))


def _aligned(similarity, rows, cols, shape) -> float:
    """The total similarity of the best one-to-one alignment of key clusters (rows) to response clusters."""
    if not len(similarity):
        return 0.0
    from scipy.optimize import linear_sum_assignment

    phi = np.zeros(shape)
    phi[rows, cols] = similarity
    return float(phi[linear_sum_assignment(phi, maximize=True)].sum())


def coref_counts(key: Sequence[Sequence[Hashable]], response: Sequence[Sequence[Hashable]]) -> Dict[str, float]:
    """The counts of one document (``COUNT_KEYS``)."""
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
    rows, cols = pairs[:, 0], pairs[:, 1]
    common = np.array(list(overlap.values()), dtype=np.float64)
    key_mentions, response_mentions, found = float(key_sizes.sum()), float(response_sizes.sum()), float(common.sum())
    counts = {}
    # MUC: links kept; a group of c common mentions keeps c - 1 of them
    correct_links = float(np.sum(common - 1))
    counts.update(muc_r_num=correct_links, muc_r_den=float(np.sum(key_sizes - 1)),
                  muc_p_num=correct_links, muc_p_den=float(np.sum(response_sizes - 1)))
    # B-cubed: every common mention contributes c / |cluster| on each side
    counts.update(bcub_r_num=float(np.sum(common ** 2 / key_sizes[rows])), bcub_r_den=key_mentions,
                  bcub_p_num=float(np.sum(common ** 2 / response_sizes[cols])), bcub_p_den=response_mentions)
    # CEAF: the best one-to-one alignment of key and response clusters by phi4 = 2 |K & R| / (|K| + |R|)
    # (entity-based, CEAF-e) and by phi3 = |K & R| (mention-based, CEAF-m)
    shape = (len(key), len(response))
    entity_similarity = _aligned(2 * common / (key_sizes[rows] + response_sizes[cols]), rows, cols, shape)
    mention_similarity = _aligned(common, rows, cols, shape)
    counts.update(ceafe_r_num=entity_similarity, ceafe_r_den=float(len(key)),
                  ceafe_p_num=entity_similarity, ceafe_p_den=float(len(response)))
    counts.update(ceafm_r_num=mention_similarity, ceafm_r_den=key_mentions,
                  ceafm_p_num=mention_similarity, ceafm_p_den=response_mentions)
    # BLANC: coreference links (two mentions of one cluster) and non-coreference links (two mentions of two
    # clusters) of each side; a link is correct when the other side has it too, so both its mentions are common
    key_links, response_links, common_links = (float(np.sum(_links(x))) for x in (key_sizes, response_sizes, common))
    common_non_links = float(_links(found) - np.sum(_links(np.bincount(rows, common, len(key))))
                              - np.sum(_links(np.bincount(cols, common, len(response)))) + common_links)
    counts.update(blanc_coref_r_num=common_links, blanc_coref_r_den=key_links,
                  blanc_coref_p_num=common_links, blanc_coref_p_den=response_links,
                  blanc_noncoref_r_num=common_non_links, blanc_noncoref_r_den=_links(key_mentions) - key_links,
                  blanc_noncoref_p_num=common_non_links,
                  blanc_noncoref_p_den=_links(response_mentions) - response_links)
    # LEA: each cluster's links found, weighted by its size
    counts.update(lea_r_num=_lea(key_sizes, response_sizes, common, rows, cols), lea_r_den=key_mentions,
                  lea_p_num=_lea(response_sizes, key_sizes, common, cols, rows), lea_p_den=response_mentions)
    # mention identification: exact-match mentions found in both
    counts.update(mentions_r_num=found, mentions_r_den=key_mentions,
                  mentions_p_num=found, mentions_p_den=response_mentions)
    return counts


def add_counts(total: Dict[str, float], counts: Dict[str, float]) -> Dict[str, float]:
    """``total`` + ``counts``, key by key (a new dict)."""
    return {key: total.get(key, 0.0) + counts.get(key, 0.0) for key in COUNT_KEYS}


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def _precision_recall_f1(counts: Dict[str, float], metric: str):
    recall = _ratio(counts.get(f"{metric}_r_num", 0.0), counts.get(f"{metric}_r_den", 0.0))
    precision = _ratio(counts.get(f"{metric}_p_num", 0.0), counts.get(f"{metric}_p_den", 0.0))
    return precision, recall, _ratio(2 * precision * recall, precision + recall)


def _blanc(counts: Dict[str, float]):
    """BLANC's precision, recall and F1: each the mean of the coreference and non-coreference links' (F1 too);
    where the key has links of one kind only (summed over the documents), that kind's alone, as the scorer does."""
    parts = [_precision_recall_f1(counts, part) for part in BLANC_PARTS if counts.get(f"{part}_r_den", 0.0)]
    return tuple(sum(values) / len(parts) for values in zip(*parts)) if parts else (0.0, 0.0, 0.0)


def coref_scores(counts: Dict[str, float]) -> Dict[str, float]:
    """``{metric}_p``, ``{metric}_r``, ``{metric}_f1`` (percent) of every metric in ``SCORED`` and ``conll_f1``,
    the mean of the MUC, B-cubed and CEAF-e F1s."""
    scores = {}
    for metric in SCORED:
        precision, recall, f1 = _blanc(counts) if metric == "blanc" else _precision_recall_f1(counts, metric)
        scores.update({f"{metric}_p": 100 * precision, f"{metric}_r": 100 * recall, f"{metric}_f1": 100 * f1})
    scores["conll_f1"] = sum(scores[f"{m}_f1"] for m in METRICS) / len(METRICS)
    return scores


def corpus_scores(keys: Sequence, responses: Sequence) -> Dict[str, float]:
    """Scores of a corpus: per-document counts summed, as the reference scorer does."""
    total = {}
    for key, response in zip(keys, responses):
        total = add_counts(total, coref_counts(key, response))
    return coref_scores(total or {k: 0.0 for k in COUNT_KEYS})
