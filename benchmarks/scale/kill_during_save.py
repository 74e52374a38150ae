#!/usr/bin/env python
"""A process killed during a checkpoint save, many times at different points: is ``checkpoint_last.pt`` always whole?

Each try runs ``fairseq-train`` (spanbert_tiny pre-training, ``--save-interval-updates 1``) through
``killed_in_save.py``, which kills it with SIGKILL part way through the save of update 3: in the write of
``checkpoint_1_3.pt.tmp`` or in the copy of that file onto ``checkpoint_last.pt``, after a fraction of the bytes
drawn from a seeded generator. Then ``checkpoint_last.pt`` is loaded (it must hold update 2, the old one, or 3, the
new one), the temporary files left behind are counted, and ``fairseq-train`` runs again to update 4 from the same
``--save-dir`` (it must resume). The corpus is Jane Austen's *Persuasion* from LitBank's novels, prepared once with
the BERT uncased WordPiece vocabulary.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scale/kill_during_save.py --tries 20 \\
        --out benchmarks/scale/kill_during_save

Writes ``results.json`` (a row per try) and ``table.md``; an existing ``--out`` is replaced only with ``--force``
and only when it is this script's.
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from results_file import add_results_options, claim_outputs, write_results_file  # noqa: E402

BIN = os.path.join(ROOT, ".venv", "bin")
HERE = os.path.dirname(os.path.abspath(__file__))
NOVEL = os.path.join(ROOT, "..", "shared", "data", "litbank", "novels", "105_persuasion.txt.gz")
VOCAB = os.path.join(ROOT, "..", "shared", "data", "bert_uncased_vocab", "vocab.txt")
KILL_AT_UPDATE = 3
TRAIN = ["--user-dir", "user_dir", "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch",
         "spanbert_tiny", "--tokens-per-sample", "128", "--batch-size", "4", "--optimizer", "adam", "--lr", "1e-3",
         "--cpu", "--num-workers", "0", "--log-format", "json", "--log-interval", "1", "--disable-validation",
         "--seed", "3", "--no-epoch-checkpoints", "--save-interval-updates", "1"]
WORK_MARK = "kill_during_save.work"


def prepare(work: str) -> str:
    data = os.path.join(work, "data")
    if os.path.isfile(os.path.join(data, "dict.txt")):
        return data
    with gzip.open(NOVEL, "rt", encoding="utf-8") as f:
        paragraphs = f.read().split("\n\n")
    cut = len(paragraphs) * 9 // 10  # the last tenth of the novel is the validation text
    train, valid = os.path.join(work, "persuasion.train.txt"), os.path.join(work, "persuasion.valid.txt")
    for path, part in ((train, paragraphs[:cut]), (valid, paragraphs[cut:])):
        with open(path, "w", encoding="utf-8") as out:
            out.write("\n\n".join(part))
    subprocess.run([os.path.join(BIN, "spanbert-prepare"), "--train", train, "--valid", valid,
                    "--join-wrapped-lines", "--destdir", data,
                    "--tokenizer", "wordpiece", "--wordpiece-vocab", VOCAB, "--lowercase", "--force"],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return data


def updates_in(checkpoint: str):
    """The update count a checkpoint holds, or the error loading it gives."""
    import torch

    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        return int(state["optimizer_history"][-1]["num_updates"]), None
    except Exception as err:  # a truncated file: whatever torch raises is the finding
        return None, f"{type(err).__name__}: {str(err)[:200]}"


def one_try(data: str, save_dir: str, phase: str, fraction: float) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    killed = subprocess.run([sys.executable, os.path.join(HERE, "killed_in_save.py"), phase, f"{fraction:.4f}",
                             str(KILL_AT_UPDATE), data, *TRAIN, "--max-update", str(KILL_AT_UPDATE + 1),
                             "--save-dir", save_dir], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    row = {"phase": phase, "fraction": round(fraction, 4), "exit_status": killed.returncode}
    last = os.path.join(save_dir, "checkpoint_last.pt")
    row["checkpoint_last_updates"], row["load_error"] = updates_in(last)
    row["readable"] = row["checkpoint_last_updates"] in (KILL_AT_UPDATE - 1, KILL_AT_UPDATE)
    row["left_behind"] = sorted(name for name in os.listdir(save_dir) if ".tmp" in name)
    resumed = subprocess.run([os.path.join(BIN, "fairseq-train"), data, *TRAIN, "--max-update",
                              str(KILL_AT_UPDATE + 1), "--save-dir", save_dir], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    row["resumed"] = resumed.returncode == 0 and updates_in(last)[0] == KILL_AT_UPDATE + 1
    row["left_after_resuming"] = sorted(name for name in os.listdir(save_dir) if ".tmp" in name)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    add_results_options(parser, "/tmp/kill_during_save")
    args = parser.parse_args(argv)
    results_path = claim_outputs(args, "kill_during_save.py", ("tries", "rows"), WORK_MARK)
    data = prepare(args.work)
    rng = np.random.default_rng(args.seed)
    rows = []
    for attempt in range(args.tries):
        phase, fraction = ("write", "copy")[attempt % 2], float(rng.uniform(0.02, 0.98))
        save_dir = os.path.join(args.work, f"try{attempt}")
        if os.path.isdir(save_dir):
            shutil.rmtree(save_dir)  # this script's own scratch folder
        row = one_try(data, save_dir, phase, fraction)
        rows.append(row)
        print(f"try {attempt + 1}/{args.tries}: {json.dumps(row)}", flush=True)
    summary = {"tries": args.tries, "seed": args.seed, "killed": sum(r["exit_status"] == -9 for r in rows),
               "readable": sum(r["readable"] for r in rows), "resumed": sum(r["resumed"] for r in rows),
               "with_files_left_behind": sum(bool(r["left_behind"]) for r in rows),
               "with_files_left_after_resuming": sum(bool(r["left_after_resuming"]) for r in rows), "rows": rows}
    write_results_file(results_path, summary)
    lines = ["| try | killed in | after this share of the bytes | exit | checkpoint_last.pt holds update | resumed "
             "| left behind | left after resuming |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for number, r in enumerate(rows, 1):
        held = r["checkpoint_last_updates"] if r["load_error"] is None else f"unreadable ({r['load_error'][:60]})"
        lines.append(f"| {number} | {r['phase']} | {r['fraction']:.2f} | {r['exit_status']} | {held} | "
                     f"{'yes' if r['resumed'] else 'no'} | {', '.join(r['left_behind']) or '-'} | "
                     f"{', '.join(r['left_after_resuming']) or '-'} |")
    lines.append(f"\n{summary['killed']} of {args.tries} killed during the save; checkpoint_last.pt whole in "
                 f"{summary['readable']}, resumed in {summary['resumed']}; temporary files left behind in "
                 f"{summary['with_files_left_behind']}, still there after resuming in "
                 f"{summary['with_files_left_after_resuming']}.")
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(lines[-1].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
