"""QA post-processing on hand-built windows, and against a per-window Python-loop reference."""
import re

import numpy as np
import pytest

from spanbert_plugin.qa.postprocess import postprocess
from spanbert_plugin.qa.windows import QASplit

BACKGROUND = -10.0  # logits of positions a test does not care about (minus a small ramp, no ties)


def make_split(contexts, windows, questions, with_negative=False):
    """A QASplit over whitespace tokens; windows: (question, first token, end token, max_context or None, offset)."""
    spans = [np.array([m.span() for m in re.finditer(r"\S+", c)], dtype=np.int64).reshape(-1, 2) for c in contexts]
    arrays = {k: [] for k in ("question_index", "passage_offset", "char_start", "char_end", "max_context")}
    lengths = []
    for question, lo, hi, max_context, offset in windows:
        span = spans[questions[question]["context_index"]][lo:hi]
        arrays["question_index"].append(question)
        arrays["passage_offset"].append(offset)
        arrays["char_start"].append(span[:, 0])
        arrays["char_end"].append(span[:, 1])
        arrays["max_context"].append(np.ones(hi - lo, bool) if max_context is None else np.array(max_context, bool))
        lengths.append(hi - lo)
    zeros = np.zeros(len(windows), dtype=np.int64)
    return QASplit(question_index=np.array(arrays["question_index"], dtype=np.int64), start_positions=zeros,
                   end_positions=zeros, passage_offset=np.array(arrays["passage_offset"], dtype=np.int64),
                   token_offsets=np.r_[0, np.cumsum(lengths)].astype(np.int64),
                   char_start=np.concatenate(arrays["char_start"]), char_end=np.concatenate(arrays["char_end"]),
                   max_context=np.concatenate(arrays["max_context"]), questions=questions, contexts=contexts,
                   format="squad2" if with_negative else "squad1", with_negative=with_negative)


def background(rows, width):
    return np.tile(BACKGROUND - 0.01 * np.arange(width), (rows, 1))


def one_window_split(context, with_negative=False, offset=3):
    n = len(context.split())
    return make_split([context], [(0, 0, n, None, offset)],
                      [{"id": "q0", "context_index": 0, "answers": []}], with_negative)


CAT = "the cat sat on the mat while the dog ran"  # tokens 0..9, passage positions 3..12, [SEP] at 13


def test_best_span_offsets_and_probabilities():
    split = one_window_split(CAT)
    start, end = background(1, 16), background(1, 16)
    start[0, 3 + 1], end[0, 3 + 2] = 5.0, 4.0  # "cat sat"
    start[0, 0], start[0, 1], end[0, 13] = 9.0, 8.0, 9.0  # [CLS], question, [SEP]: not in the passage
    start[0, 14:], end[0, 14:] = 50.0, 50.0  # columns past the window: ignored
    result = postprocess(split, np.array([0]), start, end)
    assert result.predictions == {"q0": "cat sat"}
    best = result.nbest["q0"][0]
    assert best == {"text": "cat sat", "probability": pytest.approx(best["probability"]), "start_logit": 5.0,
                    "end_logit": 4.0, "start": 4, "end": 11}
    entries = result.nbest["q0"]
    assert len(entries) == 20 and result.null_odds == {}
    assert all(CAT[e["start"]:e["end"]] == e["text"] for e in entries)
    probs = np.array([e["probability"] for e in entries])
    assert probs.sum() == pytest.approx(1.0) and np.all(np.diff(probs) <= 0)
    scores = np.array([e["start_logit"] + e["end_logit"] for e in entries])
    assert probs == pytest.approx(np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum())
    assert result.prediction_of(0) == "cat sat"


def test_length_and_order_filters():
    split = one_window_split(CAT)
    start, end = background(1, 14), background(1, 14)
    start[0, 3 + 1] = 5.0  # "cat"
    end[0, 3 + 9], end[0, 3 + 2] = 6.0, 1.0  # "ran", "sat"
    # "cat ... ran" spans 9 tokens: allowed at 9, not at 8 (then "cat sat", 5 + 1)
    assert postprocess(split, [0], start, end, max_answer_length=9).predictions["q0"] == CAT[4:]
    assert postprocess(split, [0], start, end, max_answer_length=8).predictions["q0"] == "cat sat"
    # a high end before a high start never pairs: start "dog" (8) with end "cat" (1) is dropped; the best
    # valid pair is "the cat": background start at token 0 (-10.03) + 5 = -5.03, beating "cat" alone
    # (-10.04 + 5) and "dog" alone (5 + (-10.11))
    start, end = background(1, 14), background(1, 14)
    start[0, 3 + 8], end[0, 3 + 1] = 5.0, 5.0
    result = postprocess(split, [0], start, end, max_answer_length=30)
    assert result.predictions["q0"] == "the cat"
    assert all(e["start"] < e["end"] for e in result.nbest["q0"])


def test_max_context_rule_across_windows():
    # window 0 holds tokens 0..6, window 1 tokens 4..9; token 4 has its max context in window 0,
    # tokens 5 and 6 in window 1
    split = make_split([CAT], [(0, 0, 7, [1, 1, 1, 1, 1, 0, 0], 3), (0, 4, 10, [0, 1, 1, 1, 1, 1], 2)],
                       [{"id": "q0", "context_index": 0, "answers": ["mat"]}])
    start, end = background(2, 14), background(2, 14)
    start[0, 3 + 5], end[0, 3 + 5] = 5.0, 5.0  # "mat" in window 0 (10), start not max-context there
    start[1, 2 + 1], end[1, 2 + 1] = 3.0, 3.0  # "mat" in window 1 (6)
    result = postprocess(split, [0, 1], start, end)
    best = result.nbest["q0"][0]
    assert result.predictions["q0"] == "mat" and (best["start_logit"], best["end_logit"]) == (3.0, 3.0)
    # an end token outside its max context is fine: start "on" (3) in window 0 + end "mat" (5) in window 0
    start[0, 3 + 3] = 4.0
    assert postprocess(split, [0, 1], start, end).predictions["q0"] == "on the mat"  # 4 + 5 = 9 > 6


def test_dedupe_by_text_keeps_best():
    context = "the cat saw the cat"
    split = one_window_split(context)
    start, end = background(1, 9), background(1, 9)
    start[0, 3 + 0], start[0, 3 + 3] = 4.0, 3.0  # "the" (0), "the" (3)
    end[0, 3 + 1], end[0, 3 + 4] = 4.0, 3.5  # "cat" (1), "cat" (4)
    # "the cat" at 0-1 scores 8, at 3-4 6.5 (dropped), "the cat saw the cat" 7.5
    entries = postprocess(split, [0], start, end).nbest["q0"]
    texts = [e["text"] for e in entries]
    assert texts[:2] == ["the cat", "the cat saw the cat"] and len(texts) == len(set(texts))
    assert entries[0]["start"] == 0 and entries[0]["start_logit"] + entries[0]["end_logit"] == 8.0
    # the 15 spans of the 5-token passage; "the", "cat" and "the cat" occur twice: 12 distinct texts
    assert len(entries) == 12


def two_question_split(with_negative):
    """Question q0 over two windows of CAT, question q1 over one window of another context."""
    contexts = [CAT, "paris is the capital of france"]
    questions = [{"id": "q0", "context_index": 0, "answers": []}, {"id": "q1", "context_index": 1, "answers": []}]
    windows = [(0, 0, 7, [1, 1, 1, 1, 1, 0, 0], 3), (0, 4, 10, [0, 1, 1, 1, 1, 1], 2), (1, 0, 6, None, 4)]
    return make_split(contexts, windows, questions, with_negative)


def test_null_answer_odds_and_threshold():
    split = two_question_split(with_negative=True)
    start, end = background(3, 14), background(3, 14)
    start[0, 0], end[0, 0] = 1.0, 1.0  # [CLS] of window 0: 2
    start[1, 0], end[1, 0] = 0.25, 0.75  # window 1: 1, the least: the null score of q0
    start[1, 2 + 4], end[1, 2 + 4] = 1.5, 1.5  # "dog" (token 8) in window 1: 3
    start[2, 0], end[2, 0] = 2.0, 2.0  # q1: null 4
    start[2, 4 + 0], end[2, 4 + 0] = 1.0, 0.5  # "paris": 1.5
    result = postprocess(split, [0, 1, 2], start, end)
    # q0: null_odds = 1 - 3 = -2 <= 0: the span; q1: 4 - 1.5 = 2.5 > 0: no answer
    assert result.predictions == {"q0": "dog", "q1": ""}
    assert result.null_odds == pytest.approx({"q0": -2.0, "q1": 2.5})
    q0, q1 = result.nbest["q0"], result.nbest["q1"]
    null = [e for e in q0 if e["text"] == ""]
    assert len(null) == 1 and null[0]["start"] == null[0]["end"] == -1
    assert (null[0]["start_logit"], null[0]["end_logit"]) == (0.25, 0.75)
    assert q0[0]["text"] == "dog" and q1[0]["text"] == "" and q1[1]["text"] == "paris"
    assert len(q0) == 21  # 20 spans and the null answer
    for entries in (q0, q1):
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
        scores = [e["start_logit"] + e["end_logit"] for e in entries]
        assert scores == sorted(scores, reverse=True)
    # the threshold moves the decision: q0 gives up at -2.5, q1 answers at 3
    assert postprocess(split, [0, 1, 2], start, end, null_threshold=-2.5).predictions["q0"] == ""
    assert postprocess(split, [0, 1, 2], start, end, null_threshold=3.0).predictions["q1"] == "paris"


def test_a_span_as_good_as_the_null_answer_ranks_before_it():
    """A tie between the best span and the null score: null_odds 0 is not above the threshold 0, so the span is
    the answer, and the n-best list puts it first (BERT's stable sort puts the null entry after equal spans)."""
    split = one_window_split(CAT, with_negative=True)  # passage positions 3..12
    start, end = background(1, 14), background(1, 14)
    start[0, 0], end[0, 0] = 1.0, 1.0  # null score 2
    start[0, 3 + 1], end[0, 3 + 2] = 1.0, 1.0  # "cat sat": 2
    result = postprocess(split, [0], start, end)
    assert result.predictions["q0"] == "cat sat" and result.null_odds["q0"] == 0.0
    assert [e["text"] for e in result.nbest["q0"][:2]] == ["cat sat", ""]


def test_no_candidate_at_all():
    # every passage token lacks max context: nothing survives
    split = make_split([CAT], [(0, 0, 10, [0] * 10, 3)], [{"id": "q0", "context_index": 0, "answers": []}])
    start, end = background(1, 14), background(1, 14)
    result = postprocess(split, [0], start, end)
    assert result.predictions == {"q0": ""}
    assert result.nbest["q0"] == [{"text": "", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0,
                                   "start": -1, "end": -1}]
    split.with_negative = True
    result = postprocess(split, [0], start, end)
    assert result.predictions == {"q0": ""} and result.null_odds == {"q0": float("inf")}
    assert [e["text"] for e in result.nbest["q0"]] == [""]
    assert result.nbest["q0"][0]["start_logit"] == BACKGROUND


def test_several_questions_any_window_order_and_coverage():
    split = two_question_split(with_negative=False)
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=(3, 14)), rng.normal(size=(3, 14))
    full = postprocess(split, [0, 1, 2], start, end)
    assert full.ids == ["q0", "q1"] and set(full.predictions) == {"q0", "q1"}
    order = [2, 0, 1]
    shuffled = postprocess(split, order, start[order], end[order])
    assert shuffled.predictions == full.predictions and shuffled.nbest == full.nbest
    # one question at a time, merged
    only_q1 = postprocess(split, [2], start[2:], end[2:])
    assert only_q1.ids == ["q1"] and only_q1.predictions["q1"] == full.predictions["q1"]
    merged = postprocess(split, [0, 1], start[:2], end[:2])
    merged.update(only_q1)
    assert merged.ids == full.ids and merged.nbest == full.nbest
    with pytest.raises(ValueError, match="same question"):
        merged.update(only_q1)
    with pytest.raises(KeyError):
        only_q1.prediction_of(0)


def test_incomplete_or_bad_windows_are_refused():
    split = two_question_split(with_negative=False)
    logits = np.zeros((3, 14))
    with pytest.raises(ValueError, match="window 1 .question 0. is missing"):
        postprocess(split, [0, 2], logits[:2], logits[:2])
    with pytest.raises(ValueError, match="window 2 .question 1. is repeated"):
        postprocess(split, [0, 1, 2, 2], np.zeros((4, 14)), np.zeros((4, 14)))
    with pytest.raises(ValueError, match="window ids"):
        postprocess(split, [0, 1, 3], logits, logits)
    with pytest.raises(ValueError, match="11 tokens but the logits only 10"):  # 3 + 7 passage + [SEP]
        postprocess(split, [0, 1, 2], logits[:, :10], logits[:, :10])
    with pytest.raises(ValueError, match="len.window_ids."):
        postprocess(split, [0, 1], logits, logits)


def max_context_flags(num_tokens, spans):
    """BERT's rule: a token belongs to the window where min(left, right context) + 0.01 * length is largest."""
    flags = [np.zeros(hi - lo, bool) for lo, hi in spans]
    for t in range(num_tokens):
        scores = [min(t - lo, hi - 1 - t) + 0.01 * (hi - lo) if lo <= t < hi else -1 for lo, hi in spans]
        best = int(np.argmax(scores))
        flags[best][t - spans[best][0]] = True
    return flags


def random_split(rng, num_questions, with_negative, window=16, stride=8):
    words = ["a", "b", "c", "the", "d", "e."]  # few words: repeated texts exercise the dedupe
    contexts, questions, windows = [], [], []
    for q in range(num_questions):
        n = int(rng.integers(3, 50))
        contexts.append(" ".join(rng.choice(words, size=n)))
        questions.append({"id": f"q{q}", "context_index": q, "answers": []})
        spans = [(lo, min(lo + window, n)) for lo in range(0, max(n - window, 0) + stride, stride)]
        spans = [s for i, s in enumerate(spans) if i == 0 or spans[i - 1][1] < n]
        for (lo, hi), flags in zip(spans, max_context_flags(n, spans)):
            windows.append((q, lo, hi, flags, int(rng.integers(2, 6))))
    return make_split(contexts, windows, questions, with_negative)


def reference_postprocess(split, start_logits, end_logits, n_best, max_answer_length, null_threshold):
    """Per-question, per-window Python loops (the released BERT procedure)."""
    predictions, nbest_texts, null_odds = {}, {}, {}
    for q, question in enumerate(split.questions):
        context = split.contexts[question["context_index"]]
        candidates, null = [], None
        for w in range(split.num_windows):
            if split.question_index[w] != q:
                continue
            offset = split.passage_offset[w]
            length = split.token_offsets[w + 1] - split.token_offsets[w]
            starts, ends = start_logits[w][:offset + length + 1], end_logits[w][:offset + length + 1]
            if null is None or starts[0] + ends[0] < null:
                null = starts[0] + ends[0]
            for s in np.argsort(-starts)[:n_best]:
                for e in np.argsort(-ends)[:n_best]:
                    if not (offset <= s < offset + length and offset <= e < offset + length):
                        continue
                    if e < s or e - s + 1 > max_answer_length:
                        continue
                    if not split.max_context[split.token_offsets[w] + s - offset]:
                        continue
                    a = split.token_offsets[w] + s - offset
                    b = split.token_offsets[w] + e - offset
                    candidates.append((starts[s] + ends[e], context[split.char_start[a]:split.char_end[b]]))
        candidates.sort(key=lambda c: -c[0])
        texts, best_score = [], None
        for score, text in candidates:
            if text not in texts:
                texts.append(text)
                best_score = score if best_score is None else best_score
            if len(texts) == n_best:
                break
        answer = texts[0] if texts else ""
        if split.with_negative:
            null_odds[question["id"]] = null - best_score if texts else float("inf")
            answer = "" if not texts or null - best_score > null_threshold else answer
            if "" not in texts:
                texts.append("")
        predictions[question["id"]] = answer
        nbest_texts[question["id"]] = texts or [""]
    return predictions, nbest_texts, null_odds


@pytest.mark.parametrize("with_negative", [False, True])
def test_matches_python_loop_reference(with_negative):
    rng = np.random.default_rng(1234 + with_negative)
    split = random_split(rng, num_questions=60, with_negative=with_negative)
    width = int((split.passage_offset + split.passage_lengths()).max()) + 4
    start, end = rng.normal(size=(2, split.num_windows, width)) * 3
    for n_best, max_len, threshold in ((20, 30, 0.0), (5, 4, 1.0), (1, 1, -1.0)):
        expected, texts, odds = reference_postprocess(split, start, end, n_best, max_len, threshold)
        result = postprocess(split, np.arange(split.num_windows), start, end, n_best=n_best,
                             max_answer_length=max_len, null_threshold=threshold)
        assert result.predictions == expected
        # same texts in the same order (the null answer sits by its score here, last in the reference)
        assert {q: [e["text"] for e in entries if e["text"]] for q, entries in result.nbest.items()} == \
            {q: [t for t in t_list if t] for q, t_list in texts.items()}
        assert all(("" in [e["text"] for e in result.nbest[q]]) == ("" in texts[q]) for q in texts)
        assert result.null_odds == pytest.approx(odds)
    assert np.bincount(split.question_index).max() >= 4  # questions of several windows
    if with_negative:
        assert 0 < sum(p == "" for p in result.predictions.values()) < len(result.predictions)


@pytest.mark.parametrize("with_negative", [False, True])
def test_zero_width_tokens_never_end_an_answer_or_make_one(with_negative):
    """sentencepiece's standalone '▁' (before "on" here) has no width: a span ending on it loses the space before the
    next word, and a span of it alone is no answer (an empty text would pass for the null answer)."""
    context = "the cat sat on the mat"
    spans = np.array([(0, 3), (4, 7), (8, 11), (12, 12), (12, 14), (15, 18), (19, 22)], dtype=np.int64)
    n, offset = len(spans), 3
    one = np.zeros(1, dtype=np.int64)
    split = QASplit(question_index=one, start_positions=one, end_positions=one, passage_offset=one + offset,
                    token_offsets=np.array([0, n]), char_start=spans[:, 0], char_end=spans[:, 1],
                    max_context=np.ones(n, bool), questions=[{"id": "q0", "context_index": 0, "answers": []}],
                    contexts=[context], format="squad2" if with_negative else "squad1", with_negative=with_negative)
    start, end = background(1, 16), background(1, 16)
    start[0, offset + 2], end[0, offset + 3] = 5.0, 5.0  # "sat" + the '▁': best
    result = postprocess(split, one, start, end)
    assert result.predictions["q0"] == "sat" and result.nbest["q0"][0]["end"] == 11
    start, end = background(1, 16), background(1, 16)
    start[0, offset + 3], end[0, offset + 3] = 6.0, 6.0  # the '▁' alone: best by far, but no text
    start[0, offset + 4], end[0, offset + 5] = 2.0, 2.0  # "on the"
    result = postprocess(split, one, start, end, null_threshold=1e9)
    assert result.predictions["q0"] == "on the"
    assert all(e["text"] or e["start"] == -1 for e in result.nbest["q0"])  # only the null answer is empty
    assert all(context[e["start"]:e["end"]] == e["text"] == e["text"].strip() for e in result.nbest["q0"] if e["text"])
    if with_negative:
        assert sum(e["text"] == "" for e in result.nbest["q0"]) == 1
        null = start[0, 0] + end[0, 0]
        # against "on the" from the '▁' (6 + 2: a span may start on it; its text starts at "on"), not the empty span
        assert result.null_odds["q0"] == pytest.approx(null - 8.0)


@pytest.mark.parametrize("with_negative", [False, True])
def test_tied_scores_rank_alike_whatever_else_shares_the_call(with_negative):
    """Logits of few distinct values (as bfloat16 gives them: steps of 1/64 near 3) tie often. A question's n-best
    list (texts, offsets, logits, probabilities) must depend on its own windows only: not on the other questions
    processed with it (a validation batch, the whole split of spanbert-predict-qa, hub.answer's one question), on
    their order, or on the padding of a wider batch. Before, ties ranked as numpy's quick sort and argpartition left
    them: 24 questions with logits in steps of 0.5 gave other n-best lists alone than together."""
    rng = np.random.default_rng(3)
    words = ["red", "fox", "blue", "cat", "green", "owl"]  # repeated texts: the same answer at several places
    contexts = [" ".join(rng.choice(words, 14)) for _ in range(24)]
    questions = [{"id": f"q{i}", "context_index": i, "answers": []} for i in range(24)]
    windows = [w for q in range(24) for w in ((q, 0, 10, [1] * 8 + [0] * 2, 3), (q, 5, 14, [0] * 3 + [1] * 6, 3))]
    split = make_split(contexts, windows, questions, with_negative)
    width = 3 + 10 + 1
    start, end = (rng.integers(-4, 5, size=(len(windows), width)) * 0.5 for _ in range(2))
    together = postprocess(split, np.arange(len(windows)), start, end, n_best=5)
    reversed_order = np.arange(len(windows))[::-1]
    padded = np.full((len(windows), width + 9), np.finfo(np.float32).min)
    wide_start, wide_end = padded.copy(), padded.copy()
    wide_start[:, :width], wide_end[:, :width] = start, end
    for result in (postprocess(split, reversed_order, start[reversed_order], end[reversed_order], n_best=5),
                   postprocess(split, np.arange(len(windows)), wide_start, wide_end, n_best=5)):
        assert result.nbest == together.nbest and result.predictions == together.predictions
    for q in range(24):
        own = np.arange(2 * q, 2 * q + 2)
        alone = postprocess(split, own, start[own], end[own], n_best=5)
        assert alone.nbest[f"q{q}"] == together.nbest[f"q{q}"], q


def test_equal_scores_rank_the_earlier_window_start_and_end_first():
    """The rule behind the test above: of equal scores the earlier window, start and end come first (any rule
    followed alike in every call would pass that test)."""
    split = make_split([CAT], [(0, 0, 6, None, 3), (0, 2, 10, None, 3)],
                       [{"id": "q0", "context_index": 0, "answers": []}])
    start, end = np.full((2, 16), -10.0), np.full((2, 16), -10.0)
    start[:, 3:11], end[:, 3:11] = 0.0, 0.0  # every passage span scores 0 (window 0's last three columns: padding)
    nbest = postprocess(split, np.arange(2), start, end, n_best=4).nbest["q0"]
    assert [entry["text"] for entry in nbest] == ["the", "the cat", "the cat sat", "the cat sat on"]


def test_no_window_answers_no_question_and_the_options_must_be_positive():
    """Windows of no question (an empty batch): an empty result; an n-best of 0 or answers of at most 0 tokens are
    refused (the library call; the commands and the criterion refuse them as options)."""
    split = make_split([CAT, "a b c"], [(0, 0, 10, None, 3), (1, 0, 3, None, 3)],
                       [{"id": "q0", "context_index": 0, "answers": []}, {"id": "q1", "context_index": 1, "answers": []}])
    result = postprocess(split, np.zeros(0, np.int64), np.zeros((0, 16)), np.zeros((0, 16)))
    assert len(result) == 0 and result.question_indices.tolist() == [] and result.predictions == {}
    one = postprocess(split, np.array([1]), background(1, 16), background(1, 16))
    assert len(one) == 1 and one.ids == ["q1"]
    for options in ({"n_best": 0}, {"max_answer_length": 0}):
        with pytest.raises(ValueError, match="^n_best and max_answer_length must be positive$"):
            postprocess(split, np.array([1]), background(1, 16), background(1, 16), **options)
