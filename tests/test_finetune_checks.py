"""Fine-tuning safeguards: vocabulary checks on loading, scores that agree with predictions, resumable randomness."""
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import tiny_spanbert
from spanbert_plugin.core.dictionary import SpanBertDictionary
from spanbert_plugin.core.errors import UsageError


# --- checkpoint vocabulary against the data's dict.txt -------------------------------------------------------------

def test_checkpoint_from_another_tokenizer_is_refused_naming_both(spm_data, wordpiece_data):
    """A sentencepiece checkpoint over WordPiece data (more symbols): one line naming both tokenizers and files."""
    spm_dict = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    wp_dict = SpanBertDictionary.load(os.path.join(wordpiece_data, "dict.txt"))
    assert len(wp_dict) > len(spm_dict)
    with pytest.raises(UsageError) as err:
        tiny_spanbert(wp_dict).load_state_dict(tiny_spanbert(spm_dict).state_dict())
    message = str(err.value)
    assert "\n" not in message and "does not start with the checkpoint's vocabulary" in message
    assert f"sentencepiece ({os.path.join(spm_data, 'spm.model')}); {len(spm_dict)} symbols" in message
    assert f"wordpiece ({os.path.join(wordpiece_data, 'vocab.txt')}); {len(wp_dict)} symbols" in message


def test_same_size_vocabulary_with_other_symbols_is_refused(spm_data):
    """Equal sizes are not enough: two symbols swapped is another vocabulary."""
    symbols = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt")).symbols
    swapped = list(symbols)
    swapped[10], swapped[11] = swapped[11], swapped[10]
    with pytest.raises(UsageError, match="symbol 10 is"):
        tiny_spanbert(SpanBertDictionary(swapped)).load_state_dict(tiny_spanbert(SpanBertDictionary(symbols)).state_dict())


def test_appended_symbols_grow_and_the_record_follows(spm_data):
    """Symbols appended (entity markers) extend the checkpoint's vocabulary; the new model records the grown one."""
    symbols = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt")).symbols
    grown = SpanBertDictionary(symbols + ["[SUBJ-PERSON]", "[OBJ-CITY]"])
    model = tiny_spanbert(grown)
    model.load_state_dict(tiny_spanbert(SpanBertDictionary(symbols)).state_dict())
    assert model.vocabulary.symbol_hashes.shape == (len(grown),)
    assert model.encoder.embeddings.word_embeddings.weight.shape[0] == len(grown)
    # the grown checkpoint loads into a model over the same dictionary, and refuses the shorter one
    tiny_spanbert(grown).load_state_dict(model.state_dict())
    with pytest.raises(UsageError, match=f"has {len(grown)} symbols but the data's dict.txt has {len(symbols)}: "
                                         "the checkpoint was trained with"):
        tiny_spanbert(SpanBertDictionary(symbols)).load_state_dict(model.state_dict())


def test_checkpoint_without_vocabulary_record_is_checked_by_size(spm_data, wordpiece_data):
    """Checkpoints written before the record: a larger data vocabulary still loads (grown), a smaller one is refused."""
    spm_dict = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    wp_dict = SpanBertDictionary.load(os.path.join(wordpiece_data, "dict.txt"))
    old_style = {k: v for k, v in tiny_spanbert(spm_dict).state_dict().items() if not k.startswith("vocabulary.")}
    model = tiny_spanbert(wp_dict)
    model.load_state_dict(dict(old_style))
    assert torch.equal(model.encoder.embeddings.word_embeddings.weight[: len(spm_dict)],
                       old_style["encoder.embeddings.word_embeddings.weight"])
    smaller = SpanBertDictionary(spm_dict.symbols[:-5])
    with pytest.raises(UsageError, match=f"has {len(spm_dict)} symbols but the data's dict.txt has {len(smaller)}"):
        tiny_spanbert(smaller).load_state_dict(dict(old_style))


def test_finetune_from_a_checkpoint_of_another_tokenizer_stops_fairseq_train(spm_data, wordpiece_data, tmp_path):
    """fairseq-train --finetune-from-model: one line naming both tokenizers, exit status 1, before any update."""
    from conftest import bin_path, run_cli

    tiny = ["--user-dir", "user_dir", "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch",
            "spanbert_tiny", "--encoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
            "--encoder-attention-heads", "2", "--tokens-per-sample", "64", "--batch-size", "8", "--optimizer", "adam",
            "--lr", "1e-3", "--cpu", "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints"]
    run_cli([bin_path("fairseq-train"), spm_data, *tiny, "--max-update", "1", "--save-dir", str(tmp_path / "spm_ck")])
    proc = run_cli([bin_path("fairseq-train"), wordpiece_data, *tiny, "--max-update", "1",
                    "--save-dir", str(tmp_path / "wp_ck"),
                    "--finetune-from-model", str(tmp_path / "spm_ck" / "checkpoint_last.pt")], check=False)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-3000:]
    assert f"sentencepiece ({os.path.join(spm_data, 'spm.model')})" in errors[0]
    assert f"wordpiece ({os.path.join(wordpiece_data, 'vocab.txt')})" in errors[0]
    assert not (tmp_path / "wp_ck" / "checkpoint_last.pt").exists()


# --- SQuAD 2.0: eval.json and validation score the predictions as written ------------------------------------------

def _answerable_random_split(seed):
    """random_split's questions, every other one given gold answers from its passage that keep a word when normalised.

    (A gold answer of only articles and punctuation is where the official script's null override, which counts a
    HasAns question wrong, and scoring "" against gold "" part ways; the script's rule is followed: see the next test.)
    """
    from test_qa_postprocess import random_split

    from spanbert_plugin.qa.squad_metrics import normalize_answer

    rng = np.random.default_rng(seed)
    split = random_split(rng, num_questions=40, with_negative=True)
    for i, question in enumerate(split.questions):
        words = [w for w in split.contexts[question["context_index"]].split() if normalize_answer(w)]
        if i % 2 and words:
            question["answers"] = words[:2]
    return split, rng


@pytest.mark.parametrize("null_threshold", [-1.0, 0.0, 1.0, 100.0])
def test_squad2_scores_agree_with_written_predictions(null_threshold):
    """exact/f1/HasAns/NoAns (eval.json) and em/f1 (validation) score the predictions as written; best_* unchanged."""
    from spanbert_plugin.qa.squad_metrics import evaluate
    from spanbert_plugin.qa.scoring import AnswerOptions, score_windows, summarize

    split, rng = _answerable_random_split(7)
    width = int((split.passage_offset + split.passage_lengths()).max()) + 4
    start, end = rng.normal(size=(2, split.num_windows, width)) * 3
    start[:, 0] += 4  # [CLS] logits raised: null odds spread around 0..10, so the thresholds matter
    end[:, 0] += 4
    result, records = score_windows(split, np.arange(split.num_windows), start, end,
                                    AnswerOptions(null_threshold=null_threshold))
    predictions = {q["id"]: result.predictions[q["id"]] for q in split.questions}
    as_written = evaluate(split.questions, predictions, rules="v2")  # no null-odds file: the texts alone
    with_odds = evaluate(split.questions, predictions, na_probs=result.null_odds, na_prob_thresh=null_threshold,
                         rules="v2")
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert with_odds[key] == pytest.approx(as_written[key]), key
    summary = summarize(records, with_negative=True)
    assert summary["em"] == pytest.approx(as_written["exact"]) and summary["f1"] == pytest.approx(as_written["f1"])
    assert summary["has_ans_f1"] == pytest.approx(as_written["HasAns_f1"])
    assert summary["no_ans_f1"] == pytest.approx(as_written["NoAns_f1"])
    # the threshold search is over the null odds, whatever threshold the predictions used
    default = evaluate(split.questions, predictions, na_probs=result.null_odds, rules="v2")
    assert with_odds["best_f1"] == default["best_f1"] and summary["best_f1"] == pytest.approx(default["best_f1"])
    if null_threshold == 100.0:  # every question answered with text: an unanswerable one scores only if it normalises to ""
        from spanbert_plugin.qa.squad_metrics import normalize_answer

        assert all(predictions.values())
        no_answer = [q["id"] for q in split.questions if not q["answers"]]
        empty = sum(not normalize_answer(predictions[i]) for i in no_answer)
        assert with_odds["NoAns_exact"] == pytest.approx(100 * empty / len(no_answer)) and empty < len(no_answer)
        assert default["exact"] != with_odds["exact"]  # the official script's default -t 1.0 disagreed with the texts
    assert 0 < np.count_nonzero(records[:, 6]) < len(records) or null_threshold == 100.0


def test_a_question_whose_null_odds_equal_the_threshold_keeps_its_answer():
    """The v2.0 script's override is null_odds > threshold: at a threshold equal to a question's null odds it keeps
    its text answer and its record does not count it as answered "no answer"; just below, it does."""
    from spanbert_plugin.qa.scoring import RECORD_FIELDS, AnswerOptions, score_windows

    split, rng = _answerable_random_split(7)
    width = int((split.passage_offset + split.passage_lengths()).max()) + 4
    start, end = rng.normal(size=(2, split.num_windows, width)) * 3
    windows = np.arange(split.num_windows)
    result, _ = score_windows(split, windows, start, end, AnswerOptions())
    says_null = RECORD_FIELDS.index("says_null")
    checked = 0
    for q, question in enumerate(split.questions[:10]):
        odds = result.null_odds[question["id"]]
        at, records = score_windows(split, windows, start, end, AnswerOptions(null_threshold=odds))
        if at.predictions[question["id"]] == "":  # no text answer at all: nothing to keep
            continue
        assert records[records[:, 0] == q][0, says_null] == 0
        below, records = score_windows(split, windows, start, end,
                                       AnswerOptions(null_threshold=float(np.nextafter(odds, -np.inf))))
        assert below.predictions[question["id"]] == "" and records[records[:, 0] == q][0, says_null] == 1
        checked += 1
    assert checked > 0


def test_best_threshold_search_runs_in_question_order_whatever_the_records_order():
    """Two questions of equal null odds, 0 (no answer, answered with text) and 1 (answered right): the official
    search lowers the bar question by question in question order, so 0's -1 comes first and the best stays the
    start (50%); records arriving in another order (batches from several workers) score the same."""
    from spanbert_plugin.qa.scoring import summarize

    # question, exact, f1, has_answer, null_odds, nonempty, says_null
    q0 = [0, 0.0, 0.0, 0, 0.5, 1, 0]
    q1 = [1, 1.0, 1.0, 1, 0.5, 1, 0]
    in_order = summarize(np.array([q0, q1]), with_negative=True)
    assert in_order["best_f1"] == pytest.approx(50.0) and in_order["best_f1_thresh"] == 0.0
    assert summarize(np.array([q1, q0]), with_negative=True) == in_order


def test_squad2_summary_of_only_answerable_or_only_unanswerable_questions():
    """A SQuAD 2.0 validation that scored only answerable (or only unanswerable) questions, as --max-valid-steps
    can: the missing group's f1 is left out (not a mean of nothing) and the threshold search still runs."""
    from spanbert_plugin.qa.scoring import summarize

    # question, exact, f1, has_answer, null_odds, nonempty, says_null
    answerable = np.array([[0, 1.0, 1.0, 1, 2.0, 1, 0],
                           [1, 0.0, 0.5, 1, 3.0, 1, 1]])  # said "no answer" at the threshold: scores 0
    out = summarize(answerable, with_negative=True)
    assert set(out) == {"em", "f1", "has_ans_f1", "best_f1", "best_f1_thresh"}
    assert out["em"] == pytest.approx(50.0) and out["f1"] == pytest.approx(50.0)
    assert out["has_ans_f1"] == pytest.approx(50.0)
    # answering both (threshold 3.0) gains 1 + 0.5 of 2 questions
    assert (out["best_f1"], out["best_f1_thresh"]) == (pytest.approx(75.0), 3.0)

    unanswerable = np.array([[0, 0.0, 0.0, 0, 1.0, 1, 0],   # answered with text: wrong
                             [1, 0.0, 0.0, 0, 5.0, 1, 1]])  # said "no answer": right
    out = summarize(unanswerable, with_negative=True)
    assert set(out) == {"em", "f1", "no_ans_f1", "best_f1", "best_f1_thresh"}
    assert out["em"] == pytest.approx(50.0) and out["no_ans_f1"] == pytest.approx(50.0)
    # answering any question only loses: "no answer" everywhere (threshold 0.0) scores both
    assert (out["best_f1"], out["best_f1_thresh"]) == (pytest.approx(100.0), 0.0)


def test_a_validation_that_scored_no_question_logs_nan():
    """No record (a validation of no step): the summary is empty and every QA metric logs nan, not 0."""
    from spanbert_plugin.qa.criterion import _summary_value
    from spanbert_plugin.qa.scoring import RECORD_FIELDS, summarize

    assert summarize(np.zeros((0, len(RECORD_FIELDS))), with_negative=True) == {}
    meters = {"_qa_records": SimpleNamespace(sum=torch.zeros(len(RECORD_FIELDS), 3, dtype=torch.float64))}
    for key in ("em", "f1", "best_f1"):
        assert np.isnan(_summary_value(meters, key, True))


def test_null_override_follows_the_official_script_for_empty_normalising_golds():
    """Official v2.0: a HasAns question scored as "no answer" (na_prob > -t) counts 0, even when its golds normalise to ""."""
    from spanbert_plugin.qa.squad_metrics import evaluate

    questions = [{"id": "a", "answers": ["the"]}, {"id": "b", "answers": []}]
    predictions = {"a": "", "b": ""}
    as_null = evaluate(questions, predictions, na_probs={"a": 5.0, "b": 5.0}, na_prob_thresh=1.0, rules="v2")
    assert as_null["HasAns_exact"] == 0.0 and as_null["NoAns_exact"] == 100.0
    as_text = evaluate(questions, predictions, na_probs={"a": 0.0, "b": 0.0}, na_prob_thresh=1.0, rules="v2")
    assert as_text["HasAns_exact"] == 100.0  # "" against the gold "" left after dropping "the"


# --- is_impossible as the official v2.0 script reads it ----------------------------------------------------------

def _squad_file(path, qas, version=None):
    import json

    content = {"data": [{"title": "t", "paragraphs": [{"context": "Ada lives in Paris with her cat.", "qas": qas}]}]}
    if version:
        content["version"] = version
    path.write_text(json.dumps(content), encoding="utf-8")
    return str(path)


def test_is_impossible_with_answers_is_answerable(tmp_path):
    """The answers decide, as the official v2.0 script's has_ans: is_impossible true with answers is answerable."""
    from spanbert_plugin.qa.squad_metrics import evaluate
    from spanbert_plugin.qa.prepare import read_qa_file

    qa = read_qa_file(_squad_file(tmp_path / "v2.json", [
        {"id": "contradictory", "question": "Where?", "is_impossible": True,
         "answers": [{"text": "Paris", "answer_start": 13}]},
        {"id": "unanswerable", "question": "Why?", "is_impossible": True, "answers": []},
    ], version="v2.0"))
    assert qa.with_negative and qa.format == "squad2"
    by_id = {q["id"]: q for q in qa.questions}
    assert by_id["contradictory"]["answers"] == ["Paris"] and not by_id["contradictory"]["is_impossible"]
    assert by_id["unanswerable"]["is_impossible"] and by_id["unanswerable"]["answers"] == []
    assert (qa.answer_start[0], qa.answer_end[0]) == (13, 18)  # trained towards its answer, not [CLS]
    scores = evaluate(qa.questions, {"contradictory": "Paris", "unanswerable": ""}, rules="v2")
    assert scores["HasAns_total"] == 1 and scores["exact"] == 100.0


def test_squad11_file_with_is_impossible_keys_keeps_v1_rules(tmp_path):
    """is_impossible keys alone (every question answered) do not switch a SQuAD 1.1 file to 2.0 rules."""
    from spanbert_plugin.qa.prepare import read_qa_file
    from spanbert_plugin.qa.scoring import rules_of

    qa = read_qa_file(_squad_file(tmp_path / "v1.json", [
        {"id": "a", "question": "Where?", "is_impossible": False, "answers": [{"text": "Paris", "answer_start": 13}]},
        {"id": "b", "question": "Who?", "is_impossible": True, "answers": [{"text": "Ada", "answer_start": 0}]},
    ], version="1.1"))
    assert not qa.with_negative and qa.format == "squad1" and rules_of(qa) == "v1"
    assert all(q["answers"] for q in qa.questions)
    # a file without a version holding an unanswerable question follows 2.0 rules
    qa = read_qa_file(_squad_file(tmp_path / "noversion.json", [
        {"id": "c", "question": "Why?", "is_impossible": True, "answers": []}]))
    assert qa.with_negative and rules_of(qa) == "v2"


# --- relation extraction: the TACRED scorer's definitions; a negative label that exists -------------------------------

def _tacred_score(predicted, gold, negative):
    """The TACRED scorer's micro P/R/F1 (Zhang et al. 2017), written as its per-relation loops, in percent."""
    from collections import Counter

    correct, guessed, gold_count = Counter(), Counter(), Counter()
    for p, g in zip(predicted, gold):
        if g == negative and p == negative:
            continue
        if g == negative:
            guessed[p] += 1
        elif p == negative:
            gold_count[g] += 1
        else:
            guessed[p] += 1
            gold_count[g] += 1
            if p == g:
                correct[p] += 1
    precision = sum(correct.values()) / sum(guessed.values()) if sum(guessed.values()) > 0 else 1.0
    recall = sum(correct.values()) / sum(gold_count.values()) if sum(gold_count.values()) > 0 else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1}


@pytest.mark.parametrize("case", ["random", "nothing predicted", "no gold positive", "all negative"])
def test_relation_scores_follow_the_tacred_scorer(case):
    from spanbert_plugin.relation.metrics import relation_counts, relation_scores

    rng = np.random.default_rng(3)
    gold, predicted = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    if case in ("nothing predicted", "all negative"):
        predicted[:] = 0
    if case in ("no gold positive", "all negative"):
        gold[:] = 0
    scores = relation_scores(relation_counts(predicted, gold))
    expected = _tacred_score(predicted.tolist(), gold.tolist(), negative=0)
    assert {k: scores[k] for k in expected} == pytest.approx(expected)
    if case == "nothing predicted":
        assert scores["precision"] == 100.0 and scores["recall"] == 0.0 and scores["f1"] == 0.0


def test_negative_label_absent_from_every_split_is_refused(tmp_path, capsys):
    import json

    from test_relation_extraction import BORN, TINY_VOCAB, make_tokenizer_folder

    from spanbert_plugin.cli import prepare_re

    make_tokenizer_folder(str(tmp_path / "tok"), TINY_VOCAB)
    other = dict(BORN, id="other", relation="org:founded_by")
    paths = []
    for name in ("train.json", "valid.json"):
        (tmp_path / name).write_text(json.dumps([BORN, other]))
        paths.append(str(tmp_path / name))
    args = ["--train", paths[0], "--valid", paths[1], "--tokenizer-from", str(tmp_path / "tok"),
            "--destdir", str(tmp_path / "re"), "--negative-label", "Other"]
    assert prepare_re.main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("spanbert-prepare-re: error: --negative-label Other: no example of") and err.count("\n") == 1
    assert not (tmp_path / "re").exists()
    # naming a label the data has works, and that label is index 0
    assert prepare_re.main(args[:-1] + ["org:founded_by"]) == 0, capsys.readouterr().err


# --- relation heads through spanbert-export-hf and spanbert-import-hf ---------------------------------------------

def test_relation_heads_survive_export_and_import(wordpiece_vocab, corpus_files, tmp_path):
    """A checkpoint with relation heads (both poolings) -> export (own files, self-checked) -> import: equal logits."""
    import json

    from test_hf_interop import _export, _import, _sample_lines, random_hf_bert

    from spanbert_plugin.hf.heads import RELATION
    from spanbert_plugin.model.spanbert import SpanBertModel

    random_hf_bert(tmp_path / "hf", wordpiece_vocab)
    _import(tmp_path / "hf", tmp_path / "imported")
    checkpoint = torch.load(tmp_path / "imported" / "model.pt", weights_only=True)
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    torch.manual_seed(5)
    hub.model.register_relation_head("relation_head", 5, "entity_start")
    hub.model.register_relation_head("cls_head", 3, "cls")
    with torch.no_grad():
        for p in hub.model.relation_heads.parameters():
            p.normal_(0, 0.3)  # logits of real size, so the tolerance is a real bound
    hub.model.eval()  # the new heads were created in training mode (dropout)
    checkpoint["model"] = hub.model.state_dict()
    (tmp_path / "re").mkdir()
    torch.save(checkpoint, tmp_path / "re" / "checkpoint_best.pt")

    stdout = _export(tmp_path / "re" / "checkpoint_best.pt", tmp_path / "back", "--data", tmp_path / "imported")
    assert "relation_logits:relation_head" in stdout and "relation_logits:cls_head" in stdout
    config = json.loads((tmp_path / "back" / RELATION.config_file).read_text())
    assert config["heads"]["relation_head"] == {"pooling": "entity_start", "num_classes": 5}
    assert config["heads"]["cls_head"] == {"pooling": "cls", "num_classes": 3}
    assert (tmp_path / "back" / RELATION.weights_file).is_file()

    stdout = _import(tmp_path / "back", tmp_path / "again")
    record = torch.load(tmp_path / "again" / "model.pt", weights_only=True)["model"]["vocabulary.tokenizer"]
    assert bytes(record.tolist()).decode() == f"wordpiece ({tmp_path / 'again' / 'vocab.txt'})"  # not the temporary folder
    assert "relation head relation_head (entity_start pooling, 5 classes" in stdout
    restored = SpanBertModel.from_pretrained(str(tmp_path / "again"), "model.pt")
    tokens = hub.encode(_sample_lines(corpus_files[1], 1)[0])[None, :64]
    positions = torch.tensor([[3, 9]])
    with torch.no_grad():
        for name in ("relation_head", "cls_head"):
            before, _ = hub.model(tokens, relation_head_name=name, entity_positions=positions)
            after, _ = restored.model(tokens, relation_head_name=name, entity_positions=positions)
            assert before.abs().max() > 0.1 and (before - after).abs().max() <= 1e-5, name


# --- SpanDrop draws: a function of (seed, epoch, index), whichever process draws them ---------------------------------

from test_finetune_span_drop import folders  # noqa: E402,F401 - the prepared synthetic folders (a module fixture)

RESUME_RUN = ["--user-dir", "user_dir", "--arch", "spanbert_tiny", "--encoder-layers", "1", "--encoder-embed-dim", "32",
              "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--optimizer", "adam", "--lr", "1e-3",
              "--batch-size", "32", "--cpu", "--seed", "3", "--num-workers", "2", "--span-drop-p", "0.3",
              "--max-epoch", "3", "--no-epoch-checkpoints", "--log-format", "json"]
RESUME_TASKS = {
    "cls": ["--task", "sentence_classification", "--criterion", "sentence_classification", "--max-positions", "64",
            "--span-drop-unit", "word"],
    "qa": ["--task", "extractive_qa", "--criterion", "extractive_qa", "--max-positions", "64",
           "--span-drop-unit", "sentence", "--span-drop-gamma", "1"],
    "find_animals": ["--task", "find_animals", "--criterion", "sentence_prediction", "--train-size", "200",
                     "--test-size", "64", "--seq-len", "30", "--max-positions", "40", "--span-drop-unit", "token"],
    "ner": ["--task", "relation_extraction", "--criterion", "relation_extraction", "--max-positions", "128",
            "--span-drop-unit", "token"],
}


def _toy_span_drop(seed=11):
    from spanbert_plugin.spandrop.sampler import SpanDropDataset

    generator = torch.Generator().manual_seed(0)
    items = [{"source": torch.randint(5, 50, (int(n),), generator=generator)} for n in torch.randint(8, 40, (24,), generator=generator)]
    return SpanDropDataset(items, p=0.3, gamma=1.0, seed=seed)


def _drawn(dataset, epoch, order, num_workers=0):
    """Items of ``dataset`` in ``epoch`` by index, fetched in ``order`` (by DataLoader workers when asked)."""
    dataset.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=[[int(i)] for i in order], num_workers=num_workers,
                                         collate_fn=lambda batch: batch[0])
    return {int(i): item["source"] for i, item in zip(order, loader)}


def test_span_drop_items_depend_on_seed_epoch_index_only():
    """The item drawn at (seed, epoch, index) is the same in any order, in the main process or in workers."""
    order = np.random.default_rng(0).permutation(24)
    reference = _drawn(_toy_span_drop(), 2, range(24))
    for drawn in (_drawn(_toy_span_drop(), 2, order), _drawn(_toy_span_drop(), 2, order[::-1], num_workers=2),
                  _drawn(_toy_span_drop(), 2, list(order) + list(order))):
        assert all(torch.equal(drawn[i], reference[i]) for i in range(24))
    # another epoch or another seed draws other spans (24 items with p = 0.3: equal by chance about never)
    other_epoch, other_seed = _drawn(_toy_span_drop(), 3, range(24)), _drawn(_toy_span_drop(seed=12), 2, range(24))
    assert any(not torch.equal(other_epoch[i], reference[i]) for i in range(24))
    assert any(not torch.equal(other_seed[i], reference[i]) for i in range(24))


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _resume_equals_whole_run(train, tmp_path):
    """Run ``train`` for 3 epochs; again, stopped mid-epoch 2 (by --max-update) and resumed: the same weights, bit for bit."""
    from conftest import run_cli

    run_cli([*train, "--save-dir", str(tmp_path / "whole")])
    per_epoch = torch.load(tmp_path / "whole" / "checkpoint_last.pt", map_location="cpu",
                           weights_only=True)["optimizer_history"][-1]["num_updates"] // 3
    run_cli([*train, "--save-dir", str(tmp_path / "resumed"), "--max-update", str(per_epoch + per_epoch // 2)])
    stopped = torch.load(tmp_path / "resumed" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    position = stopped["extra_state"]["train_iterator"]
    assert position["epoch"] == 2 and position["iterations_in_epoch"] > 0, position  # mid-epoch, after epoch 1
    run_cli([*train, "--save-dir", str(tmp_path / "resumed")])
    whole, resumed = _weights(tmp_path / "whole" / "checkpoint_last.pt"), _weights(tmp_path / "resumed" / "checkpoint_last.pt")
    assert whole.keys() == resumed.keys()
    different = [k for k in whole if not torch.equal(whole[k], resumed[k])]
    assert not different, different[:5]


@pytest.mark.parametrize("task", sorted(RESUME_TASKS))
def test_resume_with_workers_equals_the_uninterrupted_run(folders, tmp_path, task):  # noqa: F811 - the fixture imported above
    """Fine-tuning with SpanDrop and 2 data-loading workers resumes mid-epoch exactly."""
    from conftest import bin_path

    data = [] if task == "find_animals" else [folders[task]]  # find_animals generates its data
    _resume_equals_whole_run([bin_path("fairseq-train"), *data, *RESUME_RUN, *RESUME_TASKS[task]], tmp_path)


def test_resume_without_span_drop_equals_the_uninterrupted_run(folders, family_data, tmp_path):  # noqa: F811
    """Training splits order their examples anew each epoch (classification's length ties, coreference's
    documents): fairseq must make each epoch's batches anew, or an uninterrupted run keeps epoch 1's while a run
    resumed in epoch 2 makes epoch 2's."""
    from conftest import bin_path

    def without(options, *flags):
        kept = list(options)
        for flag in flags:
            del kept[kept.index(flag):kept.index(flag) + 2]
        return kept

    plain = without(RESUME_RUN, "--span-drop-p", "--num-workers") + ["--num-workers", "0"]
    _resume_equals_whole_run([bin_path("fairseq-train"), folders["cls"], *plain, *RESUME_TASKS["cls"][:6]],
                             tmp_path / "cls")
    coref = without(plain, "--batch-size") + ["--batch-size", "1"]
    _resume_equals_whole_run([bin_path("fairseq-train"), family_data["coref"], *coref, "--task", "coreference",
                              "--criterion", "coreference", "--coref-ffnn-size", "32"], tmp_path / "coref")


def test_validating_the_training_split_leaves_its_masks_alone(spm_data, tmp_path):
    """Validation sets its dataset's epoch to 1: on the object training reads, the batches fetched after a
    validation in epoch 2 were masked as epoch 1's. With a validation on the training split mid-epoch, training
    must reach the weights of a run without validation."""
    from conftest import bin_path, run_cli

    train = [bin_path("fairseq-train"), spm_data, "--user-dir", "user_dir", "--task", "spanbert_pretraining",
             "--criterion", "span_bert", "--arch", "spanbert_tiny", "--encoder-layers", "1", "--encoder-embed-dim", "32",
             "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--tokens-per-sample", "64",
             "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3", "--cpu", "--num-workers", "0", "--seed", "3",
             "--max-epoch", "2", "--no-epoch-checkpoints", "--train-subset", "valid"]
    run_cli([*train, "--disable-validation", "--save-dir", str(tmp_path / "plain")])
    run_cli([*train, "--valid-subset", "valid", "--validate-interval-updates", "25", "--save-interval-updates", "25",
             "--save-dir", str(tmp_path / "validated")])
    plain, validated = _weights(tmp_path / "plain" / "checkpoint_last.pt"), _weights(tmp_path / "validated" / "checkpoint_last.pt")
    different = [k for k in plain if not torch.equal(plain[k], validated[k])]
    assert not different, different[:5]


def test_pretraining_resume_with_workers_equals_the_uninterrupted_run(spm_data, tmp_path):
    """Span masks in epoch 2 come from (seed, 2, index) in the workers too, as in a run resumed there."""
    from conftest import bin_path

    _resume_equals_whole_run([bin_path("fairseq-train"), spm_data, "--user-dir", "user_dir", "--task",
                              "spanbert_pretraining", "--criterion", "span_bert", "--arch", "spanbert_tiny",
                              "--encoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                              "--encoder-attention-heads", "2", "--tokens-per-sample", "64", "--batch-size", "32",
                              "--optimizer", "adam", "--lr", "1e-3", "--cpu", "--num-workers", "2", "--seed", "3",
                              "--max-epoch", "3", "--disable-validation", "--no-epoch-checkpoints",
                              "--train-subset", "valid"], tmp_path)  # the small split: 5 updates an epoch


# --- model selection: validations between saves are warned about -------------------------------------------------

@pytest.mark.parametrize("dataset, checkpoint, expected", [
    ({"validate_interval_updates": 1000}, {"save_interval_updates": 0}, "set --save-interval-updates 1000"),
    ({"validate_interval_updates": 1000}, {"save_interval_updates": 3000}, "set --save-interval-updates 1000"),
    ({"validate_interval_updates": 1000}, {"save_interval_updates": 500}, ""),  # a save at every validation
    ({"validate_interval_updates": 1000}, {"save_interval_updates": 1000}, ""),
    ({"validate_interval": 1}, {"save_interval": 2}, "set --save-interval 1"),
    ({"validate_interval": 2}, {"save_interval": 1}, ""),
    ({"validate_interval_updates": 1000, "disable_validation": True}, {}, ""),
    ({"validate_interval_updates": 1000}, {"no_save": True}, ""),
])
def test_validations_between_saves(dataset, checkpoint, expected):
    from spanbert_plugin.core.tasks import validations_between_saves

    found = validations_between_saves(dataset, checkpoint)
    assert (expected in found and found) if expected else found == ""


def test_training_that_validates_between_saves_warns_once(folders, tmp_path):  # noqa: F811 - the fixture imported above
    """The QA pattern of docs/qa.md without --save-interval-updates: one warning; saving where it validates: none."""
    from conftest import bin_path, run_cli

    train = [bin_path("fairseq-train"), folders["cls"], *RESUME_RUN[:RESUME_RUN.index("--span-drop-p")],
             *RESUME_TASKS["cls"][:-2], "--max-update", "6", "--validate-interval-updates", "2",
             "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", "--num-workers", "0"]
    proc = run_cli([*train, "--save-dir", str(tmp_path / "a")])
    output = proc.stdout + proc.stderr
    assert output.count("is chosen only among the validations that coincide with a save") == 1, output[-3000:]
    assert "--validate-interval-updates 2 with --save-interval-updates 0" in output
    proc = run_cli([*train, "--save-dir", str(tmp_path / "b"), "--save-interval-updates", "2"])
    assert "coincide with a save" not in proc.stdout + proc.stderr


def test_heads_of_another_task_are_left_out_of_a_fine_tuning_run(folders, tmp_path):  # noqa: F811
    """Classification fine-tuned from a QA model (here a classifier given a QA head and a head of another name): the
    QA head was carried along untrained while the encoder changed, saved, and exported as BertForQuestionAnswering.
    A run starting from another checkpoint leaves such heads out, in one warning; its own head goes on."""
    from conftest import bin_path, run_cli

    train = [bin_path("fairseq-train"), folders["cls"], *RESUME_RUN[:RESUME_RUN.index("--span-drop-p")],
             *RESUME_TASKS["cls"][:-2], "--num-workers", "0", "--max-update", "1", "--disable-validation"]
    run_cli([*train, "--save-dir", str(tmp_path / "first")])
    state = torch.load(tmp_path / "first" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    weights = state["model"]
    weights["qa_outputs.weight"], weights["qa_outputs.bias"] = torch.ones(2, 32), torch.ones(2)
    own = "classification_heads.sentence_classification_head."
    for key in [k for k in weights if k.startswith(own)]:
        weights["classification_heads.other." + key[len(own):]] = weights[key].clone()
    torch.save(state, tmp_path / "with_other_heads.pt")
    proc = run_cli([*train, "--save-dir", str(tmp_path / "second"), "--finetune-from-model",
                    str(tmp_path / "with_other_heads.pt")])
    output = proc.stdout + proc.stderr
    assert output.count("the starting checkpoint's classification_heads.other, qa_outputs left out: this run does "
                        "not train it") == 1, output[-3000:]
    saved = _weights(tmp_path / "second" / "checkpoint_last.pt")
    assert not [k for k in saved if k.startswith(("qa_outputs.", "classification_heads.other."))]
    assert {k for k in saved if k.startswith(own)} == {k for k in weights if k.startswith(own)}


def test_saved_head_rows_follow_the_labels_in_a_cyclic_order(tmp_path):
    """Saved labels [a, b, c], this data's [b, c, a]: row i of the new head is the saved row of label i, i.e. the
    saved rows [1, 2, 0] (a swap of two labels, its own inverse, cannot tell the map from its inverse)."""
    from spanbert_plugin.core.checkpoint_loading import match_saved_head_labels

    key = "classification_heads.head.out_proj.weight"
    torch.save({"model": {key: torch.zeros(3, 4)}, "cfg": {}, "task_state": {"labels": ["a", "b", "c"]}},
               tmp_path / "ck.pt")
    mapped = []
    model = SimpleNamespace(map_saved_head=lambda group, head, rows: mapped.append((group, head, rows)))
    match_saved_head_labels(model, str(tmp_path / "ck.pt"), "classification_heads", "head", ["b", "c", "a"])
    assert mapped == [("classification_heads", "head", [1, 2, 0])]


def test_a_new_training_leaves_out_another_runs_relation_head():
    """A new training from a checkpoint keeps the heads it registers (their weights loaded) and leaves out a relation
    head it does not, as it does another run's classification and QA heads."""
    torch.manual_seed(0)
    dictionary = SpanBertDictionary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"])
    trained = tiny_spanbert(dictionary)
    trained.register_classification_head("cls_head", num_classes=2)
    trained.register_relation_head("other_relations", 3)
    model = tiny_spanbert(dictionary)
    model.register_classification_head("cls_head", num_classes=2)
    model.only_heads_of_this_run = True  # what the task sets for --finetune-from-model
    model.load_state_dict(trained.state_dict())
    assert "other_relations" not in model.relation_heads
    assert not [k for k in model.state_dict() if k.startswith("relation_heads.")]
    assert torch.equal(model.classification_heads["cls_head"].out_proj.weight,
                       trained.classification_heads["cls_head"].out_proj.weight)


def test_grown_rows_keep_the_models_fresh_weights_and_a_record_less_checkpoint_of_the_same_size_loads():
    symbols = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(20)]
    torch.manual_seed(0)
    saved = tiny_spanbert(SpanBertDictionary(symbols)).state_dict()
    model = tiny_spanbert(SpanBertDictionary(symbols + ["[E1]", "[E2]"]))
    fresh = model.encoder.embeddings.word_embeddings.weight.detach().clone()
    model.load_state_dict(dict(saved))
    embed = model.encoder.embeddings.word_embeddings.weight
    assert torch.equal(embed[:25], saved["encoder.embeddings.word_embeddings.weight"])
    assert torch.equal(embed[25:], fresh[25:]) and embed[25:].abs().min() > 0  # N(0, init_std) rows, not zeros
    assert torch.equal(model.lm_head.bias[25:], torch.zeros(2)) and torch.equal(model.sbo_head.bias[25:], torch.zeros(2))
    old_style = {k: v for k, v in saved.items() if not k.startswith("vocabulary.")}
    tiny_spanbert(SpanBertDictionary(symbols)).load_state_dict(old_style)  # the same size: nothing to check


def test_saved_head_rows_are_taken_in_the_mapped_order_or_left_out():
    symbols = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(20)]
    torch.manual_seed(1)
    trained = tiny_spanbert(SpanBertDictionary(symbols))
    trained.register_classification_head("head", num_classes=3)
    saved = trained.state_dict()
    for rows in ([2, 0, 1], None):
        model = tiny_spanbert(SpanBertDictionary(symbols))
        model.register_classification_head("head", num_classes=3)
        fresh = model.classification_heads["head"].out_proj.weight.detach().clone()
        model.map_saved_head("classification_heads", "head", rows)
        model.load_state_dict(dict(saved))
        out_proj = model.classification_heads["head"].out_proj
        expected = fresh if rows is None else saved["classification_heads.head.out_proj.weight"][rows]
        assert torch.equal(out_proj.weight, expected)
        assert torch.equal(model.classification_heads["head"].dense.weight, saved["classification_heads.head.dense.weight"])


def test_a_resumed_run_keeps_the_heads_of_its_checkpoint(tmp_path):
    """OneDictionaryTask.build_model marks a model that starts a new training from --finetune-from-model
    (only_heads_of_this_run: another run's heads stay behind), never one resuming its own checkpoint_last.pt."""
    from omegaconf import OmegaConf

    from spanbert_plugin.core.tasks import OneDictionaryTask

    class Base:
        def build_model(self, cfg, from_checkpoint=False):
            return SimpleNamespace(only_heads_of_this_run=False)

    class Task(OneDictionaryTask, Base):
        trains_pretraining_heads = True

    pretrained = tmp_path / "pretrained.pt"
    torch.save({"model": {}, "cfg": {"model": {}}}, pretrained)

    def built(save_dir, reset_optimizer=False):
        run = OmegaConf.create({
            "common": {"cpu": True}, "task": {"_name": "t", "compile": False}, "model": {"_name": "m"},
            "checkpoint": {"save_dir": str(save_dir), "restore_file": "checkpoint_last.pt",
                           "finetune_from_model": str(pretrained), "reset_optimizer": reset_optimizer,
                           "reset_dataloader": False}})
        task = Task.__new__(Task)
        task.cfg = run.task
        return task.build_model(run.model).only_heads_of_this_run

    assert built(tmp_path / "new_run")  # first launch: a new training from the pretrained checkpoint
    (tmp_path / "run").mkdir()
    torch.save({"model": {}, "cfg": {"model": {}}}, tmp_path / "run" / "checkpoint_last.pt")
    assert not built(tmp_path / "run")  # a resume of the run's own checkpoint_last.pt
    assert not built(tmp_path / "run", reset_optimizer=True)  # still the run's own state (its epoch, its heads)


def test_a_tokenizer_folder_whose_dict_lists_the_vocabulary_out_of_order_is_refused(wordpiece_data, tmp_path):
    """dict.txt must list the tokenizer's vocabulary in id order (token ids are the checkpoint's): two lines swapped
    keep its length but map ids to other words."""
    import shutil

    from spanbert_plugin.core.finetune_io import load_tokenizer_folder
    from spanbert_plugin.core.tokenization import TokenizerError

    folder = tmp_path / "tok"
    shutil.copytree(wordpiece_data, folder)
    tokenizer, dictionary = load_tokenizer_folder(str(folder))
    assert dictionary.symbols[: len(tokenizer.vocab)] == list(tokenizer.vocab)
    lines = (folder / "dict.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[100], lines[101] = lines[101], lines[100]
    (folder / "dict.txt").write_text("".join(lines), encoding="utf-8")
    with pytest.raises(TokenizerError, match="does not list the tokenizer's vocabulary in id order"):
        load_tokenizer_folder(str(folder))
