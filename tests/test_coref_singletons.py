"""Singletons in coreference: the mention loss, one-mention clusters in prediction, both scoring conventions."""
import json
import os

import pytest
import torch

from conftest import bin_path, run_cli
from test_coref_prepare import write_jsonl
from test_coref_train import build, gold_and_predicted, synthetic_documents, train_command, train_in_process

from spanbert_plugin.coref.metrics import CONVENTIONS, convention_counts, coref_scores

# ------------------------------------------------------------------ scoring, by the scorer's definitions

KEY = [[(0, 0), (2, 2)], [(4, 4)], [(6, 6)]]  # one two-mention cluster and two singletons
RESPONSES = {
    "no singletons": [[(0, 0), (2, 2)]],
    "every singleton": [[(0, 0), (2, 2)], [(4, 4)], [(6, 6)]],
    "an extra singleton": [[(0, 0), (2, 2)], [(4, 4)], [(6, 6)], [(8, 8)]],
}
# Worked by hand from Pradhan et al. 2014 (MUC, B-cubed, CEAF-phi4) and the scorer's mention identification.
# "no singletons": B3 recall (2^2/2)/4, precision (2^2/2)/2; CEAF-e phi4 1 over 3 key and 1 response clusters;
# mentions 2 of 4 found, 2 of 2 right. "an extra singleton": B3 precision (2 + 1 + 1 + 0)/5; CEAF-e 3 over 3 and 4.
EXPECTED = {
    "no singletons": {"muc_f1": 100.0, "bcub_r": 50.0, "bcub_p": 100.0, "bcub_f1": 200 / 3, "ceafe_r": 100 / 3,
                      "ceafe_p": 100.0, "ceafe_f1": 50.0, "mentions_r": 50.0, "mentions_p": 100.0,
                      "conll_f1": (100 + 200 / 3 + 50) / 3},
    "every singleton": {"muc_f1": 100.0, "bcub_f1": 100.0, "ceafe_f1": 100.0, "mentions_f1": 100.0, "conll_f1": 100.0},
    "an extra singleton": {"muc_f1": 100.0, "bcub_r": 100.0, "bcub_p": 80.0, "bcub_f1": 800 / 9, "ceafe_r": 100.0,
                           "ceafe_p": 75.0, "ceafe_f1": 600 / 7, "mentions_p": 80.0, "mentions_f1": 800 / 9,
                           "conll_f1": (100 + 800 / 9 + 600 / 7) / 3},
}


@pytest.mark.parametrize("name", list(RESPONSES))
def test_singletons_decide_the_score_with_singletons_and_not_without(name):
    by_convention = convention_counts(KEY, RESPONSES[name])
    with_singletons = coref_scores(by_convention["with_singletons"])
    for metric, value in EXPECTED[name].items():
        assert with_singletons[metric] == pytest.approx(value, abs=0.01), metric
    # OntoNotes convention: one-mention clusters leave key and response, and every response is perfect
    without = coref_scores(by_convention["without_singletons"])
    assert all(without[f"{m}_f1"] == pytest.approx(100.0) for m in ("muc", "bcub", "ceafe", "mentions"))
    assert by_convention["without_singletons"]["mentions_r_den"] == 2


# ------------------------------------------------------------------ learning singletons

@pytest.fixture(scope="module")
def singleton_data(wordpiece_data, tmp_path_factory):
    from spanbert_plugin.cli.prepare_coref import main

    d = tmp_path_factory.mktemp("coref_single")
    dest = str(d / "data")
    assert main(["--train", write_jsonl(d / "train.jsonl", synthetic_documents(40, 1, singletons=True)),
                 "--valid", write_jsonl(d / "valid.jsonl", synthetic_documents(10, 2, singletons=True)),
                 "--tokenizer-from", wordpiece_data, "--destdir", dest, "--max-segment-length", "48"]) == 0
    return dest


def singleton_f1(keys, responses):
    """F1 (percent) of predicted one-mention clusters against the gold ones, exact spans."""
    gold = {(d, c[0]) for d, key in enumerate(keys) for c in key if len(c) == 1}
    found = {(d, c[0]) for d, response in enumerate(responses) for c in response if len(c) == 1}
    right = len(gold & found)
    return 200 * right / (len(gold) + len(found)) if gold or found else 0.0


def test_mention_loss_teaches_singletons(singleton_data):
    """Random-init 1-layer encoder, 8 epochs over 40 documents: singleton F1 from near 0 to about 90.

    Measured once over torch seeds 0-9 (this test runs seed 0; the coarse scores c2f-coref's way): before 0-12.1,
    after 8 epochs 93.3-100 (mean 98.0, sd 2.3; seed 0: 100). The bounds sit 7.9 points above the highest `before`
    and 33 points under the lowest `after`.
    """
    torch.manual_seed(0)
    task, model, criterion = build(singleton_data, "--coref-dropout", "0", "--dropout", "0", "--attention-dropout",
                                   "0")
    assert task.cfg.mention_loss_weight == 1.0 and task.scoring_convention == "with_singletons"  # data has singletons
    task.load_dataset("train", training=True)
    task.load_dataset("valid")
    before = singleton_f1(*gold_and_predicted(model, task.dataset("valid"), 0.5))
    train_in_process(model, criterion, task.dataset("train"), 8)
    after = singleton_f1(*gold_and_predicted(model, task.dataset("valid"), 0.5))
    assert before < 20 and after > 60, (before, after)


# ------------------------------------------------------------------ prediction, validation, options

def test_no_singletons_drops_only_one_mention_clusters_and_eval_has_both_conventions(singleton_data, tmp_path):
    ck = str(tmp_path / "ck")
    # a low threshold, so that the kept spans without an antecedent become singletons whatever two epochs taught the
    # mention scorer (on one CPU's bf16 kernels no span reached 0.5): this tests the options and the files; learning
    # singletons is test_mention_loss_teaches_singletons'
    proc = run_cli(train_command(singleton_data, ck, "--max-epoch", "2", "--log-format", "json", "--bf16-autocast",
                                 "--singleton-threshold", "0.01", ffnn_size="32"))
    valid = [json.loads(line.split("| valid | ", 1)[1]) for line in (proc.stdout + proc.stderr).splitlines()
             if "| valid | " in line]
    assert {"valid_conll_f1", "valid_mentions_f1", "valid_without_singletons_conll_f1", "valid_mention_loss"} <= set(
        valid[-1])
    checkpoint = os.path.join(ck, "checkpoint_last.pt")
    outputs = {}
    for name, extra in (("with", []), ("without", ["--no-singletons"])):
        out = str(tmp_path / name)
        # --bf16: as validation ran, on any CPU (left out, a CPU that only emulates bfloat16 predicts in fp32)
        run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", checkpoint, "--split", "valid", "--out", out,
                 "--bf16", *extra])
        outputs[name] = ([json.loads(line)["clusters"] for line in open(os.path.join(out, "clusters.jsonl"))],
                         json.load(open(os.path.join(out, "eval.json"))))
    (with_clusters, with_eval), (without_clusters, without_eval) = outputs["with"], outputs["without"]
    # singletons are only added: the linked clusters are the same, --no-singletons predicts no one-mention cluster
    assert [[c for c in doc if len(c) > 1] for doc in with_clusters] == without_clusters
    assert not any(len(c) == 1 for doc in without_clusters for c in doc)
    assert any(len(c) == 1 for doc in with_clusters for c in doc)
    # eval.json: the convention in use at the top level, both conventions under their names
    assert with_eval["convention"] == "with_singletons"
    for scores in (with_eval, without_eval):
        for convention in CONVENTIONS:
            assert set(scores[convention]) == {"muc", "bcub", "ceafe", "conll_f1", "ceafm", "blanc", "lea", "mentions"}
        assert scores["conll_f1"] == scores["with_singletons"]["conll_f1"]
        assert scores["muc"] == scores["with_singletons"]["muc"]
    # validation logged the same scores as prediction writes (the run's last epoch, the same checkpoint)
    assert with_eval["conll_f1"] == pytest.approx(float(valid[-1]["valid_conll_f1"]), abs=1e-4)
    for metric in ("mentions", "ceafm", "blanc", "lea"):
        assert with_eval[metric]["f1"] == pytest.approx(float(valid[-1][f"valid_{metric}_f1"]), abs=1e-4)
    assert with_eval["without_singletons"]["conll_f1"] == pytest.approx(
        float(valid[-1]["valid_without_singletons_conll_f1"]), abs=1e-4)
    # one-mention clusters do not count without singletons: both predictions score the same there
    assert with_eval["without_singletons"] == without_eval["without_singletons"]
    # the OntoNotes convention on request
    out = str(tmp_path / "ontonotes")
    run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", checkpoint, "--split", "valid", "--out", out,
             "--scoring-convention", "without_singletons", "--bf16"])
    scores = json.load(open(os.path.join(out, "eval.json")))
    assert scores["convention"] == "without_singletons"
    assert scores["conll_f1"] == scores["without_singletons"]["conll_f1"]
    # a sweep of singleton thresholds in one pass scores as one run per threshold
    sweep, single = str(tmp_path / "sweep"), str(tmp_path / "threshold0.5")
    run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", checkpoint, "--split", "valid", "--out", sweep,
             "--singleton-threshold-sweep", "0.01,0.5", "--bf16"])
    run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", checkpoint, "--split", "valid", "--out", single,
             "--singleton-threshold", "0.5", "--bf16"])
    swept = json.load(open(os.path.join(sweep, "singleton_thresholds.json")))
    assert list(swept) == ["0.01", "0.5"] and swept["0.5"]["singleton_threshold"] == 0.5
    for threshold, expected in (("0.5", json.load(open(os.path.join(single, "eval.json")))), ("0.01", with_eval)):
        for key in ("conll_f1", "mentions", "with_singletons", "without_singletons", "convention"):
            assert swept[threshold][key] == expected[key], (threshold, key)
    assert swept["0.5"]["mentions"] != swept["0.01"]["mentions"]  # the threshold mattered on these documents


@pytest.mark.parametrize("flag,value,message", [
    ("--singleton-threshold", "1", "--singleton-threshold must be in (0, 1), got 1.0"),
    ("--singleton-threshold", "0", "--singleton-threshold must be in (0, 1), got 0.0"),
    ("--mention-loss-weight", "-0.5", "--mention-loss-weight must be at least 0, got -0.5"),
    ("--coref-dropout", "2", "--coref-dropout must be in [0, 1), got 2.0"),
    ("--criterion", "span_bert", "--criterion span_bert does not work with --task coreference; use --criterion "
                                 "coreference"),
])
def test_bad_coreference_options_are_one_line(singleton_data, tmp_path, flag, value, message):
    proc = run_cli(train_command(singleton_data, str(tmp_path / "ck"), "--max-update", "1", f"{flag}={value}"),
                   check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith(message), proc.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


@pytest.mark.parametrize("flag,value,message", [
    ("--singleton-threshold", "1.5", "--singleton-threshold must be in (0, 1), got 1.5"),
    ("--singleton-threshold-sweep", "0.3,1", "--singleton-threshold-sweep: every threshold must be in (0, 1), got 1"),
    ("--no-singletons --singleton-threshold", "0.3", "--singleton-threshold has no effect with --no-singletons (no "
                                                    "one-mention cluster is predicted); give one of them"),
    ("--text book.txt --split", "valid", "--split concerns a prepared split (its scores); it has no effect with --text"),
    ("--text book.txt --scoring-convention", "without_singletons",
     "--scoring-convention concerns a prepared split (its scores); it has no effect with --text"),
])
def test_predict_refuses_a_bad_threshold_before_loading(tmp_path, flag, value, message):
    proc = run_cli([bin_path("spanbert-predict-coref"), "--checkpoint", str(tmp_path / "none.pt"), "--out",
                    str(tmp_path / "out"), *flag.split(), value], check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"spanbert-predict-coref: error: {message}"
    assert not os.path.exists(tmp_path / "out")


def test_data_without_singletons_keeps_the_ontonotes_defaults(wordpiece_data, tmp_path):
    """test_coref_train's documents: every name is one cluster, and with 8 sentences most clusters repeat."""
    docs = [d for d in synthetic_documents(12, 5) if all(len(c) > 1 for c in d["clusters"])]
    from spanbert_plugin.cli.prepare_coref import main

    dest = str(tmp_path / "data")
    assert main(["--train", write_jsonl(tmp_path / "train.jsonl", docs), "--tokenizer-from", wordpiece_data,
                 "--destdir", dest, "--max-segment-length", "48"]) == 0
    task, _, _ = build(dest)
    assert task.cfg.mention_loss_weight == 0.0 and task.scoring_convention == "without_singletons"
    # and predicts no one-mention cluster, so the written file and eval.json's top level follow the data's
    # convention (the official scorer on the file agrees with eval.json)
    assert task.cfg.no_singletons is True and task.singleton_threshold is None
    from spanbert_plugin.coref.predict import apply_prediction_options

    # a threshold would be ignored (and a sweep would score singletons eval.json does not predict): refused
    from spanbert_plugin.coref.predict import refuse_thresholds_without_singletons
    from spanbert_plugin.core.errors import UsageError

    for threshold, sweep in ((0.3, None), (None, [0.3, 0.5])):
        with pytest.raises(UsageError, match="this checkpoint predicts no one-mention clusters"):
            refuse_thresholds_without_singletons(task, threshold, sweep)
    apply_prediction_options(task, no_singletons=False)  # spanbert-predict-coref --singletons: asked for
    assert task.singleton_threshold == 0.5
    refuse_thresholds_without_singletons(task, 0.3, [0.3, 0.5])  # then they act
    task, _, _ = build(dest, "--mention-loss-weight", "0.3", "--scoring-convention", "with_singletons")
    assert task.cfg.mention_loss_weight == 0.3 and task.scoring_convention == "with_singletons"


def test_prediction_options_override_a_dataclass_task_config():
    """A task built in Python from a CoreferenceConfig (not a checkpoint's DictConfig): the options given replace
    the config's values and those left None keep them."""
    from types import SimpleNamespace

    from spanbert_plugin.coref.predict import apply_prediction_options
    from spanbert_plugin.coref.task import CoreferenceConfig

    task = SimpleNamespace(cfg=CoreferenceConfig(singleton_threshold=0.5, no_singletons=True))
    before = CoreferenceConfig(singleton_threshold=0.5, no_singletons=True)
    apply_prediction_options(task, no_singletons=False, singleton_threshold=0.25, max_antecedent_distance=7)
    assert (task.cfg.no_singletons, task.cfg.singleton_threshold, task.cfg.max_antecedent_distance) == (False, 0.25, 7)
    for name in ("scoring_convention", "coref_prediction", "entity_cache_size"):
        assert getattr(task.cfg, name) == getattr(before, name)


def test_data_with_singletons_predicts_them(singleton_data):
    task, _, _ = build(singleton_data)
    assert task.cfg.no_singletons is False and task.singleton_threshold == 0.5


def test_raw_text_words_keep_their_decomposed_accents():
    """hub.coref's words: a combining mark (NFD text) stays with its letter, so no mention is cut at an accent."""
    import unicodedata

    from spanbert_plugin.coref.predict import split_words

    text = unicodedata.normalize("NFD", "René met Zoë. She smiled at the café's owner.")
    words, offsets, sentences = split_words(text)
    assert words[:4] == [unicodedata.normalize("NFD", w) for w in ("René", "met", "Zoë", ".")]
    assert [text[a:b] for a, b in offsets] == words and words[-3] == unicodedata.normalize("NFD", "café's")
    assert not any(unicodedata.category(w[0]) == "Mn" for w in words)
    assert sentences.tolist() == [0] * 4 + [1] * 7


def test_prediction_reads_whole_documents_whatever_the_training_window(singleton_data):
    """--max-training-segments windows training documents; predicting the train split still reads them whole."""
    from spanbert_plugin.coref.predict import predict_documents

    task, model, _ = build(singleton_data, "--max-training-segments", "1")
    task.load_dataset("train", training=True)
    assert task.dataset("train").max_segments == 1
    predict_documents(model.eval(), task, "train")
    assert task.dataset("train").max_segments == 0


def test_eval_json_counts_and_top_scores_are_the_chosen_conventions():
    """eval.json's top-level scores and summed counts are those of the checkpoint's scoring convention, under either
    convention; each convention's own scores sit under its name."""
    from spanbert_plugin.coref.metrics import add_counts
    from spanbert_plugin.coref.predict import evaluation, scores_of

    gold = [[[(0, 0), (3, 3)], [(5, 6)]], [[(1, 2)], [(4, 4), (7, 7), (9, 9)]]]
    predicted = [[[(0, 0), (3, 3)], [(8, 8)]], [[(1, 2), (4, 4)], [(7, 7), (9, 9)]]]
    totals = {c: {} for c in CONVENTIONS}
    for key, response in zip(gold, predicted):
        for c, counts in convention_counts(key, response).items():
            totals[c] = add_counts(totals[c], counts)
    assert totals[CONVENTIONS[0]] != totals[CONVENTIONS[1]]  # the singletons make a difference here
    for convention in CONVENTIONS:
        result = evaluation(gold, predicted, convention)
        assert result["convention"] == convention and result["counts"] == totals[convention]
        assert result["conll_f1"] == scores_of(totals[convention])["conll_f1"] == result[convention]["conll_f1"]
        flat = coref_scores(totals[convention])
        assert result["muc"] == {part: flat[f"muc_{part}"] for part in ("p", "r", "f1")}


def test_a_threshold_sweep_predicts_every_document_at_each_threshold(monkeypatch):
    """predict_documents: the predictions at the checkpoint's threshold, and for each swept threshold the clusters
    the head gives at that threshold (one exact pass per document, its outputs reused)."""
    from types import SimpleNamespace

    from spanbert_plugin.coref import predict

    passes = []
    monkeypatch.setattr(predict, "predicts_bounded", lambda cfg, num_words: False)
    monkeypatch.setattr(predict, "document_outputs", lambda model, sample: passes.append(sample["doc"]) or sample["doc"])
    monkeypatch.setattr(predict, "predicted_clusters", lambda doc, token_word, threshold: [(doc, threshold)])
    monkeypatch.setattr(predict, "gold_clusters", lambda gold: gold)

    class Documents:
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return index

        def collater(self, items):
            return {"doc": items[0], "coref": {"num_words": 4, "token_word": torch.zeros(4)}, "gold": ["gold", items[0]]}

    documents = Documents()
    task = SimpleNamespace(cfg=None, singleton_threshold=0.5, load_dataset=lambda split, training: None,
                           dataset=lambda split: documents)
    predicted, gold, swept = predict.predict_documents(torch.nn.Linear(1, 1), task, "valid", (0.2, 0.9))
    assert predicted == [[(0, 0.5)], [(1, 0.5)]] and gold == [["gold", 0], ["gold", 1]]
    assert swept == {0.2: [[(0, 0.2)], [(1, 0.2)]], 0.9: [[(0, 0.9)], [(1, 0.9)]]}
    assert passes == [0, 1]


def test_a_text_of_only_white_space_is_refused(tmp_path):
    """--text with nothing to resolve (only spaces, tabs and line breaks, or zero-width and other invisible
    characters, which strip() keeps) is one line, not an empty prediction."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.coref.predict import read_input_text

    for name, text in (("blank.txt", " \n\t\n  \n"), ("invisible.txt", "\u200b\u2060 \u00ad\n\u200e")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(UsageError, match=f"{name}: empty or only white space and invisible characters, no word"):
            read_input_text(str(tmp_path / name))
    (tmp_path / "text.txt").write_text("\n Anna said she would come.\n", encoding="utf-8")
    assert read_input_text(str(tmp_path / "text.txt")) == "\n Anna said she would come.\n"


def test_a_threshold_sweep_predicts_a_long_document_again_at_each_threshold(monkeypatch):
    """predict_documents: a document predicted in bounded memory runs once per threshold (its entity cache depends
    on it), the checkpoint's first; only that first run's notice is shown."""
    from types import SimpleNamespace

    from spanbert_plugin.coref import predict

    runs = []
    monkeypatch.setattr(predict, "predicts_bounded", lambda cfg, num_words: num_words > 10)
    monkeypatch.setattr(predict, "document_clusters", lambda model, task, sample, threshold, notice: (
        notice(f"bounded {sample['doc']}"), runs.append((sample["doc"], threshold)), [(sample["doc"], threshold)])[-1])
    monkeypatch.setattr(predict, "document_outputs", lambda model, sample: sample["doc"])
    monkeypatch.setattr(predict, "predicted_clusters", lambda doc, token_word, threshold: [(doc, "exact", threshold)])
    monkeypatch.setattr(predict, "gold_clusters", lambda gold: gold)

    class Documents:
        words = [50, 4]  # the first document is long

        def __len__(self):
            return 2

        def __getitem__(self, index):
            return index

        def collater(self, items):
            return {"doc": items[0], "coref": {"num_words": self.words[items[0]], "token_word": torch.zeros(4)},
                    "gold": ["gold", items[0]]}

    documents, notices = Documents(), []
    task = SimpleNamespace(cfg=None, singleton_threshold=0.5, load_dataset=lambda split, training: None,
                           dataset=lambda split: documents)
    predicted, gold, swept = predict.predict_documents(torch.nn.Linear(1, 1), task, "valid", (0.2, 0.9),
                                                       notices.append)
    assert predicted == [[(0, 0.5)], [(1, "exact", 0.5)]] and gold == [["gold", 0], ["gold", 1]]
    assert swept == {0.2: [[(0, 0.2)], [(1, "exact", 0.2)]], 0.9: [[(0, 0.9)], [(1, "exact", 0.9)]]}
    assert runs == [(0, 0.5), (0, 0.2), (0, 0.9)] and notices == ["bounded 0"]


@pytest.mark.parametrize("options,message", [
    ({"max_antecedent_distance": 0}, "--max-antecedent-distance must be at least 1, got 0"),
    ({"entity_cache_size": -2}, "--entity-cache-size must be at least 1, got -2"),
    ({"join_wrapped_lines": True}, "--join-wrapped-lines applies to --text only"),
    ({"genre": "nw"}, "--genre applies to --text only"),
])
def test_predict_refuses_options_out_of_place_before_loading(tmp_path, options, message):
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.coref.predict import predict_split

    with pytest.raises(UsageError) as caught:
        predict_split(str(tmp_path / "none.pt"), None, None, str(tmp_path / "out"), **options)
    assert str(caught.value) == message
    assert not os.path.exists(tmp_path / "out")


def test_a_docs_file_that_does_not_match_the_npz_is_one_line_and_writes_nothing(wordpiece_data, tmp_path, monkeypatch):
    """valid.docs.jsonl from another preparation (one document short): the predictions could not be written as the
    documents' lines; refused before anything is written."""
    from spanbert_plugin.cli.prepare_coref import main
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.coref import predict

    dest = str(tmp_path / "data")
    docs = synthetic_documents(2, 3, sentences=2)
    assert main(["--train", write_jsonl(tmp_path / "d.jsonl", docs), "--valid", str(tmp_path / "d.jsonl"),
                 "--tokenizer-from", wordpiece_data, "--destdir", dest, "--max-segment-length", "48"]) == 0
    docs_file = os.path.join(dest, "valid.docs.jsonl")
    with open(docs_file, encoding="utf-8") as f:
        first = f.readline()
    with open(docs_file, "w", encoding="utf-8") as f:
        f.write(first)
    task, model, _ = build(dest)
    monkeypatch.setattr(predict, "load_finetuned_checkpoint", lambda checkpoint, name, data, cpu: (model.eval(), task,
                                                                                                   None))
    out = tmp_path / "out"
    with pytest.raises(UsageError) as caught:
        predict.predict_split(str(tmp_path / "c.pt"), dest, "valid", str(out))
    assert str(caught.value) == (f"{dest}: valid.npz holds 2 documents but valid.docs.jsonl 1; prepare the folder "
                                 "again")
    assert not out.exists()


@pytest.mark.parametrize("text", ["", "\u200b\u2060\ufeff", "\n\u200e"])
def test_raw_text_without_a_word_resolves_to_no_cluster_without_the_model(text):
    """Text of no word (empty, or only zero-width and format characters, which separate words but are none): no
    clusters, and the model is never run (its tokenizer and dictionary are not even read)."""
    from types import SimpleNamespace

    from spanbert_plugin.coref.predict import resolve_text, split_words

    words, offsets, sentences = split_words(text, "sentence")
    assert words == [] and offsets == [] and sentences.tolist() == []
    task = SimpleNamespace(dictionary=None, meta=None, singleton_threshold=None)
    assert resolve_text(None, task, None, text, genre="other") == []


def test_a_threshold_sweep_that_is_not_numbers_is_an_argument_error(tmp_path, capsys):
    from spanbert_plugin.cli.predict_coref import main

    with pytest.raises(SystemExit) as caught:
        main(["--checkpoint", str(tmp_path / "none.pt"), "--out", str(tmp_path / "out"),
              "--singleton-threshold-sweep", "0.3,high"])
    assert caught.value.code == 2  # argparse's status for an option it cannot read
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "spanbert-predict-coref: error: argument --singleton-threshold-sweep: expected comma-separated numbers in "
        "(0, 1), got '0.3,high'")
    assert not os.path.exists(tmp_path / "out")
