"""benchmarks/coreference/coref_litbank.py --paired-with: this run minus another run of the command, paired by fold and seed
(only the pairs both hold), with the t-interval and TOST of benchmarks/common/paired_stats.py; bad flags refused in one
line, exit 1, before any work; --out replaced only when it is this command's own (with --force), written at once."""
import argparse
import csv
import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from scipy import stats

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "coreference"))
import coref_litbank  # noqa: E402

DRIVER = os.path.join(ROOT, "benchmarks", "coreference", "coref_litbank.py")


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
    rows = coref_litbank.paired_with(results, coref_litbank.read_baseline([str(tmp_path / "baseline" / "results.csv")]), 2.7)
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
    text = coref_litbank.paired_text(rows, ["benchmarks/coreference/coref_litbank/baseline"])
    assert f"| test_conll_f1 | 0/1 0/2 0/3 1/1 | {conll['mean']:+.2f} | {low:+.2f} to {high:+.2f} |" in text
    assert "| test_conll_f1_dev_threshold | 1/1 | +1.50 | – (one pair) | – | ±2.7 |" in text


def test_the_baseline_may_be_several_folders_and_other_columns(tmp_path):
    """Seeds run apart (two --out folders) make one baseline; --paired-metrics pairs other results.csv columns."""
    columns = ["fold", "arm", "seed", "test_conll_f1", "test_conll_f1_no_singleton_output"]
    for name, seeds in (("seeds12", (1, 2)), ("seed3", (3,))):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "results.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows({"fold": 0, "arm": "pretrained", "seed": seed, "test_conll_f1": 47.0 + seed,
                              "test_conll_f1_no_singleton_output": 40.0 + seed} for seed in seeds)
    results = [{"fold": 0, "arm": "pretrained", "seed": seed, "test_conll_f1": 39.0 + seed,
                "test_conll_f1_no_singleton_output": 39.0 + seed + seed / 10} for seed in (1, 2, 3)]
    baseline = coref_litbank.read_baseline([str(tmp_path / "seeds12" / "results.csv"),
                                            str(tmp_path / "seed3" / "results.csv")])
    rows = coref_litbank.paired_with(results, baseline, 2.7, ["test_conll_f1", "test_conll_f1_no_singleton_output"])
    assert [(row["metric"], row["pairs"]) for row in rows] == [("test_conll_f1", "0/1 0/2 0/3"),
                                                               ("test_conll_f1_no_singleton_output", "0/1 0/2 0/3")]
    assert rows[0]["mean"] == pytest.approx(-8.0) and rows[1]["mean"] == pytest.approx(-0.8)
    assert "Paired with `a`, `b` (this run minus it" in coref_litbank.paired_text(rows, ["a", "b"])
    with pytest.raises(SystemExit, match="fold 0, pretrained, seed 1 is also in another of its folders"):
        coref_litbank.read_baseline([str(tmp_path / "seeds12" / "results.csv")] * 2)


@pytest.mark.parametrize("flags, expected", [
    ([], "--checkpoint {tmp}/none.pt: no such file (expected a spanbert checkpoint)"),
    (["--paired-with", "missing_folder"], "--paired-with missing_folder: expected a folder with this command's "
                                          "results.csv"),
    (["--folds", "0-x"], "--folds '0-x': expected folds such as 0-9 or 0,3"),
    (["--paired-with", os.path.join(ROOT, "benchmarks", "coreference", "coref_litbank", "minilm_fold0_20epochs"), "--paired-metrics",
      "test_conll_f1,test_conll"], "--paired-metrics test_conll: not a column of the --paired-with results.csv"),
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

    results_folder = os.path.join(ROOT, "benchmarks", "coreference", "coref_litbank")
    committed = os.path.join(results_folder, "gpu_span_sbo_fold0_20epochs")  # three seeds, paired with the baseline
    with open(os.path.join(committed, "runs.jsonl")) as f:
        results = [dict(json.loads(line), commands=[f"train seed {i + 1}"]) for i, line in enumerate(f)]
    folds = coref_litbank.fold_means(results)
    baseline = coref_litbank.read_baseline([os.path.join(results_folder, "minilm_fold0_20epochs", "results.csv")])
    paired = coref_litbank.paired_with(results, baseline, 2.7)
    text = coref_litbank.summary(results, folds) + coref_litbank.paired_text(
        paired, ["benchmarks/coreference/coref_litbank/minilm_fold0_20epochs"])
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


def write_out_folder(path, runs, invocation):
    """An --out folder as this command writes it: runs.jsonl and commands.txt (invocation, preparation, runs)."""
    path.mkdir()
    with open(path / "runs.jsonl", "w") as f:
        f.writelines(json.dumps(run) + "\n" for run in runs)
    with open(path / "commands.txt", "w") as f:
        f.write(f"# {invocation}\nprepare fold {runs[0]['fold']}\n")
        for run in runs:
            f.write(f"# fold {run['fold']}, {run['arm']}, seed {run['seed']}\ntrain {run['fold']}/{run['seed']}\n"
                    f"predict {run['fold']}/{run['seed']}\n")


def test_included_runs_come_with_their_commands_and_where_they_came_from(tmp_path):
    committed = os.path.join(ROOT, "benchmarks", "coreference", "coref_litbank", "gpu_span_sbo_fold0_20epochs", "runs.jsonl")
    with open(committed) as f:
        record = json.loads(f.readline())
    cpu = [dict(record, fold=fold) for fold in (0, 1)]
    gpu = [dict(record, fold=2, seed=seed) for seed in (1, 2)]
    write_out_folder(tmp_path / "cpu", cpu, "coref_litbank.py --folds 0,1")
    write_out_folder(tmp_path / "gpu", gpu, "coref_litbank.py --folds 2 --seeds 1,2")
    runs, origin, preamble = coref_litbank.included_runs([str(tmp_path / "cpu"), str(tmp_path / "gpu")])
    assert sorted(runs) == [(0, "pretrained", 1), (1, "pretrained", 1), (2, "pretrained", 1), (2, "pretrained", 2)]
    assert runs[(2, "pretrained", 2)]["commands"] == ["train 2/2", "predict 2/2"]
    assert runs[(1, "pretrained", 1)]["test_conll_f1"] == record["test_conll_f1"]
    assert origin[(2, "pretrained", 1)] == str(tmp_path / "gpu")
    assert preamble == [f"# runs included from {tmp_path}/cpu, whose commands.txt begins:",
                        "# coref_litbank.py --folds 0,1", "#   prepare fold 0",
                        f"# runs included from {tmp_path}/gpu, whose commands.txt begins:",
                        "# coref_litbank.py --folds 2 --seeds 1,2", "#   prepare fold 2"]


def test_every_run_included_trains_nothing_and_writes_one_summary(tmp_path, monkeypatch):
    """The driver with every run of --folds x --seeds included: no fold is prepared, nothing is trained (the
    checkpoint is only read for its settings), and the summary says where the runs came from."""
    with open(os.path.join(ROOT, "benchmarks", "coreference", "coref_litbank", "gpu_span_sbo_fold0_20epochs", "runs.jsonl")) as f:
        record = json.loads(f.readline())
    write_out_folder(tmp_path / "a", [dict(record, fold=0, test_conll_f1=60.0)], "a")
    write_out_folder(tmp_path / "b", [dict(record, fold=1, test_conll_f1=50.0)], "b")
    checkpoint, out, work = tmp_path / "model.pt", tmp_path / "out", tmp_path / "work"
    checkpoint.write_bytes(b"read only for its settings")
    monkeypatch.setattr(coref_litbank, "checkpoint_settings", lambda path: ({"max_positions": 512}, None))
    monkeypatch.setattr(sys, "argv", [DRIVER, "--checkpoint", str(checkpoint), "--folds", "0,1", "--out", str(out),
                                      "--work", str(work), "--include", str(tmp_path / "a"), str(tmp_path / "b")])
    assert coref_litbank.main() == 0
    assert os.listdir(work) == ["runs"] and os.listdir(work / "runs") == []  # nothing prepared or trained
    with open(out / "folds.csv") as f:
        assert [float(row["test_conll_f1"]) for row in csv.DictReader(f)] == [60.0, 50.0]
    text = (out / "summary.md").read_text()
    assert "| pretrained | 2 | 1/1 | 55.0 ± 7.1 |" in text
    assert f"(not trained here): `{os.path.relpath(tmp_path / 'a', ROOT)}`: fold 0 seed 1; " in text
    commands = (out / "commands.txt").read_text().splitlines()
    assert commands[1:3] == [f"# runs included from {tmp_path}/a, whose commands.txt begins:", "# a"]
    assert commands[-3:] == ["# fold 1, pretrained, seed 1", "train 1/1", "predict 1/1"]


@pytest.mark.parametrize("include, expected", [
    (["mine"], "--include {tmp}/mine: expected an --out folder of this command (runs.jsonl and commands.txt)"),
    (["a", "a"], "--include {tmp}/a: fold 0, pretrained, seed 1 is also in {tmp}/a"),
])
def test_a_bad_include_is_refused_in_one_line_before_any_work(tmp_path, include, expected):
    (tmp_path / "mine").mkdir()
    write_out_folder(tmp_path / "a", [{"fold": 0, "arm": "pretrained", "seed": 1, "test_conll_f1": 60.0}], "a")
    proc = subprocess.run([sys.executable, DRIVER, "--checkpoint", str(tmp_path / "none.pt"), "--out",
                           str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--include",
                           *(str(tmp_path / name) for name in include)], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"coref_litbank: {expected.format(tmp=tmp_path)}"]
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def _run_args(tmp_path, checkpoint, **changes):
    args = dict(checkpoint=str(checkpoint), recipe=os.path.join(ROOT, "configs", "finetune", "litbank.yaml"), epochs=1,
                encoder_lr=2e-5, head_lr=2e-4, ffnn_size=50, max_segment_length=384, bf16_autocast=False, cpu=True,
                train_docs=2, eval_docs=1, override=[], litbank=str(tmp_path), work=str(tmp_path / "work"),
                singleton_thresholds=None)
    return argparse.Namespace(**{**args, **changes})


def test_a_finished_run_is_reused_only_under_the_same_settings(tmp_path, monkeypatch):
    """A finished run in --work belongs to its checkpoint (by content), recipe and budget: another checkpoint, or the
    same path rewritten, or other epochs start a run of their own instead of reporting this one's scores."""
    first = tmp_path / "first.pt"
    first.write_bytes(b"one encoder")
    args = _run_args(tmp_path, first)
    name, settings = coref_litbank.run_name(args, 0, "pretrained", 1)
    os.makedirs(tmp_path / "work" / "runs")
    record = {"fold": 0, "arm": "pretrained", "seed": 1, "settings": settings, "test_conll_f1": 61.0}
    (tmp_path / "work" / "runs" / f"{name}.json").write_text(json.dumps(record))
    assert coref_litbank.finetune_and_test(args, 0, "data", {}, "pretrained", 1) == record

    class Trains(Exception):
        pass

    def trains(*_args, **_kwargs):
        raise Trains

    monkeypatch.setattr(coref_litbank, "finetune_command", trains)  # the training it would start
    second = tmp_path / "second.pt"
    second.write_bytes(b"another encoder")
    for other in (_run_args(tmp_path, second), _run_args(tmp_path, first, epochs=2)):
        with pytest.raises(Trains):
            coref_litbank.finetune_and_test(other, 0, "data", {}, "pretrained", 1)
    first.write_bytes(b"the path's encoder, trained further")
    with pytest.raises(Trains):
        coref_litbank.finetune_and_test(args, 0, "data", {}, "pretrained", 1)


def test_the_training_command_gives_hydra_its_paths_as_they_are(tmp_path):
    """A --work or checkpoint path with a comma was read by hydra as a list of two, and one with a bracket or a quote
    was a syntax error."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    odd = tmp_path / "runs, (old) it's ${x}"
    data = odd / "data"
    data.mkdir(parents=True)
    (data / "prepare_stats.json").write_text(json.dumps({"train": {"documents": 80}}))
    checkpoint = odd / "model.pt"
    command = coref_litbank.finetune_command(_run_args(odd, checkpoint), str(data), {}, "pretrained", 1,
                                             str(odd / "save"))
    assert command[1:5] == ["--config-dir", os.path.join(ROOT, "configs", "finetune"), "--config-name", "litbank"]
    values = {o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(command[5:])}
    resolved = OmegaConf.create({key.replace(".", "_"): value for key, value in values.items()})  # ${x} stays text
    assert (resolved.task_data, resolved.checkpoint_save_dir, resolved.checkpoint_finetune_from_model) == (
        str(data), str(odd / "save"), str(checkpoint))
    assert resolved.optimizer_groups_default_lr_scheduler_total_num_update == 80  # 1 epoch of 80 documents


@pytest.mark.parametrize("flags, expected", [
    (["--folds", "10"], "--folds 10: no fold 10 in {litbank}/splits (LitBank has 0-9)"),
    (["--folds", "5-2"], "--folds '5-2': '5-2' is not a range from a lower to a higher fold"),
    (["--seeds", "x"], "--seeds x: 'x' is not a seed (whole numbers >= 0, comma-separated)"),
    (["--seeds=-1"], "--seeds -1: '-1' is not a seed (whole numbers >= 0, comma-separated)"),
    (["--arms", "Pretrained"], "--arms Pretrained: 'Pretrained' is not an arm (pretrained and/or random)"),
])
def test_bad_runs_are_refused_in_one_line_before_any_work(tmp_path, flags, expected):
    litbank = tmp_path / "litbank"
    for fold in range(10):
        (litbank / "splits" / f"fold{fold}").mkdir(parents=True)
        (litbank / "splits" / f"fold{fold}" / "train.txt").write_text("")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, DRIVER, "--checkpoint", str(tmp_path / "none.pt"), "--out", str(out),
                           "--work", str(tmp_path / "work"), "--litbank", str(litbank), *flags], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"coref_litbank: {expected.format(litbank=litbank)}"]
    assert not out.exists() and not (tmp_path / "work").exists()


def test_a_runs_row_holds_the_scorer_metrics_its_eval_json_has(tmp_path):
    """A run's row takes every metric's F1 from eval.json (with singletons); an eval.json written before CEAF-m, BLANC
    and LEA were scored (a resumed earlier run) gives a row without them."""
    def scores(value, metrics):
        return {**{m: {"p": value, "r": value, "f1": value} for m in (*metrics, "mentions")}, "conll_f1": value}

    every = ("muc", "bcub", "ceafe", "ceafm", "blanc", "lea")
    for name, metrics in (("now", every), ("earlier", every[:3])):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"with_singletons": scores(60.0, metrics),
                                    "without_singletons": scores(50.0, metrics), "documents": 10}))
        row, documents = coref_litbank.test_scores(str(path))
        assert documents == 10 and row["test_conll_f1"] == 60.0 and row["test_conll_f1_without_singletons"] == 50.0
        assert {k for k in row if k.startswith("test_") and k.endswith("_f1") and k[5:-3] in every} == {
            f"test_{m}_f1" for m in metrics}
