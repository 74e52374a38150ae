"""spanbert-findanimals: baseline vs SpanDrop vs Beta-SpanDrop vs SpanMask on FINDANIMALS (SPEC §2.1).

Each run is ``fairseq-train --task find_animals`` on a small 3-layer ``spanbert``
classifier trained from scratch; the error is measured on 10,000 held-out
examples (fairseq's final validation). Writes ``results.csv`` and
``error_vs_train_size.png`` into ``--out``.
"""
import argparse
import csv
import itertools
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def run_one(method, size, seed, args):
    """Train one model; return its held-out error (%) and wall time."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "fairseq-train"), "--user-dir", os.path.join(ROOT, "user_dir"),
           "--task", "find_animals", "--criterion", "sentence_prediction", *MODEL,
           "--max-positions", str(args.seq_len + 16), "--seq-len", str(args.seq_len),
           "--animals", args.animals, "--train-size", str(size), "--test-size", str(args.test_size), "--data-seed", str(seed), "--seed", str(seed),
           "--position-bias", args.position_bias, "--batch-size", "32", "--optimizer", "adam", "--lr", "1e-3",
           "--lr-scheduler", "polynomial_decay", "--warmup-updates", "50", "--total-num-update", str(args.max_update),
           "--max-update", str(args.max_update), "--validate-interval", "100000", "--cpu", "--num-workers", "0",
           "--log-format", "json", "--no-save", *METHODS[method]]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    if proc.returncode != 0:
        raise RuntimeError(f"{method} size {size} seed {seed} failed:\n{proc.stderr[-3000:]}")
    valid = [json.loads(m.group(1)) for m in re.finditer(r"valid \| (\{.*\})", proc.stdout + proc.stderr)]
    return 100.0 - float(valid[-1]["valid_accuracy"]), time.time() - start


def plot(rows, path, title):
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
        errs = [[r["error"] for r in rows if r["method"] == method and r["train_size"] == s] for s in sizes]
        means, stds = [np.mean(e) for e in errs], [np.std(e) for e in errs]
        ax.errorbar(sizes, means, yerr=stds, marker="o", capsize=3, label=method)
    ax.set_xscale("log")
    ax.set_xlabel("training examples")
    ax.set_ylabel("held-out error (%)")
    ax.axhline(50, color="grey", linestyle=":", linewidth=1)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="spanbert-findanimals", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="quick", help="quick (<30 min, 2 cores) or full")
    parser.add_argument("--out", default="findanimals_out", help="folder for results.csv and the plot")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of " + ", ".join(METHODS))
    parser.add_argument("--sizes", help="comma-separated training sizes (default: the setting's)")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the setting's)")
    parser.add_argument("--seq-len", type=int, help="letters per string (default: the setting's)")
    parser.add_argument("--max-update", type=int, help="updates per run (default: the setting's)")
    parser.add_argument("--animals", help="comma-separated animal names (default: the setting's, 'cat' as in SPEC §2.1)")
    parser.add_argument("--test-size", type=int, default=10000, help="held-out examples")
    parser.add_argument("--position-bias", default="uniform", choices=["uniform", "fixed", "first100"], help="training position bias")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    args = parser.parse_args(argv)
    setting = SETTINGS[args.setting]
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else setting["sizes"]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else setting["seeds"]
    args.seq_len = args.seq_len or setting["seq_len"]
    args.max_update = args.max_update or setting["max_update"]
    args.animals = args.animals or setting["animals"]
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; expected {', '.join(METHODS)}")
    os.makedirs(args.out, exist_ok=True)
    runs = list(itertools.product(sizes, seeds, methods))
    rows = []
    with ThreadPoolExecutor(args.jobs) as pool, tqdm(total=len(runs), desc="FINDANIMALS runs", unit="run") as bar:
        futures = {pool.submit(run_one, m, size, seed, args): (m, size, seed) for size, seed, m in runs}
        for future in futures:
            method, size, seed = futures[future]
            error, seconds = future.result()
            rows.append({"method": method, "train_size": size, "seed": seed, "seq_len": args.seq_len, "animals": args.animals,
                         "max_update": args.max_update, "position_bias": args.position_bias,
                         "error": round(error, 2), "seconds": round(seconds, 1)})
            bar.set_postfix_str(f"{method} n={size} seed={seed}: {error:.1f}%")
            bar.update()
    csv_path = os.path.join(args.out, "results.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, os.path.join(args.out, "error_vs_train_size.png"),
         f"FINDANIMALS ({args.animals}), n={args.seq_len}, bias={args.position_bias}, {len(seeds)} seeds")
    print(f"\n{'method':>14} " + " ".join(f"{s:>12}" for s in sizes))
    for method in methods:
        cells = []
        for s in sizes:
            errs = [r["error"] for r in rows if r["method"] == method and r["train_size"] == s]
            mean = sum(errs) / len(errs)
            sd = (sum((e - mean) ** 2 for e in errs) / len(errs)) ** 0.5
            cells.append(f"{mean:6.1f} ± {sd:4.1f}")
        print(f"{method:>14} " + " ".join(f"{c:>12}" for c in cells))
    print(f"\nwrote {csv_path} and error_vs_train_size.png (held-out error %, mean ± sd over seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
