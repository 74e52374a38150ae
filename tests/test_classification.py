"""Sentence(-pair) classification: GLUE reading, BERT inputs, metrics, training, prediction and bad input."""
import json
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairseq.data.indexed_dataset import MMapIndexedDataset

from conftest import (bert_uncased_tokenizer, bin_path, needs_shared_data, require_shared_data, run_cli, run_gloo_ranks,
                      shared_path, tiny_spanbert, training_batches)
from spanbert_plugin.classification.prepare import (
    ReadOptions,
    Table,
    featurise,
    parse_columns,
    read_table,
    truncated_lengths,
)
from spanbert_plugin.cli.prepare_classification import main as prepare_main
from spanbert_plugin.classification import metrics as cm

GLUE = shared_path("glue")
needs_glue = needs_shared_data("glue")
TINY_CLS = ["--user-dir", "user_dir", "--task", "sentence_classification", "--criterion", "sentence_classification",
            "--arch", "spanbert_tiny", "--optimizer", "adam", "--cpu", "--num-workers", "0",
            "--log-format", "json", "--log-interval", "10", "--seed", "1"]


def read_glue(task, split, text, label):
    return read_table(os.path.join(GLUE, task, f"{split}.tsv"),
                      ReadOptions(parse_columns(text, "--text-columns"), parse_columns(label, "--label-column")[0]))


def valid_records(output):
    return [json.loads(m.group(1)) for m in re.finditer(r"\| valid \| (\{.*\})", output)]


# ---------------------------------------------------------------- GLUE files as distributed

@needs_glue
@pytest.mark.parametrize("task,text,label,rows,counts", [
    ("SST-2", "sentence", "label", (67349, 872), ({"0": 29780, "1": 37569}, {"0": 428, "1": 444})),
    ("CoLA", "3", "1", (8551, 1043), ({"1": 6023, "0": 2528}, {"1": 721, "0": 322})),
    ("RTE", "sentence1,sentence2", "label", (2490, 277),
     ({"entailment": 1249, "not_entailment": 1241}, {"entailment": 146, "not_entailment": 131})),
])
def test_glue_files_parse_to_known_rows(task, text, label, rows, counts):
    for split, n, expected in zip(("train", "dev"), rows, counts):
        table = read_glue(task, split, text, label)
        assert len(table) == n and all(len(t) == n for t in table.texts)
        values, freq = np.unique(table.labels, return_counts=True)
        assert dict(zip(values.tolist(), freq.tolist())) == expected
    if task == "RTE":  # unbalanced quotes stay inside their field (row 2164 starts with one)
        assert read_glue(task, "train", text, label).texts[0][2164].startswith('"')


# ---------------------------------------------------------------- BERT inputs equal transformers'

def _bert_tokenizer_fast(vocab_file):
    from transformers import BertTokenizerFast

    with open(vocab_file, encoding="utf-8") as f:
        vocab = [line.rstrip("\n") for line in f]
    return BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=False)


def _pairs_tsv(path, corpus_file, n=60):
    with open(corpus_file, encoding="utf-8") as f:
        lines = [" ".join(line.split()) for line in f if line.strip()][: 2 * n]
    with open(path, "w", encoding="utf-8") as f:
        f.write("a\tb\tlabel\n")
        for i in range(n):
            f.write(f"{lines[2 * i]}\t{lines[2 * i + 1]}\t{'yes' if i % 3 else 'no'}\n")
    return lines


def test_pairs_ids_and_token_types_equal_bert_tokenizer_fast(wordpiece_data, wordpiece_vocab, corpus_files, tmp_path):
    from spanbert_plugin.classification.dataset import ClassificationDataset
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    _pairs_tsv(tmp_path / "train.tsv", corpus_files[0])
    dest = str(tmp_path / "cls")
    assert prepare_main(["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "train.tsv"),
                         "--tokenizer-from", wordpiece_data, "--destdir", dest, "--text-columns", "a,b",
                         "--label-column", "label", "--max-seq-length", "24"]) == 0
    stats = json.load(open(os.path.join(dest, "prepare_stats.json")))
    assert stats["train"]["truncated"] > 10  # the comparison covers truncation
    table = read_table(str(tmp_path / "train.tsv"), ReadOptions(["a", "b"], "label"))
    hf = _bert_tokenizer_fast(wordpiece_vocab)(
        table.texts[0], table.texts[1], truncation="longest_first", max_length=24)
    dictionary = SpanBertDictionary.load(os.path.join(dest, "dict.txt"))
    dataset = ClassificationDataset.load(dest, "train", dictionary)
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    for i in range(len(dataset)):
        n = len(hf["input_ids"][i])
        assert batch["net_input"]["src_tokens"][i, :n].tolist() == hf["input_ids"][i]
        assert batch["net_input"]["segment_labels"][i, :n].tolist() == hf["token_type_ids"][i]
        assert not batch["net_input"]["segment_labels"][i, n:].any()  # padding has type 0


def test_longest_first_truncation_matches_transformers_for_every_length(wordpiece_data, wordpiece_vocab):
    """All (len A, len B, max length) up to 9 / 9 / 13 against BertTokenizerFast with one-token words."""
    from spanbert_plugin.core.finetune_io import load_tokenizer_folder

    tokenizer, dictionary = load_tokenizer_folder(wordpiece_data)
    hf = _bert_tokenizer_fast(wordpiece_vocab)
    word = next(w for w in tokenizer.vocab if w.isalpha() and len(w) > 2 and len(tokenizer.encode_ids([w])[0]) == 1)
    grid = [(a, b) for a in range(10) for b in range(10)]
    texts_a, texts_b = [" ".join([word] * a) for a, _ in grid], [" ".join([word] * b) for _, b in grid]
    for max_len in range(4, 14):
        table = Table("grid", [texts_a, texts_b], ["x"] * len(grid), None, list(range(len(grid))))
        features = featurise(table, tokenizer, dictionary, max_len, "grid")
        expected = hf(texts_a, texts_b, truncation="longest_first", max_length=max_len)
        assert [f.tolist() for f in features.items] == expected["input_ids"], max_len
        first_b = [types.index(1) if 1 in types else len(types) for types in expected["token_type_ids"]]
        assert features.segment_a.tolist() == first_b


def test_truncated_lengths_single_and_budget():
    keep, none = truncated_lengths(np.array([0, 5, 9]), None, 6)
    assert keep.tolist() == [0, 5, 6] and none is None
    a, b = truncated_lengths(np.array([10, 2, 7, 7]), np.array([2, 10, 7, 3]), 8)
    assert a.tolist() == [6, 2, 4, 5] and b.tolist() == [2, 6, 4, 3]


# ---------------------------------------------------------------- metrics, by hand and against references

def test_metrics_by_hand_and_degenerate_cases():
    # gold 1 1 1 0 0 0 0 1 ; predicted 1 0 1 0 1 0 0 1: TP 3, FN 1, FP 1, TN 3
    confusion = cm.confusion_matrix([1, 1, 1, 0, 0, 0, 0, 1], [1, 0, 1, 0, 1, 0, 0, 1], 2)
    assert confusion.tolist() == [[3, 1], [1, 3]]
    m = cm.classification_metrics(confusion)
    assert m["accuracy"] == pytest.approx(75.0)
    assert m["f1"] == pytest.approx(100 * 2 * 3 / (2 * 3 + 1 + 1))
    assert m["acc_and_f1"] == pytest.approx((75.0 + 75.0) / 2)  # GLUE's MRPC/QQP score
    assert m["mcc"] == pytest.approx(100 * (3 * 3 - 1 * 1) / np.sqrt(4 * 4 * 4 * 4))
    # everything predicted as one class: MCC 0 (scikit-learn's convention), F1 of the empty class 0
    constant = cm.confusion_matrix([0, 1, 1, 0], [1, 1, 1, 1], 2)
    assert cm.matthews_corrcoef(constant) == 0.0
    assert cm.classification_metrics(constant)["f1"] == pytest.approx(100 * 2 * 2 / (2 * 2 + 2))
    assert cm.f1_per_class(cm.confusion_matrix([1, 1], [1, 1], 2)).tolist() == [0.0, 1.0]
    assert cm.matthews_corrcoef(np.zeros((3, 3))) == 0.0 and cm.accuracy(np.zeros((2, 2))) == 0.0
    assert cm.matthews_corrcoef([[5, 0], [0, 5]]) == 1.0 and cm.matthews_corrcoef([[0, 5], [5, 0]]) == -1.0
    assert cm.pearson([1, 1, 1], [1, 2, 3]) == 0.0 and cm.spearman([2.0], [1.0]) == 0.0


def test_multiclass_mcc_and_f1_equal_sklearn():
    from sklearn.metrics import f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    for k in (2, 3, 7):
        gold = rng.integers(0, k, 500)
        pred = np.where(rng.random(500) < 0.6, gold, rng.integers(0, k, 500))
        confusion = cm.confusion_matrix(gold, pred, k)
        assert cm.matthews_corrcoef(confusion) == pytest.approx(matthews_corrcoef(gold, pred), abs=1e-12)
        assert cm.f1_per_class(confusion) == pytest.approx(f1_score(gold, pred, average=None, labels=range(k)), abs=1e-12)
        if k > 2:  # the unweighted mean over classes, not weighted by their support
            assert cm.classification_metrics(confusion)["macro_f1"] == pytest.approx(
                100 * f1_score(gold, pred, average="macro"), abs=1e-10)


def test_pearson_spearman_equal_scipy_with_ties():
    from scipy.stats import pearsonr, rankdata, spearmanr

    rng = np.random.default_rng(1)
    x = rng.integers(0, 6, 300).astype(float)  # many ties
    y = x + rng.normal(0, 2, 300)
    assert cm.average_ranks(x) == pytest.approx(rankdata(x))
    m = cm.regression_metrics(y, x)
    assert m["pearson"] == pytest.approx(100 * pearsonr(y, x)[0], abs=1e-9)
    assert m["spearman"] == pytest.approx(100 * spearmanr(y, x)[0], abs=1e-9)
    assert m["corr"] == pytest.approx(50 * (pearsonr(y, x)[0] + spearmanr(y, x)[0]), abs=1e-9)  # GLUE's STS-B score
    assert m["mse"] == pytest.approx(np.mean((y - x) ** 2))


def _reduce(logging_outputs_per_step):
    """Feed per-step logging outputs through the criterion into one aggregator, as fairseq's validate does."""
    from fairseq.logging import metrics

    from spanbert_plugin.classification.criterion import SentenceClassificationCriterion

    with metrics.aggregate(new_root=True) as agg:
        for outputs in logging_outputs_per_step:
            with metrics.aggregate():
                SentenceClassificationCriterion.reduce_metrics(outputs)
        return agg.get_smoothed_values()


def test_validation_metrics_are_exact_over_batches():
    """Split metrics from uneven batches (and two 'workers' per step) equal the whole-split metrics."""
    rng = np.random.default_rng(2)
    k, n = 3, 211
    gold = rng.integers(0, k, n)
    pred = np.where(rng.random(n) < 0.5, gold, rng.integers(0, k, n))
    bounds = [0, 1, 8, 50, 51, 130, 211]
    steps = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        mid = (lo + hi) // 2
        steps.append([{"loss": torch.tensor(1.0), "sample_size": b - a, "nsentences": b - a, "ntokens": 10,
                       "confusion": torch.from_numpy(cm.confusion_matrix(gold[a:b], pred[a:b], k))}
                      for a, b in ((lo, mid), (mid, hi))])
    values = _reduce(steps)
    expected = cm.classification_metrics(cm.confusion_matrix(gold, pred, k))
    for name in ("accuracy", "macro_f1", "mcc"):
        assert values[name] == pytest.approx(round(expected[name], 2))
    binary = cm.confusion_matrix(gold % 2, pred % 2, 2)  # a binary task logs GLUE's MRPC/QQP score too
    binary_values = _reduce([[{"loss": torch.tensor(1.0), "sample_size": n, "confusion": torch.from_numpy(binary)}]])
    for name in ("accuracy", "f1", "acc_and_f1", "mcc"):
        assert binary_values[name] == pytest.approx(round(cm.classification_metrics(binary)[name], 2))
    per_batch_mcc = np.mean([cm.matthews_corrcoef(sum(s["confusion"] for s in step).numpy()) for step in steps]) * 100
    assert abs(per_batch_mcc - expected["mcc"]) > 0.5  # averaging batches would have been wrong

    # regression: batches in any order of the split's indices, two "workers" per step
    from spanbert_plugin.classification.criterion import pairs_by_index

    x = rng.normal(size=n)
    y = x + rng.normal(size=n)
    order = torch.from_numpy(rng.permutation(n))
    steps = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        mid = (lo + hi) // 2
        steps.append([{"loss": torch.tensor(0.0), "sample_size": b - a,
                       "regression_pairs": pairs_by_index(order[a:b], torch.from_numpy(x)[order[a:b]],
                                                          torch.from_numpy(y)[order[a:b]], n)}
                      for a, b in ((lo, mid), (mid, hi))])
    values = _reduce(steps)
    expected = cm.regression_metrics(x, y)
    assert values["pearson"] == pytest.approx(round(expected["pearson"], 2))
    assert values["spearman"] == pytest.approx(round(expected["spearman"], 2))
    assert values["corr"] == pytest.approx(round(expected["corr"], 2))
    values = _reduce(steps[:3])  # part of the split (--max-valid-steps): metrics of the examples seen
    seen = order[: bounds[3]].numpy()
    assert values["spearman"] == pytest.approx(round(cm.regression_metrics(x[seen], y[seen])["spearman"], 2))


# ---------------------------------------------------------------- fine-tuning end to end

@pytest.fixture(scope="module")
def sst2_slice(tmp_path_factory):
    """3,000 SST-2 training sentences and the full dev set, with a 2,000-piece WordPiece vocabulary of the slice."""
    require_shared_data("glue")
    from tokenizers import BertWordPieceTokenizer

    from spanbert_plugin.cli.prepare import main as cli_main

    d = tmp_path_factory.mktemp("sst2")
    with open(os.path.join(GLUE, "SST-2", "train.tsv"), encoding="utf-8") as f:
        lines = f.readlines()[:3001]
    (d / "train.tsv").write_text("".join(lines), encoding="utf-8")
    (d / "text.txt").write_text("".join(line.split("\t")[0] + "\n" for line in lines[1:]), encoding="utf-8")
    wp = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    wp.train([str(d / "text.txt")], vocab_size=2000, min_frequency=2, show_progress=False)
    wp.save_model(str(d))
    assert cli_main(["--train", str(d / "text.txt"), "--valid", str(d / "text.txt"), "--destdir", str(d / "tok"),
                     "--tokenizer", "wordpiece", "--wordpiece-vocab", str(d / "vocab.txt")]) == 0
    assert prepare_main(["--train", str(d / "train.tsv"), "--valid", os.path.join(GLUE, "SST-2", "dev.tsv"),
                         "--tokenizer-from", str(d / "tok"), "--destdir", str(d / "cls"), "--text-columns", "sentence",
                         "--label-column", "label", "--max-seq-length", "64"]) == 0
    return str(d / "cls")


def test_sst2_slice_learns_from_random_init(sst2_slice, tmp_path):
    """Two epochs over 3,000 sentences, small random-init encoder: dev accuracy far above the majority class.

    The dev majority class is 444/872 = 50.9%; a classifier that learned nothing stays within a few
    standard errors (sqrt(0.25/872) = 1.7 points) of it, so 60% is more than five standard errors above.
    """
    proc = run_cli([bin_path("fairseq-train"), sst2_slice, *TINY_CLS, "--encoder-layers", "1",
                    "--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2",
                    "--batch-size", "32", "--lr", "2e-3", "--max-epoch", "2", "--save-dir", str(tmp_path / "ck"),
                    "--no-epoch-checkpoints", "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric"])
    records = valid_records(proc.stdout + proc.stderr)
    assert len(records) == 2
    assert max(float(r["valid_accuracy"]) for r in records) > 60.0
    assert {"valid_f1", "valid_mcc"} <= set(records[-1])
    # the best checkpoint was chosen by accuracy
    assert float(records[-1]["valid_best_accuracy"]) == max(float(r["valid_accuracy"]) for r in records)


def _corpus_examples(corpus_file, n, offset=0):
    """(text, 3-class label by length, regression target) from corpus lines."""
    with open(corpus_file, encoding="utf-8") as f:
        lines = [" ".join(line.split()) for line in f if line.strip()][offset: offset + n]
    return [(line, ("short", "medium", "long")[min(len(line.split()) // 8, 2)], len(line.split()) / 10) for line in lines]


def _write_jsonl(path, examples, regression=False):
    with open(path, "w", encoding="utf-8") as f:
        for i, (text, label, value) in enumerate(examples):
            f.write(json.dumps({"uid": f"ex{i}", "text": text, "label": value if regression else label}) + "\n")


def test_classification_head_with_another_class_count_starts_fresh(spm_data, caplog):
    """--finetune-from-model of a 3-class checkpoint into a 2-class task: the encoder loads, the head is re-created."""
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    dictionary = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    torch.manual_seed(0)
    trained = tiny_spanbert(dictionary, dim=64)
    trained.register_classification_head("sentence_classification_head", num_classes=3)
    trained.register_classification_head("other_head", num_classes=4)
    model = tiny_spanbert(dictionary, dim=64)
    model.register_classification_head("sentence_classification_head", num_classes=2)
    fresh = {k: v.clone() for k, v in model.classification_heads.state_dict().items()}
    with caplog.at_level("WARNING"):
        model.load_state_dict(trained.state_dict())
    assert "outputs 3, this model's 2" in caplog.text
    head = model.classification_heads["sentence_classification_head"]
    assert head.out_proj.weight.shape == (2, 64)
    for key, value in head.state_dict().items():  # fresh weights kept, not the checkpoint's
        assert torch.equal(value, fresh[f"sentence_classification_head.{key}"]), key
    assert torch.equal(model.encoder.embeddings.word_embeddings.weight, trained.encoder.embeddings.word_embeddings.weight)
    # a head the task did not register is taken from the checkpoint as it is
    assert torch.equal(model.classification_heads["other_head"].out_proj.weight,
                       trained.classification_heads["other_head"].out_proj.weight)
    # the same shape loads the checkpoint's head, silently
    caplog.clear()
    again = tiny_spanbert(dictionary, dim=64)
    again.register_classification_head("sentence_classification_head", num_classes=3)
    again.load_state_dict(trained.state_dict())
    assert torch.equal(again.classification_heads["sentence_classification_head"].out_proj.weight,
                       trained.classification_heads["sentence_classification_head"].out_proj.weight)
    assert "outputs" not in caplog.text


def _last_checkpoint_state(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def test_finetune_from_pretrained_checkpoint_then_predict_equals_validation(spm_data, corpus_files, tmp_path):
    from test_pretrain import TINY

    run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "4", "--save-dir", str(tmp_path / "pt")])
    _write_jsonl(tmp_path / "train.jsonl", _corpus_examples(corpus_files[0], 96))
    _write_jsonl(tmp_path / "valid.jsonl", _corpus_examples(corpus_files[1], 37))  # 37: uneven last batch
    with open(tmp_path / "test.jsonl", "w", encoding="utf-8") as f:  # unlabelled, as GLUE's test files
        f.writelines(json.dumps({"uid": f"t{i}", "text": text}) + "\n" for i, (text, _, _) in
                     enumerate(_corpus_examples(corpus_files[1], 5, offset=40)))
    cls = str(tmp_path / "cls")
    assert prepare_main(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "valid.jsonl"),
                         "--test", str(tmp_path / "test.jsonl"), "--tokenizer-from", spm_data, "--destdir", cls,
                         "--text-columns", "text", "--label-column", "label", "--id-column", "uid",
                         "--max-seq-length", "48"]) == 0
    with open(os.path.join(spm_data, "dict.txt")) as a, open(os.path.join(cls, "dict.txt")) as b:
        assert a.read() == b.read()  # the task's dictionary is the checkpoint's
    pretrained = str(tmp_path / "pt" / "checkpoint_last.pt")
    proc = run_cli([bin_path("fairseq-train"), cls, *TINY_CLS, "--finetune-from-model", pretrained,
                    "--batch-size", "8", "--batch-size-valid", "5", "--lr", "1e-5", "--max-update", "3",
                    "--save-dir", str(tmp_path / "ft"), "--no-epoch-checkpoints"])
    before, after = _last_checkpoint_state(pretrained), _last_checkpoint_state(str(tmp_path / "ft" / "checkpoint_last.pt"))
    encoder = [k for k in before if k.startswith("encoder.")]
    assert encoder and max((after[k] - before[k]).abs().max().item() for k in encoder) < 1e-3  # 3 Adam steps of 1e-5
    assert after["classification_heads.sentence_classification_head.out_proj.weight"].shape[0] == 3
    valid = valid_records(proc.stdout + proc.stderr)[-1]

    out = tmp_path / "pred"
    run_cli([bin_path("spanbert-predict-classification"), "--checkpoint", str(tmp_path / "ft" / "checkpoint_last.pt"),
             "--out", str(out), "--batch-size", "16"])
    scores = json.load(open(out / "eval.json"))
    assert scores["examples"] == 37 and scores["labels"] == ["long", "medium", "short"]
    for name in ("accuracy", "macro_f1", "mcc"):
        assert float(valid[f"valid_{name}"]) == pytest.approx(scores[name], abs=0.006)
    records = [json.loads(line) for line in open(out / "predictions.jsonl")]
    assert [r["id"] for r in records] == [f"ex{i}" for i in range(37)] and [r["index"] for r in records] == list(range(37))
    assert all(abs(sum(r["probabilities"].values()) - 1) < 1e-4 and r["label"] in r["probabilities"] for r in records)
    assert sum(r["label"] == r["gold"] for r in records) == pytest.approx(scores["accuracy"] * 37 / 100)
    # hub.classify on the raw texts: the command's predictions, texts over --max-seq-length cut as it cuts them
    from spanbert_plugin.model.spanbert import SpanBertModel

    assert json.load(open(os.path.join(cls, "prepare_stats.json")))["valid"]["truncated"] > 0
    hub = SpanBertModel.from_pretrained(str(tmp_path / "ft"), "checkpoint_last.pt")
    for (text, _, _), record in zip(_corpus_examples(corpus_files[1], 37), records):
        predicted = hub.classify(text)
        assert predicted["label"] == record["label"]
        assert predicted["probabilities"] == pytest.approx(record["probabilities"], abs=1e-5)
    with pytest.raises(ValueError, match="not fine-tuned with --task sentence_classification"):
        SpanBertModel.from_pretrained(str(tmp_path / "pt"), "checkpoint_last.pt").classify("a text")

    from spanbert_plugin.classification.predict import predict_split

    scores = predict_split(str(tmp_path / "ft" / "checkpoint_last.pt"), None, "test", str(tmp_path / "test_pred"))
    assert scores == {"split": "test", "examples": 5, "labelled": False}
    records = [json.loads(line) for line in open(tmp_path / "test_pred" / "predictions.jsonl")]
    assert [r["id"] for r in records] == [f"t{i}" for i in range(5)] and not any("gold" in r for r in records)
    tsv = open(tmp_path / "test_pred" / "predictions.tsv", encoding="utf-8").read().splitlines()  # a GLUE submission's rows
    assert tsv == ["index\tprediction", *(f"{r['index']}\t{r['label']}" for r in records)]

    # data prepared with other labels (here only two of the three) are refused, in one line, nothing written
    _write_jsonl(tmp_path / "two.jsonl", [e for e in _corpus_examples(corpus_files[0], 96) if e[1] != "medium"])
    two = str(tmp_path / "two")
    assert prepare_main(["--train", str(tmp_path / "two.jsonl"), "--valid", str(tmp_path / "two.jsonl"),
                         "--tokenizer-from", spm_data, "--destdir", two, "--text-columns", "text",
                         "--label-column", "label", "--max-seq-length", "48"]) == 0
    proc = run_cli([bin_path("spanbert-predict-classification"), "--checkpoint", str(tmp_path / "ft" / "checkpoint_last.pt"),
                    "--data", two, "--out", str(tmp_path / "refused")], check=False)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert re.search(r"error: --data \S*two: labels \['long', 'short'\] differ from the checkpoint's "
                     r"\['long', 'medium', 'short'\]", proc.stderr), proc.stderr
    assert not (tmp_path / "refused").exists()


def test_regression_correlations_over_two_workers_equal_prediction(spm_data, corpus_files, tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", _corpus_examples(corpus_files[0], 64), regression=True)
    _write_jsonl(tmp_path / "valid.jsonl", _corpus_examples(corpus_files[1], 29), regression=True)
    cls = str(tmp_path / "cls")
    assert prepare_main(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "valid.jsonl"),
                         "--tokenizer-from", spm_data, "--destdir", cls, "--text-columns", "text",
                         "--label-column", "label", "--regression", "--max-seq-length", "48"]) == 0
    # two gloo workers: each validates part of the split; the correlations must be those of the whole split
    outputs = run_gloo_ranks(lambda rank: [
        bin_path("fairseq-train"), cls, *TINY_CLS, "--batch-size", "8", "--batch-size-valid", "6",
        "--lr", "1e-3", "--max-update", "4", "--save-dir", str(tmp_path / "ck"), "--no-epoch-checkpoints",
        "--best-checkpoint-metric", "spearman", "--maximize-best-checkpoint-metric"])
    valid = valid_records(outputs[0])[-1]
    run_cli([bin_path("spanbert-predict-classification"), "--checkpoint", str(tmp_path / "ck" / "checkpoint_last.pt"),
             "--out", str(tmp_path / "pred")])
    scores = json.load(open(tmp_path / "pred" / "eval.json"))
    for name in ("pearson", "spearman", "corr"):
        assert float(valid[f"valid_{name}"]) == pytest.approx(scores[name], abs=0.006)
    assert float(valid["valid_loss"]) == pytest.approx(scores["mse"], rel=1e-3, abs=1e-4)
    records = [json.loads(line) for line in open(tmp_path / "pred" / "predictions.jsonl")]
    assert len(records) == 29 and all(isinstance(r["value"], float) for r in records)


def test_every_example_is_batched(wordpiece_data, corpus_files, tmp_path):
    from spanbert_plugin.classification.dataset import ClassificationDataset
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    _write_jsonl(tmp_path / "d.jsonl", _corpus_examples(corpus_files[0], 37))
    dest = str(tmp_path / "cls")
    assert prepare_main(["--train", str(tmp_path / "d.jsonl"), "--valid", str(tmp_path / "d.jsonl"), "--tokenizer-from",
                         wordpiece_data, "--destdir", dest, "--text-columns", "text", "--label-column", "label"]) == 0
    dataset = ClassificationDataset.load(dest, "valid", SpanBertDictionary.load(os.path.join(dest, "dict.txt")))
    indices = dataset.ordered_indices()
    for max_sentences, multiple in ((5, 8), (16, 8), (10, 3)):
        batches = dataset.batch_by_size(indices, max_sentences=max_sentences, required_batch_size_multiple=multiple)
        assert sorted(np.concatenate(batches).tolist()) == list(range(37))
    from spanbert_plugin.core.errors import UsageError

    with pytest.raises(UsageError, match="--max-tokens 3: an example is longer"):  # fairseq asserts
        dataset.batch_by_size(indices, max_tokens=3)


# ---------------------------------------------------------------- formats and bad input

def test_tsv_csv_jsonl_and_indices_give_the_same_data(wordpiece_data, tmp_path):
    rows = [("A first, short one", "pos"), ('Quotes " stay', "neg"), ("Third text", "pos")]
    (tmp_path / "d.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")
    (tmp_path / "noheader.tsv").write_text("".join(f"x\t{y}\t{t}\n" for t, y in rows), encoding="utf-8")
    (tmp_path / "d.csv").write_text("label,text\n" + "".join(f'{y},"{t.replace(chr(34), 2 * chr(34))}"\n' for t, y in rows),
                                    encoding="utf-8")
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t, "label": y}) + "\n\n" for t, y in rows), encoding="utf-8")
    outputs = []
    for name, text, label in (("d.tsv", "text", "label"), ("noheader.tsv", "2", "1"), ("d.csv", "text", "label"),
                              ("d.jsonl", "text", "label")):
        dest = tmp_path / ("out_" + name.replace(".", "_"))
        assert prepare_main(["--train", str(tmp_path / name), "--valid", str(tmp_path / name), "--tokenizer-from",
                             wordpiece_data, "--destdir", str(dest), "--text-columns", text, "--label-column", label]) == 0
        outputs.append((open(dest / "train.bin", "rb").read(), np.load(dest / "train.labels.npy").tolist()))
    assert all(o == outputs[0] for o in outputs) and outputs[0][1] == [1, 0, 1]


@pytest.mark.parametrize("train, valid", [
    ("a\tneutral\nb\tgood\nc\tbad\nd\tgood\n", "a\tneutral\nb\tgood\n"),  # valid: train's first lines
    ("a\tpositive\nb\tnegative\n", "c\tnegative\n"),  # words only: no word stands out among numeric labels
])
def test_a_rare_first_class_without_a_headers_evidence_is_a_warning(wordpiece_data, tmp_path, capsys, train, valid):
    (tmp_path / "train.tsv").write_text(train, encoding="utf-8")
    (tmp_path / "valid.tsv").write_text(valid, encoding="utf-8")
    assert prepare_main(["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "valid.tsv"),
                         "--tokenizer-from", wordpiece_data, "--destdir", str(tmp_path / "out"), "--text-columns", "0",
                         "--label-column", "1"]) == 0
    assert "train.tsv:1: label" in capsys.readouterr().err


def test_integer_labels_sort_numerically_and_header_yes_no(wordpiece_data, tmp_path, capsys):
    rows = [("first text", "10"), ("second text", "2"), ("third text", "1"), ("fourth text", "2")]
    body = "".join(f"{t}\t{y}\n" for t, y in rows)
    (tmp_path / "plain.tsv").write_text(body, encoding="utf-8")
    (tmp_path / "named.tsv").write_text("sentence\tlabel\n" + body, encoding="utf-8")

    def prepare(name, header):
        dest = tmp_path / f"out_{name}_{header}"
        assert prepare_main(["--train", str(tmp_path / name), "--valid", str(tmp_path / name), "--tokenizer-from",
                             wordpiece_data, "--destdir", str(dest), "--text-columns", "0", "--label-column", "1",
                             "--header", header, "--force"]) == 0
        meta = json.load(open(dest / "classification.json"))
        return meta["labels"], np.load(dest / "train.labels.npy").tolist()

    # all labels integers: 1 < 2 < 10 (as strings "10" would sort before "2"); the second label is positive
    assert prepare("plain.tsv", "no") == (["1", "2", "10"], [2, 1, 0, 1])
    capsys.readouterr()
    assert prepare("plain.tsv", "auto") == prepare("plain.tsv", "no")  # columns by index: no header line
    # its first class occurs only there, as a header's label would: a warning, since a rare class may come first
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and warned[0].endswith("plain.tsv:1: label '10' occurs in no other row of the training "
                                                   "and validation files; if it is a header line, pass --header yes")
    # a word among numeric labels, once, first: a header line, refused in one line
    assert prepare_main(["--train", str(tmp_path / "named.tsv"), "--valid", str(tmp_path / "named.tsv"),
                         "--tokenizer-from", wordpiece_data, "--destdir", str(tmp_path / "refused"), "--text-columns",
                         "0", "--label-column", "1"]) == 1
    assert "named.tsv:1: label 'label' occurs in no other row" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
    assert prepare("named.tsv", "yes") == (["1", "2", "10"], [2, 1, 0, 1])  # the first line is skipped
    # --header no reads that line as data: "label" is a label, so the labels sort as strings
    assert prepare("named.tsv", "no") == (["1", "10", "2", "label"], [3, 1, 2, 0, 2])


BAD_INPUTS = {
    "missing label column": ("sentence\tlabel\na\t0\n", "sentence\tlabel\nb\t1\n", ["sentence", "lbl"],
                             r"train\.tsv:1: --label-column 'lbl' is not a column"),
    "missing text column": ("sentence\tlabel\na\t0\n", "sentence\tlabel\nb\t1\n", ["sentence,other", "label"],
                            r"train\.tsv:1: --text-columns 'other' is not a column"),
    "index out of range": ("a\t0\n", "b\t1\n", ["4", "1"], r"train\.tsv: --text-columns 4 does not exist"),
    "wrong field count": ("sentence\tlabel\na\t0\nb\t1\textra\n", "sentence\tlabel\nb\t1\n", ["sentence", "label"],
                          r"train\.tsv:3: 3 fields, expected 2"),
    "empty file": ("", "sentence\tlabel\nb\t1\n", ["sentence", "label"], r"train\.tsv: file is empty"),
    "header only": ("sentence\tlabel\n", "sentence\tlabel\nb\t1\n", ["sentence", "label"], r"train\.tsv: no data rows"),
    "unseen label": ("sentence\tlabel\na\t0\nb\t1\n", "sentence\tlabel\nb\t1\nc\t2\n", ["sentence", "label"],
                     r"valid\.tsv:3: label '2' does not occur in the training file"),
    "empty label": ("sentence\tlabel\na\t0\nb\t \n", "sentence\tlabel\nb\t1\n", ["sentence", "label"],
                    r"train\.tsv:3: empty label"),
    "header line read as a row": ("sentence\tlabel\na\t0\nb\t1\n", "sentence\tlabel\nb\t1\n", ["0", "1"],
                                  r"train\.tsv:1: label 'label' occurs in no other row of the training and validation "
                                  r"files: a header line\? Pass --header yes"),
    "one class": ("sentence\tlabel\na\t0\nb\t0\n", "sentence\tlabel\nb\t0\n", ["sentence", "label"],
                  r"train\.tsv: every example has the label '0'; a classifier needs at least two classes"),
    "regression non-number": ("sentence\tlabel\na\t0.5\nb\tx\n", "sentence\tlabel\nb\t1\n", ["sentence", "label", "--regression"],
                              r"train\.tsv:3: --regression needs a number"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_error_and_writes_nothing(case, wordpiece_data, tmp_path, capsys):
    train, valid, (text, label, *extra), message = BAD_INPUTS[case]
    (tmp_path / "train.tsv").write_text(train, encoding="utf-8")
    (tmp_path / "valid.tsv").write_text(valid, encoding="utf-8")
    dest = tmp_path / "out"
    status = prepare_main(["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "valid.tsv"),
                           "--tokenizer-from", wordpiece_data, "--destdir", str(dest), "--text-columns", text,
                           "--label-column", label, *extra])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("spanbert-prepare-classification: error: ") and re.search(message, err), err
    assert sorted(os.listdir(tmp_path)) == ["train.tsv", "valid.tsv"]  # no output, no temporary folder


@pytest.mark.parametrize("edit, message", [
    ({"num_classes": 5}, "num_classes 5 does not match its 2 labels"),
    ({"num_classes": 2.0}, "num_classes 2.0 does not match its 2 labels"),
    ({"labels": "negative"}, "labels must list the class names, found 'negative'"),
    ({"regression": "no"}, "regression must be true or false, found 'no'"),
])
def test_a_hand_edited_classification_json_whose_head_and_labels_disagree_is_one_line(wordpiece_data, tmp_path, edit,
                                                                                      message):
    """num_classes 5 with two labels trained a 5-way head whose three classes no label names, without a word."""
    from spanbert_plugin.classification.prepare import read_meta
    from spanbert_plugin.core.errors import UsageError

    (tmp_path / "train.tsv").write_text("sentence\tlabel\na\t0\nb\t1\n", encoding="utf-8")
    dest = tmp_path / "out"
    assert prepare_main(["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "train.tsv"),
                         "--tokenizer-from", wordpiece_data, "--destdir", str(dest), "--text-columns", "sentence",
                         "--label-column", "label"]) == 0
    assert read_meta(str(dest))["labels"] == ["0", "1"]
    meta = json.loads((dest / "classification.json").read_text(encoding="utf-8"))
    (dest / "classification.json").write_text(json.dumps({**meta, **edit}), encoding="utf-8")
    with pytest.raises(UsageError, match=re.escape(f"{dest / 'classification.json'}: {message}")):
        read_meta(str(dest))


def test_bad_jsonl_and_existing_destination(wordpiece_data, tmp_path, capsys):
    (tmp_path / "t.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n', encoding="utf-8")
    args = ["--train", str(tmp_path / "t.jsonl"), "--valid", str(tmp_path / "t.jsonl"), "--tokenizer-from", wordpiece_data,
            "--text-columns", "text", "--label-column", "label"]
    assert prepare_main([*args, "--destdir", str(tmp_path / "out")]) == 1
    assert re.search(r"t\.jsonl:2: --label-column 'label' is not a key", capsys.readouterr().err)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's", encoding="utf-8")
    (tmp_path / "t.jsonl").write_text('{"text": "a", "label": "x"}\n', encoding="utf-8")
    assert prepare_main([*args, "--destdir", str(tmp_path / "mine")]) == 1
    assert "exists" in capsys.readouterr().err and os.listdir(tmp_path / "mine") == ["notes.txt"]


def test_glue_test_files_of_their_own_layout(wordpiece_data, tmp_path):
    """GLUE's test files differ from train and dev: CoLA's train/dev have no header and 4 columns, its test file a
    header 'index sentence'; MRPC's test file has 'index' where train has 'Quality' (read by index 0, the recipe took
    the indices for labels). --test-text-columns reads the test file by its own columns, without labels."""
    cola_rows = [("gj04", "1", "", 'The "cat" sat on the mat .'), ("gj04", "0", "*", "Cat the mat on sat ."),
                 ("gj04", "1", "", "Bill ran home ."), ("gj04", "0", "*", 'Home ran " Bill .')]
    for split in ("train", "dev"):
        (tmp_path / f"cola_{split}.tsv").write_text("".join("\t".join(r) + "\n" for r in cola_rows), encoding="utf-8")
    (tmp_path / "cola_test.tsv").write_text('index\tsentence\n0\tThe "dog" sat .\n1\tRan dog the .\n', encoding="utf-8")
    out = tmp_path / "cola"
    assert prepare_main(["--train", str(tmp_path / "cola_train.tsv"), "--valid", str(tmp_path / "cola_dev.tsv"),
                         "--test", str(tmp_path / "cola_test.tsv"), "--tokenizer-from", wordpiece_data, "--destdir",
                         str(out), "--text-columns", "3", "--label-column", "1", "--header", "no",
                         "--test-text-columns", "sentence"]) == 0
    assert np.load(out / "test.labels.npy").tolist() == [-1, -1]
    items = MMapIndexedDataset(str(out / "test"))
    from spanbert_plugin.core.finetune_io import load_tokenizer_folder

    tokenizer, dictionary = load_tokenizer_folder(wordpiece_data)
    for item, text in zip(items, ('The "dog" sat .', "Ran dog the .")):  # the sentence column, quotes kept as text
        assert item.tolist() == [dictionary.bos(), *tokenizer.encode(text).ids.tolist(), dictionary.eos()]
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    pairs = [("1", "1", "2", "He said \"yes\" .", "He agreed ."), ("0", "3", "4", "It rained .", "The sun shone .")]
    for split in ("train", "dev"):
        (tmp_path / f"mrpc_{split}.tsv").write_text(header + "".join("\t".join(r) + "\n" for r in pairs), encoding="utf-8")
    (tmp_path / "mrpc_test.tsv").write_text("index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                           "0\t5\t6\tIt snowed .\tIt was cold .\n", encoding="utf-8")
    out = tmp_path / "mrpc"  # the recipe's names: the test file has no Quality column and is read unlabelled
    assert prepare_main(["--train", str(tmp_path / "mrpc_train.tsv"), "--valid", str(tmp_path / "mrpc_dev.tsv"),
                         "--test", str(tmp_path / "mrpc_test.tsv"), "--tokenizer-from", wordpiece_data, "--destdir",
                         str(out), "--text-columns", "#1 String,#2 String", "--label-column", "Quality"]) == 0
    assert np.load(out / "test.labels.npy").tolist() == [-1]


def test_qqp_rows_split_by_a_line_break_are_skipped_when_asked(wordpiece_data, tmp_path, capsys):
    """GLUE's QQP train.tsv and dev.tsv hold questions with a line break, which split their row in two lines of too
    few fields: run_glue.py skips them (its count, 363,846, is without them); the plugin refused the file.
    --skip-malformed-rows drops them from train and valid with a warning and a count, never from the test file."""
    header = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
    good = ["1\t1\t2\tHow do I cook rice?\tWhat is the way to cook rice?\t1",
            "2\t3\t4\tWhy is the sky blue?\tWho won the cup?\t0",
            "3\t5\t6\tWhat is a prime?\tHow do I learn Go?\t0"]
    split = ["4\t7\t8\tWas Muhammad a real", "\thistorical figure?\t0"]  # lines 3 and 4
    (tmp_path / "train.tsv").write_text(header + "\n".join([good[0], *split, *good[1:]]) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text(header + "\n".join(good) + "\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("id\tquestion1\tquestion2\n0\tA?\tB?\n1\tC?\n", encoding="utf-8")
    args = ["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "dev.tsv"), "--tokenizer-from",
            wordpiece_data, "--text-columns", "question1,question2", "--label-column", "is_duplicate"]
    assert prepare_main([*args, "--destdir", str(tmp_path / "refused")]) == 1
    assert capsys.readouterr().err.strip().endswith(
        "train.tsv:3: 4 fields, expected 6 (--skip-malformed-rows drops such rows from train and valid)")
    assert prepare_main([*args, "--destdir", str(tmp_path / "out"), "--skip-malformed-rows"]) == 0
    assert "train.tsv: skipped 2 row(s) without 6 fields (lines 3, 4)" in capsys.readouterr().err
    stats = json.load(open(tmp_path / "out" / "prepare_stats.json"))
    assert (stats["train"]["malformed_rows_skipped"], stats["valid"]["malformed_rows_skipped"]) == (2, 0)
    assert np.load(tmp_path / "out" / "train.labels.npy").tolist() == [1, 0, 0]
    assert prepare_main([*args, "--destdir", str(tmp_path / "with_test"), "--skip-malformed-rows", "--test",
                         str(tmp_path / "test.tsv"), "--test-text-columns", "question1,question2"]) == 1
    assert re.search(r"test\.tsv:3: 2 fields, expected 3", capsys.readouterr().err)  # test rows keep GLUE's index
    # a split left without rows is one line; without a header the usual width counts, not the first row's
    (tmp_path / "broken.tsv").write_text(header + "\n".join(split) + "\n", encoding="utf-8")
    assert prepare_main([*args[:2], "--valid", str(tmp_path / "broken.tsv"), *args[4:], "--destdir",
                         str(tmp_path / "empty"), "--skip-malformed-rows"]) == 1
    assert capsys.readouterr().err.strip().endswith("broken.tsv: every data row has another number of fields than the "
                                                    "header's 6 (--skip-malformed-rows would leave none)")
    rows = "".join(f"{line}\n" for line in [*split, *good])  # no header: its first line is a split one
    (tmp_path / "plain.tsv").write_text(rows, encoding="utf-8")
    assert prepare_main(["--train", str(tmp_path / "plain.tsv"), "--valid", str(tmp_path / "plain.tsv"),
                         "--tokenizer-from", wordpiece_data, "--text-columns", "3,4", "--label-column", "5",
                         "--destdir", str(tmp_path / "plain"), "--skip-malformed-rows"]) == 0
    assert np.load(tmp_path / "plain" / "train.labels.npy").tolist() == [1, 0, 0]
    assert prepare_main([*args[:2], "--valid", str(tmp_path / "dev.tsv"), str(tmp_path / "dev.tsv"), *args[4:],
                         "--destdir", str(tmp_path / "twice")]) == 1
    assert capsys.readouterr().err.strip().endswith("dev.tsv: given twice (each file is a split of its own)")


def test_mnli_matched_mismatched_and_diagnostic_sets_in_one_folder(wordpiece_data, tmp_path):
    """MNLI is scored on dev_matched and dev_mismatched, and a GLUE submission holds MNLI-m, MNLI-mm and AX (the
    diagnostic set, predicted by the MNLI model): several --valid and --test files are the splits valid, valid_1 and
    test, test_1, test_2 (a second --test kept only the last before)."""
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"

    def labelled(rows):
        return header + "".join(f"{i}\t1\t1n\tfiction\t{a}\t{b}\t{y}\t{y}\n" for i, (a, b, y) in enumerate(rows))

    rows = [("A man sleeps .", "Someone rests .", "entailment"), ("A dog runs .", "A cat sits .", "contradiction"),
            ("It rains .", "It may snow .", "neutral")]
    (tmp_path / "train.tsv").write_text(labelled(rows), encoding="utf-8")
    (tmp_path / "dev_matched.tsv").write_text(labelled(rows[:2]), encoding="utf-8")
    (tmp_path / "dev_mismatched.tsv").write_text(labelled(rows[1:]), encoding="utf-8")
    test_header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\n"
    (tmp_path / "test_matched.tsv").write_text(test_header + "0\t2\t2n\tfiction\tA b .\tC d .\n", encoding="utf-8")
    (tmp_path / "test_mismatched.tsv").write_text(test_header + "0\t3\t3n\tletters\tE f .\tG h .\n"
                                                  "1\t4\t4n\tletters\tI j .\tK l .\n", encoding="utf-8")
    (tmp_path / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tM n .\tO p .\n", encoding="utf-8")
    out = tmp_path / "mnli"
    assert prepare_main(["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "dev_matched.tsv"),
                         str(tmp_path / "dev_mismatched.tsv"), "--test", str(tmp_path / "test_matched.tsv"),
                         str(tmp_path / "test_mismatched.tsv"), "--test", str(tmp_path / "diagnostic.tsv"),
                         "--tokenizer-from", wordpiece_data, "--destdir", str(out),
                         "--text-columns", "sentence1,sentence2", "--label-column", "gold_label"]) == 0
    meta = json.load(open(out / "classification.json"))
    assert {split: (os.path.basename(m["source"]), m["examples"], m["labelled"]) for split, m in meta["splits"].items()} == {
        "train": ("train.tsv", 3, True), "valid": ("dev_matched.tsv", 2, True), "valid_1": ("dev_mismatched.tsv", 2, True),
        "test": ("test_matched.tsv", 1, False), "test_1": ("test_mismatched.tsv", 2, False),
        "test_2": ("diagnostic.tsv", 1, False)}
    assert meta["labels"] == ["contradiction", "entailment", "neutral"]  # run_glue.py's MNLI order
    assert np.load(out / "valid_1.labels.npy").tolist() == [0, 2]
    # fairseq-train validates on both (a split named valid1 stopped it: its .npy files looked like other subsets)
    trained = run_cli([bin_path("fairseq-train"), str(out), "--user-dir", "user_dir", "--task", "sentence_classification",
                       "--criterion", "sentence_classification", "--arch", "spanbert_tiny", "--optimizer", "adam",
                       "--lr", "1e-4", "--batch-size", "2", "--max-update", "1", "--cpu", "--num-workers", "0",
                       "--save-dir", str(tmp_path / "ck"), "--no-save", "--valid-subset", "valid,valid_1"])
    assert all(f"valid on '{split}' subset" in trained.stdout + trained.stderr for split in ("valid", "valid_1"))


@pytest.mark.parametrize("regression", [False, True])
def test_a_test_split_exported_by_hf_datasets_with_label_minus_one_is_unlabelled(regression, wordpiece_data, tmp_path,
                                                                                 capsys):
    """datasets marks a split without labels as label -1: classification refused it ('-1' is no class), and
    regression took -1.0 as every gold value (a meaningless Pearson of 0, 'labelled': true)."""
    labels = ["0.5", "3.2", "4.0", "1.5"] if regression else ["0", "1", "1", "0"]
    rows = [{"sentence": f"the {w} text", "label": label} for w, label in zip(["first", "second", "third", "fourth"],
                                                                               labels)]
    _write_jsonl(tmp_path / "train.jsonl", [(r["sentence"], r["label"], None) for r in rows])
    with open(tmp_path / "test.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": f"a test {i}", "label": -1}) + "\n" for i in range(3))
    out = tmp_path / "prepared"
    assert prepare_main(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "train.jsonl"),
                         "--test", str(tmp_path / "test.jsonl"), "--tokenizer-from", wordpiece_data, "--destdir",
                         str(out), "--text-columns", "text", "--label-column", "label",
                         *(["--regression"] if regression else [])]) == 0
    assert "every label is -1" in capsys.readouterr().err
    test_labels = np.load(out / "test.labels.npy")
    assert (np.isnan(test_labels).all() if regression else (test_labels == -1).all()) and len(test_labels) == 3


def test_the_classification_loss_is_summed_over_examples():
    """fairseq divides the gradients by sample_size, so the criterion returns the sum: 4 examples at uniform logits
    over 2 classes lose 4 ln 2, and sample_size is 4."""
    import math

    from spanbert_plugin.classification.criterion import SentenceClassificationCriterion

    task = SimpleNamespace(cfg=SimpleNamespace(classification_head_name="head"), regression=False, num_classes=2)
    criterion = SentenceClassificationCriterion(None, task)
    loss, sample_size, _ = criterion(lambda **kwargs: (torch.zeros(4, 2), None),
                                     {"net_input": {}, "target": torch.tensor([0, 1, 1, 0]), "ntokens": 10})
    assert sample_size == 4 and loss.item() == pytest.approx(4 * math.log(2))


def test_classification_a_pair_that_fits_exactly_is_not_counted_as_truncated():
    """max_seq_length 7 leaves 4 tokens beside [CLS] [SEP] [SEP]: a 2 + 2-token pair fits exactly (not truncated),
    a 2 + 3-token pair loses one token of the longer text."""
    from spanbert_plugin.classification.prepare import Table, featurise

    tokenizer, dictionary = bert_uncased_tokenizer()
    table = Table("t.tsv", [["the river", "the river"], ["old city", "old big city"]], ["0", "1"], None, [1, 2])
    features = featurise(table, tokenizer, dictionary, 7, "train")
    assert [len(item) for item in features.items] == [7, 7]
    assert features.stats["truncated"] == 1 and features.stats["tokens_removed"] == 1


def test_regression_records_write_each_examples_value_and_gold():
    """predictions.jsonl of a regression split: the model's value of each example (not an argmax over one output),
    its gold value where labelled."""
    from spanbert_plugin.classification.predict import prediction_records

    task = SimpleNamespace(regression=True, labels=None)
    outputs = np.array([[2.5], [-1.25], [0.75]])
    gold = np.array([1.0, np.nan, 3.5])
    records = list(prediction_records(task, outputs, gold, ["a", "b", "c"]))
    assert records == [{"index": 0, "id": "a", "value": 2.5, "gold": 1.0},
                       {"index": 1, "id": "b", "value": -1.25},
                       {"index": 2, "id": "c", "value": 0.75, "gold": 3.5}]


def test_hub_classify_truncates_a_pair_longest_first_to_max_seq_length():
    """max_seq_length 10, pair: 3 special tokens, so 7 text tokens; A has 3, B 8: B (the longer) is cut to 4."""
    from spanbert_plugin.classification.hub import hub_classify
    from spanbert_plugin.classification.task import SentenceClassificationTask

    task = object.__new__(SentenceClassificationTask)  # only what hub.classify reads
    task.meta, task.regression, task.labels = {"max_seq_length": 10}, False, ["neg", "pos"]
    task.cfg = SimpleNamespace(classification_head_name="head")
    given = []

    def predict(head, tokens):
        given.append((head, tokens.tolist()))
        return torch.log(torch.tensor([[0.25, 0.75]]))

    hub = SimpleNamespace(
        task=task, predict=predict,
        tokenizer=SimpleNamespace(encode=lambda t: SimpleNamespace(ids=np.array([ord(w) for w in t.split()]))),
        dictionary=SimpleNamespace(bos=lambda: 1, eos=lambda: 2))
    result = hub_classify(hub, "a b c", "d e f g h i j k")
    # [CLS] a b c [SEP] d e f g [SEP]
    assert given == [("head", [1, 97, 98, 99, 2, 100, 101, 102, 103, 2])]
    assert result["label"] == "pos" and result["probabilities"] == pytest.approx({"neg": 0.25, "pos": 0.75})


def test_other_labels_are_refused_after_loading_when_the_training_folder_is_gone(tmp_path, monkeypatch):
    """With the training folder gone (``_check_same_labels`` cannot read it), the labels the checkpoint saved, which
    loading puts in the task's state, are compared with the --data folder's: other labels are one line."""
    from spanbert_plugin.classification import predict
    from spanbert_plugin.core.errors import UsageError

    def loaded(saved, data_labels):
        task = SimpleNamespace(state=SimpleNamespace(labels=saved), labels=data_labels)
        cfg = SimpleNamespace(task=SimpleNamespace(data=str(tmp_path / "data")))
        monkeypatch.setattr(predict, "load_finetuned_checkpoint", lambda *args, **kwargs: ("model", task, cfg))
        return predict.load_classifier("ck.pt", str(tmp_path / "data"))

    assert loaded(["neg", "pos"], ["neg", "pos"])[0] == "model"
    with pytest.raises(UsageError, match=r"labels \['neg', 'neutral', 'pos'\] differ from the checkpoint's "
                                         r"\['neg', 'pos'\]"):
        loaded(["neg", "pos"], ["neg", "neutral", "pos"])


def test_prediction_data_prepared_with_the_training_labels_is_accepted_and_other_labels_refused(tmp_path):
    """The check spanbert-predict-classification makes while the training folder still exists, before any model is
    built: the same labels (in the same order) pass, any other list is one line naming --data."""
    from spanbert_plugin.classification.predict import _check_same_labels
    from spanbert_plugin.core.errors import UsageError

    def folder(name, labels):
        os.makedirs(tmp_path / name)
        meta = {"regression": False, "labels": labels, "num_classes": len(labels)}
        (tmp_path / name / "classification.json").write_text(json.dumps(meta))
        return str(tmp_path / name)

    trained_on = folder("train", ["neg", "pos"])
    assert _check_same_labels(folder("same", ["neg", "pos"]), trained_on) is None
    other = folder("other", ["pos", "neg"])
    with pytest.raises(UsageError) as error:
        _check_same_labels(other, trained_on)
    assert str(error.value) == f"--data {other}: labels ['pos', 'neg'] differ from the checkpoint's ['neg', 'pos']"


# ---------------------------------------------------------------- more bad input: columns, formats, JSON Lines, options

MORE_BAD_INPUTS = {  # case -> ({file name: content}, arguments ({name}: that file's path), expected message)
    "three text columns": ({"train.tsv": "a\tb\tc\t0\nd\te\tf\t1\n"}, ["--text-columns", "0,1,2", "--label-column", "3"],
                           "--text-columns '0,1,2': expected one or two column names or 0-based indices, comma-separated"),
    "two label columns": ({"train.tsv": "a\t0\t1\nb\t1\t0\n"}, ["--text-columns", "0", "--label-column", "1,2"],
                          "--label-column '1,2': expected one column name or 0-based index"),
    "unknown extension": ({"train.txt": "a\t0\nb\t1\n"}, ["--text-columns", "0", "--label-column", "1"],
                          "{train.txt}: cannot tell the format from the extension; pass --format tsv, csv or jsonl"),
    # one field over the csv module's limit (an opening quote never closed swallows the rest of a file the same way)
    "csv field over the limit": ({"train.csv": 'text,label\n"' + "x" * 131073 + '",0\n'},
                                 ["--text-columns", "text", "--label-column", "label"],
                                 "{train.csv}:2: field larger than field limit (131072)"),
    "name without a header line": ({"train.tsv": "a\t0\nb\t1\n"},
                                   ["--text-columns", "sentence", "--label-column", "1", "--header", "no"],
                                   "{train.tsv}: --text-columns 'sentence' is a name, but the file is read without a "
                                   "header line"),
    "JSON Lines column by index": ({"train.jsonl": '{"text": "a", "label": "x"}\n'},
                                   ["--text-columns", "0", "--label-column", "label"],
                                   "{train.jsonl}: --text-columns 0 is an index; JSON Lines columns are named by key"),
    "JSON Lines line not JSON": ({"train.jsonl": '{"text": "a", "label": "x"}\n{"text": "b",\n'},
                                 ["--text-columns", "text", "--label-column", "label"],
                                 "{train.jsonl}:2: not a JSON object (Expecting property name enclosed in double quotes: "
                                 "line 1 column 14 (char 13))"),
    "JSON Lines line a list": ({"train.jsonl": '{"text": "a", "label": "x"}\n["b", "y"]\n'},
                               ["--text-columns", "text", "--label-column", "label"],
                               "{train.jsonl}:2: expected a JSON object, got list"),
    "JSON Lines text a number": ({"train.jsonl": '{"text": "a", "label": "x"}\n{"text": 12.5, "label": "y"}\n'},
                                 ["--text-columns", "text", "--label-column", "label"],
                                 "{train.jsonl}:2: 'text' must be a string, got 12.5"),
    "JSON Lines label null": ({"train.jsonl": '{"text": "a", "label": "x"}\n{"text": "b", "label": null}\n'},
                              ["--text-columns", "text", "--label-column", "label"],
                              "{train.jsonl}:2: 'label' must be a string or number, got null"),
    "regression label infinite": ({"train.tsv": "a\t0.5\nb\tinf\n"},
                                  ["--text-columns", "0", "--label-column", "1", "--regression"],
                                  "{train.tsv}:2: label 'inf' is not a finite number"),
    "max-seq-length below a pair's specials": ({"train.tsv": "a\tb\t0\nc\td\t1\n"},
                                               ["--text-columns", "0,1", "--label-column", "2", "--max-seq-length", "3"],
                                               "--max-seq-length 3: too short for any text (at least 4 for pairs)"),
    "test file with fewer texts": ({"train.tsv": "a\tb\t0\nc\td\t1\ne\tf\t0\n", "test.tsv": "g\nh\n"},
                                   ["--text-columns", "0,1", "--label-column", "2", "--test", "{test.tsv}",
                                    "--test-text-columns", "0"],
                                   "--test-text-columns: 1 column(s), but --text-columns gives 2; a test file has the "
                                   "same texts as the others"),
    "test layout without a test file": ({"train.tsv": "a\t0\nb\t1\n"},
                                        ["--text-columns", "0", "--label-column", "1", "--test-header", "yes"],
                                        "--test-text-columns and --test-header describe the --test files; give --test"),
}


@pytest.mark.parametrize("case", sorted(MORE_BAD_INPUTS))
def test_more_bad_input_is_one_line_naming_file_line_or_flag_and_writes_nothing(case, wordpiece_data, tmp_path, capsys):
    files, extra, message = MORE_BAD_INPUTS[case]
    for name, content in files.items():
        (tmp_path / name).write_text(content, encoding="utf-8")
    paths = {"{" + name + "}": str(tmp_path / name) for name in files}
    train = str(tmp_path / next(iter(files)))
    status = prepare_main(["--train", train, "--valid", train, "--tokenizer-from", wordpiece_data, "--destdir",
                           str(tmp_path / "out"), *(paths.get(arg, arg) for arg in extra)])
    err = capsys.readouterr().err.strip()
    for placeholder, path in paths.items():
        message = message.replace(placeholder, path)
    assert status == 1 and err == f"spanbert-prepare-classification: error: {message}", err
    assert sorted(os.listdir(tmp_path)) == sorted(files)  # no output, no temporary folder


def test_format_flag_reads_any_extension_and_test_header_applies_to_the_test_file_only(wordpiece_data, tmp_path):
    """--format tsv reads .txt files; --test-header yes skips the test file's header line while --header no keeps the
    first line of train and valid as data."""
    (tmp_path / "train.txt").write_text("first text\tneg\nsecond text\tpos\nthird text\tpos\n", encoding="utf-8")
    (tmp_path / "test.txt").write_text("sentence\tlabel\nfourth text\tpos\nfifth text\tneg\n", encoding="utf-8")
    out = tmp_path / "out"
    assert prepare_main(["--train", str(tmp_path / "train.txt"), "--valid", str(tmp_path / "train.txt"),
                         "--test", str(tmp_path / "test.txt"), "--tokenizer-from", wordpiece_data, "--destdir", str(out),
                         "--text-columns", "0", "--label-column", "1", "--format", "tsv", "--header", "no",
                         "--test-header", "yes"]) == 0
    meta = json.load(open(out / "classification.json"))
    assert meta["labels"] == ["neg", "pos"]
    assert np.load(out / "train.labels.npy").tolist() == [0, 1, 1]  # the first line is data
    assert np.load(out / "test.labels.npy").tolist() == [1, 0]  # the header line is skipped, the labels read
    from spanbert_plugin.core.finetune_io import load_tokenizer_folder

    tokenizer, dictionary = load_tokenizer_folder(wordpiece_data)
    items = MMapIndexedDataset(str(out / "test"))
    assert [items[i].tolist() for i in range(len(items))] == [
        [dictionary.bos(), *tokenizer.encode(text).ids.tolist(), dictionary.eos()] for text in ("fourth text", "fifth text")]


def test_more_than_two_text_columns_and_a_meta_file_of_another_shape_are_refused_through_the_api(tmp_path):
    """prepare_classification called from Python (the command's parse_columns refuses three columns before); a
    classification.json holding a list is named, not a TypeError."""
    from spanbert_plugin.classification.prepare import PrepareOptions, prepare_classification, read_meta
    from spanbert_plugin.core.errors import UsageError

    (tmp_path / "t.tsv").write_text("a\tb\tc\t0\n", encoding="utf-8")
    options = PrepareOptions(str(tmp_path / "tok"), str(tmp_path / "out"), ReadOptions(text_columns=[0, 1, 2], label_column=3))
    with pytest.raises(UsageError, match=r"^--text-columns: expected one or two columns, got 3$"):
        prepare_classification(str(tmp_path / "t.tsv"), str(tmp_path / "t.tsv"), options)
    assert sorted(os.listdir(tmp_path)) == ["t.tsv"]
    (tmp_path / "classification.json").write_text("[]", encoding="utf-8")
    with pytest.raises(UsageError, match=re.escape(f"{tmp_path / 'classification.json'}: expected a JSON object, found list")):
        read_meta(str(tmp_path))


def _two_class_folder(wordpiece_data, tmp_path):
    (tmp_path / "train.tsv").write_text("first text\tneg\nsecond text\tpos\n", encoding="utf-8")
    out = tmp_path / "prepared"
    assert prepare_main(["--train", str(tmp_path / "train.tsv"), "--valid", str(tmp_path / "train.tsv"),
                         "--tokenizer-from", wordpiece_data, "--destdir", str(out), "--text-columns", "0",
                         "--label-column", "1"]) == 0
    return out


def test_a_split_not_prepared_and_labels_of_another_kind_than_the_meta_file_are_one_line(wordpiece_data, tmp_path):
    """--valid-subset test on a folder prepared without --test names the missing file; a classification.json edited to
    say regression over class-index labels is refused when the split loads (its integers would be read as targets)."""
    from spanbert_plugin.classification.dataset import ClassificationDataset
    from spanbert_plugin.classification.task import SentenceClassificationConfig, SentenceClassificationTask
    from spanbert_plugin.core.errors import UsageError

    out = _two_class_folder(wordpiece_data, tmp_path)
    task = SentenceClassificationTask.setup_task(SentenceClassificationConfig(data=str(out), seed=1))
    with pytest.raises(UsageError, match=re.escape(f"{out / 'test'}.idx: no such file (split 'test' of a "
                                                   "spanbert-prepare-classification folder)")):
        ClassificationDataset.load(str(out), "test", task.dictionary)
    meta = json.loads((out / "classification.json").read_text(encoding="utf-8"))
    (out / "classification.json").write_text(json.dumps({**meta, "regression": True, "num_classes": 1, "labels": None}),
                                             encoding="utf-8")
    task = SentenceClassificationTask.setup_task(SentenceClassificationConfig(data=str(out), seed=1))
    with pytest.raises(UsageError, match=re.escape(f"{out}: split 'train' has class labels, but classification.json "
                                                   "says regression=True")):
        task.load_dataset("train")


def test_a_model_with_fewer_positions_than_the_prepared_length_is_refused_when_built(wordpiece_data, tmp_path):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from spanbert_plugin.core.errors import UsageError

    out = _two_class_folder(wordpiece_data, tmp_path)  # the default --max-seq-length, 128
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(out), "--user-dir", "user_dir", "--task", "sentence_classification", "--criterion",
        "sentence_classification", "--arch", "spanbert_tiny", "--max-positions", "64", "--cpu"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    with pytest.raises(UsageError, match=re.escape(f"{out}: prepared with --max-seq-length 128, but the model has 64 "
                                                   "positions")):
        task.build_model(cfg.model)


def test_hub_classify_of_a_regression_checkpoint_returns_the_models_value():
    """A regression head has one output, the predicted value itself (no softmax over classes)."""
    from spanbert_plugin.classification.hub import hub_classify
    from spanbert_plugin.classification.task import SentenceClassificationTask

    task = object.__new__(SentenceClassificationTask)  # only what hub.classify reads
    task.meta, task.regression, task.labels = {"max_seq_length": 16}, True, None
    task.cfg = SimpleNamespace(classification_head_name="sts")
    given = []

    def predict(head, tokens):
        given.append((head, tokens.tolist()))
        return torch.tensor([[3.25]], dtype=torch.float16)

    hub = SimpleNamespace(
        task=task, predict=predict,
        tokenizer=SimpleNamespace(encode=lambda t: SimpleNamespace(ids=np.array([ord(w) for w in t.split()]))),
        dictionary=SimpleNamespace(bos=lambda: 1, eos=lambda: 2))
    assert hub_classify(hub, "a b", "c") == {"value": 3.25}
    assert given == [("sts", [1, 97, 98, 2, 99, 2])]


def test_max_tokens_below_the_longest_example_is_one_line_in_training_not_a_skipped_example(wordpiece_data, tmp_path):
    """fairseq-train filters the training split by the least of the task's, the model's and --max-tokens' limits, and
    skipped the longer examples with a warning: the run trained on less data than prepared. Named as in batching."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from spanbert_plugin.core.errors import UsageError

    out = _two_class_folder(wordpiece_data, tmp_path)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(out), "--user-dir", "user_dir", "--task", "sentence_classification", "--criterion",
        "sentence_classification", "--arch", "spanbert_tiny", "--max-tokens", "3", "--cpu"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    task.load_dataset("train")
    dataset = task.dataset("train")
    longest = int(dataset.sizes.max())
    assert longest > 3


    with pytest.raises(UsageError, match=r"^--max-tokens 3: an example is longer, and a batch holds whole examples"):
        training_batches(task, model, dataset, 3)
    batches = training_batches(task, model, dataset, longest).next_epoch_itr(shuffle=False)
    assert sorted(i for batch in batches for i in batch["id"].tolist()) == [0, 1]
