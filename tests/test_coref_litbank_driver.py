"""benchmarks/coref_litbank.py --paired-with: this run minus another run of the command, paired by fold and seed
(only the pairs both hold), with the t-interval and TOST of benchmarks/paired_stats.py; bad flags refused in one
line, exit 1, before any work; --out replaced only when it is this command's own (with --force), written at once."""
import csv
import json
import os
import subprocess
import sys

import pytest
from scipy import stats

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import coref_litbank  # noqa: E402

DRIVER = os.path.join(ROOT, "benchmarks", "coref_litbank.py")


def write_results(path, rows):
    path.mkdir()
    with open(path / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["fold", "arm", "seed", "test_conll_f1", "test_conll_f1_dev_threshold"])
        writer.writeheader()
        writer.writerows(rows)


def test_paired_differences_match_by_fold_and_seed(tmp_path):
    baseline = [{"fold": 0, "arm": "pretrained", "seed": seed, "test_conll_f1": score, "test_conll_f1_dev_threshold": ""}
                for seed, score in ((1, 57.5), (2, 58.6), (3, 57.4))]
    baseline.append({"fold": 1, "arm": "pretrained", "seed": 1, "test_conll_f1": 50.0,
                     "test_conll_f1_dev_threshold": 51.0})
    write_results(tmp_path / "baseline", baseline)
    # as results come from this command: ints and floats; seed 4 has no partner, fold 1 no dev-threshold partner
    results = [{"fold": 0, "arm": "pretrained", "seed": seed, "test_conll_f1": score}
               for seed, score in ((1, 60.0), (2, 60.4), (3, 59.0), (4, 70.0))]
    results.append({"fold": 1, "arm": "pretrained", "seed": 1, "test_conll_f1": 53.0,
                    "test_conll_f1_dev_threshold": 52.5})
    rows = coref_litbank.paired_with(results, str(tmp_path / "baseline" / "results.csv"), 2.7)
    differences = [2.5, 1.8, 1.6, 3.0]
    assert [row["metric"] for row in rows] == ["test_conll_f1", "test_conll_f1_dev_threshold"]
    conll = rows[0]
    assert conll["pairs"] == "0/1 0/2 0/3 1/1"
    mean = sum(differences) / 4
    low, high = stats.t.interval(0.95, 3, loc=mean, scale=stats.sem(differences))
    assert conll["mean"] == pytest.approx(mean) and (conll["low"], conll["high"]) == pytest.approx((low, high))
    assert conll["tost_p"] == pytest.approx(stats.t.cdf((mean - 2.7) / stats.sem(differences), 3))
    one_pair = rows[1]  # only fold 1 has a dev-threshold score on both sides
    assert one_pair["pairs"] == "1/1" and one_pair["mean"] == pytest.approx(1.5) and one_pair["low"] is None
    text = coref_litbank.paired_text(rows, "benchmarks/coref_litbank/baseline")
    assert f"| test_conll_f1 | 0/1 0/2 0/3 1/1 | {conll['mean']:+.2f} | {low:+.2f} to {high:+.2f} |" in text
    assert "| test_conll_f1_dev_threshold | 1/1 | +1.50 | – (one pair) | – | ±2.7 |" in text


@pytest.mark.parametrize("flags, expected", [
    ([], "--checkpoint {tmp}/none.pt: no such file (expected a spanbert checkpoint)"),
    (["--paired-with", "missing_folder"], "--paired-with missing_folder: expected a folder with this command's "
                                          "results.csv"),
    (["--folds", "0-x"], "--folds '0-x': expected folds such as 0-9 or 0,3"),
])
def test_bad_flags_are_refused_in_one_line_before_any_work(tmp_path, flags, expected):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, DRIVER, "--checkpoint", str(tmp_path / "none.pt"), "--out", str(out),
                           "--work", str(tmp_path / "work"), *flags], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"coref_litbank: {expected.format(tmp=tmp_path)}"]
    assert not out.exists() and not (tmp_path / "work").exists()


def test_an_out_folder_it_did_not_write_is_refused_before_any_work_and_kept(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("a user's own results\n")
    proc = subprocess.run([sys.executable, DRIVER, "--checkpoint", str(tmp_path / "none.pt"), "--out", str(out),
                           "--work", str(tmp_path / "work"), "--force"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"coref_litbank: --out {out}: exists and was not written by a spanbert command")
    assert (out / "results.csv").read_text() == "a user's own results\n"
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no work folder, no temporary folder


def test_its_own_earlier_out_passes_the_check_only_with_force(tmp_path):
    from spanbert_plugin.core.file_utils import atomic_directory

    out = tmp_path / "out"
    with atomic_directory(str(out), coref_litbank.COMMAND) as folder:
        open(os.path.join(folder, "results.csv"), "w").close()
    proc = subprocess.run([sys.executable, DRIVER, "--checkpoint", str(tmp_path / "none.pt"), "--out", str(out),
                           "--work", str(tmp_path / "work")], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"coref_litbank: --out {out}: exists (an output of coref_litbank.py); pass --force to replace it"]
    # with --force the check passes and the command goes on to the checkpoint (missing here)
    proc = subprocess.run([sys.executable, DRIVER, "--checkpoint", str(tmp_path / "none.pt"), "--out", str(out),
                           "--work", str(tmp_path / "work"), "--force"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.stderr.strip().splitlines() == [
        f"coref_litbank: --checkpoint {tmp_path}/none.pt: no such file (expected a spanbert checkpoint)"]
    assert sorted(os.listdir(out)) == [".spanbert-output.json", "results.csv"]  # kept: no run finished


def test_the_writer_reproduces_the_committed_span_sbo_outputs_with_a_manifest(tmp_path):
    from spanbert_plugin.core.file_utils import atomic_directory

    results_folder = os.path.join(ROOT, "benchmarks", "coref_litbank")
    committed = os.path.join(results_folder, "gpu_span_sbo_fold0_20epochs")  # three seeds, paired with the baseline
    with open(os.path.join(committed, "runs.jsonl")) as f:
        results = [dict(json.loads(line), commands=[f"train seed {i + 1}"]) for i, line in enumerate(f)]
    folds = coref_litbank.fold_means(results)
    paired = coref_litbank.paired_with(results, os.path.join(results_folder, "minilm_fold0_20epochs", "results.csv"),
                                       2.7)
    text = coref_litbank.summary(results, folds) + coref_litbank.paired_text(
        paired, "benchmarks/coref_litbank/minilm_fold0_20epochs")
    out = tmp_path / "out"
    with atomic_directory(str(out), coref_litbank.COMMAND) as folder:
        coref_litbank.write_outputs(folder, results, folds, paired, text, ["# the invocation"])
    assert sorted(os.listdir(out)) == [".spanbert-output.json", "commands.txt", "folds.csv", "folds.png",
                                       "paired.csv", "results.csv", "runs.jsonl", "summary.md"]
    for name in ("results.csv", "folds.csv", "paired.csv", "runs.jsonl", "summary.md"):
        with open(out / name) as written, open(os.path.join(committed, name)) as expected:
            assert written.read() == expected.read(), name
    assert (out / "commands.txt").read_text().splitlines()[:3] == [
        "# the invocation", "# fold 0, pretrained, seed 1", "train seed 1"]
