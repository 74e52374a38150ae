#!/usr/bin/env python
"""Python's garbage-collection pauses during fairseq-train updates: how often the collector runs, and for how long.

A ``fairseq-train`` process tracks about 400,000 objects (nearly all made by importing torch, fairseq and what they
import), and Python's full collection walks them all: if it came often, its pauses would cost every update (and
under DDP every rank would wait for each rank's). This runs ``fairseq-train`` (SST-2 fine-tuning with the
update-cost benchmark's inputs and options: ``update_cost.py``) in child processes and times every collection
from the first update on through ``gc.callbacks``, with the update it fell in.

    .venv/bin/python benchmarks/cpu_speed/update_cost/collector_pauses.py --encoder narrow-minilm --vocab-from $VOCAB \
        --work /tmp/update_cost_work --out benchmarks/cpu_speed/update_cost/results/collector_pauses.json

Writes the JSON file ``--out`` and prints its table; an existing ``--out`` is replaced only with ``--force``, and only
when it is an earlier result of this script.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
import update_cost  # noqa: E402  (this script's folder)
from results_file import check_results_file, write_results_file  # noqa: E402

RESULT_KEYS = ("updates", "repeats", "runs", "summary")


def child(spec):
    """One fairseq-train run; prints its collections (update, generation, ms) as JSON."""
    import gc

    from fairseq.trainer import Trainer
    from fairseq_cli import train as fairseq_train

    argv = update_cost.in_process_sst2_argv(spec["encoder"], spec["vocab_from"], spec["work"])
    updates, collections, started, tracked = [0], [], [0.0], {}
    original = Trainer.train_step

    def train_step(self, samples, raise_oom=False):
        updates[0] += 1
        if updates[0] == 1:
            tracked.update(objects=len(gc.get_objects()))
        return original(self, samples, raise_oom)

    def timed(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        elif updates[0] > 0:
            collections.append((updates[0], info["generation"], (time.perf_counter() - started[0]) * 1e3))

    Trainer.train_step = train_step
    gc.callbacks.append(timed)
    sys.argv = ["fairseq-train", *argv, "--max-update", str(spec["updates"])]
    fairseq_train.cli_main()
    gc.callbacks.remove(timed)
    print("COLLECTIONS " + json.dumps({"collections": collections, **tracked}))


def summarise(runs, updates):
    pauses = [ms for r in runs for _, _, ms in r["collections"]]
    full = [(update, ms) for r in runs for update, generation, ms in r["collections"] if generation == 2]
    return {"processes": len(runs), "objects_tracked": statistics.median(r["objects"] for r in runs),
            "collections_per_1000_updates": 1000 * len(pauses) / (updates * len(runs)),
            "full_collections": len(full), "full_collections_at_updates": [update for update, _ in full],
            "full_collection_ms": [ms for _, ms in full], "longest_pause_ms": max(pauses, default=0.0),
            "pause_ms_per_update": sum(pauses) / (updates * len(runs))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    update_cost.add_in_process_arguments(parser)
    parser.add_argument("--updates", type=int, default=1000, help="updates per process")
    parser.add_argument("--repeats", type=int, default=3, help="processes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if not args.out:
        parser.error("--out is required")
    if args.encoder != "minilm" and not args.vocab_from:
        parser.error("--encoder with a shape needs --vocab-from")
    check_results_file(args.out, "collector_pauses.py", args.force, RESULT_KEYS)
    command = " ".join(["benchmarks/cpu_speed/update_cost/collector_pauses.py", *sys.argv[1:]])
    update_cost.in_process_sst2_argv(args.encoder, args.vocab_from, args.work)  # the inputs, made once
    runs = []
    for repeat in range(args.repeats):
        spec = {"encoder": args.encoder, "vocab_from": args.vocab_from, "work": args.work, "updates": args.updates}
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                              env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("COLLECTIONS ")]
        if done.returncode != 0 or not lines:
            sys.exit(f"collector_pauses.py: a child failed (exit {done.returncode}): "
                     f"{done.stderr.strip().splitlines()[-1:] or ''}")
        runs.append(json.loads(lines[-1][len("COLLECTIONS "):]))
        print(f"[{repeat + 1}/{args.repeats}] {len(runs[-1]['collections'])} collections", flush=True)
    summary = summarise(runs, args.updates)
    write_results_file(args.out, {"updates": args.updates, "repeats": args.repeats, "encoder": args.encoder,
                                  "command": command, "summary": summary, "runs": runs})
    full = ", ".join(f"{ms:.0f} ms at update {update}" for update, ms in
                     zip(summary["full_collections_at_updates"], summary["full_collection_ms"])) or "none"
    print(f"\n{args.repeats} processes of {args.updates} SST-2 updates: {summary['objects_tracked']:,.0f} objects tracked "
          f"at the first update; {summary['collections_per_1000_updates']:.1f} collections per 1,000 updates, the "
          f"longest {summary['longest_pause_ms']:.1f} ms, {summary['pause_ms_per_update']:.3f} ms per update in all; "
          f"full collections: {full}")


if __name__ == "__main__":
    main()
