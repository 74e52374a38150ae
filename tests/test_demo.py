"""`make demo` (scripts/demo.py) run twice in one folder, the second time with fewer updates than the log interval;
`make bench` (benchmarks/cpu_speed/masking_throughput.py) in its quick mode."""
import json
import os
import re
import sys

import torch

from conftest import ROOT, run_cli
from spanbert_plugin.core.file_utils import MANIFEST

DEMO = [sys.executable, os.path.join(ROOT, "scripts", "demo.py")]


def loss_rows(stdout):
    """(update, mlm_loss) of each row of the demo's final loss table."""
    table = stdout.split("== Losses (bits per masked token) over training:")[1].split("\n\n")[0]
    return [(int(row.split()[0]), float(row.split()[1])) for row in table.strip().splitlines()[1:]]


def loss_table(stdout):
    """The update numbers of the demo's final loss table."""
    return [update for update, _ in loss_rows(stdout)]


def test_demo_trains_shows_predictions_and_runs_twice_in_one_folder(tmp_path):
    out = str(tmp_path / "demo_out")
    first = run_cli([*DEMO, "--out", out, "--max-update", "24", "--vocab-size", "1000"])
    rows = loss_rows(first.stdout)
    assert [update for update, _ in rows] == list(range(3, 25, 3))  # at least 8 loss records however short the run
    # the loss falls: from log2(1000) = 9.97 bits, 1.7 bits lower after 40 updates when the test was written
    assert rows[-1][1] < rows[0][1] - 0.3, rows
    from spanbert_plugin.core.precision import cpu_supports_bf16

    precision = "bfloat16 autocast" if cpu_supports_bf16() else "fp32"  # the demo's choice, said in one line
    assert f"== Precision: {precision} (" in first.stdout and f"task.bf16_autocast={precision != 'fp32'}".lower() in (
        first.stdout.lower())
    assert "earlier demo run" not in first.stdout
    manifest = json.load(open(os.path.join(out, MANIFEST)))
    assert manifest["command"] == "demo"
    assert {"corpus.train.txt", "data/dict.txt", "checkpoints/checkpoint_last.pt", "checkpoints/train.log"} <= set(
        manifest["files"])
    # what the model learned, as a person sees it: masked spans of held-out text, trained and untrained guesses
    predictions = first.stdout.split("== Masked spans of held-out text")[1]
    assert predictions.count("    target: ") == 3
    assert predictions.count("   trained: ") == 3 and predictions.count(" untrained: ") == 3
    assert torch.load(os.path.join(out, "checkpoints", "checkpoint_last.pt"), weights_only=False)[
        "optimizer_history"][-1]["num_updates"] == 24

    second = run_cli([*DEMO, "--out", out, "--max-update", "2", "--vocab-size", "1000"])  # fewer than the interval
    count = re.search(r"holds an earlier demo run: starting over \(removing the (\d+) files it wrote\)", second.stdout)
    assert count and int(count.group(1)) == len(manifest["files"])
    # started over: the finished run was not resumed (which trained nothing and logged no loss)
    assert loss_table(second.stdout) == [1, 2]
    with open(os.path.join(out, "checkpoints", "train.log"), encoding="utf-8") as f:
        assert "No existing checkpoint found" in f.read()  # fairseq's log goes to a file; the screen gets a summary
    assert "INFO" not in second.stdout and len(second.stdout.splitlines()) < 80
    assert json.load(open(os.path.join(out, MANIFEST)))["files"] == manifest["files"]


def test_demo_refuses_a_folder_with_other_files_and_touches_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"command": "demo", "files": ["corpus.train.txt"]}))
    (out / "corpus.train.txt").write_text("an earlier demo corpus\n")
    (out / "notes.txt").write_text("the user's own notes")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = run_cli([*DEMO, "--out", str(out), "--max-update", "2"], check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"demo: error: --out {out}: holds files that demo did not write (notes.txt); it is never replaced, "
        "even with --force: move them away first"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    (out / MANIFEST).unlink()  # a folder no spanbert command wrote
    result = run_cli([*DEMO, "--out", str(out), "--max-update", "2"], check=False)
    assert result.returncode == 1 and "was not written by a spanbert command" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["corpus.train.txt", "notes.txt"]


def test_masking_benchmark_quick_mode(tmp_path):
    """`make bench`'s quick mode is a smoke run (its numbers mean nothing, it says so): every side is timed and
    every line of the report is there, with positive throughputs and ratios."""
    result = run_cli([sys.executable, os.path.join(ROOT, "benchmarks", "cpu_speed", "masking_throughput.py"), "--quick",
                      "--out", str(tmp_path)])
    assert "(--quick: not a measurement)" in result.stdout
    rates = dict(re.findall(r"^(fairseq .*?|spanbert .*?)\s+(\d+) blocks/s$", result.stdout, re.M))
    assert sorted(rates) == ["fairseq MaskTokensDataset, source only", "fairseq masked_lm example (src + tgt)",
                             "spanbert SpanMaskedDataset example"]
    assert all(int(rate) > 0 for rate in rates.values())
    ratios = re.findall(r"^ratio (.*): (\d+\.\d+)x \(median of 3 alternating runs, range", result.stdout, re.M)
    assert [name for name, _ in ratios] == ["per training example (spanbert / fairseq masked_lm)",
                                            "against a single MaskTokensDataset"]
    assert all(float(value) > 0 for _, value in ratios)
