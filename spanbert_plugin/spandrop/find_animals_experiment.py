"""FINDANIMALS experiment (SPEC §2.1): baseline vs SpanDrop vs Beta-SpanDrop vs SpanMask.

Each run is ``fairseq-train --task find_animals`` on a small 3-layer ``spanbert``
classifier trained from scratch; the error is measured on the held-out test set
(fairseq's final validation, which covers every test example). The console
command ``spanbert-findanimals`` (``spanbert_plugin.cli.findanimals``) drives
this module.
"""
import csv
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Dict, Iterator, List

from ..core.user_dir import USER_DIR

METHODS = {
    "baseline": [],
    "spandrop": ["--span-drop-p", "0.1"],
    "beta_spandrop": ["--span-drop-p", "0.1", "--span-drop-gamma", "1"],
    "spanmask": ["--span-drop-p", "0.1", "--span-drop-mode", "mask"],
}
SETTINGS = {
    # quick: finishes in under 30 minutes on 2 cores; strings of 50 letters instead of 300
    "quick": {"sizes": [200, 1000], "seeds": [1, 2, 3], "seq_len": 50, "max_update": 1500, "animals": "cat"},
    "full": {"sizes": [200, 500, 1000, 2000, 5000, 10000], "seeds": [1, 2, 3, 4, 5], "seq_len": 300,
             "max_update": 10000, "animals": "cat"},
}
MODEL = ["--arch", "spanbert_tiny", "--encoder-layers", "3", "--encoder-embed-dim", "64",
         "--encoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4", "--attention-dropout", "0"]
RESULTS_FILE, PLOT_FILE = "results.csv", "error_vs_train_size.png"


class RunFailed(RuntimeError):
    """A training run exited with an error; the message holds the end of its output."""


@dataclass
class RunOptions:
    """What every run of one experiment shares."""

    seq_len: int
    max_update: int
    animals: str
    test_size: int = 10000
    position_bias: str = "uniform"
    threads: int = 1
    device: str = "cpu"  # "cuda": runs train on the GPU (several at once share it)


def train_command(method: str, size: int, seed: int, options: RunOptions, save_dir: str) -> List[str]:
    """The fairseq-train command line of one run; ``save_dir`` an empty folder of its own (with --no-save fairseq
    still resumes from the save folder's checkpoint_last.pt: the working directory's checkpoints/ would do)."""
    o = options
    return [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), "--user-dir", USER_DIR,
            "--task", "find_animals", "--criterion", "sentence_prediction", *MODEL,
            "--max-positions", str(o.seq_len + 16), "--seq-len", str(o.seq_len), "--animals", o.animals,
            "--train-size", str(size), "--test-size", str(o.test_size), "--data-seed", str(seed), "--seed", str(seed),
            "--position-bias", o.position_bias, "--batch-size", "32", "--optimizer", "adam", "--lr", "1e-3",
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", "50", "--total-num-update", str(o.max_update),
            "--max-update", str(o.max_update), "--validate-interval", "100000", *(["--cpu"] if o.device == "cpu" else []),
            "--num-workers", "0", "--log-format", "json", "--no-save", "--save-dir", save_dir, *METHODS[method]]


class ChildRuns:
    """The fairseq-train processes of an experiment, so that all of them stop when the experiment stops.

    Runs start from worker threads; a signal or an error reaches the main thread, whose
    ``stop`` terminates every live child (killed after ``grace`` seconds) and keeps new ones from starting.
    """

    def __init__(self, grace: float = 10.0):
        self.grace = grace
        self._lock = threading.Lock()
        self._live = set()
        self._stopped = False

    def run(self, args, env) -> subprocess.CompletedProcess:
        """``subprocess.run(args)`` with output captured, unless the experiment is stopping."""
        with self._lock:
            if self._stopped:
                raise RunFailed("stopped before this run started")
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            self._live.add(proc)
        try:
            out, err = proc.communicate()
        finally:
            with self._lock:
                self._live.discard(proc)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def stop(self) -> None:
        """Terminate every live child and wait for it (SIGKILL after the grace period)."""
        with self._lock:
            self._stopped = True
            live = list(self._live)
        for proc in live:
            if proc.poll() is None:
                proc.terminate()
        for proc in live:
            try:
                proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_one(method: str, size: int, seed: int, options: RunOptions, children: ChildRuns = None):
    """Train one model; return its held-out error (%) and wall time in seconds."""
    start = time.time()
    env = dict(os.environ, OMP_NUM_THREADS=str(options.threads))
    with tempfile.TemporaryDirectory(prefix="findanimals-run-") as save_dir:
        proc = (children or ChildRuns()).run(train_command(method, size, seed, options, save_dir), env)
    if proc.returncode != 0:
        raise RunFailed(f"{method} size {size} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    valid = [json.loads(m.group(1)) for m in re.finditer(r"valid \| (\{.*\})", proc.stdout + proc.stderr)]
    if not valid:
        raise RunFailed(f"{method} size {size} seed {seed}: no validation result in its output")
    return 100.0 - float(valid[-1]["valid_accuracy"]), time.time() - start


def run_all(methods, sizes, seeds, options: RunOptions, jobs: int = 2) -> Iterator[Dict]:
    """Run every (size, seed, method) combination, ``jobs`` at a time; yield one result row per run as it ends.

    When the caller stops (Ctrl-C, SIGTERM or SIGHUP raised in the main thread, a failed run, or the
    generator closed), the runs in progress are terminated and the others never start.
    """
    runs = list(itertools.product(sizes, seeds, methods))
    children = ChildRuns()
    pool = ThreadPoolExecutor(jobs)
    try:
        futures = {pool.submit(run_one, method, size, seed, options, children): (method, size, seed)
                   for size, seed, method in runs}
        for future in as_completed(futures):
            method, size, seed = futures[future]
            error, seconds = future.result()
            yield {"method": method, "train_size": size, "seed": seed, "seq_len": options.seq_len,
                   "animals": options.animals, "max_update": options.max_update, "position_bias": options.position_bias,
                   "error": round(error, 2), "seconds": round(seconds, 1)}
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        while True:
            try:
                children.stop()
                break
            except KeyboardInterrupt:  # a second signal while stopping: the children must still go
                continue
        pool.shutdown(wait=True)


def _errors(rows, method, size):
    return [r["error"] for r in rows if r["method"] == method and r["train_size"] == size]


def summary_table(rows: List[Dict], methods, sizes) -> str:
    """Held-out error (%) per method and training size: mean ± sample sd (n - 1) over seeds."""
    lines = [f"{'method':>14} " + " ".join(f"{s:>12}" for s in sizes)]
    for method in methods:
        cells = []
        for size in sizes:
            errs = _errors(rows, method, size)
            mean = statistics.mean(errs)
            sd = statistics.stdev(errs) if len(errs) > 1 else 0.0  # the sample sd, as the other experiments report
            cells.append(f"{mean:6.1f} ± {sd:4.1f}")
        lines.append(f"{method:>14} " + " ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def write_results(rows: List[Dict], folder: str, title: str) -> None:
    """``results.csv`` (one row per run, in a fixed order) and the error-vs-size plot, into ``folder``."""
    rows = sorted(rows, key=lambda r: (r["train_size"], r["seed"], list(METHODS).index(r["method"])))
    with open(os.path.join(folder, RESULTS_FILE), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, os.path.join(folder, PLOT_FILE), title)


def plot(rows, path, title):
    """Error vs training size (log scale), one line per method with the seed spread as error bars."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4))
    for method in METHODS:
        sizes = sorted({r["train_size"] for r in rows if r["method"] == method})
        if not sizes:
            continue
        errs = [_errors(rows, method, s) for s in sizes]
        spread = [np.std(e, ddof=1) if len(e) > 1 else 0.0 for e in errs]  # sample SD
        ax.errorbar(sizes, [np.mean(e) for e in errs], yerr=spread, marker="o", capsize=3, label=method)
    ax.set_xscale("log")
    ax.set_xlabel("training examples")
    ax.set_ylabel("held-out error (%)")
    ax.axhline(50, color="grey", linestyle=":", linewidth=1)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
