"""Checkpoints written before the package moved into feature folders still load and compute the same outputs.

The fixture (tests/fixtures/legacy_layout) was written by commit fd67781; registered names
(tasks, criteria, architectures, options) are what checkpoints refer to, never module paths.
"""
import os

import numpy as np

from conftest import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "legacy_layout")


def test_pretraining_checkpoint_of_the_old_layout_gives_the_same_hidden_states():
    from spanbert_plugin import SpanBertModel

    expected = np.load(os.path.join(FIXTURE, "expected.npz"))
    folder = os.path.join(FIXTURE, "pretrain")
    hub = SpanBertModel.from_pretrained(folder, "checkpoint.pt", data_name_or_path=folder).eval()
    tokens = hub.encode("The module is good and the code is fine.")
    np.testing.assert_array_equal(tokens.numpy(), expected["tokens"])
    features = hub.extract_features(tokens).detach().numpy()
    np.testing.assert_allclose(features, expected["features"], rtol=0, atol=1e-5)


def test_classification_checkpoint_of_the_old_layout_predicts_the_same(tmp_path):
    from conftest import bin_path, run_cli

    expected = np.load(os.path.join(FIXTURE, "expected.npz"))
    out = tmp_path / "pred"
    run_cli([bin_path("spanbert-predict-classification"), "--checkpoint",
             os.path.join(FIXTURE, "classification", "checkpoint.pt"), "--data", os.path.join(FIXTURE, "classification"),
             "--split", "valid", "--out", str(out), "--cpu"])
    import json

    with open(out / "predictions.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    probs = np.array([[row["probabilities"][label] for label in ("0", "1")] for row in rows])
    np.testing.assert_allclose(probs, expected["valid_probs"], rtol=0, atol=1e-5)
