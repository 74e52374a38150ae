"""SQuAD v1.1 / v2.0 metrics on cases worked out by hand, and the real SQuAD 1.1 dev quirks."""
import collections
import json
import re
import string

import numpy as np
import pytest

from conftest import needs_shared_data, shared_path
from spanbert_plugin.qa.squad_metrics import best_threshold, evaluate, exact_match, f1, normalize_answer

SQUAD_DEV = shared_path("squad", "dev-v1.1.json")


def test_normalize_answer():
    # lower-case; punctuation removed (so "brown-fox" joins); a/an/the removed as words only
    assert normalize_answer("  The Quick,  brown-fox! An apple a day ") == "quick brownfox apple day"
    assert normalize_answer("The theater and Anna") == "theater and anna"
    assert normalize_answer("tab\tand\nnewline") == "tab and newline"
    assert normalize_answer("a") == ""
    assert normalize_answer("(the) .") == ""


def test_exact_match():
    assert exact_match("the Denver Broncos!", "Denver broncos") == 1
    assert exact_match("Denver", "Denver Broncos") == 0
    assert exact_match("", "the .") == 1  # both normalise to ""


def test_partial_overlap_f1():
    # pred tokens [big, red, dog, barked] (4), gold [red, dog] (2), 2 in common:
    # P = 2/4, R = 2/2, F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    assert f1("the big red dog barked", "a red dog") == pytest.approx(2 / 3)
    # repeated tokens count by multiset: pred {dog: 2, cat: 1}, gold {dog: 1, cat: 2}, common 1 + 1 = 2;
    # P = 2/3, R = 2/3, F1 = 2/3
    assert f1("dog dog cat", "dog cat cat") == pytest.approx(2 / 3)
    # pred [1999], gold [in, 1999]: P = 1, R = 1/2, F1 = 2 * 0.5 / 1.5 = 2/3
    assert f1("1999", "in 1999", rules="v2") == pytest.approx(2 / 3)
    assert f1("Paris", "London") == 0.0


def test_empty_answers_v1_vs_v2():
    assert f1("", "", rules="v1") == 0.0  # no common token
    assert f1("the", ".", rules="v1") == 0.0
    assert f1("", "", rules="v2") == 1.0  # int(gold_toks == pred_toks)
    assert f1("the", ".", rules="v2") == 1.0
    assert f1("", "Paris", rules="v2") == 0.0
    assert f1("Paris", "", rules="v2") == 0.0
    with pytest.raises(ValueError):
        f1("a", "b", rules="v3")


def test_evaluate_v1_several_golds_empty_gold_and_missing():
    questions = [
        {"id": "q1", "answers": ["Denver Broncos", "the Denver Broncos"]},
        {"id": "q2", "answers": ["."]},  # normalises to "" (like 3 golds of SQuAD 1.1 dev)
        {"id": "q3", "answers": ["Santa Clara"]},
        {"id": "q4", "answers": ["seven", "7", "seven times"]},
    ]
    predictions = {"q1": "Broncos", "q2": "", "q4": "seven times"}  # q3 missing
    # q1: EM 0; F1: [broncos] vs [denver, broncos]: P = 1, R = 1/2, F1 = 2/3 (both golds alike)
    # q2: EM 1 ("" == ""), F1 0 under v1 (no common token)
    # q3: missing, 0 and 0
    # q4: EM 1 against "seven times"; F1 1 (max over the golds)
    result = evaluate(questions, predictions)
    assert result["total"] == 4 and result["missing"] == 1
    assert result["exact"] == pytest.approx(100 * 2 / 4)
    assert result["exact_match"] == result["exact"]
    assert result["f1"] == pytest.approx(100 * (2 / 3 + 1) / 4)

    # v2 drops the "." gold of q2: gold becomes "", F1 of two empties is 1; q2 still HasAns
    result = evaluate(questions, predictions, rules="v2")
    assert result["exact"] == pytest.approx(100 * 2 / 4)
    assert result["f1"] == pytest.approx(100 * (2 / 3 + 1 + 1) / 4)
    assert result["HasAns_total"] == 4 and "NoAns_total" not in result and result["missing"] == 1


def test_v1_needs_gold_answers():
    with pytest.raises(ValueError, match="q0"):
        evaluate([{"id": "q0", "answers": []}], {"q0": ""})


V2_QUESTIONS = [
    {"id": "a", "answers": ["Paris"]},
    {"id": "b", "answers": ["in 1999", "1999."]},
    {"id": "c", "answers": []},
    {"id": "d", "answers": []},
]
V2_PREDICTIONS = {"a": "Paris", "b": "1999", "c": "", "d": "London"}
V2_NA_PROBS = {"a": 0.2, "b": 0.6, "c": 0.9, "d": 0.4}


def test_evaluate_v2_unanswerable_and_threshold():
    # raw scores: a EM 1 F1 1; b EM 1 ("1999." normalises to "1999") F1 1; c EM 1 F1 1 (both empty);
    # d EM 0 F1 0
    result = evaluate(V2_QUESTIONS, V2_PREDICTIONS, rules="v2")
    assert result == pytest.approx({"exact": 75.0, "f1": 75.0, "total": 4, "HasAns_exact": 100.0,
                                    "HasAns_f1": 100.0, "HasAns_total": 2, "NoAns_exact": 50.0,
                                    "NoAns_f1": 50.0, "NoAns_total": 2, "missing": 0})
    # threshold 0.5: b (0.6) and c (0.9) scored as "no answer": b -> 0 (it has an answer), c -> 1;
    # a and d keep their raw scores: exact = f1 = (1 + 0 + 1 + 0) / 4
    result = evaluate(V2_QUESTIONS, V2_PREDICTIONS, na_probs=V2_NA_PROBS, na_prob_thresh=0.5, rules="v2")
    assert result["exact"] == pytest.approx(50.0) and result["f1"] == pytest.approx(50.0)
    assert result["HasAns_exact"] == pytest.approx(50.0) and result["NoAns_exact"] == pytest.approx(50.0)
    # best search from 2 (both NoAns right) over na order a .2 (+1 -> 3), d .4 (-1 -> 2), b .6 (+1 -> 3,
    # not strictly better), c .9 (0 -> 3): best 3 of 4 at threshold 0.2
    assert result["best_exact"] == pytest.approx(75.0) and result["best_exact_thresh"] == pytest.approx(0.2)
    assert result["best_f1"] == pytest.approx(75.0) and result["best_f1_thresh"] == pytest.approx(0.2)
    # the official default threshold 1.0 changes nothing here
    default = evaluate(V2_QUESTIONS, V2_PREDICTIONS, na_probs=V2_NA_PROBS, rules="v2")
    assert default["exact"] == pytest.approx(75.0) and default["f1"] == pytest.approx(75.0)


def test_a_probability_at_the_threshold_keeps_the_answer():
    """The official script scores a question as unanswered when its probability is above the threshold: b's 0.6
    at a threshold of 0.6 keeps its exact 1, so (1 + 1 + 1 + 0) / 4."""
    result = evaluate(V2_QUESTIONS, V2_PREDICTIONS, na_probs=V2_NA_PROBS, na_prob_thresh=0.6, rules="v2")
    assert result["exact"] == pytest.approx(75.0)


def test_the_best_threshold_scores_count_missing_questions_as_wrong():
    """a (HasAns, right) and c (NoAns, empty) answered, b and d missing: the best search over a and c finds both
    right, 2 of the 4 questions."""
    result = evaluate(V2_QUESTIONS, {"a": "Paris", "c": ""}, na_probs={"a": 0.1, "c": 0.9}, rules="v2")
    assert result["best_exact"] == pytest.approx(50.0) and result["best_f1"] == pytest.approx(50.0)


def test_evaluate_v2_partial_f1_and_missing():
    predictions = {"a": "Paris, France", "c": "nothing"}  # b and d missing
    # a: [paris, france] vs [paris]: P = 1/2, R = 1, F1 = 2/3, EM 0; c: NoAns with text: 0
    result = evaluate(V2_QUESTIONS, predictions, rules="v2")
    assert result["missing"] == 2 and result["total"] == 4
    assert result["exact"] == 0.0
    assert result["f1"] == pytest.approx(100 * (2 / 3) / 4)
    assert result["HasAns_f1"] == pytest.approx(100 * (2 / 3) / 2)
    # na-probs needed for answered questions only; a missing one is refused
    with pytest.raises(ValueError, match="question c"):
        evaluate(V2_QUESTIONS, predictions, na_probs={"a": 0.1}, rules="v2")


def test_best_threshold_ties_keep_question_order():
    # start: 2 NoAns questions (1 and 4) right. Stable order by na_prob: 1 (.1), 3 (.3), 0, 2, 4 (.5 each)
    # 1: NoAns with text -1 -> 1; 3: raw 0 -> 1; 0: +1 -> 2; 2: +1 -> 3; 4: NoAns empty 0 -> 3
    na = np.array([0.5, 0.1, 0.5, 0.3, 0.5])
    raw = np.array([1.0, 0.0, 1.0, 0.0, 0.0])
    has = np.array([True, False, True, True, False])
    nonempty = np.array([True, True, True, True, False])
    assert best_threshold(na, raw, has, nonempty) == pytest.approx((60.0, 0.5))
    # a tie where order matters: HasAns first reaches 2 of 2 at .5; NoAns first goes 0 then 1,
    # never strictly above the start (1), so the threshold stays 0.0
    assert best_threshold([0.5, 0.5], [1.0, 0.0], [True, False], [True, True]) == pytest.approx((100.0, 0.5))
    assert best_threshold([0.5, 0.5], [0.0, 1.0], [False, True], [True, True]) == pytest.approx((50.0, 0.0))


def _official_best_threshold(na_probs, raw_scores, has_answer, nonempty):
    """The official evaluate-v2.0.py's find_best_thresh, loop for loop (its float sums in its order)."""
    current = best = sum(not h for h in has_answer)
    best_threshold = 0.0
    for i in sorted(range(len(na_probs)), key=lambda k: na_probs[k]):
        current += raw_scores[i] if has_answer[i] else (-1 if nonempty[i] else 0)
        if current > best:
            best, best_threshold = current, na_probs[i]
    return 100.0 * best / len(na_probs), best_threshold


def test_best_threshold_sums_as_the_official_script():
    """start + cumsum(gains) rounds prefixes other than the official running sum: here a later prefix came out
    larger by one ulp and won (threshold 4.0 against the official 0.0)."""
    case = ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [2 / 3, 0.0, 0.2, 0.0, 0.8, 0.0],
            [True, False, True, True, True, False], [True] * 6)
    assert best_threshold(*case) == _official_best_threshold(*case) == (44.444444444444436, 0.0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        na = rng.integers(0, 4, n).astype(float)  # many ties
        has = rng.random(n) < 0.6
        raw = np.where(has, rng.choice([0.0, 0.2, 1 / 3, 0.5, 2 / 3, 0.8, 1.0], n), 0.0)
        nonempty = rng.random(n) < 0.7
        args = (na.tolist(), raw.tolist(), has.tolist(), nonempty.tolist())
        assert best_threshold(*args) == _official_best_threshold(*args)


@needs_shared_data("squad/dev-v1.1.json")
def test_squad11_dev_empty_normalising_golds():
    with open(SQUAD_DEV, encoding="utf-8") as f:
        data = json.load(f)["data"]
    questions = [{"id": qa["id"], "answers": [a["text"] for a in qa["answers"]]}
                 for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    assert len(questions) == 10570
    quirky = [q["id"] for q in questions if any(not normalize_answer(a) for a in q["answers"])]
    assert len(quirky) == 3  # the dev set's "." golds
    predictions = {q["id"]: "." if q["id"] in quirky else q["answers"][0] for q in questions}
    # v1 matches "." exactly but gives F1 0 (two empty token lists); v2 drops the "." gold: 0 and 0
    v1 = evaluate(questions, predictions)
    assert v1["exact_match"] == 100.0 and v1["f1"] == pytest.approx(100 * 10567 / 10570)
    v2 = evaluate(questions, predictions, rules="v2")
    assert v2["exact"] == pytest.approx(100 * 10567 / 10570) and v2["f1"] == pytest.approx(100 * 10567 / 10570)


# ---- the official scripts' definitions, written out here independently of the module under test
OFFICIAL_PUNCTUATION = set(string.punctuation)


def official_normalize(s):
    """evaluate-v1.1.py / evaluate-v2.0.py: lower, remove punctuation, remove articles, fix white space
    (applied in that order, as the scripts nest them)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in OFFICIAL_PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s, flags=re.UNICODE)
    return " ".join(s.split())


def official_f1_v1(prediction, gold):
    prediction_tokens, gold_tokens = official_normalize(prediction).split(), official_normalize(gold).split()
    num_same = sum((collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)).values())
    if num_same == 0:
        return 0
    precision, recall = num_same / len(prediction_tokens), num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def official_f1_v2(prediction, gold):
    gold_tokens, prediction_tokens = official_normalize(gold).split(), official_normalize(prediction).split()
    if not gold_tokens or not prediction_tokens:
        return int(gold_tokens == prediction_tokens)
    return official_f1_v1(prediction, gold)


def official_question_scores(prediction, answers, rules):
    """metric_max_over_ground_truths (v1.1) / get_raw_scores' gold list (v2.0: golds normalising to "" dropped,
    none left: [""])."""
    if rules == "v2":
        answers = [a for a in answers if official_normalize(a)] or [""]
    score_f1 = official_f1_v1 if rules == "v1" else official_f1_v2
    return (max(int(official_normalize(prediction) == official_normalize(a)) for a in answers),
            max(score_f1(prediction, a) for a in answers))


HAND_CASES = [("Broncos", ["Denver Broncos", "the Denver Broncos"]), ("", ["."]), ("", []),
              ("dog dog cat", ["dog cat cat", "a dog", "."]), ("in 1999", ["1999", "in 1999!"]),
              ("The  THE an", ["the"]), ("co-operate", ["cooperate"]), ("Théâtre, a b", ["théâtre b", "an a"])]


def test_question_scores_match_the_official_definitions_on_hand_cases():
    from spanbert_plugin.qa.squad_metrics import question_scores

    for prediction, answers in HAND_CASES:
        for rules in ("v1", "v2"):
            if rules == "v1" and not answers:
                with pytest.raises(ValueError):
                    question_scores(prediction, answers, rules)
                continue
            assert question_scores(prediction, answers, rules) == pytest.approx(
                official_question_scores(prediction, answers, rules)), (prediction, answers, rules)
            golds = [a for a in answers if rules == "v1" or official_normalize(a)] or [""]
            assert [official_normalize(a) for a in golds] == [normalize_answer(a) for a in golds]


@needs_shared_data("squad/dev-v1.1.json")
def test_question_scores_match_the_official_definitions_on_squad_dev():
    """Every SQuAD 1.1 dev question against a random stretch of words around its first answer (often
    overlapping it in part, sometimes empty or punctuation only), under both rules."""
    from spanbert_plugin.qa.squad_metrics import question_scores

    with open(SQUAD_DEV, encoding="utf-8") as f:
        data = json.load(f)["data"]
    rng = np.random.default_rng(0)
    compared = 0
    for article in data:
        for paragraph in article["paragraphs"]:
            words = paragraph["context"].split(" ")
            for qa in paragraph["qas"]:
                answers = [a["text"] for a in qa["answers"]]
                at = len(paragraph["context"][: qa["answers"][0]["answer_start"]].split(" ")) - 1
                start = max(0, at + int(rng.integers(-3, 4)))
                prediction = " ".join(words[start: start + int(rng.integers(0, 6))])
                for rules in ("v1", "v2"):
                    assert question_scores(prediction, answers, rules) == pytest.approx(
                        official_question_scores(prediction, answers, rules)), (qa["id"], prediction, rules)
                compared += 1
    assert compared == 10570


def test_gold_answers_are_the_official_scripts_gold_lists():
    """v1.1 compares with every gold as given; v2.0 drops golds that normalise to "" and, none left, compares with
    "" (get_raw_scores), as official_question_scores writes it."""
    from spanbert_plugin.qa.squad_metrics import gold_answers

    for _, answers in HAND_CASES:
        assert gold_answers(answers, "v1") == list(answers)
        assert gold_answers(answers, "v2") == ([a for a in answers if official_normalize(a)] or [""])
    assert gold_answers(["The", "a.", "Paris"], "v2") == ["Paris"] and gold_answers([".", "the"], "v2") == [""]


def test_v2_without_any_prediction_finds_no_threshold_and_v1_takes_no_probabilities():
    """No question answered: every score, and the best-threshold search over the answered questions, is 0 (the
    official script counts a missing question as wrong); no-answer probabilities mean nothing under v1.1 rules."""
    result = evaluate(V2_QUESTIONS, {}, na_probs={}, na_prob_thresh=0.5, rules="v2")
    assert (result["exact"], result["f1"], result["missing"]) == (0.0, 0.0, 4)
    assert (result["best_exact"], result["best_exact_thresh"], result["best_f1"], result["best_f1_thresh"]) == (0, 0, 0, 0)
    assert best_threshold(np.zeros(0), np.zeros(0), np.zeros(0, bool), np.zeros(0, bool)) == (0.0, 0.0)
    with pytest.raises(ValueError, match="^no-answer probabilities need rules='v2'$"):
        evaluate([{"id": "a", "answers": ["Paris"]}], {"a": "Paris"}, na_probs={"a": 0.1})
