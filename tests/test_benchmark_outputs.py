"""The benchmark scripts never replace a user's files: a results folder or file they did not write is refused in
one line, exit 1, before any measurement, and left as it was; their own earlier output is replaced only with
--force (the committed results included, so their documented commands can be run again)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "regularisers"))  # span_drop_squad
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "cpu_speed"))  # the speed scripts
import span_drop_squad  # noqa: E402
from results_file import check_results_file, write_results_file  # noqa: E402

from spanbert_plugin.core.file_utils import OutputError, check_destination  # noqa: E402

BENCHMARKS = os.path.join(ROOT, "benchmarks")


def run(script, *argv):
    return subprocess.run([sys.executable, os.path.join(BENCHMARKS, script), *argv], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def users_folder(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.json").write_text("my own results\n")
    return folder


def assert_refused_in_one_line(result, folder):
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "--out" in result.stderr and str(folder) in result.stderr
    assert sorted(os.listdir(folder)) == ["results.json"]
    assert (folder / "results.json").read_text() == "my own results\n"


def test_coref_cost_refuses_a_users_folder_before_measuring(tmp_path):
    folder = users_folder(tmp_path)
    result = run("coreference/coref_cost.py", "--shapes", "tiny", "--sizes", "1000", "--modes", "predict", "--cpu",
                 "--work", str(tmp_path / "work"), "--out", str(folder), "--force")
    assert_refused_in_one_line(result, folder)
    assert not (tmp_path / "work").exists()  # nothing prepared, nothing measured


def test_coref_cost_grows_per_doubling_of_the_words_whatever_sizes_were_measured():
    sys.path.insert(0, os.path.join(BENCHMARKS, "coreference"))
    import coref_cost

    short, long_ = {"words": 1000, "seconds": 2.0}, {"words": 4000, "seconds": 8.0}  # 4x the time over two doublings
    assert coref_cost.per_doubling(short, long_, "seconds") == pytest.approx(2.0)
    rows = [dict(shape="tiny", mode="train", words=w, tokens=w, seconds=t, peak_rss_mib=m)
            for w, t, m in ((1000, 2.0, 100.0), (4000, 8.0, 400.0), (8000, 12.0, 400.0))]
    table = coref_cost.table([*rows, dict(shape="tiny", mode="train", words=16000, error="out of memory")])
    assert [line.split(" | ")[-2:] for line in table.splitlines()[2:5]] == [["", " |"], ["2.00", "2.00 |"],
                                                                            ["1.50", "1.00 |"]]
    assert "peak GPU" not in table  # no row ran on a GPU: no column of blanks
    assert table.splitlines()[-1] == "- tiny train 16,000 words: failed: out of memory"


def test_coref_cost_draws_its_committed_rows_again_and_refuses_a_file_of_other_rows(tmp_path):
    """--from-results measures nothing: the committed folder's table and plot come back from its rows (the table
    as committed), in a new folder or in place; a results.json of other rows is one line, nothing written."""
    import shutil

    committed = os.path.join(BENCHMARKS, "coreference", "coref_cost")
    copy = tmp_path / "coref_cost"
    shutil.copytree(committed, copy)
    result = run("coreference/coref_cost.py", "--from-results", str(copy), "--out", str(copy), "--force")
    assert result.returncode == 0, result.stderr
    table = lambda folder: open(os.path.join(folder, "results.md")).read().split("\n\nThe rows of")[0]  # noqa: E731
    assert table(copy) == table(committed)
    assert json.load(open(copy / "results.json")) == json.load(open(os.path.join(committed, "results.json")))
    assert (copy / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "results.json").write_text(json.dumps([{"shape": "tiny", "mode": "train", "words": 1000}]))
    refused = run("coreference/coref_cost.py", "--from-results", str(tmp_path / "other"), "--out", str(tmp_path / "out"))
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"coref_cost: --from-results {tmp_path / 'other' / 'results.json'}: row 1 is not one of this script's "
        "(an object with shape, mode, words, tokens, seconds, peak_rss_mib)")
    assert not (tmp_path / "out").exists()


def test_loss_curve_refuses_a_users_folder_before_training(tmp_path):
    model, data = tmp_path / "imported", tmp_path / "data"
    model.mkdir()
    data.mkdir()
    (model / "model.pt").write_bytes(b"")
    (data / "prepare_stats.json").write_text("{}")
    folder = users_folder(tmp_path)
    result = run("cpu_speed/bf16_autocast_loss_curve.py", "--from-model", str(model), "--data", str(data),
                 "--work", str(tmp_path / "work"), "--out", str(folder), "--force")
    assert_refused_in_one_line(result, folder)
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("folder, command", [
    ("coreference/coref_cost", "coref_cost.py"), ("coreference/coref_cost_mention_loss_0", "coref_cost.py"),
    ("coreference/coref_cost_mention_loss_1", "coref_cost.py"),
    ("cpu_speed/bf16_autocast/loss_curve", "bf16_autocast_loss_curve.py"),
    ("pretraining/continued_pretraining/lr_choice_on_dev", "lr_choice_on_dev.py"),
    ("against_transformers/results/qa_inference", "qa_inference.py"),
    ("against_transformers/results/qa_inference_all_recheck", "qa_inference.py")])
def test_committed_results_are_replaced_only_by_their_script_and_only_with_force(folder, command):
    destination = os.path.join(BENCHMARKS, folder)
    check_destination(destination, command, force=True, flag="--out")
    with pytest.raises(OutputError, match="pass --force"):
        check_destination(destination, command, force=False, flag="--out")
    with pytest.raises(OutputError, match="not of coref_litbank.py"):
        check_destination(destination, "coref_litbank.py", force=True, flag="--out")


SPEED_KEYS = ("threads", "runs", "steps", "workloads")


def test_a_results_file_is_replaced_only_with_force_and_only_when_it_is_the_scripts(tmp_path, capsys):
    path = tmp_path / "results.json"
    check_results_file(str(path), "speed.py", False, SPEED_KEYS)  # new: fine
    write_results_file(str(path), {"threads": 1, "runs": 2, "steps": 3, "workloads": {}})
    assert json.loads(path.read_text())["runs"] == 2 and os.listdir(tmp_path) == ["results.json"]
    with pytest.raises(SystemExit, match="pass --force"):
        check_results_file(str(path), "speed.py", False, SPEED_KEYS)
    check_results_file(str(path), "speed.py", True, SPEED_KEYS)
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"threads": 1}')
    with pytest.raises(SystemExit, match="never replaced, even with --force"):
        check_results_file(str(foreign), "speed.py", True, SPEED_KEYS)
    (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit, match="not a plain file"):
        check_results_file(str(tmp_path / "folder"), "speed.py", True, SPEED_KEYS)
    assert foreign.read_text() == '{"threads": 1}'


@pytest.mark.parametrize("script", ["bf16_autocast_speed.py", "vocab_cross_entropy_speed.py", "update_cost/module_walks.py",
                                    "update_cost/seeding.py", "update_cost/collector_pauses.py"])
def test_speed_scripts_refuse_a_users_file_before_measuring(tmp_path, script):
    path = tmp_path / "notes.json"
    path.write_text("my notes\n")
    result = run(os.path.join("cpu_speed", script), "--out", str(path), "--force")
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0 and str(path) in result.stderr
    assert path.read_text() == "my notes\n"
    assert run(os.path.join("cpu_speed", script), "--out", str(path)).stderr.strip().endswith("choose another name")


@pytest.mark.parametrize("name, script", [
    ("results_1thread.json", "bf16_autocast_speed"), ("results_2threads.json", "bf16_autocast_speed"),
    ("results_avx2_1thread.json", "bf16_autocast_speed"), ("results_1thread_chunked_ce.json", "bf16_autocast_speed"),
    ("vocab_cross_entropy_1thread.json", "vocab_cross_entropy_speed")])
def test_committed_speed_results_are_their_scripts(name, script):
    module = __import__(script)
    check_results_file(os.path.join(BENCHMARKS, "cpu_speed", "bf16_autocast", name), script + ".py", True, module.RESULT_KEYS)


@pytest.mark.parametrize("script", ["module_walks", "seeding", "collector_pauses"])
def test_committed_update_cost_results_are_their_scripts(script):
    sys.path.insert(0, os.path.join(BENCHMARKS, "cpu_speed", "update_cost"))
    module = __import__(script)
    check_results_file(os.path.join(BENCHMARKS, "cpu_speed", "update_cost", "results", script + ".json"),
                       script + ".py", True, module.RESULT_KEYS)


def test_span_drop_squad_keeps_its_folder_to_its_own_files(tmp_path):
    out = tmp_path / "out"
    assert span_drop_squad.out_problem(str(out), resume=False) is None
    out.mkdir()
    assert span_drop_squad.out_problem(str(out), resume=False) is None  # empty
    (out / "results.csv").write_text("seed\n")
    assert "pass --resume" in span_drop_squad.out_problem(str(out), resume=False)
    assert span_drop_squad.out_problem(str(out), resume=True) is None
    (out / "draft.md").write_text("mine")
    assert "did not write (draft.md)" in span_drop_squad.out_problem(str(out), resume=True)


def test_qa_quality_refuses_a_results_folder_it_did_not_write(tmp_path):
    tokenizer = tmp_path / "data"
    tokenizer.mkdir()
    (tokenizer / "dict.txt").write_text("a 1\n")
    folder = users_folder(tmp_path)
    result = run("pretraining/qa_quality.py", "--setups", "random-init", "--tokenizer-from", str(tokenizer),
                 "--work", str(tmp_path / "work"), "--results", str(folder), "--fresh")
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0, result.stderr
    assert f"--results {folder}: holds files, but no settings.json" in result.stderr
    assert os.listdir(folder) == ["results.json"] and not (tmp_path / "work").exists()


def test_qa_inference_refuses_a_users_folder_before_any_work(tmp_path):
    folder = users_folder(tmp_path)
    result = run("against_transformers/qa_inference.py", "--checkpoint", str(tmp_path / "model.pt"), "--tokenizer-from",
                 str(tmp_path), "--work", str(tmp_path / "work"), "--out", str(folder), "--force")
    assert_refused_in_one_line(result, folder)
    assert not (tmp_path / "work").exists()


def test_side_by_side_refuses_a_folder_without_its_runs(tmp_path):
    folder = users_folder(tmp_path)
    result = run("against_transformers/side_by_side.py", "--task", "sst2", "--work", str(tmp_path / "work"), "--out", str(folder))
    assert_refused_in_one_line(result, folder)
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("script, extra, committed", [
    ("gpu/throughput_ratios.py", [], "gpu/logs/throughput_ratios.json"),
    ("against_transformers/wall_time_per_epoch.py", [], "against_transformers/results/wall_time_per_epoch.json"),
    ("cpu_speed/malloc_zeroing.py", [], "cpu_speed/malloc_zeroing/results.json"),
    ("gpu/export_size.py", ["--imported", "{tmp}", "--work", "{tmp}/work"], "gpu/export_size/sizes.json"),
])
def test_json_results_scripts_refuse_a_users_file_and_own_their_committed_result(tmp_path, script, extra, committed):
    """The user's file is refused in one line before any work (nothing beside it, no --work folder), and the
    committed result is one the script may replace with --force."""
    import importlib

    path = tmp_path / "notes.json"
    path.write_text("my notes\n")
    result = run(script, *(arg.format(tmp=tmp_path) for arg in extra), "--out", str(path), "--force")
    assert result.returncode == 1 and result.stderr.strip().count("\n") == 0 and str(path) in result.stderr
    assert path.read_text() == "my notes\n" and sorted(os.listdir(tmp_path)) == ["notes.json"]
    folder, name = os.path.split(os.path.join(BENCHMARKS, script))
    sys.path.insert(0, folder)
    module = importlib.import_module(name[:-len(".py")])
    check_results_file(os.path.join(BENCHMARKS, committed), name, True, module.RESULT_KEYS)


def test_the_wall_time_table_is_what_its_script_makes_of_the_committed_runs(tmp_path):
    """The committed wall-time table (the README's, and its plot) is rewritten from the committed runs alike, and
    its SST-2 CPU row is the mean of its three seeds' epochs on each side."""
    out = tmp_path / "wall.json"
    result = run("against_transformers/wall_time_per_epoch.py", "--out", str(out))
    assert result.returncode == 0, result.stderr
    committed = json.load(open(os.path.join(BENCHMARKS, "against_transformers", "results", "wall_time_per_epoch.json")))
    assert json.load(open(out))["rows"] == committed["rows"]
    assert (tmp_path / "wall.png").stat().st_size > 0 and "**0.93x**" in (tmp_path / "wall.md").read_text()
    runs = [json.loads(line) for line in open(os.path.join(BENCHMARKS, "against_transformers", "results",
                                                           "sst2_full_1epoch", "runs.jsonl"))]
    mean = lambda side: sum(r["epoch_seconds"][0] for r in runs if r["side"] == side) / 3  # noqa: E731
    row = committed["rows"][0]
    assert row["ours_over_group_by_length"] == pytest.approx(mean("ours") / mean("transformers (group_by_length)"))
    elsewhere = run("against_transformers/wall_time_per_epoch.py", "--results", str(tmp_path / "none"), "--out",
                    str(tmp_path / "none.json"))
    assert elsewhere.returncode == 1 and elsewhere.stderr.strip().startswith(
        f"wall_time_per_epoch.py: --results {tmp_path / 'none'}: No such file or directory") and "\n" not in (
        elsewhere.stderr.strip()) and not (tmp_path / "none.json").exists()


def test_score_tests_write_every_row_whole_with_welchs_p_and_a_plot(tmp_path):
    """side_by_side.py --score-tests from a runs.jsonl: each side of ours against each transformers side with two
    runs or more, a p under 0.01 (printed in exponent form) in a whole table row like the others (one such row lost
    its first six columns), p recomputed by hand from Welch's formula, and the scores' plot beside the table."""
    import math

    from scipy import stats

    settings = "task squad, 1 epoch(s)"
    runs = {"ours": [60.1, 61.5, 60.9], "transformers": [58.2, 61.0, 60.3], "random-init": [9.4, 9.9]}
    with open(tmp_path / "runs.jsonl", "w") as f:
        for side, scores in runs.items():
            for seed, score in enumerate(scores, 1):
                f.write(json.dumps({"side": side, "seed": seed, "settings": settings, "score_per_epoch": [score],
                                    "epoch_seconds": [1.0]}) + "\n")
    result = run("against_transformers/side_by_side.py", "--task", "squad", "--score-tests", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    rows = [line for line in (tmp_path / "score_tests.md").read_text().splitlines() if line.startswith("| ")]
    assert len(rows) == 3 and all(row.count("|") == 9 for row in rows), rows  # the header and two tests
    tests = {t["side"]: t for t in json.load(open(tmp_path / "score_tests.json"))["tests"]}
    assert set(tests) == {"ours", "random-init"} and {t["peer"] for t in tests.values()} == {"transformers"}
    for side, test in tests.items():
        a, b = runs[side], runs["transformers"]
        va, vb = stats.tvar(a) / len(a), stats.tvar(b) / len(b)
        t = (sum(a) / len(a) - sum(b) / len(b)) / math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
        assert test["welch_t"] == pytest.approx(t) and test["welch_df"] == pytest.approx(df)
        assert test["p"] == pytest.approx(2 * stats.t.sf(abs(t), df))
    assert tests["random-init"]["p"] < 0.01 and f"| {tests['random-init']['p']:.1e} |" in rows[2]
    assert rows[2].startswith("| random-init | transformers | 9.40 / 9.90 (1, 2) |")
    assert (tmp_path / "score_tests.png").stat().st_size > 0


def test_qa_inference_draws_its_committed_results_again_and_refuses_other_results(tmp_path):
    """--from-results measures nothing: the committed folder's table (as committed) and its plots come back from its
    results.json, in place; a results.json of an older layout is one line, nothing written."""
    import shutil

    committed = os.path.join(BENCHMARKS, "against_transformers", "results", "qa_inference_all_recheck")
    copy = tmp_path / "qa_inference_all_recheck"
    shutil.copytree(committed, copy)
    result = run("against_transformers/qa_inference.py", "--from-results", str(copy), "--out", str(copy), "--force")
    assert result.returncode == 0, result.stderr
    table = lambda folder: open(os.path.join(folder, "summary.md")).read().split("\n\nTable and plots drawn")[0]  # noqa: E731
    assert table(copy) == table(committed) and "--fp32-recheck-margin 0.05" in table(copy)  # the measuring command kept
    assert json.load(open(copy / "results.json")) == json.load(open(os.path.join(committed, "results.json")))
    for plot in ("questions_per_second.png", "fp32_recheck_sweep.png"):
        assert (copy / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    older = os.path.join(BENCHMARKS, "against_transformers", "results", "qa_inference")  # one ratio, no per-side keys
    refused = run("against_transformers/qa_inference.py", "--from-results", older, "--out", str(tmp_path / "out"))
    assert refused.returncode == 1 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert refused.stderr.startswith(f"qa_inference: --from-results {os.path.join(older, 'results.json')}: not this "
                                     "script's results")
    assert not (tmp_path / "out").exists()
