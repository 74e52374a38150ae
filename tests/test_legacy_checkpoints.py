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


def _legacy_args_checkpoint(folder, recorded_data):
    """The pre-training fixture rewritten in fairseq's older layout: the options as an ``args`` namespace (``cfg``
    None), which fairseq's loader turns into a run config, recording ``recorded_data`` as the data folder."""
    import argparse
    import shutil

    import torch

    shutil.copytree(os.path.join(FIXTURE, "pretrain"), folder)
    state = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=True)
    cfg = state["cfg"]
    options = {k: v for section in cfg.values() if isinstance(section, dict) for k, v in section.items()
               if not k.startswith("_")}
    options.update(arch=cfg["model"]["_name"], task=cfg["task"]["_name"], criterion=cfg["criterion"]["_name"],
                   optimizer=cfg["optimizer"]["_name"], lr_scheduler=cfg["lr_scheduler"]["_name"], data=recorded_data)
    state["args"], state["cfg"] = argparse.Namespace(**options), None
    torch.save(state, os.path.join(folder, "args.pt"))


def test_a_checkpoint_of_fairseqs_args_layout_loads_with_the_data_folder_given(tmp_path):
    """fairseq builds such a checkpoint's model and task from its ``args``: the data folder given to the hub (and the
    plugin's user dir) must reach them there, not only the run config derived from them."""
    from spanbert_plugin import SpanBertModel

    folder = str(tmp_path / "legacy")
    _legacy_args_checkpoint(folder, "/nonexistent/data")
    expected = np.load(os.path.join(FIXTURE, "expected.npz"))
    hub = SpanBertModel.from_pretrained(folder, "args.pt", data_name_or_path=folder).eval()
    assert hub.cfg.task.data == folder
    tokens = hub.encode("The module is good and the code is fine.")
    np.testing.assert_array_equal(tokens.numpy(), expected["tokens"])
    np.testing.assert_allclose(hub.extract_features(tokens).detach().numpy(), expected["features"], rtol=0, atol=1e-5)
