"""benchmarks/pretraining/masking_ablation.py --from-model at its smoke budget: two invocations side by side (one arm each,
as one per core) extend one results.csv and commands.md, and the LitBank rows keep their runs and commands; a
later invocation adds the scores at the singleton threshold chosen on dev to the finished runs."""
import csv
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, driver_env, needs_shared_data, served_command

DRIVER = os.path.join(ROOT, "benchmarks", "pretraining", "masking_ablation.py")


def results_by_run(results):
    """results.csv's rows by (arm, task, seed)."""
    with open(results / "results.csv", newline="") as f:
        return {(r["arm"], r["task"], r["seed"]): r for r in csv.DictReader(f)}


def assert_each_command_once(commands_md):
    """Each invocation's section of commands.md lists each command it ran once."""
    for section in commands_md.split("\n## `")[1:]:
        listed = [line for line in section.splitlines() if line.startswith("- ")]
        assert len(listed) == len(set(listed)), section


@needs_shared_data("litbank/novels", "litbank/splits/fold0/train.txt")
def test_two_arms_side_by_side_share_one_results_folder(imported, tmp_path):
    results = tmp_path / "results"
    common = [sys.executable, DRIVER, "--from-model", imported, "--smoke", "--pretrain-batch", "3",
              "--tasks", "coref", "--seeds", "1", "--heldout-mlm", "--results", str(results)]
    env = driver_env(OMP_NUM_THREADS="1")
    runs = [subprocess.Popen(served_command([*common, "--schemes", arm, "--work", str(tmp_path / f"work_{i}")]), cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i, arm in enumerate(("none", "span+sbo"))]
    outputs = [run.communicate(timeout=900)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs), "\n".join(output[-3000:] for output in outputs)
    assert all(re.search(r"\n   epoch 1/\d+: dev CoNLL F1 \d+\.\d\d\n", output) for output in outputs)  # progress
    rows = results_by_run(results)
    assert set(rows) == {("none", "litbank_fold0", "1"), ("span+sbo", "litbank_fold0", "1"),
                         ("span+sbo", "heldout_mlm", "1")}, rows
    assert rows[("span+sbo", "heldout_mlm", "1")]["metric"] == "mlm_bits"
    assert {r["precision"] for r in rows.values()} == {"fp32"}  # no --bf16-autocast
    commands = (results / "commands.md").read_text(encoding="utf-8")
    assert commands.count("\n## `") == 2  # both invocations, neither overwriting the other
    assert "- pre-train span+sbo: " in commands and commands.count("- LitBank fold 0, ") >= 4
    assert "--max-update 4 --batch-size 3 " in commands  # --pretrain-batch, in place of the smoke budget's 4
    assert_each_command_once(commands)
    for arm in ("none", "span+sbo"):
        run = json.loads((results / "coref_runs" / f"{arm}_seed1_fp32.json").read_text())
        assert float(rows[(arm, "litbank_fold0", "1")]["score"]) == run["test_conll_f1"]
        assert any("fairseq-hydra-train" in command for command in run["commands"])
    # the finished none run, scored again at the singleton threshold with the best dev CoNLL F1
    again = subprocess.run(served_command([*common, "--schemes", "none", "--work", str(tmp_path / "work_0"),
                            "--singleton-thresholds", "0.2,0.5"]), cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rows = results_by_run(results)
    run = json.loads((results / "coref_runs" / "none_seed1_fp32.json").read_text())
    assert run["singleton_threshold_dev"] in (0.2, 0.5) and set(run["dev_conll_f1_per_threshold"]) == {"0.2", "0.5"}
    assert float(rows[("none", "litbank_fold0_dev_threshold", "1")]["score"]) == run["test_conll_f1_dev_threshold"]
    assert float(rows[("none", "litbank_fold0", "1")]["score"]) == run["test_conll_f1"]  # the first score stays
    assert_each_command_once((results / "commands.md").read_text(encoding="utf-8"))
    # another --freeze-encoder-updates: an arm of its own (its own pre-training), paired with the scheme's rows
    variant = subprocess.run(served_command([*common, "--schemes", "span+sbo", "--work", str(tmp_path / "work_1"),
                              "--freeze-encoder-updates", "2", "--singleton-thresholds", "0.2,0.5"]),
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert variant.returncode == 0, variant.stdout[-3000:] + variant.stderr[-3000:]
    rows = results_by_run(results)
    assert {("span+sbo_freeze2", "litbank_fold0", "1"), ("span+sbo_freeze2", "litbank_fold0_dev_threshold", "1"),
            ("span+sbo_freeze2", "heldout_mlm", "1"), ("span+sbo", "litbank_fold0", "1")} <= set(rows)
    assert_each_command_once((results / "commands.md").read_text(encoding="utf-8"))  # one LitBank run, both rows
    assert (tmp_path / "work_1" / "pretrain" / "span+sbo_freeze2" / "checkpoint_last.pt").is_file()
    assert "--freeze-encoder-updates 2" in (results / "commands.md").read_text(encoding="utf-8")
    assert json.loads((results / "settings.json").read_text())["freeze_encoder_updates"] == 0  # the experiment's
    table = (results / "table.md").read_text(encoding="utf-8")
    assert "| span+sbo_freeze2 |" in table and "| litbank_fold0 | span+sbo_freeze2 − span+sbo | 1 |" in table


def test_pretraining_curves_keep_arms_whose_work_folder_is_gone(tmp_path):
    """A curve pre-trained in an earlier --work (another machine, a cleared /tmp) keeps its rows in
    pretrain_curves.csv when a later invocation writes the curves its own --work holds; this --work's log replaces
    only the curve of the same arm in the same precision (read from the configuration fairseq logs)."""
    import argparse

    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    results, work = tmp_path / "results", tmp_path / "work"
    results.mkdir()
    (results / "pretrain_curves.csv").write_text(
        "arm,precision,update,mlm_loss,sbo_loss\nspan+sbo,bf16_autocast,50,15.0,14.3\n"
        "span+sbo,bf16_autocast,100,12.6,11.2\nsubword,fp32,50,9.9,\n")
    for arm in ("subword", "span+sbo"):  # both fp32 here
        (work / "pretrain" / arm).mkdir(parents=True)
        (work / "pretrain" / arm / "train.log").write_text(
            "2026-11-26 18:39:00 | INFO | fairseq_cli.train | {'common': {'bf16_autocast': False}}\n"
            '2026-11-26 18:40:00 | INFO | train_inner | {"num_updates": "50", "mlm_loss": "14.1"}\n'
            '2026-11-26 18:42:00 | INFO | train_inner | {"num_updates": "100", "mlm_loss": "11.9"}\n')
    masking_ablation.pretraining_curves(argparse.Namespace(work=str(work), results=str(results)))
    with open(results / "pretrain_curves.csv", newline="") as f:
        rows = [(r["arm"], r["precision"], r["update"], r["mlm_loss"], r["sbo_loss"]) for r in csv.DictReader(f)]
    assert rows == [("span+sbo", "fp32", "50", "14.1", ""), ("span+sbo", "fp32", "100", "11.9", ""),
                    ("subword", "fp32", "50", "14.1", ""), ("subword", "fp32", "100", "11.9", ""),
                    ("span+sbo", "bf16_autocast", "50", "15.0", "14.3"),  # another precision: kept
                    ("span+sbo", "bf16_autocast", "100", "12.6", "11.2")]


def test_pretraining_precision_reads_every_start_of_a_resumed_run(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    log = tmp_path / "train.log"
    start = "2026-11-26 18:39:00 | INFO | fairseq_cli.train | {{'common': {{'bf16_autocast': {}}}}}\n"
    log.write_text(start.format("True") * 2)
    assert masking_ablation.pretraining_precision(str(log)) == "bf16_autocast"
    log.write_text(start.format("False"))
    assert masking_ablation.pretraining_precision(str(log)) == "fp32"
    log.write_text(start.format("True") + start.format("False"))
    assert masking_ablation.pretraining_precision(str(log)) == "mixed"
    # a GPU run under fairseq's --fp16 (the driver's default there without --bf16-autocast)
    log.write_text("2026-11-27 22:08:10 | INFO | fairseq_cli.train | {'common': {'fp16': True, 'bf16': False}, "
                   "'task': {'bf16_autocast': False}}\n")
    assert masking_ablation.pretraining_precision(str(log)) == "fp16"


def test_arms_are_compared_within_one_precision():
    """An arm that ran in two precisions is compared with another arm only in the precision both ran in (the
    precision would otherwise be part of the difference), and with itself across precisions; an arm that ran in one
    precision only is still compared with one that ran in another."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    runs = [("none", "bf16_autocast", 48.0), ("none", "fp32", 48.5), ("subword", "fp32", 54.0),
            ("span+sbo", "bf16_autocast", 53.5), ("span", "bf16_autocast", 53.0)]
    rows = masking_ablation.labelled_by_precision(
        [{"arm": arm, "precision": precision, "task": "litbank_fold0", "seed": str(seed), "score": str(score + seed)}
         for arm, precision, score in runs for seed in (1, 2)])
    labels = ["none (bf16_autocast)", "none (fp32)", "subword", "span", "span+sbo"]
    table = masking_ablation.paired_differences(rows, ["litbank_fold0"], labels)
    differences = [line.split(" | ")[1] for line in table.splitlines() if line.startswith("| litbank_fold0")]
    assert differences == ["subword − none (fp32)", "span − none (bf16_autocast)", "span+sbo − none (bf16_autocast)",
                           "span+sbo − subword", "span+sbo − span", "span − subword",
                           "none (fp32) − none (bf16_autocast)"]


def test_another_pretraining_lr_adds_arms_compared_with_their_scheme_and_each_other():
    """--pretrain-lr other than the experiment's (each scheme's lr-grid choice) joins the experiment as arms
    SCHEME_lrX: the experiment keeps its first invocation's lr; each variant is paired with its scheme's rows, and
    the scheme comparisons are made again between the variants (never between a variant and another plain scheme)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    stored = {"pretrain_lr": 1e-4, "freeze_encoder_updates": 100, "pretrain_updates": 2000}
    settings = masking_ablation.experiment_settings(stored, {**stored, "pretrain_lr": 4e-4})
    assert settings == stored and masking_ablation.same_settings(stored, settings)
    assert masking_ablation.variant_arm("span+sbo", {**stored, "pretrain_lr": 4e-4}, settings) == "span+sbo_lr0.0004"
    assert masking_ablation.variant_arm("subword", stored, settings) == "subword"
    assert masking_ablation.variant_arm("none", {**stored, "pretrain_lr": 4e-4}, settings) == "none"
    both = {"pretrain_lr": 2e-4, "freeze_encoder_updates": 0}
    assert masking_ablation.variant_arm("noun_phrase", both, settings) == "noun_phrase_freeze0_lr0.0002"
    assert masking_ablation.scheme_of("noun_phrase_freeze0_lr0.0002") == "noun_phrase"
    assert masking_ablation.experiment_settings(None, both) == both  # the first invocation sets the experiment

    arms = ["none", "subword", "span+sbo", "subword_lr0.0002", "span+sbo_lr0.0004", "span+sbo_freeze0"]
    rows = masking_ablation.labelled_by_precision(
        [{"arm": arm, "precision": "fp32", "task": "litbank_fold0", "seed": str(seed), "score": str(50 + i + seed)}
         for i, arm in enumerate(arms) for seed in (1, 2)])
    labels = ["none", "subword", "subword_lr0.0002", "span+sbo", "span+sbo_freeze0", "span+sbo_lr0.0004"]
    table = masking_ablation.paired_differences(rows, ["litbank_fold0"], labels)
    differences = {line.split(" | ")[1] for line in table.splitlines() if line.startswith("| litbank_fold0")}
    assert differences == {
        *(f"{arm} − none" for arm in labels[1:]), "span+sbo − subword", "span+sbo_lr0.0004 − subword_lr0.0002",
        "subword_lr0.0002 − subword", "span+sbo_freeze0 − span+sbo", "span+sbo_lr0.0004 − span+sbo"}


def test_an_invocation_without_coreference_joins_the_same_experiment():
    """--tasks squad after --tasks coref: coreference's own settings are compared only where both ran it."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    with_coref = {"pretrain_updates": 2000, "coref_epochs": 10, "coref_ffnn_size": 150}
    assert masking_ablation.same_settings(with_coref, {"pretrain_updates": 2000})
    assert masking_ablation.same_settings({"pretrain_updates": 2000}, with_coref)
    assert not masking_ablation.same_settings(with_coref, {**with_coref, "coref_epochs": 20})
    assert not masking_ablation.same_settings(with_coref, {"pretrain_updates": 1000})


@needs_shared_data("litbank/novels", "litbank/splits/fold0/train.txt")
def test_lr_grid_scores_each_peak_lr_on_the_validation_split(imported, tmp_path):
    """--lr-grid: each lr's short run on the experiment's schedule, scored on the pre-training validation split;
    rows kept, and a second invocation runs nothing already scored but redraws the plot; the experiment at a grid
    point's lr resumes that point's run."""
    results = tmp_path / "results"
    command = [sys.executable, DRIVER, "--from-model", imported, "--smoke", "--schemes", "none", "subword",
               "--lr-grid", "1e-4", "3e-4", "--lr-grid-updates", "2", "--results", str(results),
               "--work", str(tmp_path / "work")]
    env = driver_env(OMP_NUM_THREADS="1")
    first = subprocess.run(served_command(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    with open(results / "lr_grid.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["arm"], float(r["lr"]), r["updates"], r["schedule_updates"]) for r in rows] == [
        ("subword", 1e-4, "2", "4"), ("subword", 3e-4, "2", "4")]  # none trains nothing: no row
    assert all(0 < float(r["valid_mlm_loss"]) <= float(r["valid_loss"]) < 30 for r in rows)
    best = min(rows, key=lambda r: float(r["valid_loss"]))
    assert f"subword: lowest validation loss {float(best['valid_loss']):.3f} bits at lr {float(best['lr']):g}" in first.stdout
    commands = (results / "lr_grid_commands.md").read_text(encoding="utf-8")
    assert commands.count("- pre-train subword, peak lr ") == 2 and commands.count("--max-update 2 ") == 2
    assert commands.count("- validation loss of subword") == 2 and (results / "lr_grid.png").stat().st_size > 0
    assert not (results / "results.csv").exists()  # the grid is not the experiment
    (results / "lr_grid.png").unlink()
    again = subprocess.run(served_command(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "== " not in again.stdout.replace("== prepare", "")  # nothing trained again
    assert (results / "lr_grid_commands.md").read_text(encoding="utf-8") == commands
    assert (results / "lr_grid.png").stat().st_size > 0  # redrawn from the rows on disk
    # the experiment at a grid point's lr starts from that run: the same command but for where it stops
    arm = subprocess.run(served_command([*command[:command.index("--schemes")], "--schemes", "subword", "--tasks", "coref", "--seeds",
                          "--pretrain-lr", "3e-4", "--results", str(results), "--work", str(tmp_path / "work")]),
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert arm.returncode == 0, arm.stdout[-3000:] + arm.stderr[-3000:]
    assert "== start subword from the lr grid's run of its configuration (2 updates)" in arm.stdout
    log = (tmp_path / "work" / "pretrain" / "subword" / "train.log").read_text(encoding="utf-8")
    grid_log = (tmp_path / "work" / "pretrain_lr_grid" / "subword_lr0.0003_2of4_fp32" / "train.log").read_text(
        encoding="utf-8")
    assert log.startswith(grid_log) and "(epoch 1 @ 2 updates)" in log[len(grid_log):]  # resumed at update 2
    assert "- start subword from the lr grid's run of its configuration (2 updates): `cp " in (
        results / "commands.md").read_text(encoding="utf-8")


def test_a_pretraining_batch_below_one_is_refused_before_anything_is_written(tmp_path):
    refused = subprocess.run(served_command([sys.executable, DRIVER, "--pretrain-batch", "0", "--work", str(tmp_path / "work"),
                              "--results", str(tmp_path / "results")]), cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 1
    assert refused.stderr.strip() == "masking_ablation: --pretrain-batch 0: expected at least 1 sequence"
    assert list(tmp_path.iterdir()) == []


def test_a_results_folder_of_other_files_is_refused_before_anything_is_written(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.csv").write_text("my own\n")
    refused = subprocess.run(served_command([sys.executable, DRIVER, "--work", str(tmp_path / "work"), "--results", str(results)]),
                             cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 1 and refused.stderr.strip().count("\n") == 0
    assert refused.stderr.startswith(f"masking_ablation: --results {results}: holds files, but no settings.json")
    assert os.listdir(results) == ["results.csv"] and (results / "results.csv").read_text() == "my own\n"
    assert not (tmp_path / "work").exists()


def test_another_experiments_settings_are_named_when_its_folder_is_refused():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    stored = {"setting": "cpu", "pretrain_updates": 2000, "smoke": False, "coref_epochs": 10}
    assert masking_ablation.differing_settings(stored, {**stored, "smoke": True, "pretrain_updates": 4}) == [
        "pretrain_updates", "smoke"]
    # coreference's own settings count only where both invocations ran it, as in same_settings
    without_coref = {k: v for k, v in stored.items() if k != "coref_epochs"}
    assert masking_ablation.differing_settings(stored, without_coref) == []
    assert masking_ablation.same_settings(stored, without_coref)


@needs_shared_data("litbank/novels", "litbank/splits/fold0/train.txt")
def test_an_arm_pretrained_again_differently_is_refused_or_its_earlier_rows_retired(tmp_path, monkeypatch, capsys):
    """An arm's rows are one encoder's. Pre-trained again in a new --work (same settings) with another loss curve than
    the one recorded, the arm is refused before a row is added; --retire moves its earlier rows (and LitBank
    records) aside, leaving the other arms' rows and the same arm's rows in another precision."""
    import pytest

    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    results, work = tmp_path / "results", tmp_path / "work"
    (work / "pretrain_data").mkdir(parents=True)
    (work / "pretrain_data" / "prepare_stats.json").write_text('{"train": {"tokens": 1000}}')
    novels, _ = masking_ablation.pretraining_novels(0, masking_ablation.SETTINGS["cpu"]["novels"])
    (work / "pretrain_data.inputs.json").write_text(json.dumps(  # the corpus as if this setting had prepared it
        masking_ablation.corpus_inputs(novels, masking_ablation.BERT_VOCAB, False)))
    monkeypatch.setattr(masking_ablation, "pretrain",  # the pre-training as if it had run: its log is written below
                        lambda log, args, cfg, data, scheme, env, save_dir=None, **kw: os.path.join(save_dir, "x.pt"))
    argv = ["--schemes", "subword", "--tasks", "coref", "--seeds", "--work", str(work), "--results", str(results)]
    masking_ablation.main(argv)  # the experiment's settings.json; no rows
    (results / "results.csv").write_text(
        "arm,task,seed,score,metric,precision\nsubword,heldout_mlm,1,5.7,mlm_bits,fp32\n"
        "subword,litbank_fold0,1,53.0,conll_f1,fp32\nnone,litbank_fold0,1,48.0,conll_f1,fp32\n"
        "subword,litbank_fold0,2,54.0,conll_f1,bf16_autocast\n")
    (results / "coref_runs").mkdir()
    (results / "coref_runs" / "subword_seed1_fp32.json").write_text("{}")
    (results / "pretrain_curves.csv").write_text(
        "arm,precision,update,mlm_loss,sbo_loss\nsubword,fp32,50,12.737,\nsubword,fp32,100,9.777,\n")
    log = work / "pretrain" / "subword" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text('2026-11-28 23:50:57 | INFO | train_inner | {"num_updates": "50", "mlm_loss": "12.737"}\n'
                   '2026-11-28 23:52:32 | INFO | train_inner | {"num_updates": "100", "mlm_loss": "9.734"}\n')
    assert masking_ablation.departure_from({50: 12.737, 100: 9.777}, str(log)) == (100, 9.777, 9.734)
    assert masking_ablation.departure_from({50: 12.737}, str(log)) is None  # agrees where both logged
    before = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    with pytest.raises(SystemExit) as refused:
        masking_ablation.main(argv)
    assert str(refused.value) == (
        f"masking_ablation: subword (fp32): this pre-training is another encoder than the one its rows in "
        f"{results / 'results.csv'} came from (MLM loss 9.734 at update 100, 9.777 recorded); pass --retire subword "
        "to move those rows to retired.csv and score this one, or choose another --results")
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == before  # nothing written
    masking_ablation.main([*argv, "--retire", "subword"])
    assert "subword (fp32): 2 rows of the earlier pre-training moved to retired.csv" in capsys.readouterr().out
    kept = masking_ablation.read_rows(results / "results.csv")
    assert [(r["arm"], r["seed"], r["precision"]) for r in kept] == [("none", "1", "fp32"),
                                                                     ("subword", "2", "bf16_autocast")]
    retired = masking_ablation.read_rows(results / "retired.csv")
    assert [(r["arm"], r["task"], r["seed"]) for r in retired] == [("subword", "heldout_mlm", "1"),
                                                                   ("subword", "litbank_fold0", "1")]
    assert (results / "coref_runs" / "retired" / "subword_seed1_fp32.json").is_file()
    assert not (results / "coref_runs" / "subword_seed1_fp32.json").exists()
    with open(results / "pretrain_curves.csv", newline="") as f:  # the new encoder's curve
        assert [r["mlm_loss"] for r in csv.DictReader(f)] == ["12.737", "9.734"]
    masking_ablation.main([*argv, "--retire", "subword"])  # its curve is now the one on record: nothing moves
    assert "subword (fp32): --retire: this pre-training is the recorded one" in capsys.readouterr().out
    assert len(masking_ablation.read_rows(results / "retired.csv")) == 2
    with pytest.raises(SystemExit) as refused:  # a name of no arm here: refused before anything runs
        masking_ablation.main([*argv, "--retire", "subword_freeze0"])
    assert str(refused.value) == ("masking_ablation: --retire subword_freeze0: not an arm this invocation pre-trains "
                                  "(subword)")


def test_long_runs_show_their_progress():
    """The console lines a pre-training or fine-tuning prints as fairseq logs (the full log goes to its file)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "coreference"))
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
    from coref_litbank import epoch_progress
    from command_output import train_progress

    update = train_progress(2000)
    assert update('2026-11-29 03:57:11 | INFO | train_inner | {"epoch": 1, "num_updates": "400", "loss": "8.181"}\n') \
        == "   update 400/2000: loss 8.181"
    assert update("2026-11-29 03:57:11 | INFO | fairseq.trainer | begin training epoch 1\n") is None
    epoch = epoch_progress(10)
    assert epoch('[2026-11-29 03:15:09,844][valid][INFO] - {"epoch": 10, "valid_loss": "801.997", '
                 '"valid_conll_f1": "51.2345"}\n') == "   epoch 10/10: dev CoNLL F1 51.23"
    assert epoch('[2026-11-29 03:15:09,844][train][INFO] - {"epoch": 10, "train_loss": "336.285"}\n') is None


def test_a_gpu_pretraining_with_head_warm_up_keeps_per_parameter_fp16_master_weights(tmp_path):
    """On a GPU the driver pre-trains under fairseq's --fp16, whose flat fp32 copy of the weights cannot leave the
    frozen encoder out (the plugin refuses it): with --freeze-encoder-updates it asks for per-parameter copies."""
    import argparse

    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    class Log:
        def run(self, argv, what, env, log_path=None, progress=None):
            self.argv = argv

    cfg = {"tokens": 128, "update_freq": 1, "pretrain_updates": 20, "pretrain_lr": 1e-4, "batch": 16, "cpu": False}
    for freeze, cpu in ((100, False), (0, False), (100, True)):
        args = argparse.Namespace(from_model=str(tmp_path / "imported"), from_model_arch="spanbert_base",
                                  freeze_encoder_updates=freeze, work=str(tmp_path / f"work{freeze}{cpu}"),
                                  fresh=False, pretrain_seed=1)
        log = Log()
        masking_ablation.pretrain(log, args, {**cfg, "cpu": cpu}, str(tmp_path / "data"), "span+sbo", {},
                                  lr=1e-4, stop_at=10, save_dir=str(tmp_path / f"run{freeze}{cpu}"))
        assert ("--fp16" in log.argv) == (not cpu)
        assert ("--fp16-no-flatten-grads" in log.argv) == (freeze > 0 and not cpu), log.argv


@needs_shared_data("litbank/splits/fold0/test.txt")
@pytest.mark.parametrize("flags, expected", [
    (["--fold", "10"], "--fold 10: no such LitBank fold in {litbank}/splits (LitBank has 0-9)"),
    (["--seeds=-1"], "--seeds -1: seeds are whole numbers >= 0"),
    (["--pretrain-updates=-5"], "--pretrain-updates -5: expected at least 1"),
    (["--from-model", "{tmp}"], "--from-model {tmp}: no model.pt (expected a spanbert-import-hf folder)"),
])
def test_bad_flags_are_refused_in_one_line_before_any_work(tmp_path, flags, expected):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    flags = [flag.format(tmp=tmp_path) for flag in flags]
    refused = subprocess.run(served_command([sys.executable, DRIVER, *flags, "--work", str(tmp_path / "work"), "--results",
                              str(tmp_path / "results")]), cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 1
    expected = expected.format(tmp=tmp_path, litbank=masking_ablation.LITBANK)
    assert refused.stderr.strip().splitlines() == [f"masking_ablation: {expected}"]
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()


@needs_shared_data("litbank/novels", "litbank/splits/fold1/test.txt")
@pytest.mark.parametrize("record", ["fold0", None])
def test_a_corpus_prepared_for_other_novels_is_never_pretrained_on(tmp_path, record, imported):
    """A --work whose corpus was prepared for fold 0 (whose pre-training novels hold 10 of fold 1's dev and test
    novels), or before the driver recorded what it prepared, is refused for --fold 1, before anything runs."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    work = tmp_path / "work"
    (work / "pretrain_data").mkdir(parents=True)
    (work / "pretrain_data" / "prepare_stats.json").write_text(json.dumps({"train": {"tokens": 1}}))
    if record:
        novels, _ = masking_ablation.pretraining_novels(0, 0)
        inputs = masking_ablation.corpus_inputs(novels, os.path.join(imported, "vocab.txt"), False, imported)
        (work / "pretrain_data.inputs.json").write_text(json.dumps(inputs))
    refused = subprocess.run(served_command([sys.executable, DRIVER, "--from-model", imported, "--fold", "1", "--smoke", "--tasks",
                              "coref", "--work", str(work), "--results", str(tmp_path / "results")]), cwd=ROOT,
                             capture_output=True, text=True)
    assert refused.returncode == 1, refused.stderr[-2000:]
    what = ("was prepared from other novels, another vocabulary or for another encoder (another --fold, --novels or "
            "--from-model)"
            if record else "was prepared without a record of its novels")
    assert refused.stderr.strip().splitlines() == [
        f"masking_ablation: --work {work}: its pre-training corpus {what}; use another --work, or --fresh to prepare "
        "it again (which also discards the encoders pre-trained on it)"]
    assert sorted(os.listdir(work)) == ["pretrain_data", *(["pretrain_data.inputs.json"] if record else [])]


@needs_shared_data("litbank/novels", "litbank/splits/fold0/train.txt")
def test_a_span_annotated_corpus_records_its_inputs_before_it_is_prepared(tmp_path, monkeypatch):
    """--schemes with named_entity/noun_phrase (the default) records what the corpus is made from, annotated, before
    spanbert-prepare runs (the set of schemes needing spans once went into the JSON record and stopped the driver)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))
    import masking_ablation

    class Stop(Exception):
        pass

    class FirstCommandStops:
        def run(self, *args, **kwargs):
            raise Stop

    monkeypatch.setattr(masking_ablation, "CommandLog", FirstCommandStops)
    work = tmp_path / "work"
    with pytest.raises(Stop):
        masking_ablation.main(["--smoke", "--schemes", "named_entity", "span", "--tasks", "sst2", "--seeds", "1",
                               "--work", str(work), "--results", str(tmp_path / "results")])
    inputs = json.loads((work / "pretrain_data.inputs.json").read_text())
    assert inputs["annotated"] is True and len(inputs["novels"]) == 2
