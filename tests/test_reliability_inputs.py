"""What the commands read and replace: --force across commands, inputs named by a checkpoint, one-line
errors for malformed inputs, the byte-order mark, and --help without torch.

Most cases call a command's ``main(argv)`` in this process (fast: torch is imported once); the ones about
start-up and signals run the console command in a subprocess.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from spanbert_plugin.cli import export_hf, predict_classification, predict_qa, predict_re
from spanbert_plugin.cli import prepare_classification, prepare_qa, prepare_re
from spanbert_plugin.errors import UsageError
from spanbert_plugin.file_utils import MANIFEST, OutputError, check_destination, checkpoint_inputs, parse_json, read_text


def fake_output(folder, command, files=("dict.txt", "train.bin")):
    """A folder shaped like an output of ``command``: its files and a manifest naming it."""
    os.makedirs(folder)
    for name in files:
        with open(os.path.join(folder, name), "w") as f:
            f.write(name)
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump({"command": command, "files": list(files)}, f)
    return str(folder)


def contents(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def one_line_error(capsys, prog, expected):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: error:") and expected in err[0], err


# ----------------------------------------------------------------------------- --force across commands


@pytest.mark.parametrize("writer, main, prog, argv", [
    ("spanbert-prepare", predict_qa.main, "spanbert-predict-qa", ["--checkpoint", "missing.pt", "--out"]),
    ("spanbert-prepare-re", prepare_qa.main, "spanbert-prepare-qa", ["--train", "t.json", "--tokenizer-from", "tok", "--destdir"]),
    ("spanbert-prepare", predict_classification.main, "spanbert-predict-classification", ["--checkpoint", "missing.pt", "--out"]),
    ("spanbert-prepare-qa", prepare_re.main, "spanbert-prepare-re",
     ["--train", "t.json", "--valid", "v.json", "--tokenizer-from", "tok", "--destdir"]),
    ("spanbert-predict-qa", export_hf.main, "spanbert-export-hf", ["--checkpoint", "missing.pt", "--out"]),
])
def test_force_never_replaces_another_commands_output(tmp_path, monkeypatch, capsys, writer, main, prog, argv):
    folder = fake_output(tmp_path / "out", writer)
    before = contents(folder)
    monkeypatch.chdir(tmp_path)
    assert main(argv + ["out", "--force"]) == 1
    one_line_error(capsys, prog, f"is an output of {writer}, not of {prog}")
    assert contents(folder) == before


def test_force_replaces_only_the_same_commands_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_output(tmp_path / "mine", "spanbert-predict-qa")
    check_destination("mine", "spanbert-predict-qa", [], True, "--out")
    with pytest.raises(OutputError, match="pass --force"):
        check_destination("mine", "spanbert-predict-qa", [], False, "--out")
    # a manifest that names no command is not this command's either
    fake_output(tmp_path / "anonymous", "")
    with pytest.raises(OutputError, match="is an output of a spanbert command, not of spanbert-predict-qa"):
        check_destination("anonymous", "spanbert-predict-qa", [], True, "--out")


def test_every_command_records_its_own_name():
    """The name each command gives check_destination/atomic_directory is its console name (a stable contract)."""
    from spanbert_plugin import prepare as pretraining_prepare
    from spanbert_plugin.classification import predict as classification_predict, prepare as classification_prepare
    from spanbert_plugin.qa import predict as qa_predict, prepare as qa_prepare
    from spanbert_plugin.relation_extraction import predict as re_predict, prepare as re_prepare

    named = {module.COMMAND for module in (pretraining_prepare, classification_predict, classification_prepare,
                                           qa_predict, qa_prepare, re_predict, re_prepare)}
    assert named == {"spanbert-prepare", "spanbert-predict-classification", "spanbert-prepare-classification",
                     "spanbert-predict-qa", "spanbert-prepare-qa", "spanbert-predict-re", "spanbert-prepare-re"}


# ----------------------------------------------------------------------------- inputs named by a checkpoint


def fake_checkpoint(path, data):
    """A file with a fairseq checkpoint's shape as far as its stored task.data goes (no weights)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"cfg": {"task": {"_name": "extractive_qa", "data": data}}, "model": {}}, path)
    return str(path)


def test_checkpoint_inputs_include_the_data_it_was_trained_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ck = fake_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", f"data{os.pathsep}more")
    assert checkpoint_inputs(ck) == [ck, "data", os.path.join(str(tmp_path / "ck"), "data"),
                                     "more", os.path.join(str(tmp_path / "ck"), "more")]
    assert checkpoint_inputs(ck, "given") == [ck, "given"]
    assert checkpoint_inputs("missing.pt") == ["missing.pt"]
    (tmp_path / "damaged.pt").write_bytes(b"PK\x03\x04 not a zip")
    assert checkpoint_inputs(str(tmp_path / "damaged.pt")) == [str(tmp_path / "damaged.pt")]


@pytest.mark.parametrize("main, prog, out", [
    (export_hf.main, "spanbert-export-hf", "data"),
    (predict_qa.main, "spanbert-predict-qa", "data/squad"),
    (predict_qa.main, "spanbert-predict-qa", "data"),
    (predict_re.main, "spanbert-predict-re", "data/squad"),
    (predict_classification.main, "spanbert-predict-classification", "data/squad"),
])
def test_default_data_folder_is_an_input(tmp_path, monkeypatch, capsys, main, prog, out):
    """--out may not be or hold the folder the checkpoint was trained on, though --data was not given.

    The checkpoint holds no weights: a refusal proves the check came before any model was built.
    """
    monkeypatch.chdir(tmp_path)
    fake_output(tmp_path / "data" / "squad", "spanbert-prepare-qa")
    ck = fake_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", "data/squad")
    before = contents(tmp_path / "data" / "squad")
    assert main(["--checkpoint", ck, "--out", out, "--force"]) == 1
    one_line_error(capsys, prog, "is or holds the input data/squad")
    assert contents(tmp_path / "data" / "squad") == before
