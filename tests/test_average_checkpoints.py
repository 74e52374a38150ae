"""spanbert-average-checkpoints: fairseq's checkpoint averaging on checkpoints that carry the vocabulary record."""
import os

import pytest
import torch

from conftest import bin_path, run_cli
from test_pretrain import TINY

PROG = "spanbert-average-checkpoints"


@pytest.fixture(scope="module")
def run_folder(corpus_files, wordpiece_vocab, tmp_path_factory):
    """A 3-epoch pre-training run that keeps every epoch's checkpoint and one every 2 updates."""
    from spanbert_plugin.cli.prepare import main as prepare

    root = tmp_path_factory.mktemp("averaging")
    documents = open(corpus_files[0], encoding="utf-8").read().split("\n\n")[:6]
    (root / "train.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    data = str(root / "data")
    assert prepare(["--train", str(root / "train.txt"), "--valid", corpus_files[1], "--destdir", data,
                    "--tokenizer", "wordpiece", "--wordpiece-vocab", wordpiece_vocab]) == 0
    options = [o for o in TINY if o != "--no-epoch-checkpoints"]
    run_cli([bin_path("fairseq-train"), data, *options, "--max-epoch", "3", "--save-interval-updates", "2",
             "--save-dir", str(root / "ck")])
    return root / "ck"


def average(*args):
    return run_cli([bin_path(PROG), *map(str, args)], check=False)


def weights(path):
    return torch.load(path, weights_only=True)["model"]


def test_the_last_epochs_are_averaged_and_the_records_kept(run_folder, tmp_path):
    out = tmp_path / "averaged.pt"
    proc = average("--inputs", run_folder, "--num-epoch-checkpoints", "2", "--output", out)
    assert proc.returncode == 0, proc.stderr
    newest, older = weights(run_folder / "checkpoint3.pt"), weights(run_folder / "checkpoint2.pt")
    got = torch.load(out, weights_only=True)
    floats = 0
    for key, value in got["model"].items():
        if newest[key].is_floating_point():
            floats += 1
            assert value.dtype == newest[key].dtype
            torch.testing.assert_close(value, (newest[key] + older[key]) / 2, rtol=0, atol=1e-7)
        else:  # the vocabulary record and other integer buffers, as they were
            assert torch.equal(value, newest[key]) and value.dtype == newest[key].dtype, key
    assert floats > 10 and "vocabulary.symbol_hashes" in got["model"]
    assert not torch.equal(newest["lm_head.dense.weight"], older["lm_head.dense.weight"])
    # everything else is the newest checkpoint's, and the result loads where fairseq's checkpoints do
    state3 = torch.load(run_folder / "checkpoint3.pt", weights_only=True)
    assert got["cfg"] == state3["cfg"] and got["extra_state"]["train_iterator"] == state3["extra_state"]["train_iterator"]
    from spanbert_plugin.model.spanbert import SpanBertModel

    hub = SpanBertModel.from_pretrained(str(tmp_path), "averaged.pt")
    torch.testing.assert_close(hub.model.state_dict()["lm_head.dense.weight"],
                               got["model"]["lm_head.dense.weight"], rtol=0, atol=0)
    assert len(hub.fill_mask("The <mask> is here", topk=2)) == 2
    assert sorted(os.listdir(tmp_path)) == ["averaged.pt"]  # no temporary file left


def test_update_checkpoints_up_to_a_bound_and_explicit_inputs(run_folder, tmp_path):
    updates = sorted(int(n.split("_")[2][:-3]) for n in os.listdir(run_folder) if n.count("_") == 2)
    assert len(updates) >= 3, os.listdir(run_folder)
    bound = updates[-2]
    picked = sorted((n for n in os.listdir(run_folder) if n.count("_") == 2 and int(n.split("_")[2][:-3]) <= bound),
                    key=lambda n: -int(n.split("_")[2][:-3]))[:2]
    proc = average("--inputs", run_folder, "--num-update-checkpoints", "2", "--checkpoint-upper-bound", bound,
                   "--output", tmp_path / "by_update.pt")
    assert proc.returncode == 0, proc.stderr
    assert f"{run_folder / picked[0]}, {run_folder / picked[1]}" in proc.stdout
    proc = average("--inputs", *(run_folder / n for n in picked), "--output", tmp_path / "explicit.pt")
    assert proc.returncode == 0, proc.stderr
    by_update, explicit = weights(tmp_path / "by_update.pt"), weights(tmp_path / "explicit.pt")
    assert by_update.keys() == explicit.keys() and all(torch.equal(by_update[k], explicit[k]) for k in by_update)


def one_line_error(proc, *expected):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def test_bad_inputs_are_one_line_and_write_nothing(run_folder, tmp_path):
    last, prev = run_folder / "checkpoint3.pt", run_folder / "checkpoint2.pt"
    # a checkpoint over another vocabulary: its hashes differ
    state = torch.load(prev, weights_only=True)
    state["model"]["vocabulary.symbol_hashes"][5] += 1
    torch.save(state, tmp_path / "other_vocab.pt")
    one_line_error(average("--inputs", last, tmp_path / "other_vocab.pt", "--output", tmp_path / "a.pt"),
                   "other_vocab.pt: its vocabulary.symbol_hashes differs")
    # another model: a weight missing, a shape changed
    del state["model"]["lm_head.bias"]
    torch.save(state, tmp_path / "fewer.pt")
    one_line_error(average("--inputs", last, tmp_path / "fewer.pt", "--output", tmp_path / "a.pt"),
                   "fewer.pt: another model: it lacks lm_head.bias")
    (tmp_path / "damaged.pt").write_bytes(last.read_bytes()[:4000])
    one_line_error(average("--inputs", last, tmp_path / "damaged.pt", "--output", tmp_path / "a.pt"),
                   "damaged.pt: truncated or damaged checkpoint")
    one_line_error(average("--inputs", last, tmp_path / "absent.pt", "--output", tmp_path / "a.pt"),
                   "absent.pt: no such file")
    one_line_error(average("--inputs", last, run_folder / ".." / run_folder.name / "checkpoint3.pt",
                           "--output", tmp_path / "a.pt"), "named twice")
    one_line_error(average("--inputs", run_folder, "--num-epoch-checkpoints", "4", "--output", tmp_path / "a.pt"),
                   "3 checkpointE.pt checkpoints there, --num-epoch-checkpoints asks for 4")
    one_line_error(average("--inputs", last, "--num-epoch-checkpoints", "1", "--output", tmp_path / "a.pt"),
                   "not a folder")
    one_line_error(average("--inputs", last, prev, "--output", tmp_path / "no" / "a.pt"), "does not exist")
    assert not (tmp_path / "a.pt").exists()
    # an existing file is never replaced
    (tmp_path / "mine.pt").write_bytes(b"the user's file")
    one_line_error(average("--inputs", last, prev, "--output", tmp_path / "mine.pt"), "mine.pt: exists")
    assert (tmp_path / "mine.pt").read_bytes() == b"the user's file"
    proc = average("--inputs", last, "--checkpoint-upper-bound", "2", "--output", tmp_path / "a.pt")
    assert proc.returncode == 2 and "--checkpoint-upper-bound needs" in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["damaged.pt", "fewer.pt", "mine.pt", "other_vocab.pt"]


@pytest.mark.parametrize("inputs, output, expected", [
    (["run/checkpoint1.pt", "run/checkpoint2.pt"], "mine.pt", "--output mine.pt: exists"),
    (["run/checkpoint1.pt", "run/checkpoint2.pt"], "absent/a.pt", "its folder"),
    (["run", "--num-epoch-checkpoints", "2"], "run/checkpoint3.pt", "named like the run's own checkpoints in run"),
    (["run/checkpoint1.pt", "run/checkpoint2.pt"], "run/checkpoint_3_10.pt", "named like the run's own checkpoints"),
], ids=["exists", "no folder", "epoch name in the save dir", "update name beside the inputs"])
def test_the_output_is_checked_before_any_input_is_read(tmp_path, monkeypatch, capsys, inputs, output, expected):
    """Damaged inputs would be named first if they were read first: the --output refusals come before."""
    from spanbert_plugin.cli.average_checkpoints import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    for name in ("checkpoint1.pt", "checkpoint2.pt"):
        (tmp_path / "run" / name).write_text("not a checkpoint")
    (tmp_path / "mine.pt").write_bytes(b"the user's file")
    assert main(["--inputs", *inputs, "--output", output]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: --output {output}: ") and expected in lines[0], lines
    assert (tmp_path / "mine.pt").read_bytes() == b"the user's file"
    assert sorted(os.listdir(tmp_path / "run")) == ["checkpoint1.pt", "checkpoint2.pt"]


def test_a_checkpoint_name_outside_the_inputs_folder_is_allowed(tmp_path, monkeypatch, capsys):
    from spanbert_plugin.cli.average_checkpoints import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint1.pt").write_text("not a checkpoint")
    assert main(["--inputs", "run/checkpoint1.pt", "--output", "checkpoint1.pt"]) == 1
    assert "run/checkpoint1.pt: a text file, not a PyTorch checkpoint" in capsys.readouterr().err  # the input's turn


@pytest.mark.parametrize("number", ["--num-epoch-checkpoints", "--num-update-checkpoints"])
def test_the_last_n_checkpoints_of_several_folders_are_refused_before_anything_is_read(number, tmp_path, capsys):
    from spanbert_plugin.cli.average_checkpoints import main

    with pytest.raises(SystemExit) as stopped:
        main(["--inputs", str(tmp_path / "run1"), str(tmp_path / "run2"), number, "2", "--output", str(tmp_path / "a.pt")])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"{PROG}: error: with --num-epoch-checkpoints or --num-update-checkpoints, --inputs names one folder")


def small_checkpoint(path, **weights):
    """A fairseq-shaped checkpoint of the given weights (enough for averaging, which reads only ``model``)."""
    torch.save({"model": weights, "cfg": {"model": {}}}, path)
    return path


@pytest.mark.parametrize("second, expected", [
    ([1, 2], "a PyTorch file but not a fairseq checkpoint (no 'model' entry)"),
    ({"model": {"w": torch.zeros(2), "step": 3}}, "its 'model' entry holds something other than tensors"),
    ({"model": {"w": torch.zeros(3)}}, "another model: w has shape (3,), (2,) in "),
    ({"model": {"w": torch.zeros(2, dtype=torch.long)}}, "w is torch.int64, torch.float32 in "),
], ids=["not a dict", "not tensors", "another shape", "integer weight"])
def test_an_input_that_cannot_be_averaged_is_one_line_naming_it(tmp_path, capsys, second, expected):
    from spanbert_plugin.cli.average_checkpoints import main

    first = small_checkpoint(tmp_path / "first.pt", w=torch.ones(2))
    torch.save(second, tmp_path / "second.pt")
    assert main(["--inputs", str(first), str(tmp_path / "second.pt"), "--output", str(tmp_path / "a.pt")]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"{PROG}: error: {tmp_path / 'second.pt'}: {expected}" + (str(first) if expected.endswith(" in ") else "")]
    assert sorted(os.listdir(tmp_path)) == ["first.pt", "second.pt"]


@pytest.mark.parametrize("flag, count", [("--num-epoch-checkpoints", "0"), ("--num-update-checkpoints", "-1")])
def test_a_count_of_checkpoints_below_one_is_refused(tmp_path, capsys, flag, count):
    from spanbert_plugin.cli.average_checkpoints import main

    small_checkpoint(tmp_path / "checkpoint1.pt", w=torch.ones(2))
    assert main(["--inputs", str(tmp_path), flag, count, "--output", str(tmp_path / "a.pt")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"{PROG}: error: {flag} {count}: expected at least 1"]
    assert os.listdir(tmp_path) == ["checkpoint1.pt"]


def test_an_output_name_the_file_system_refuses_is_one_line(tmp_path, capsys):
    """A name longer than the file system allows passes the checks made before reading (it does not exist); its
    creation fails: one line naming --output and the reason, and nothing written."""
    from spanbert_plugin.cli.average_checkpoints import main

    inputs = [str(small_checkpoint(tmp_path / f"checkpoint{i}.pt", w=torch.full((2,), float(i)))) for i in (1, 2)]
    output = str(tmp_path / ("a" * 300 + ".pt"))
    assert main(["--inputs", *inputs, "--output", output]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"{PROG}: error: --output {output}: cannot be created (File name too long)"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint1.pt", "checkpoint2.pt"]


def test_a_full_disk_while_writing_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    import errno

    from spanbert_plugin.cli.average_checkpoints import main

    inputs = [str(small_checkpoint(tmp_path / f"checkpoint{i}.pt", w=torch.full((2,), float(i)))) for i in (1, 2)]

    def fills_the_disk(obj, f):
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", fills_the_disk)
    output = str(tmp_path / "average.pt")
    assert main(["--inputs", *inputs, "--output", output]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: writing {output}: no space left on the device ("), lines
    assert "MiB free there now" in lines[0]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint1.pt", "checkpoint2.pt"]  # neither the file nor its temporary


def test_another_failure_while_writing_propagates_and_leaves_nothing(tmp_path, monkeypatch):
    from spanbert_plugin.core.checkpoint_averaging import write_new_checkpoint

    def fails(obj, f):
        f.write(b"half a checkpoint")
        raise RuntimeError("another failure")

    monkeypatch.setattr(torch, "save", fails)
    with pytest.raises(RuntimeError, match="another failure"):
        write_new_checkpoint({"model": {}}, str(tmp_path / "average.pt"))
    assert os.listdir(tmp_path) == []


def test_no_room_for_the_temporary_file_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """The temporary file itself cannot be made (no inode left: ENOSPC before a byte is written): the disk-full
    line, and the claimed --output name is given up again."""
    import errno
    import tempfile

    from spanbert_plugin.core.checkpoint_averaging import write_new_checkpoint
    from spanbert_plugin.core.file_utils import OutputError

    def no_inode_left(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", no_inode_left)
    output = str(tmp_path / "average.pt")
    with pytest.raises(OutputError) as err:
        write_new_checkpoint({"model": {}}, output)
    assert str(err.value).startswith(f"writing {output}: no space left on the device (") and "\n" not in str(err.value)
    assert os.listdir(tmp_path) == []
