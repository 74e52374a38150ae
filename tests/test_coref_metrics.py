"""CoNLL-2012 metrics against the reference scorer's published test cases, and the CoNLL reader/writer.

The cases below are the key/response pairs of the reference scorer's
``test/TestCases.README`` and ``test/CorefMetricTestConfig.pm``
(conll/reference-coreference-scorers), written as clusters of one-letter
mentions. A capital letter there is a mention overlapping its lower-case twin
(a different span), except in A7-A9 where it repeats the same span: those
duplicates are written here as the lower-case letter, which the scorer drops.
Expected values are (recall, precision, F1).
"""

import itertools
import re

import numpy as np
import pytest

from spanbert_plugin.coref.conll import coref_column, read_conll, read_jsonlines, with_coref_column
from spanbert_plugin.coref.metrics import COUNT_KEYS, add_counts, coref_counts, coref_scores, corpus_scores
from spanbert_plugin.core.errors import UsageError


def clusters(text):
    """'{a} {bc}' -> [['a'], ['b', 'c']]; 'x10' inside a cluster repeats the previous mention ten times."""
    out = []
    for group in text.split():
        body, mentions = group.strip("{}"), []
        i = 0
        while i < len(body):
            if body[i] == "x" and body[i + 1 : i + 3] == "10":
                mentions += [mentions[-1]] * 9
                i += 3
                continue
            mentions.append(body[i])
            i += 1
        out.append(mentions)
    return out


A_KEY = "{a} {bc} {def}"
CASES = [
    # id, key, response, {metric: (recall, precision, f1)}
    ("A1", A_KEY, "{a} {bc} {def}", {"muc": (1, 1, 1), "bcub": (1, 1, 1), "ceafe": (1, 1, 1)}),
    ("A2", A_KEY, "{a} {de}", {"muc": (1 / 3, 1, 0.5), "bcub": ((7 / 3) / 6, 1, 14 / 25), "ceafe": (0.6, 0.9, 0.72)}),
    (
        "A3",
        A_KEY,
        "{a} {bcx} {defy} {z}",
        {"muc": (1, 3 / 5, 0.75), "bcub": (1, (4 + 7 / 12) / 9, 110 / 163), "ceafe": (0.88571, 0.66429, 0.75918)},
    ),
    (
        "A4",
        A_KEY,
        "{a} {bcx} {dy} {z}",
        {"muc": (1 / 3, 1 / 3, 1 / 3), "bcub": (5 / 9, 17 / 42, None), "ceafe": (0.73333, 0.55, 0.62857)},
    ),
    (
        "A5",
        A_KEY,
        "{a} {bcxB} {dy} {z}",
        {"muc": (1 / 3, 1 / 4, 2 / 7), "bcub": (5 / 9, 2.5 / 8, None), "ceafe": (0.68889, 0.51667, 0.59048)},
    ),
    (
        "A6",
        A_KEY,
        "{a} {bcx} {dy} {Bz}",
        {"muc": (1 / 3, 1 / 4, 2 / 7), "bcub": (5 / 9, 17 / 48, None), "ceafe": (0.73333, 0.55, 0.62857)},
    ),
    (
        "A7",
        A_KEY,
        "{a} {bcxb} {dy} {z}",
        {"muc": (1 / 3, 1 / 3, 1 / 3), "bcub": (5 / 9, 17 / 42, None), "ceafe": (0.73333, 0.55, 0.62857)},
    ),
    (
        "A8",
        A_KEY,
        "{a} {bcx} {dy} {bz}",
        {"muc": (1 / 3, 1 / 3, 1 / 3), "bcub": (5 / 9, 17 / 42, None), "ceafe": (0.73333, 0.55, 0.62857)},
    ),
    (
        "A9",
        A_KEY,
        "{a} {bcx} {dy} {bx10z}",
        {"muc": (1 / 3, 1 / 3, 1 / 3), "bcub": (5 / 9, 17 / 42, None), "ceafe": (0.73333, 0.55, 0.62857)},
    ),
    ("A10", A_KEY, "{a} {b} {c} {d} {e} {f}", {"muc": (0, 0, 0), "bcub": (3 / 6, 1, 2 / 3)}),
    ("A11", A_KEY, "{abcdef}", {"muc": (1, 3 / 5, 0.75), "bcub": (1, 7 / 18, 14 / 25)}),
    ("A12", A_KEY, "{a} {x} {y} {c} {d} {e} {z}", {"muc": (0, 0, 0), "bcub": (13 / 36, 4 / 7, None)}),
    ("A13", A_KEY, "{axycdez}", {"muc": (1 / 3, 1 / 6, 2 / 9), "bcub": (17 / 36, 6 / 49, None)}),
    ("D1", "{12345} {67} {89ABC}", "{12345} {6789ABC}", {"muc": (1, 9 / 10, None), "bcub": (1, 16 / 21, None)}),
    ("E1", "{12345} {67} {89ABC}", "{1234589ABC} {67}", {"muc": (1, 9 / 10, None), "bcub": (1, 7 / 12, None)}),
    ("F1", "{ABCD}", "{AB} {CD}", {"muc": (2 / 3, 1, None)}),
    ("G1", "{AB} {CD}", "{ABCD}", {"muc": (1, 2 / 3, None)}),
    ("H1", "{ABCD}", "{ABCD}", {"muc": (1, 1, 1)}),
    ("I1", "{ABCD}", "{AB} {CD}", {"muc": (2 / 3, 1, None)}),
    ("J1", "{ABC}", "{AC}", {"muc": (1 / 2, 1, None)}),
    ("K1", "{BCDEGHJ}", "{ABC} {DEF} {GHI}", {"muc": (3 / 6, 3 / 6, 3 / 6)}),
    ("L1", "{ABC} {DEFG}", "{AB} {CD} {FGH}", {"muc": (2 / 5, 2 / 4, None)}),
    ("M1", "{abcdef}", "{abcdef}", {"muc": (1, 1, 1), "bcub": (1, 1, 1), "ceafe": (1, 1, 1)}),
    ("M2", "{abcdef}", "{a} {b} {c} {d} {e} {f}", {"muc": (0, 0, 0)}),
    ("M5", "{abcdef}", "{a} {b} {c} {x} {y} {z}", {"muc": (0, 0, 0)}),
    (
        "N1",
        "{a} {b} {c} {d} {e} {f}",
        "{a} {b} {c} {d} {e} {f}",
        {"muc": (0, 0, 0), "bcub": (1, 1, 1), "ceafe": (1, 1, 1)},
    ),
    ("N2", "{a} {b} {c} {d} {e} {f}", "{abcdef}", {"muc": (0, 0, 0)}),
    ("N4", "{a} {b} {c} {d} {e} {f}", "{a} {b} {c} {x} {y} {z}", {"muc": (0, 0, 0)}),
]


def f1_of(recall, precision):
    return 2 * recall * precision / (recall + precision) if recall + precision else 0.0


@pytest.mark.parametrize("case_id,key,response,expected", CASES, ids=[c[0] for c in CASES])
def test_reference_scorer_cases(case_id, key, response, expected):
    scores = coref_scores(coref_counts(clusters(key), clusters(response)))
    assert len(expected) >= 1
    for metric, (recall, precision, f1) in expected.items():
        f1 = f1_of(recall, precision) if f1 is None else f1
        # the published CEAF values are rounded to 5 decimals
        tolerance = 1e-5 if metric == "ceafe" else 1e-9
        assert scores[f"{metric}_r"] / 100 == pytest.approx(recall, abs=tolerance), metric
        assert scores[f"{metric}_p"] / 100 == pytest.approx(precision, abs=tolerance), metric
        assert scores[f"{metric}_f1"] / 100 == pytest.approx(f1, abs=tolerance), metric


def test_readme_bcubed_and_ceafe_fractions():
    """TestCases.README's own fractions: A3 B-cubed precision 55/108, A3 CEAF-e common 1 + 4/5 + 6/7."""
    counts = coref_counts(clusters(A_KEY), clusters("{a} {bcx} {defy} {z}"))
    assert counts["bcub_p_num"] / counts["bcub_p_den"] == pytest.approx(55 / 108)
    assert counts["ceafe_r_num"] == pytest.approx(1 + 4 / 5 + 6 / 7)
    assert (counts["ceafe_r_den"], counts["ceafe_p_den"]) == (3, 4)
    assert (counts["muc_r_num"], counts["muc_r_den"], counts["muc_p_den"]) == (3, 3, 5)


def test_corpus_scores_sum_counts_not_scores():
    """Two documents: their counts add up; the corpus score is not the mean of the documents' scores."""
    doc1 = (clusters(A_KEY), clusters("{a} {de}"))
    doc2 = (clusters("{ABCD}"), clusters("{AB} {CD}"))
    total = add_counts(coref_counts(*doc1), coref_counts(*doc2))
    assert set(total) == set(COUNT_KEYS)
    corpus = corpus_scores([doc1[0], doc2[0]], [doc1[1], doc2[1]])
    assert corpus == coref_scores(total)
    # MUC: (1 + 2) / (3 + 3) recall, (1 + 2) / (1 + 2) precision
    assert corpus["muc_r"] == pytest.approx(50.0)
    assert corpus["muc_p"] == pytest.approx(100.0)
    mean_of_docs = (coref_scores(coref_counts(*doc1))["muc_f1"] + coref_scores(coref_counts(*doc2))["muc_f1"]) / 2
    assert corpus["muc_f1"] != pytest.approx(mean_of_docs)
    assert corpus["conll_f1"] == pytest.approx((corpus["muc_f1"] + corpus["bcub_f1"] + corpus["ceafe_f1"]) / 3)


def test_ceafe_alignment_is_optimal():
    """A greedy alignment would pair {abcd} with {abx}; the optimum pairs it with {cd..} and gains more."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        mentions = list(range(12))
        key = [list(g) for g in np.array_split(rng.permutation(mentions), 4)]
        response = [list(g) for g in np.array_split(rng.permutation(mentions), 3)]
        counts = coref_counts(key, response)
        best = 0.0
        for perm in itertools.permutations(range(4), 3):
            best = max(
                best,
                sum(
                    2 * len(set(key[k]) & set(response[r])) / (len(key[k]) + len(response[r]))
                    for r, k in enumerate(perm)
                ),
            )
        assert counts["ceafe_r_num"] == pytest.approx(best)



def test_a_response_cluster_of_repeated_mentions_only_is_dropped_whole():
    """The scorer drops a response mention repeating an earlier one; a cluster left with none is no cluster at all
    (not an empty one counting -1 MUC link and one CEAF-e cluster): {ab} {ab} scores as {ab} alone."""
    key, response = clusters("{ab}"), clusters("{ab} {ab}")
    counts = coref_counts(key, response)
    assert counts == coref_counts(key, clusters("{ab}"))
    assert (counts["muc_p_num"], counts["muc_p_den"], counts["ceafe_p_den"], counts["bcub_p_den"]) == (1, 1, 1, 2)
    assert coref_scores(counts)["conll_f1"] == pytest.approx(100.0)


def test_an_empty_key_cluster_counts_for_nothing():
    """An empty key cluster is no entity: it adds no MUC link (not -1) and no CEAF-e cluster to the recall's
    denominators."""
    counts = coref_counts([[], ["a", "b"]], clusters("{ab}"))
    assert counts == coref_counts(clusters("{ab}"), clusters("{ab}"))
    assert (counts["muc_r_den"], counts["ceafe_r_den"], counts["bcub_r_den"]) == (1, 1, 2)
    assert coref_scores(counts)["conll_f1"] == pytest.approx(100.0)

# The scorer's other metrics. CEAF-m and BLANC: its test/CorefMetricTestConfig.pm (A1-A13, B1, C1; CEAF-m given for
# A1-A9 only); LEA, and BLANC for the M and N cases: its test/TestCases.README (B1's and C1's clusters are from there
# too: x is a response mention not in the key). Values are (recall, precision, F1), F1 None where the source gives
# recall and precision only; those given to five decimals are rounded. BLANC's F1 is the mean of its coreference and
# non-coreference links' F1s, not the harmonic mean of its recall and precision.
A7_TO_A9 = {"ceafm": (0.66667, 0.57143, 0.61538), "blanc": (0.35227, 0.27206, 0.30357), "lea": (0.5, 2 / 7, 4 / 11)}
ZERO = (0, 0, 0)
OTHER_CASES = [
    ("A1", A_KEY, "{a} {bc} {def}", {"ceafm": (1, 1, 1), "blanc": (1, 1, 1), "lea": (1, 1, 1)}),
    ("A2", A_KEY, "{a} {de}", {"ceafm": (0.5, 1, 0.66667), "blanc": (0.21591, 1, 0.35385), "lea": (1 / 3, 1, 0.5)}),
    ("A3", A_KEY, "{a} {bcx} {defy} {z}",
     {"ceafm": (1, 0.66667, 0.8), "blanc": (1, 0.42593, 0.59717), "lea": (1, 4 / 9, 8 / 13)}),
    ("A4", A_KEY, "{a} {bcx} {dy} {z}", A7_TO_A9),
    ("A5", A_KEY, "{a} {bcxB} {dy} {z}",
     {"ceafm": (0.66667, 0.5, 0.57143), "blanc": (0.35227, 0.19048, 0.24716), "lea": (0.5, 5 / 24, 5 / 17)}),
    ("A6", A_KEY, "{a} {bcx} {dy} {Bz}",
     {"ceafm": (0.66667, 0.5, 0.57143), "blanc": (0.35227, 0.20870, 0.25817), "lea": (0.5, 0.25, 1 / 3)}),
    ("A7", A_KEY, "{a} {bcxb} {dy} {z}", A7_TO_A9),
    ("A8", A_KEY, "{a} {bcx} {dy} {bz}", A7_TO_A9),
    ("A9", A_KEY, "{a} {bcx} {dy} {bx10z}", A7_TO_A9),
    ("A10", A_KEY, "{a} {b} {c} {d} {e} {f}", {"blanc": (0.5, 0.36667, 0.42308), "lea": (1 / 6, 1 / 6, 1 / 6)}),
    ("A11", A_KEY, "{abcdef}", {"blanc": (0.5, 0.13333, 0.21053), "lea": (5 / 6, 4 / 15, 40 / 99)}),
    ("A12", A_KEY, "{a} {x} {y} {c} {d} {e} {z}", {"blanc": (0.22727, 0.11905, 0.15625), "lea": (1 / 6, 1 / 7, 2 / 13)}),
    ("A13", A_KEY, "{axycdez}", {"blanc": (0.125, 0.02381, 0.04), "lea": (1 / 6, 1 / 21, 2 / 27)}),
    ("B1", "{ab} {cde}", "{bcx} {de}", {"blanc": (7 / 24, 7 / 24, 7 / 24), "lea": (1 / 5, 2 / 5, 4 / 15)}),
    ("C1", "{ab} {cde} {fg}", "{bcx} {de} {fg}", {"blanc": (0.5125, 0.5125, 0.5125), "lea": (3 / 7, 4 / 7, 24 / 49)}),
    ("D1", "{12345} {67} {89ABC}", "{12345} {6789ABC}", {"lea": (1, (5 + 7 * 11 / 21) / 12, None)}),
    ("E1", "{12345} {67} {89ABC}", "{1234589ABC} {67}", {"lea": (1, (10 * 20 / 45 + 2) / 12, None)}),
    ("F1", "{ABCD}", "{AB} {CD}", {"lea": (1 / 3, 1, None)}),
    ("G1", "{AB} {CD}", "{ABCD}", {"lea": (1, 1 / 3, None)}),
    ("H1", "{ABCD}", "{ABCD}", {"lea": (1, 1, 1)}),
    ("J1", "{ABC}", "{AC}", {"lea": (1 / 3, 1, None)}),
    ("K1", "{BCDEGHJ}", "{ABC} {DEF} {GHI}", {"lea": (1 / 7, 1 / 3, None)}),
    ("L1", "{ABC} {DEFG}", "{AB} {CD} {FGH}", {"lea": (5 / 21, 3 / 7, None)}),
    ("M1", "{abcdef}", "{abcdef}", {"ceafm": (1, 1, 1), "blanc": (1, 1, 1), "lea": (1, 1, 1)}),
    ("M2", "{abcdef}", "{a} {b} {c} {d} {e} {f}", {"blanc": ZERO, "lea": ZERO}),
    ("M3", "{abcdef}", "{ab} {cde} {f}", {"blanc": (4 / 15, 1, 8 / 19), "lea": (4 / 15, 5 / 6, None)}),
    ("M4", "{abcdef}", "{abcxyz}", {"blanc": (0.2, 0.2, 0.2), "lea": (0.2, 0.2, 0.2)}),
    ("M5", "{abcdef}", "{a} {b} {c} {x} {y} {z}", {"blanc": ZERO, "lea": ZERO}),
    ("M6", "{abcdef}", "{ab} {cxy} {z}", {"blanc": (1 / 15, 1 / 4, 2 / 19), "lea": (1 / 15, 1 / 3, None)}),
    ("N1", "{a} {b} {c} {d} {e} {f}", "{a} {b} {c} {d} {e} {f}",
     {"ceafm": (1, 1, 1), "blanc": (1, 1, 1), "lea": (1, 1, 1)}),
    ("N2", "{a} {b} {c} {d} {e} {f}", "{abcdef}", {"blanc": ZERO, "lea": ZERO}),
    ("N3", "{a} {b} {c} {d} {e} {f}", "{ab} {cde} {f}", {"blanc": (11 / 15, 1, 22 / 26), "lea": (1 / 6, 1 / 6, 1 / 6)}),
    ("N4", "{a} {b} {c} {d} {e} {f}", "{a} {b} {c} {x} {y} {z}", {"blanc": (0.2, 0.2, 0.2), "lea": (0.5, 0.5, 0.5)}),
    ("N5", "{a} {b} {c} {d} {e} {f}", "{abcxyz}", {"blanc": ZERO, "lea": ZERO}),
    ("N6", "{a} {b} {c} {d} {e} {f}", "{ab} {cxy} {z}", {"blanc": (2 / 15, 2 / 11, 4 / 26), "lea": ZERO}),
]


@pytest.mark.parametrize("case_id,key,response,expected", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_reference_scorer_cases_of_ceafm_blanc_and_lea(case_id, key, response, expected):
    scores = coref_scores(coref_counts(clusters(key), clusters(response)))
    for metric, (recall, precision, f1) in expected.items():
        f1 = f1_of(recall, precision) if f1 is None else f1
        for part, value in (("r", recall), ("p", precision), ("f1", f1)):
            # five decimals, rounded: at most 5e-6 off (the fractions are exact)
            assert scores[f"{metric}_{part}"] / 100 == pytest.approx(value, abs=5e-6), f"{metric}_{part}"


def test_blanc_decides_its_link_kinds_on_the_corpus_sums():
    """The scorer averages the coreference and non-coreference links' scores unless the key holds no link of one
    kind over the whole corpus: here one document's key has only a non-coreference link and the other's only a
    coreference link, so the corpus averages both, though each document alone would score one kind only."""
    singletons, pair = (clusters("{a} {b}"), clusters("{ab}")), (clusters("{cd}"), clusters("{cd}"))
    assert corpus_scores([singletons[0]], [singletons[1]])["blanc_f1"] == 0.0  # non-coreference links only: 0 of 1
    assert corpus_scores([pair[0]], [pair[1]])["blanc_f1"] == pytest.approx(100.0)  # coreference links only
    both = corpus_scores([singletons[0], pair[0]], [singletons[1], pair[1]])
    # coreference links: 1 found of 1 in the key, of 2 in the responses; non-coreference: 0 of 1, of none
    coref_f1 = f1_of(1.0, 0.5)
    assert (both["blanc_r"], both["blanc_p"]) == pytest.approx((50.0, 25.0))
    assert both["blanc_f1"] == pytest.approx(100 * coref_f1 / 2)


def _links_by_definition(clusters_):
    coreferent = {frozenset(pair) for cluster in clusters_ for pair in itertools.combinations(cluster, 2)}
    mentions = [m for cluster in clusters_ for m in cluster]
    return coreferent, {frozenset(pair) for pair in itertools.combinations(mentions, 2)} - coreferent


def _lea_by_definition(entities, other):
    other_coreferent, _ = _links_by_definition(other)
    alone = {cluster[0] for cluster in other if len(cluster) == 1}
    numerator = 0.0
    for entity in entities:
        if len(entity) == 1:
            numerator += entity[0] in alone
        else:
            links = list(itertools.combinations(entity, 2))
            numerator += len(entity) * sum(frozenset(link) in other_coreferent for link in links) / len(links)
    return numerator, sum(map(len, entities))


def test_ceafm_blanc_and_lea_counts_equal_their_definitions_on_random_clusterings():
    """Against link sets enumerated pair by pair, each side's alignment tried in full, and LEA entity by entity:
    random keys and responses with mentions on one side only and repeated response mentions (dropped first)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        key_mentions = rng.permutation(10)[: rng.integers(1, 11)]
        key = [list(g) for g in np.array_split(key_mentions, rng.integers(1, min(4, len(key_mentions)) + 1))]
        pool = np.concatenate([np.arange(14), rng.integers(0, 14, size=3)])  # 10-13 twinless, three repeats
        picked = rng.permutation(pool)[: rng.integers(1, len(pool) + 1)]
        response = [list(g) for g in np.array_split(picked, rng.integers(1, min(4, len(picked)) + 1))]
        counts = coref_counts(key, response)
        seen, kept = set(), []
        for cluster in response:
            kept.append([m for m in cluster if not (m in seen or seen.add(m))])
        kept = [c for c in kept if c]
        (key_coref, key_non), (response_coref, response_non) = map(_links_by_definition, (key, kept))
        assert (counts["blanc_coref_r_num"], counts["blanc_coref_r_den"], counts["blanc_coref_p_den"]) == (
            len(key_coref & response_coref), len(key_coref), len(response_coref))
        assert (counts["blanc_noncoref_r_num"], counts["blanc_noncoref_r_den"], counts["blanc_noncoref_p_den"]) == (
            len(key_non & response_non), len(key_non), len(response_non))
        assert (counts["lea_r_num"], counts["lea_r_den"]) == pytest.approx(_lea_by_definition(key, kept))
        assert (counts["lea_p_num"], counts["lea_p_den"]) == pytest.approx(_lea_by_definition(kept, key))
        padded = len(key) + len(kept)
        best = max(sum(len(set(key[k]) & set(kept[r])) for k, r in enumerate(perm) if r < len(kept))
                   for perm in itertools.permutations(range(padded), len(key)))
        assert counts["ceafm_r_num"] == best
        assert (counts["ceafm_r_den"], counts["ceafm_p_den"]) == (len(key_mentions), sum(map(len, kept)))


CONLL = """#begin document (doc_a); part 000
doc_a\t0\t0\tAlice\t_\t_\t_\t_\t_\tspk1\t_\t_\t(0)
doc_a\t0\t1\tsaw\t_\t_\t_\t_\t_\tspk1\t_\t_\t
doc_a\t0\t2\ther\t_\t_\t_\t_\t_\tspk1\t_\t_\t(1(3)
doc_a\t0\t3\tsister\t_\t_\t_\t_\t_\tspk1\t_\t_\t1)

doc_a\t0\t0\tShe\t_\t_\t_\t_\t_\tspk2\t_\t_\t(0)
doc_a\t0\t1\tthe\t_\t_\t_\t_\t_\tspk2\t_\t_\t(4(5
doc_a\t0\t2\tman\t_\t_\t_\t_\t_\tspk2\t_\t_\t5)
doc_a\t0\t3\t's\t_\t_\t_\t_\t_\tspk2\t_\t_\t4)
#end document
"""


def test_conll_reader_nested_same_start_and_empty_last_column():
    """Read as the reference scorer does: "(1(3)" is a one-word mention of 3 and an opening of 1."""
    (doc,) = read_conll("x.conll", CONLL)
    assert doc.words == ["Alice", "saw", "her", "sister", "She", "the", "man", "'s"]
    assert doc.sentence_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert doc.speakers == ["spk1"] * 4 + ["spk2"] * 4
    assert doc.clusters == [[(0, 0), (4, 4)], [(2, 2)], [(2, 3)], [(5, 6)], [(5, 7)]]  # by first mention


def test_conll_writer_round_trip():
    (doc,) = read_conll("x.conll", CONLL)
    predicted = [[(0, 0), (2, 2)], [(2, 3), (4, 4)], [(0, 3)], [(5, 7), (5, 6)]]
    lines = with_coref_column(doc, predicted)
    assert lines[1].split("\t")[:12] == doc.lines[1].split("\t")[:12]
    (again,) = read_conll("y.conll", "\n".join(lines) + "\n")
    assert sorted(map(sorted, again.clusters)) == sorted(map(sorted, predicted))
    assert coref_column(3, [[(0, 2), (0, 0)], [(0, 1)]]) == ["(0|(1|(0)", "1)", "0)"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ 3)\n#end document\n", "x.conll:2: unbalanced brackets"),
        (
            "#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ (3\n#end document\n#begin document (d); part 1\n"
            "d 1 0 w _ _ _ _ _ _ _ _ 3)\n#end document\n",
            "x.conll:2: unbalanced brackets: mention of cluster 3 is not closed",
        ),
        ("#begin document (d); part 0\n\n#end document\n", "x.conll:1: empty document"),
        ("#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ 3\n#end document\n", "malformed coreference field"),
        ("#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ -\n", "has no #end document"),
        # a token line must hold the word (column 4) and the coreference column: a CoNLL-2003 line has 4 columns
        ("#begin document (d); part 0\nEU NNP B-NP B-ORG\n#end document\n",
         "x.conll:2: a token line needs at least 5 columns (word in column 4, coreference last), got 4"),
        ("#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ -\n#begin document (e); part 0\n",
         "x.conll:3: #begin document inside document (d); part 0 (line 1) without its #end document"),
        ("#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ -\n#end document\n#end document\n",
         "x.conll:4: #end document without #begin document"),
    ],
)
def test_conll_reader_errors(text, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        read_conll("x.conll", text)


def test_jsonlines_reader_and_errors():
    line = '{"doc_key": "nw/x", "sentences": [["A", "b"], ["c"]], "clusters": [[[0, 0], [2, 2]]]}'
    (doc,) = read_jsonlines("x.jsonlines", line)
    assert doc.genre == "nw" and doc.sentence_ids.tolist() == [0, 0, 1]
    assert doc.clusters == [[(0, 0), (2, 2)]]
    (again,) = read_conll("y.conll", "\n".join(doc.lines))
    assert again.clusters == doc.clusters and again.words == doc.words
    with pytest.raises(UsageError, match=r"x.jsonlines:1: cluster span \[2, 3\] is outside document nw/x"):
        read_jsonlines("x.jsonlines", line.replace("[2, 2]", "[2, 3]"))


@pytest.mark.parametrize(
    "text,message",
    [
        ('{"doc_key": "d", "sentences": [["x"]]}\n{"doc_key": "e", "sentences": [["y"]]\n',
         "x.jsonlines:2: not valid JSON (Expecting ',' delimiter: line 1 column 38 (char 37))"),
        ('{"doc_key": "d", "sentences": [["x"]]}\n["e", [["y"]]]\n',
         "x.jsonlines:2: a JSON-lines document needs doc_key and sentences"),
        ('{"doc_key": "d", "words": ["x"]}\n', "x.jsonlines:1: a JSON-lines document needs doc_key and sentences"),
        ('{"doc_key": "d", "sentences": [[], []]}\n', "x.jsonlines:1: empty document d (no words)"),
    ],
)
def test_jsonlines_reader_names_the_line_of_a_bad_document(text, message):
    with pytest.raises(UsageError) as caught:
        read_jsonlines("x.jsonlines", text)
    assert str(caught.value) == message


def test_comment_lines_inside_a_document_are_kept_in_place_and_those_outside_are_dropped():
    """A "#" line inside a document is no token: it is copied to the prediction where it stood (the scorer skips
    it); one between documents belongs to none."""
    text = ("# a file comment\n#begin document (d); part 000\nd 0 0 Anna x x x x x - (0)\n# speaker change\n"
            "d 0 1 she x x x x x - (0)\n\n#end document\n")
    (doc,) = read_conll("x.conll", text)
    assert doc.words == ["Anna", "she"] and doc.clusters == [[(0, 0), (1, 1)]]
    assert doc.lines == text.splitlines()[1:]
    assert doc.token_lines.tolist() == [1, 3]
    assert with_coref_column(doc, [[(1, 1)]]) == ["#begin document (d); part 000", "d 0 0 Anna x x x x x - -",
                                                  "# speaker change", "d 0 1 she x x x x x - (0)", "", "#end document"]


def test_a_mention_closes_the_latest_open_mention_of_its_cluster():
    """(1 (1 1) 1): the inner mention is words 1-2 and the outer 0-3, as the reference scorer reads nested mentions
    of one cluster (a stack per cluster)."""
    text = ("#begin document (d); part 000\n"
            + "".join(f"d 0 {i} w{i} x x x x x - {c}\n" for i, c in enumerate(["(1", "(1", "1)", "1)"]))
            + "\n#end document\n")
    (doc,) = read_conll("x.conll", text)
    assert doc.clusters == [[(0, 3), (1, 2)]]


def test_several_blank_lines_end_one_sentence():
    text = "#begin document (d); part 000\nd 0 0 a x x x x x - -\n\n\nd 0 1 b x x x x x - -\n\n#end document\n"
    (doc,) = read_conll("x.conll", text)
    assert doc.sentence_ids.tolist() == [0, 1]
