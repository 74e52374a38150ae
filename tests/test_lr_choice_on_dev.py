"""benchmarks/pretraining/lr_choice_on_dev.py: each arm's pre-training lr is the one with the best mean LitBank dev score across
results folders, and the arms are compared on test at their chosen rates, paired by seed."""
import csv
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
import lr_choice_on_dev  # noqa: E402

SCRIPT = os.path.join(ROOT, "benchmarks", "pretraining", "lr_choice_on_dev.py")


def results_folder(root, name, default_lr, runs, precision):
    """A masking_ablation.py results folder: settings.json and coref_runs/ARM_seedS_PRECISION.json records."""
    folder = os.path.join(root, name)
    os.makedirs(os.path.join(folder, "coref_runs"))
    with open(os.path.join(folder, "settings.json"), "w") as f:
        json.dump({"pretrain_lr": default_lr}, f)
    for (arm, seed), (dev, test) in runs.items():
        with open(os.path.join(folder, "coref_runs", f"{arm}_seed{seed}_{precision}.json"), "w") as f:
            json.dump({"best_dev_conll_f1": dev, "test_conll_f1": test}, f)
    return folder


def test_chooses_on_dev_not_test_and_pairs_the_chosen_runs(tmp_path):
    # at 1e-4 subword has the better dev but the worse test score: the choice must follow dev
    low = results_folder(tmp_path, "low", 1e-4, {
        ("none", 1): (50, 48), ("none", 2): (51, 47),
        ("subword", 1): (56, 50), ("subword", 2): (57, 51),
        ("span+sbo", 1): (52, 60), ("span+sbo", 2): (53, 61)}, "fp32")
    high = results_folder(tmp_path, "high", 1e-4, {
        ("none", 1): (49, 60), ("none", 2): (48, 61),
        ("subword_lr0.0002", 1): (54, 58), ("subword_lr0.0002", 2): (55, 59),
        ("span+sbo_lr0.0004", 1): (55, 52), ("span+sbo_lr0.0004", 2): (56, 54)}, "fp16")
    # a record of another precision in the same folder is not a candidate
    with open(os.path.join(high, "coref_runs", "subword_lr0.0002_seed1_fp32.json"), "w") as f:
        json.dump({"best_dev_conll_f1": 99, "test_conll_f1": 99}, f)
    out = tmp_path / "out"
    lr_choice_on_dev.main(["--runs", f"{low}:fp32", f"{high}:fp16", "--out", str(out)])
    with open(out / "lr_choice.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    chosen = {r["arm"]: (r["pretrain_lr"], r["precision"]) for r in rows if r["chosen"] == "True"}
    assert chosen == {"none": ("", "fp32"), "subword": ("0.0001", "fp32"), "span+sbo": ("0.0004", "fp16")}
    assert len(rows) == 6
    subword_low = next(r for r in rows if r["arm"] == "subword" and r["pretrain_lr"] == "0.0001")
    assert float(subword_low["dev_conll_f1_mean"]) == 56.5 and float(subword_low["test_conll_f1_mean"]) == 50.5
    report = (out / "lr_choice.md").read_text()
    # span+sbo (lr 4e-4: test 52, 54) against subword (lr 1e-4: test 50, 51): +2.5 on average
    assert "| span+sbo − subword | 1, 2 | +2.50 |" in report
    assert "| subword − none | 1, 2 | +3.00 |" in report
    assert (out / "lr_choice.png").stat().st_size > 0


def test_a_folder_that_is_not_a_results_folder_is_refused_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, SCRIPT, "--runs", f"{tmp_path}:fp32", "--out", str(tmp_path / "out")],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and str(tmp_path) in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("entry", ["no_precision", ":fp32"])
def test_an_entry_without_folder_or_precision_is_refused(tmp_path, entry):
    result = subprocess.run([sys.executable, SCRIPT, "--runs", entry, "--out", str(tmp_path / "out")],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "FOLDER:PRECISION" in result.stderr


def test_out_is_replaced_only_with_force_and_never_when_it_holds_a_users_files(tmp_path):
    runs = results_folder(tmp_path, "runs", 1e-4, {("none", 1): (50, 48), ("subword", 1): (56, 50)}, "fp32")
    out = tmp_path / "out"
    lr_choice_on_dev.main(["--runs", f"{runs}:fp32", "--out", str(out)])
    before = (out / "lr_choice.csv").read_text()
    with pytest.raises(SystemExit, match="pass --force"):
        lr_choice_on_dev.main(["--runs", f"{runs}:fp32", "--out", str(out)])
    lr_choice_on_dev.main(["--runs", f"{runs}:fp32", "--out", str(out), "--force"])
    assert (out / "lr_choice.csv").read_text() == before
    (out / "notes.md").write_text("mine")
    with pytest.raises(SystemExit, match="did not write"):
        lr_choice_on_dev.main(["--runs", f"{runs}:fp32", "--out", str(out), "--force"])
    assert (out / "notes.md").read_text() == "mine"
