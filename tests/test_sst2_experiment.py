"""benchmarks/pretraining/sst2_experiment.py --lr-grid: each arm's learning rate is chosen on held-out rows of the training
slice (never on dev), from runs trained on the other rows."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
import sst2_experiment  # noqa: E402

SCRIPT = os.path.join(ROOT, "benchmarks", "pretraining", "sst2_experiment.py")


def fake_glue(tmp_path, monkeypatch, rows=10):
    source = tmp_path / "glue" / "SST-2"
    source.mkdir(parents=True)
    (source / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"row {i}\t{i % 2}\n" for i in range(rows)))
    (source / "dev.tsv").write_text("sentence\tlabel\ndev row\t1\n")
    monkeypatch.setattr(sst2_experiment, "GLUE", str(tmp_path / "glue"))
    prepared = []
    monkeypatch.setattr(sst2_experiment, "run_logged", lambda command, log: prepared.append(command))
    return prepared


def test_heldout_rows_are_the_end_of_the_training_slice_and_train_keeps_the_rest(tmp_path, monkeypatch):
    prepared = fake_glue(tmp_path, monkeypatch)
    folder = sst2_experiment.prepare_glue(str(tmp_path / "work"), "SST-2", "tok", 8, 128, [], heldout=3)
    command = prepared[0]
    train = open(command[command.index("--train") + 1]).read().splitlines()
    valid = open(command[command.index("--valid") + 1]).read().splitlines()
    assert train == ["sentence\tlabel"] + [f"row {i}\t{i % 2}" for i in range(5)]
    assert valid == ["sentence\tlabel"] + [f"row {i}\t{i % 2}" for i in range(5, 8)]  # rows 8-9 are outside the slice
    assert folder.endswith("SST-2_8_128_heldout3") and command[command.index("--destdir") + 1] == folder
    # without held-out rows: the whole slice trains and dev validates, as before
    sst2_experiment.prepare_glue(str(tmp_path / "work"), "SST-2", "tok", 8, 128, [])
    plain = prepared[1]
    assert len(open(plain[plain.index("--train") + 1]).read().splitlines()) == 9
    assert plain[plain.index("--valid") + 1] == str(tmp_path / "glue" / "SST-2" / "dev.tsv")


def test_each_arm_gets_its_best_heldout_lr_and_ties_go_to_the_smaller(tmp_path, monkeypatch):
    fake_glue(tmp_path, monkeypatch, rows=100)
    heldout_accuracy = {("pretrained", 1e-4): 81.0, ("pretrained", 1e-3): 80.0,
                        ("random", 1e-4): 75.0, ("random", 1e-3): 78.0, ("random", 3e-4): 78.0}
    runs = []

    def finetune_run(work, name, command, log):
        runs.append(command)
        init = "pretrained" if "--finetune-from-model" in command else "random"
        return {"dev_accuracy": heldout_accuracy.get((init, float(command[command.index("--lr") + 1])), 70.0)}

    monkeypatch.setattr(sst2_experiment, "finetune_run", finetune_run)
    args = SimpleNamespace(work=str(tmp_path / "work"), train_size=100, heldout=20, max_seq_length=128, seeds="4,5",
                           lr_grid=[1e-4, 3e-4, 1e-3], checkpoint=str(tmp_path / "pretrained.pt"))
    settings = sst2_experiment.FinetuneSettings(max_epoch=1, batch_size=10)
    chosen, grid = sst2_experiment.choose_learning_rates(args, settings, ["--arch", "spanbert"], "tok", [])
    assert chosen == {"pretrained": 1e-4, "random": 3e-4}
    assert [(row["init"], row["lr"]) for row in grid] == [(i, lr) for i in ("pretrained", "random") for lr in args.lr_grid]
    assert all(row["seed"] == 4 for row in grid)  # the first seed only
    for command in runs:  # trained on the 80 rows before the held-out 20: 8 updates of 10
        assert command[1].endswith("SST-2_100_128_heldout20")
        assert command[command.index("--total-num-update") + 1] == "8"
        assert command[command.index("--seed") + 1] == "4"


@pytest.mark.parametrize("flags, expected", [
    (["--lr-grid", "1e-4,x"], "--lr-grid 1e-4,x: expected comma-separated positive learning rates"),
    (["--lr-grid", "1e-4,0"], "--lr-grid 1e-4,0: expected comma-separated positive learning rates"),
    (["--lr-grid", "1e-4", "--train-size", "2000", "--heldout", "2000"], "--heldout 2000: expected between 0 and"),
])
def test_bad_grid_flags_are_refused_in_one_line(flags, expected, tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                           *flags], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_a_run_stopped_before_its_result_was_cached_trains_again_from_the_start(tmp_path, monkeypatch):
    """fairseq resumes from a save folder's checkpoint_last.pt; one left by a run stopped after training (while it
    scored the training split) would resume after the last epoch, train nothing and log no validation."""
    save_dir = tmp_path / "work" / "checkpoints" / "SST-2_random_1"
    save_dir.mkdir(parents=True)
    (save_dir / "checkpoint_last.pt").write_bytes(b"the stopped run's model")
    found_at_start = []

    def run_logged(command, log):
        if "--save-dir" in command:
            found_at_start.append(sorted(os.listdir(save_dir)) if save_dir.exists() else None)
            save_dir.mkdir(parents=True, exist_ok=True)
            (save_dir / "checkpoint_last.pt").write_bytes(b"a new model")
            return '| valid | {"epoch": 1, "valid_accuracy": "81.5"}\n| train | {"epoch": 1}\n'
        predicted = command[command.index("--out") + 1]
        os.makedirs(predicted, exist_ok=True)
        with open(os.path.join(predicted, "eval.json"), "w") as f:
            f.write('{"accuracy": 90.0}')
        return ""

    monkeypatch.setattr(sst2_experiment, "run_logged", run_logged)
    command = ["fairseq-train", "data", "--save-dir", str(save_dir), "--seed", "1"]
    result = sst2_experiment.finetune_run(str(tmp_path / "work"), "SST-2_random_1", command, [])
    assert found_at_start == [None]  # the stopped run's folder was gone when training started
    assert result["dev_accuracy"] == 81.5 and result["train_accuracy"] == 90.0


def test_the_plot_shows_each_seeds_paired_difference_and_the_interval(tmp_path, monkeypatch):
    fake_glue(tmp_path, monkeypatch)  # the majority-class line reads dev.tsv
    accuracy = {("pretrained", 1): 80.0, ("pretrained", 2): 81.0, ("pretrained", 3): 80.5,
                ("random", 1): 79.0, ("random", 2): 80.5, ("random", 3): 80.5}
    rows = [{"init": init, "seed": seed, "train_size": 100, "dev_accuracy": value, "train_dev_gap": 5.0}
            for (init, seed), value in accuracy.items()]
    saved, save_figure = {}, sst2_experiment.save_figure

    def keep_figure(plt, figure, path):
        saved["axes"] = figure.axes
        save_figure(plt, figure, path)

    monkeypatch.setattr(sst2_experiment, "save_figure", keep_figure)
    sst2_experiment.plot_sst2(rows, str(tmp_path))
    assert (tmp_path / "sst2_pretrained_vs_random.png").stat().st_size > 0
    middle = saved["axes"][1]
    assert middle.collections[0].get_offsets().tolist() == [[1, 1.0], [2, 0.5], [3, 0.0]]  # by seed
    low, high = sst2_experiment.pretrained_minus_random(rows)["ci95"]
    band = middle.patches[0]  # the 95% interval of the mean difference
    assert (round(band.get_y(), 2), round(band.get_y() + band.get_height(), 2)) == (low, high)
