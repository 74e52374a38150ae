"""Relation extraction end to end on generated TACRED-style data (no shared data needed): spanbert-prepare-re ->
fairseq-train from a pre-trained spanbert_tiny -> spanbert-predict-re, whose scores equal validation's and an
independent TACRED-style scoring of its own predictions."""
import json
import os
import random

import pytest

from conftest import bin_path, run_cli
from spanbert_plugin.cli import prepare_re
from test_pretrain import TINY

NEGATIVE = "no_relation"
RELATION_OF_OBJECT_TYPE = {"CITY": "per:city_of_birth", "ORGANIZATION": "per:employee_of", "DATE": NEGATIVE}


def generated_examples(count, seed, words, prefix):
    """TACRED-format examples: filler words with a PERSON subject and an object whose type decides the relation."""
    rng = random.Random(seed)
    examples = []
    for i in range(count):
        tokens = [rng.choice(words) for _ in range(rng.randint(8, 16))]
        subject_len, object_len = rng.randint(1, 2), rng.randint(1, 2)
        subject_start = rng.randrange(0, len(tokens) - subject_len - object_len)
        object_start = rng.randrange(subject_start + subject_len, len(tokens) - object_len + 1)
        if rng.random() < 0.5:  # object before subject in half of them
            subject_start, object_start = (object_start + object_len - subject_len), subject_start
        object_type = rng.choice(sorted(RELATION_OF_OBJECT_TYPE))
        examples.append({"id": f"{prefix}{i}", "token": tokens, "subj_start": subject_start,
                         "subj_end": subject_start + subject_len - 1, "obj_start": object_start,
                         "obj_end": object_start + object_len - 1, "subj_type": "PERSON", "obj_type": object_type,
                         "relation": RELATION_OF_OBJECT_TYPE[object_type]})
    return examples


def tacred_scores(predicted, gold):
    """The official TACRED scorer's micro P/R/F1 (percent), written out independently of the plugin."""
    correct = sum(p == g != NEGATIVE for p, g in zip(predicted, gold))
    guessed = sum(p != NEGATIVE for p in predicted)
    gold_positive = sum(g != NEGATIVE for g in gold)
    precision = correct / guessed if guessed else 1.0
    recall = correct / gold_positive if gold_positive else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": 100 * precision, "recall": 100 * recall, "f1": 100 * f1}, gold_positive


def test_relation_extraction_end_to_end_on_generated_data(spm_data, corpus_files, tmp_path):
    with open(corpus_files[0], encoding="utf-8") as f:
        words = sorted({w for w in f.read().split() if w.isalpha() and w.islower()})[:800]
    splits = {"train": generated_examples(48, 1, words, "t"), "valid": generated_examples(21, 2, words, "v")}
    paths = {}
    for split, examples in splits.items():
        paths[split] = str(tmp_path / f"{split}.json")
        with open(paths[split], "w", encoding="utf-8") as f:
            json.dump(examples, f)
    # for each ordered subject/object pair the spans never overlap and lie inside the sentence
    for ex in splits["train"] + splits["valid"]:
        subject = set(range(ex["subj_start"], ex["subj_end"] + 1))
        assert not subject & set(range(ex["obj_start"], ex["obj_end"] + 1))
        assert 0 <= min(ex["subj_start"], ex["obj_start"]) and max(ex["subj_end"], ex["obj_end"]) < len(ex["token"])

    run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "2", "--save-dir", str(tmp_path / "pt")])
    dest = str(tmp_path / "re")
    assert prepare_re.main(["--train", paths["train"], "--valid", paths["valid"], "--tokenizer-from", spm_data,
                            "--destdir", dest, "--entity-marker", "typed_marker"]) == 0
    with open(os.path.join(dest, "re_meta.json"), encoding="utf-8") as f:
        assert json.load(f)["labels"] == [NEGATIVE, "per:city_of_birth", "per:employee_of"]

    train = run_cli([bin_path("fairseq-train"), dest, "--user-dir", "user_dir", "--task", "relation_extraction",
                     "--criterion", "relation_extraction", "--arch", "spanbert_tiny", "--re-pooling", "entity_start",
                     "--finetune-from-model", str(tmp_path / "pt" / "checkpoint_last.pt"), "--batch-size", "8",
                     "--optimizer", "adam", "--lr", "1e-3", "--max-update", "3", "--cpu", "--num-workers", "0",
                     "--log-format", "json", "--no-epoch-checkpoints", "--seed", "1",
                     "--save-dir", str(tmp_path / "ft")])
    output = train.stdout + train.stderr
    assert "grown from 1001 to 1093 symbols" in output  # the 92 typed markers appended to the sentencepiece pieces
    valid_lines = [line.split("| valid | ", 1)[1] for line in output.splitlines() if "| valid | " in line]
    assert valid_lines, output[-3000:]
    valid = json.loads(valid_lines[-1])
    assert int(valid["valid_re_examples"]) == 21  # batches of 8: the trailing 5 are evaluated too

    out = tmp_path / "pred"
    run_cli([bin_path("spanbert-predict-re"), "--checkpoint", str(tmp_path / "ft" / "checkpoint_last.pt"),
             "--split", "valid", "--out", str(out)])
    with open(out / "predictions.jsonl", encoding="utf-8") as f:
        predictions = [json.loads(line) for line in f]
    with open(out / "eval.json", encoding="utf-8") as f:
        scores = json.load(f)
    assert [p["id"] for p in predictions] == [ex["id"] for ex in splits["valid"]]
    assert all(p["label"] in RELATION_OF_OBJECT_TYPE.values() and 0 < p["prob"] <= 1 for p in predictions)
    predicted, gold = [p["label"] for p in predictions], [ex["relation"] for ex in splits["valid"]]
    expected, gold_positive = tacred_scores(predicted, gold)
    assert scores["counts"]["gold_positive"] == gold_positive
    assert scores["counts"]["correct"] == sum(p == g for p, g in zip(predicted, gold)) == int(valid["valid_re_correct"])
    for key in ("precision", "recall", "f1"):
        assert scores[key] == pytest.approx(expected[key], abs=1e-9), key
        assert scores[key] == pytest.approx(float(valid[f"valid_{key}"]), abs=1e-3), key  # logs keep 3 decimals
    assert scores["accuracy"] == pytest.approx(100 * scores["counts"]["correct"] / 21, abs=1e-9)
    assert scores["accuracy"] == pytest.approx(float(valid["valid_accuracy"]), abs=1e-3)
    # HuggingFace and back: the sentencepiece export carries the appended markers (after <mask>, in the
    # dictionary's ids), and the import gives back the same dictionary and relation head
    import torch
    from transformers import AutoTokenizer

    from spanbert_plugin.model.spanbert import SpanBertModel

    hf, imported = tmp_path / "hf", tmp_path / "imported"
    run_cli([bin_path("spanbert-export-hf"), "--checkpoint", str(tmp_path / "ft" / "checkpoint_last.pt"), "--out",
             str(hf)])
    hub = SpanBertModel.from_pretrained(str(tmp_path / "ft"), "checkpoint_last.pt")
    symbols = list(hub.task.dictionary.symbols)
    assert AutoTokenizer.from_pretrained(str(hf)).convert_ids_to_tokens(list(range(1000, len(symbols)))) == symbols[1000:]
    run_cli([bin_path("spanbert-import-hf"), "--hf", str(hf), "--out", str(imported)])
    again = SpanBertModel.from_pretrained(str(imported), "model.pt")
    assert list(again.task.dictionary.symbols) == symbols
    for key, value in hub.model.relation_heads.state_dict().items():
        assert torch.equal(again.model.relation_heads.state_dict()[key], value), key
