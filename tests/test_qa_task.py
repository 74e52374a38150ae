"""extractive_qa end to end: prepare, fairseq-train (learns, exact validation EM/F1), predict, resume."""
import json
import os
import random
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import bin_path, run_cli, run_gloo_ranks

QA_TRAIN = [
    "--user-dir", "user_dir", "--task", "extractive_qa", "--criterion", "extractive_qa",
    "--arch", "spanbert_tiny", "--max-positions", "128", "--optimizer", "adam", "--lr", "2e-3",
    "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "50", "--batch-size", "32", "--cpu",
    "--num-workers", "0", "--seed", "3", "--no-epoch-checkpoints", "--log-format", "json",
    "--log-interval", "20", "--best-checkpoint-metric", "f1", "--maximize-best-checkpoint-metric",
    "--dropout", "0", "--attention-dropout", "0",
]
NAMES = ["Ada", "Bruno", "Chen", "Dora", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kira", "Lev"]
CITIES = ["Oslo", "Lima", "Kyoto", "Accra", "Quito", "Perth", "Turin", "Dakar", "Hanoi", "Bergen"]


def synthetic_squad(path, n_contexts, seed, filler_words, version_2=False):
    """Passages of filler sentences, one 'NAME lives in CITY .' fact and two distractor city mentions.

    The question asks where NAME lives; answering needs the 'lives in' cue, so picking one of the
    three cities of the passage at random (the trivial baseline) scores about 33.
    """
    rng = random.Random(seed)
    paragraphs = []
    for c in range(n_contexts):
        person = rng.choice(NAMES)
        city, *distractors = rng.sample(CITIES, 3)
        sentences = [" ".join(rng.choices(filler_words, k=rng.randint(3, 7))) + " ." for _ in range(3)]
        for other in distractors:
            sentences.insert(rng.randint(0, len(sentences)), f"We flew over {other} today .")
        sentences.insert(rng.randint(0, len(sentences)), f"{person} lives in {city} .")
        context = " ".join(sentences)
        start = context.index(f"{person} lives in ") + len(f"{person} lives in ")
        qas = [{"id": f"q{c}", "question": f"Where does {person} live ?",
                "answers": [{"text": city, "answer_start": start}]}]
        if version_2:
            absent = rng.choice([n for n in NAMES if n != person])
            qas.append({"id": f"q{c}_none", "question": f"Where does {absent} live ?", "answers": [], "is_impossible": True})
        paragraphs.append({"context": context, "qas": qas})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "v2.0" if version_2 else "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}, f)


@pytest.fixture(scope="module")
def qa_data(wordpiece_data, corpus_files, tmp_path_factory):
    d = tmp_path_factory.mktemp("qa")
    words = [w for w in open(corpus_files[0], encoding="utf-8").read().split() if w.isalpha() and w.islower()][:3000]
    synthetic_squad(d / "train.json", 600, 1, words)
    synthetic_squad(d / "valid.json", 80, 2, words)
    run_cli([bin_path("spanbert-prepare-qa"), "--train", str(d / "train.json"), "--valid", str(d / "valid.json"),
             "--tokenizer-from", wordpiece_data, "--destdir", str(d / "prepared"), "--max-seq-length", "64",
             "--doc-stride", "24", "--max-query-length", "16"])
    return str(d / "prepared")


def _valid_logs(stdout_and_err):
    logs = []
    for line in stdout_and_err.splitlines():
        if "valid_f1" in line and "{" in line:
            logs.append(json.loads(line[line.index("{"):]))
    return logs


# The shared run's length. Validation F1 after 300 updates, measured at seeds 1-5 (this data, --seed N): 81.1, 100,
# 100, 100, 99.2 (the test's seed 3: 100; at 200 updates 62-80, where 400 updates gave 91-100). The learning test's
# bound, 70, is 11 points below the lowest; guessing one of the passage's three cities scores about 33.
QA_UPDATES = 300


@pytest.fixture(scope="module")
def qa_run(qa_data, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("qa_ck"))
    proc = run_cli([bin_path("fairseq-train"), qa_data, *QA_TRAIN, "--max-update", str(QA_UPDATES), "--save-dir", save,
                    "--validate-interval-updates", "150"])
    return save, proc.stdout + proc.stderr


def test_qa_training_learns_and_validates_whole_questions(qa_run, qa_data):
    save, log = qa_run
    logs = _valid_logs(log)
    assert len(logs) >= 2, log[-3000:]  # mid-epoch validations work (--validate-interval-updates)
    last = logs[-1]
    for key in ("valid_em", "valid_f1", "valid_loss"):
        assert key in last
    # three cities per passage: guessing one of them scores about 33
    assert float(last["valid_f1"]) > 70, logs
    stats = json.load(open(os.path.join(qa_data, "prepare_stats.json")))
    assert stats["valid"]["questions"] == 80


def test_predict_takes_the_checkpoints_answer_options(qa_run, qa_data, tmp_path):
    """Unset, --n-best, --max-answer-length and --null-threshold are the ones the checkpoint validated with."""
    import torch

    save, _ = qa_run
    state = torch.load(os.path.join(save, "checkpoint_best.pt"), map_location="cpu", weights_only=True)
    state["cfg"]["criterion"].update(n_best=3, max_answer_length=4)
    torch.save(state, tmp_path / "narrow.pt")
    base = [bin_path("spanbert-predict-qa"), "--checkpoint", str(tmp_path / "narrow.pt"), "--data", qa_data,
            "--split", "valid"]
    run_cli(base + ["--out", str(tmp_path / "default")])
    run_cli(base + ["--out", str(tmp_path / "given"), "--n-best", "3", "--max-answer-length", "4"])
    proc = run_cli(base + ["--out", str(tmp_path / "wide"), "--n-best", "20", "--null-threshold", "1"])
    assert "--null-threshold has no effect" in proc.stderr  # SQuAD 1.1 rules: every question gets a span
    for name in ("predictions.json", "nbest_predictions.json", "eval.json"):
        assert (tmp_path / "default" / name).read_bytes() == (tmp_path / "given" / name).read_bytes(), name
    narrow = json.load(open(tmp_path / "default" / "nbest_predictions.json"))
    wide = json.load(open(tmp_path / "wide" / "nbest_predictions.json"))
    assert max(map(len, narrow.values())) == 3 and max(map(len, wide.values())) > 3
    assert any(answers[0]["text"] for answers in narrow.values())


def test_predict_equals_validation(qa_run, qa_data, tmp_path):
    save, log = qa_run
    best = max(float(v["valid_f1"]) for v in _valid_logs(log))
    out = tmp_path / "pred"
    run_cli([bin_path("spanbert-predict-qa"), "--checkpoint", os.path.join(save, "checkpoint_best.pt"),
             "--data", qa_data, "--split", "valid", "--out", str(out)])
    scores = json.load(open(out / "eval.json"))
    predictions = json.load(open(out / "predictions.json"))
    assert len(predictions) == scores["total"] == 80
    assert scores["f1"] == pytest.approx(best, abs=1e-3)
    nbest = json.load(open(out / "nbest_predictions.json"))
    for qid, answers in nbest.items():
        assert answers[0]["text"] == predictions[qid]
        assert sum(a["probability"] for a in answers) == pytest.approx(1, abs=1e-4)


def _bf16_logit_error(checkpoint, data):
    """The largest |bf16 - fp32| start or end logit over the split's real tokens, batches as spanbert-predict-qa's."""
    import torch

    from spanbert_plugin.qa.predict import load_qa_checkpoint, split_logits

    model, task, cfg = load_qa_checkpoint(checkpoint, data, cpu=True)
    fp32 = split_logits(model, task, cfg, "valid")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = split_logits(model, task, cfg, "valid")
    real = fp32.start > np.finfo(np.float32).min / 2
    return float(max(np.abs(fp32.start - bf16.start)[real].max(), np.abs(fp32.end - bf16.end)[real].max()))


def test_predict_bf16_differs_from_fp32_only_at_near_ties(qa_run, qa_data, tmp_path):
    """--bf16 runs the model under bfloat16 autocast. With every logit within e of fp32's, a span score moves by at
    most 2e, so an answer can change only where bf16's best leads the next by less than 4e. --fp32-recheck-margin M
    answers the questions leading by less than M from fp32 logits and leaves the others as bf16 gave them."""
    from spanbert_plugin.qa.predict import answer_lead

    save, _ = qa_run
    checkpoint = os.path.join(save, "checkpoint_best.pt")

    def predict(name, *extra):
        out = tmp_path / name
        proc = run_cli([bin_path("spanbert-predict-qa"), "--checkpoint", checkpoint, "--data", qa_data,
                        "--split", "valid", "--out", str(out), "--cpu", *extra])
        return proc.stderr, {f: json.load(open(out / f"{f}.json")) for f in ("predictions", "nbest_predictions", "eval")}

    _, fp32 = predict("fp32")
    _, bf16 = predict("bf16", "--bf16")
    assert bf16["eval"]["total"] == 80
    bound = 4 * _bf16_logit_error(checkpoint, qa_data)
    lead = {q: answer_lead(nbest) for q, nbest in bf16["nbest_predictions"].items()}
    changed = [q for q in fp32["predictions"] if bf16["predictions"][q] != fp32["predictions"][q]]
    assert all(lead[q] < bound for q in changed), (changed, bound)

    margin = float(np.median(list(lead.values())))  # about half the questions: both paths are exercised
    log, recheck = predict("recheck", "--bf16", "--fp32-recheck-margin", repr(margin))
    close = {q for q in lead if lead[q] < margin}
    assert 0 < len(close) < 80 and f" {len(close)} of 80 questions were near ties" in log
    for q, nbest in recheck["nbest_predictions"].items():
        source = fp32 if q in close else bf16
        assert recheck["predictions"][q] == source["predictions"][q]
        expected = source["nbest_predictions"][q][0]
        assert nbest[0]["start_logit"] == pytest.approx(expected["start_logit"], abs=1e-4), q
        assert nbest[0]["end_logit"] == pytest.approx(expected["end_logit"], abs=1e-4), q


def test_fp32_recheck_margin_needs_bf16(qa_run, qa_data, tmp_path):
    save, _ = qa_run
    base = [bin_path("spanbert-predict-qa"), "--checkpoint", os.path.join(save, "checkpoint_best.pt"), "--data", qa_data,
            "--out", str(tmp_path / "out"), "--cpu"]
    for extra, message in ((["--fp32-recheck-margin", "0.1"], "only with --bf16"),
                           (["--bf16", "--fp32-recheck-margin", "-1"], "must be a finite number of at least 0"),
                           (["--bf16", "--fp32-recheck-margin", "nan"], "must be a finite number of at least 0")):
        proc = run_cli(base + extra, check=False)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_resume_continues(qa_run, qa_data):
    import torch

    save, _ = qa_run
    proc = run_cli([bin_path("fairseq-train"), qa_data, *QA_TRAIN, "--max-update", str(QA_UPDATES + 20),
                    "--save-dir", save])
    assert f"@ {QA_UPDATES} updates" in proc.stdout + proc.stderr  # resumed from checkpoint_last.pt, not from scratch
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == QA_UPDATES + 20
    assert "qa_outputs.weight" in state["model"]


@pytest.fixture(scope="module")
def squad2_run(wordpiece_data, corpus_files, tmp_path_factory):
    """SQuAD 2.0-style data and a checkpoint trained 20 updates by two gloo workers: (data, save dir, rank-0 log)."""
    tmp_path = tmp_path_factory.mktemp("squad2")
    words = [w for w in open(corpus_files[0], encoding="utf-8").read().split() if w.isalpha() and w.islower()][:3000]
    synthetic_squad(tmp_path / "train.json", 40, 5, words, version_2=True)
    synthetic_squad(tmp_path / "valid.json", 10, 6, words, version_2=True)
    data = str(tmp_path / "prepared")
    run_cli([bin_path("spanbert-prepare-qa"), "--train", str(tmp_path / "train.json"), "--valid", str(tmp_path / "valid.json"),
             "--tokenizer-from", wordpiece_data, "--destdir", data, "--max-seq-length", "64", "--doc-stride", "24",
             "--max-query-length", "16"])
    # two gloo workers: each validates part of the questions; the metrics must be those of the whole split
    save = str(tmp_path / "ck")
    outputs = run_gloo_ranks(lambda rank: [bin_path("fairseq-train"), data, *QA_TRAIN, "--max-update", "20",
                                           "--save-dir", save, "--batch-size-valid", "6"])
    return data, save, outputs[0]


def test_squad2_metrics_logged(squad2_run, tmp_path):
    data, save, log = squad2_run
    last = _valid_logs(log)[-1]
    for key in ("valid_em", "valid_f1", "valid_has_ans_f1", "valid_no_ans_f1", "valid_best_f1", "valid_best_f1_thresh"):
        assert key in last, last
    out = tmp_path / "pred"
    run_cli([bin_path("spanbert-predict-qa"), "--checkpoint", os.path.join(save, "checkpoint_last.pt"),
             "--split", "valid", "--out", str(out)])
    scores = json.load(open(out / "eval.json"))
    odds = json.load(open(out / "null_odds.json"))
    assert len(odds) == scores["total"] == 20
    assert scores["f1"] == pytest.approx(float(last["valid_f1"]), abs=1e-3)
    assert scores["best_f1"] == pytest.approx(float(last["valid_best_f1"]), abs=1e-3)
    for key in ("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1_thresh"):
        assert key in scores


def test_the_hub_puts_the_null_answer_first_exactly_where_predict_says_no_answer(squad2_run):
    """hub.answer's first answer is the null one when the null odds (null score - best span score) exceed
    null_threshold, as spanbert-predict-qa answers "" then."""
    from spanbert_plugin.model.spanbert import SpanBertModel

    data, save, _ = squad2_run
    model = SpanBertModel.from_pretrained(save, "checkpoint_last.pt")
    context = " ".join(json.loads(line) for line in open(os.path.join(data, "valid.contexts.jsonl")))[:600]
    for question in ("Where does Ada live ?", "Where does Kira live ?"):
        answers = model.answer(question, context, topk=100, null_threshold=0.0)
        odds = (next(a["score"] for a in answers if a["start"] < 0)
                - max(a["score"] for a in answers if a["start"] >= 0))
        margin = abs(odds) + 0.5
        assert model.answer(question, context, null_threshold=odds + margin)[0]["start"] >= 0
        assert model.answer(question, context, null_threshold=odds - margin)[0]["start"] < 0


def _predict(save, out, *options):
    """spanbert-predict-qa on the valid split; (predictions, null_odds, nbest, eval) as written."""
    run_cli([bin_path("spanbert-predict-qa"), "--checkpoint", os.path.join(save, "checkpoint_last.pt"),
             "--split", "valid", "--out", str(out), *options])

    def strict(name):  # JSON as the official script reads it: no Infinity / NaN
        with open(out / name, encoding="utf-8") as f:
            return json.load(f, parse_constant=lambda c: pytest.fail(f"{name} holds {c}"))

    return tuple(strict(n) for n in ("predictions.json", "null_odds.json", "nbest_predictions.json", "eval.json"))


def test_predict_null_threshold_and_max_answer_length_options(squad2_run, tmp_path):
    from test_squad_metrics import official_question_scores

    data, save, _ = squad2_run
    predictions, odds, nbest, _ = _predict(save, tmp_path / "default")
    golds = {q["id"]: q["answers"] for q in map(json.loads, open(os.path.join(data, "valid.questions.jsonl")))}

    # --null-threshold: "" exactly where the null odds exceed it, else the best non-null candidate; eval.json
    # scores predictions.json as written (the official v2.0 definitions)
    threshold = sorted(odds.values())[len(odds) // 2]
    thresholded, same_odds, _, scores = _predict(save, tmp_path / "threshold", "--null-threshold", repr(threshold))
    assert same_odds == odds
    assert 0 < sum(o > threshold for o in odds.values()) < len(odds)
    for qid, o in odds.items():
        best_text = next((e["text"] for e in nbest[qid] if e["start"] >= 0), "")
        assert thresholded[qid] == ("" if o > threshold else best_text), qid
    expected = [official_question_scores(thresholded[qid], golds[qid], "v2") for qid in golds]
    assert scores["exact"] == pytest.approx(100 * sum(e for e, _ in expected) / len(expected))
    assert scores["f1"] == pytest.approx(100 * sum(f for _, f in expected) / len(expected))

    # --max-answer-length 1: every candidate is one WordPiece token, so one word
    assert any(" " in e["text"] for entries in nbest.values() for e in entries)  # the limit has work to do
    _, _, short_nbest, _ = _predict(save, tmp_path / "short", "--max-answer-length", "1")
    assert any(e["text"] for entries in short_nbest.values() for e in entries)
    assert all(" " not in e["text"] for entries in short_nbest.values() for e in entries)

    # --n-best 1: the top start and end rarely make a span; a question left with no span at all gets the
    # largest finite float as its null odds (the official script reads no Infinity) and the answer ""
    top, top_odds, top_nbest, _ = _predict(save, tmp_path / "top1", "--n-best", "1")
    no_span = [qid for qid, entries in top_nbest.items() if all(e["start"] < 0 for e in entries)]
    assert no_span
    for qid in no_span:
        assert top_odds[qid] == sys.float_info.max and top[qid] == ""
    assert all(abs(o) < 1e6 for qid, o in top_odds.items() if qid not in no_span)


def test_squad2_rules_windows_and_validated_threshold_survive_a_huggingface_round_trip(squad2_run, tmp_path):
    """BertForQuestionAnswering holds the logits only: qa_settings.json beside the export carries how the model
    answers, so the imported checkpoint answers as the exported one did, and its export writes the same file."""
    from spanbert_plugin.model.spanbert import SpanBertModel

    data, save, _ = squad2_run
    checkpoint = os.path.join(save, "checkpoint_last.pt")
    run_cli([bin_path("spanbert-export-hf"), "--checkpoint", checkpoint, "--out", str(tmp_path / "hf")])
    settings = json.loads((tmp_path / "hf" / "qa_settings.json").read_text())
    original = SpanBertModel.from_pretrained(save, "checkpoint_last.pt")
    assert settings["with_negative"] is True and settings["validated_null_threshold"] is not None
    assert (settings["max_seq_length"], settings["doc_stride"], settings["max_query_length"]) == (64, 24, 16)
    assert settings["validated_null_threshold"] == original.task.validated_null_threshold()

    imported_report = run_cli([bin_path("spanbert-import-hf"), "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "imported")])
    assert "SQuAD 2.0 rules and windows of 64 from qa_settings.json" in imported_report.stdout
    imported = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    # a context longer than one 64-token window, questions answerable and not
    context = " ".join(json.loads(line) for line in open(os.path.join(data, "valid.contexts.jsonl")))[:600]
    for question in ("Where does Ada live ?", "Where does Kira live ?", "Where does Lev live ?"):
        for options in ({}, {"null_threshold": "validation"}, {"null_threshold": -1.0, "topk": 3}):
            theirs = imported.answer(question, context, **options)
            ours = original.answer(question, context, **options)
            assert [(a["start"], a["end"], a["text"]) for a in theirs] == [(a["start"], a["end"], a["text"]) for a in ours]
            assert [a["score"] for a in theirs] == pytest.approx([a["score"] for a in ours], abs=1e-4)
    assert any(a["start"] < 0 for a in original.answer("Where does Kira live ?", context, topk=20))  # the null competes

    run_cli([bin_path("spanbert-export-hf"), "--checkpoint", str(tmp_path / "imported" / "model.pt"), "--out", str(tmp_path / "again")])
    assert json.loads((tmp_path / "again" / "qa_settings.json").read_text()) == settings

    # a damaged file, or settings without the head they describe: one line naming the file
    (tmp_path / "hf" / "qa_settings.json").write_text(json.dumps({**settings, "doc_stride": 0}))
    failed = run_cli([bin_path("spanbert-import-hf"), "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "bad")], check=False)
    assert failed.returncode == 1 and "qa_settings.json: doc_stride must be a positive integer" in failed.stderr
    assert not (tmp_path / "bad").exists()
    (tmp_path / "hf" / "qa_settings.json").write_text(json.dumps({**settings, "max_seq_length": 4096}))
    failed = run_cli([bin_path("spanbert-import-hf"), "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "bad")], check=False)
    assert failed.returncode == 1 and "qa_settings.json: max_seq_length 4096 exceeds the model's 128 positions" in failed.stderr


@pytest.mark.parametrize("windows, message", [
    ({"max_seq_length": 64, "doc_stride": 1, "max_query_length": 62}, "--max-seq-length 64 must be above"),
    ({"max_seq_length": 64, "doc_stride": 60, "max_query_length": 16}, "--doc-stride must be between 1 and 45"),
])
def test_qa_settings_whose_windows_hold_no_passage_or_skip_tokens_are_one_line(tmp_path, windows, message):
    """The windows of qa_settings.json obey what spanbert-prepare-qa asks of its options: a question of 62 tokens
    in 64 leaves no passage token, a stride of 60 past 45 passage tokens skips some."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.qa.hf_settings import read_qa_settings

    path = tmp_path / "qa_settings.json"
    path.write_text(json.dumps({**windows, "n_best": 20, "max_answer_length": 30, "with_negative": False,
                                "null_threshold": 0.0, "validated_null_threshold": None}))
    with pytest.raises(UsageError, match=f"^{path}: {message}"):
        read_qa_settings(str(path))

def test_question_with_more_windows_than_a_batch_stays_whole():
    from spanbert_plugin.qa.dataset import question_batches

    rng = np.random.default_rng(0)
    windows_per_question = np.array([2, 7, 1, 3, 5, 1, 4, 2])
    question_index = np.repeat(np.arange(len(windows_per_question)), windows_per_question)
    sizes = rng.integers(10, 64, len(question_index))
    for limits in ({"max_sentences": 4}, {"max_tokens": 4 * 64}, {"max_sentences": 3, "max_tokens": 200}):
        indices = rng.permutation(len(question_index))
        batches = question_batches(question_index, sizes, indices, **limits)
        assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(len(question_index)))  # each window once
        owner = {}
        for b, batch in enumerate(batches):
            questions = np.unique(question_index[batch])
            for q in questions:
                assert q not in owner, (limits, q)  # all windows of a question in one batch
                owner[q] = b
            fits = len(batch) <= limits.get("max_sentences", len(batch)) and \
                len(batch) * sizes[batch].max() <= limits.get("max_tokens", np.inf)
            # only a question too big for any batch may break the limits, and then it is alone
            assert fits or len(questions) == 1, (limits, batch)
        oversize = [q for q, n in enumerate(windows_per_question)
                    if n > limits.get("max_sentences", n) or n * sizes[question_index == q].max() > limits.get("max_tokens", np.inf)]
        assert oversize and all(len(np.unique(question_index[batches[owner[q]]])) == 1 for q in oversize)



def test_question_batches_are_filled_up_to_the_limits():
    """Whole questions go into a batch while it stays within the limits, up to them exactly: ten one-window
    questions of 10 tokens under --max-tokens 40 are batches of 4, 4 and 2; questions of 1, 2, 1, 3, 1 windows under
    --batch-size 3 are batches of 3 (1 + 2), 1, 3 and 1 windows."""
    from spanbert_plugin.qa.dataset import question_batches

    batches = question_batches(np.arange(10), np.full(10, 10), np.arange(10), max_tokens=40)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    question_index = np.repeat(np.arange(5), [1, 2, 1, 3, 1])
    batches = question_batches(question_index, np.full(8, 10), np.arange(8), max_sentences=3)
    assert [b.tolist() for b in batches] == [[0, 1, 2], [3], [4, 5, 6], [7]]
    assert question_batches(question_index, np.full(8, 10), [], max_sentences=3) == []  # no window: no batch

def test_training_batches_hold_every_window_and_a_small_max_tokens_is_one_line(qa_data):
    """Training batches go through fairseq's batching plus its dropped tail (the shared helper): a --max-tokens below
    the longest window was fairseq's AssertionError traceback."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.qa.task import ExtractiveQAConfig, ExtractiveQATask

    task = ExtractiveQATask.setup_task(ExtractiveQAConfig(data=qa_data, seed=1))
    task.load_dataset("train")
    dataset = task.datasets["train"]
    indices = dataset.ordered_indices()
    batches = dataset.batch_by_size(indices, max_sentences=7, required_batch_size_multiple=8)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(dataset)))
    with pytest.raises(UsageError, match="--max-tokens 3: an example is longer"):
        dataset.batch_by_size(indices, max_tokens=3)


def test_hub_answer(qa_run):
    from spanbert_plugin.model.spanbert import SpanBertModel

    save, _ = qa_run
    hub = SpanBertModel.from_pretrained(save, "checkpoint_best.pt")
    # long enough for several 64-token windows: the answer sits in a late one
    context = "the value of the list is returned . " * 20 + "Dora lives in Perth . We flew over Oslo today ."
    answers = hub.answer("Where does Dora live ?", context, topk=3)
    assert len(answers) == 3
    best = answers[0]
    assert context[best["start"]:best["end"]] == best["text"]
    assert best["score"] >= answers[1]["score"] and 0 < best["probability"] <= 1
    assert best["text"] == "Perth"
    with pytest.raises(ValueError, match="non-empty context"):
        hub.answer("Where does Dora live ?", "   ")
    # zero-width and control characters pass strip() but leave no token: no made-up empty answer
    with pytest.raises(ValueError, match="the context .* has no token"):
        hub.answer("Where does Dora live ?", "\u200b\u200b")
    with pytest.raises(ValueError, match="the question .* has no token"):
        hub.answer("\u200b", context)
    with pytest.raises(TypeError, match="hub.answer: question must be a string, got list; one text a call"):
        hub.answer(["Where does Dora live ?"], context)
    for name, value in (("topk", 2.5), ("n_best", 0), ("max_answer_length", None)):
        with pytest.raises(ValueError, match=f"hub.answer: {name} must be an integer of at least 1, got {value!r}"):
            hub.answer("Where does Dora live ?", context, **{name: value})
    with pytest.raises(ValueError, match="hub.answer: null_threshold must be a number or 'validation', got 'high'"):
        hub.answer("Where does Dora live ?", context, null_threshold="high")
    # a SQuAD 1.1 model never answers with the empty answer: a threshold given is said to do nothing
    with pytest.warns(UserWarning, match="null_threshold has no effect"):
        assert hub.answer("Where does Dora live ?", context, null_threshold=-100)[0]["text"] == "Perth"


def test_hub_counts_and_thresholds_computed_with_numpy_are_taken():
    """topk=np.int64(3) or null_threshold=np.float32(-1.5) (from an array of scores, say) worked before the hub
    methods checked their arguments; they are numbers, given on as Python's."""
    from spanbert_plugin.model.hub_interface import check_count
    from spanbert_plugin.qa.answer import check_null_threshold

    assert check_count("answer", "topk", np.int64(3)) == 3 and type(check_count("answer", "topk", np.int32(3))) is int
    assert check_null_threshold(np.float32(-1.5)) == -1.5 and check_null_threshold(np.int64(2)) == 2.0
    for value in (True, np.float64(2.0), np.int64(0)):
        with pytest.raises(ValueError, match="hub.answer: topk must be an integer of at least 1"):
            check_count("answer", "topk", value)
    for value in (np.float32("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="hub.answer: null_threshold must be a number or 'validation'"):
            check_null_threshold(value)

def test_hub_answer_knows_unanswerable_data_without_a_validation_split():
    """A data folder without a valid split: SQuAD 2.0 rules come from the formats qa_config.json records."""
    from spanbert_plugin.qa.answer import trained_with_negative

    class Task:
        def __init__(self, formats):
            self.qa_config = {"splits": {f"split{i}": {"format": f} for i, f in enumerate(formats)}}

        def qa_split(self, split):
            raise FileNotFoundError(split)

    assert trained_with_negative(Task(["squad2"])) and trained_with_negative(Task(["squad1", "squad2"]))
    assert not trained_with_negative(Task(["squad1"])) and not trained_with_negative(Task(["mrqa"]))


def test_the_qa_loss_is_the_mean_of_the_start_and_end_cross_entropies():
    """BERT's span loss, (CE(start) + CE(end)) / 2, summed over windows: at uniform logits over 8 positions, and 6
    in a window with 2 of padding (never a candidate), ln 8 + ln 6."""
    import math

    import torch

    from spanbert_plugin.qa.criterion import ExtractiveQACriterion

    class UniformLogits(torch.nn.Module):
        encoder = SimpleNamespace(padding_idx=1)

        def forward(self, src_tokens, qa=True):
            return (torch.zeros(src_tokens.shape), torch.zeros(src_tokens.shape)), None

    tokens = torch.full((2, 8), 5)
    tokens[1, 6:] = 1
    sample = {"net_input": {"src_tokens": tokens}, "start_positions": torch.tensor([1, 2]),
              "end_positions": torch.tensor([3, 4]), "nsentences": 2, "ntokens": 14}
    loss, sample_size, _ = ExtractiveQACriterion(None)(UniformLogits().train(), sample)
    assert sample_size == 2 and loss.item() == pytest.approx(math.log(8) + math.log(6), rel=1e-6)


def test_near_ties_measure_the_null_odds_from_the_threshold():
    from spanbert_plugin.qa.predict import near_ties

    clear_lead = [{"start": 0, "start_logit": 9.0, "end_logit": 9.0}, {"start": 3, "start_logit": 1.0, "end_logit": 1.0}]
    result = SimpleNamespace(question_indices=np.array([0, 1, 2]), ids=["q0", "q1", "q2"],
                             null_odds={"q0": 5.05, "q1": 0.05, "q2": 7.0}, nbest={q: clear_lead for q in ("q0", "q1", "q2")})
    # |5.05 - 5| < 0.1 only for q0; q1's odds are near 0, not near the threshold
    assert near_ties(result, 0.1, null_threshold=5.0).tolist() == [0]


def qa_setup(data, *extra):
    """The run config and the task fairseq-train would build from these arguments (in-process)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import spanbert_plugin.registry  # noqa: F401  (the plugin's task, criterion and models)

    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--task", "extractive_qa", "--criterion", "extractive_qa", "--arch", "spanbert_tiny",
        "--encoder-layers", "1", "--cpu", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    return cfg, tasks.setup_task(cfg.task)


@pytest.mark.parametrize("extra,message", [
    (["--arch", "roberta", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2"],
     "extractive_qa needs a spanbert model (--arch spanbert_*), got RobertaModel"),
    (["--max-positions", "32"],
     "{data}: windows of up to 64 tokens exceed the model's 32 positions; prepare the data again with a smaller "
     "--max-seq-length"),
])
def test_a_model_that_is_not_spanbert_or_shorter_than_the_windows_is_one_line(qa_data, extra, message):
    from spanbert_plugin.core.errors import UsageError

    cfg, task = qa_setup(qa_data, *extra)
    with pytest.raises(UsageError) as caught:
        task.build_model(cfg.model)
    assert str(caught.value) == message.format(data=qa_data)


@pytest.mark.parametrize("flag,value", [("--n-best", "0"), ("--max-answer-length", "-1")])
def test_answer_options_that_allow_no_answer_are_refused_before_training(qa_data, flag, value):
    """--n-best 0 or --max-answer-length below 1 left no answer to validate: accepted, they failed at the first
    validation, after a whole epoch of training, with postprocess's ValueError traceback."""
    from spanbert_plugin.core.errors import UsageError

    cfg, task = qa_setup(qa_data, flag, value)
    with pytest.raises(UsageError) as caught:
        task.build_criterion(cfg.criterion)
    assert str(caught.value) == f"{flag} must be at least 1, got {value}"
    cfg, task = qa_setup(qa_data, "--n-best", "1", "--max-answer-length", "1")
    criterion = task.build_criterion(cfg.criterion)
    assert (criterion.n_best, criterion.max_answer_length) == (1, 1)


def test_a_split_whose_token_files_are_missing_or_from_another_preparation_is_one_line(qa_data, tmp_path):
    """valid.bin/.idx gone, or train.bin/.idx copied from the valid split: under fairseq-train these were a
    FileNotFoundError and a ValueError traceback; now one line naming the files."""
    import shutil

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.qa.task import ExtractiveQAConfig, ExtractiveQATask

    data = tmp_path / "data"
    shutil.copytree(qa_data, data)
    os.remove(data / "valid.bin")
    for suffix in (".bin", ".idx"):
        shutil.copyfile(os.path.join(qa_data, "valid" + suffix), data / f"train{suffix}")
    task = ExtractiveQATask.setup_task(ExtractiveQAConfig(data=str(data), seed=1))
    with pytest.raises(UsageError) as caught:
        task.load_dataset("valid")
    assert str(caught.value) == (f"{data / 'valid'}.bin/.idx: no such file (split 'valid' has its windows.npz); copy "
                                 "the split's .bin and .idx too, or prepare the folder again")
    windows = {split: json.load(open(os.path.join(qa_data, "prepare_stats.json")))[split]["windows"]
               for split in ("train", "valid")}
    with pytest.raises(UsageError) as caught:
        task.load_dataset("train")
    assert str(caught.value) == (f"{data / 'train'}.bin/.idx: {windows['valid']} windows, but {data / 'train'}."
                                 f"windows.npz describes {windows['train']}: the files come from different "
                                 "preparations; prepare the folder again")


def test_windows_longer_than_max_tokens_name_max_tokens(qa_data):
    """fairseq bounds the training windows by --max-tokens too (the least of it and the model's positions): the
    error named the model's positions (128 here) as 40 and asked for a smaller --max-seq-length."""
    from fairseq import utils

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.qa.task import ExtractiveQAConfig, ExtractiveQATask

    task = ExtractiveQATask.setup_task(ExtractiveQAConfig(data=qa_data, seed=1))
    task.load_dataset("train")
    dataset = task.datasets["train"]
    assert (dataset.sizes > 40).any() and dataset.sizes.max() == 64
    with pytest.raises(UsageError) as caught:  # as fairseq's Trainer.get_train_iterator asks for the batches
        task.get_batch_iterator(dataset, max_tokens=40, max_positions=utils.resolve_max_positions(
            task.max_positions(), 128, 40), disable_iterator_cache=True)
    assert str(caught.value) == ("--max-tokens 40: an example is longer, and a batch holds whole examples; give at "
                                 "least the longest example's length, or leave --max-tokens out")
    batches = task.get_batch_iterator(dataset, max_tokens=64, max_positions=utils.resolve_max_positions(
        task.max_positions(), 128, 64), disable_iterator_cache=True).next_epoch_itr(shuffle=False)
    assert sum(len(batch["id"]) for batch in batches) == len(dataset)  # the longest window's length is enough


@pytest.mark.parametrize("edit,message", [
    (lambda s: [1, 2], "expected a JSON object, found list"),
    (lambda s: {**s, "with_negative": "yes"}, "with_negative must be true or false, found 'yes'"),
    (lambda s: {**s, "null_threshold": None}, "null_threshold must be a number, found None"),
    (lambda s: {**s, "null_threshold": True}, "null_threshold must be a number, found True"),
    (lambda s: {**s, "validated_null_threshold": "0.5"}, "validated_null_threshold must be a number or null, found '0.5'"),
])
def test_qa_settings_with_a_value_of_the_wrong_kind_are_one_line(tmp_path, edit, message):
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.qa.hf_settings import read_qa_settings

    settings = {"max_seq_length": 64, "doc_stride": 16, "max_query_length": 16, "n_best": 20, "max_answer_length": 30,
                "with_negative": True, "null_threshold": 0.0, "validated_null_threshold": -1.5}
    path = tmp_path / "qa_settings.json"
    path.write_text(json.dumps(settings))
    assert read_qa_settings(str(path)) == settings
    path.write_text(json.dumps(edit(settings)))
    with pytest.raises(UsageError) as caught:
        read_qa_settings(str(path))
    assert str(caught.value) == f"{path}: {message}"


def test_hub_answer_refusals_that_need_no_model():
    """A blank question, a checkpoint without a QA head, and null_threshold='validation' on an imported checkpoint
    whose export recorded no validated threshold: each a ValueError saying so."""
    from spanbert_plugin.qa.answer import answer_question, hub_answer

    with pytest.raises(ValueError, match="^answer\\(\\) needs a non-empty question$"):
        answer_question(None, None, None, " \n", "Dora lives in Perth .")
    with pytest.raises(ValueError, match="^this checkpoint has no QA head; fine-tune it with --task extractive_qa "
                                         "first$"):
        hub_answer(SimpleNamespace(model=SimpleNamespace()), "Where does Dora live ?", "Dora lives in Perth .")
    recorded = {"max_seq_length": 64, "doc_stride": 16, "max_query_length": 16, "n_best": 20, "max_answer_length": 30,
                "with_negative": True, "null_threshold": 0.0, "validated_null_threshold": None}
    hub = SimpleNamespace(model=SimpleNamespace(qa_outputs=object()),
                          task=SimpleNamespace(state=SimpleNamespace(state_dict={"qa_settings": recorded})))
    with pytest.raises(ValueError, match="^null_threshold='validation': this checkpoint holds no validated threshold"):
        hub_answer(hub, "Where does Dora live ?", "Dora lives in Perth .", null_threshold="validation")
