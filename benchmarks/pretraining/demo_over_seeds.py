#!/usr/bin/env python
"""``make demo`` over seeds: the held-out masked-word accuracy before and after, per seed and as mean ± sd.

Each seed runs ``scripts/demo.py --seed N`` as ``make demo`` runs it (torch's default threads), in its own folder
under ``--work`` (a seed whose ``summary.json`` is there already is not run again, so a cut-off call resumes);
each run's ``summary.json`` is copied to ``--out`` as ``seed_N.json`` beside ``results.json`` and ``table.md``.

    .venv/bin/python benchmarks/pretraining/demo_over_seeds.py --seeds 1 2 3 --work /tmp/demo_over_seeds \\
        --out benchmarks/pretraining/demo_over_seeds

An existing ``--out`` is replaced only with ``--force`` and only when it is this script's.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from command_output import relative_to_root, write_atomic  # noqa: E402
from results_file import add_results_options, claim_outputs, write_results_file  # noqa: E402

SCRIPT = "demo_over_seeds.py"
WORK_MARK = "demo_over_seeds.work"
MEASURES = ("heldout_top1", "heldout_top5")


def run_seed(seed: int, work: str) -> dict:
    """The demo's ``summary.json`` for ``seed``, running it unless its folder under ``work`` holds one."""
    folder = os.path.join(work, f"seed_{seed}")
    summary = os.path.join(folder, "summary.json")
    if not os.path.isfile(summary):
        print(f"seed {seed}: scripts/demo.py --seed {seed} --out {folder}", flush=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "demo.py"), "--seed", str(seed), "--out",
                        folder], check=True, cwd=ROOT)
    with open(summary, encoding="utf-8") as f:
        return json.load(f)


def mean_sd(values):
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def table(per_seed: dict, results: dict) -> str:
    lines = ["| seed | top-1 before | top-1 after | top-5 before | top-5 after | seconds | precision |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for seed, s in per_seed.items():
        lines.append(f"| {seed} | {s['heldout_top1']['before']:.2f} | {s['heldout_top1']['after']:.2f} | "
                     f"{s['heldout_top5']['before']:.2f} | {s['heldout_top5']['after']:.2f} | {s['seconds']:.0f} | "
                     f"{s.get('precision', 'not recorded')} |")
    cells = [f"{results[m][phase]['mean']:.2f} ± {results[m][phase]['sd']:.2f}" for m in MEASURES
             for phase in ("before", "after")]
    lines.append(f"| mean ± sd | {' | '.join(cells)} | | |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    add_results_options(parser, os.path.join(ROOT, "benchmarks", "out", "demo_over_seeds"))
    args = parser.parse_args(argv)
    results_path = claim_outputs(args, SCRIPT, ("seeds", *MEASURES), WORK_MARK)
    per_seed = {seed: run_seed(seed, args.work) for seed in args.seeds}
    results = {"seeds": args.seeds, "command": relative_to_root(" ".join([".venv/bin/python", *sys.argv])),
               "encoder": next(iter(per_seed.values()))["encoder"],
               **{m: {phase: mean_sd([s[m][phase] for s in per_seed.values()]) for phase in ("before", "after")}
                  for m in MEASURES}}
    os.makedirs(args.out, exist_ok=True)
    for seed in args.seeds:
        shutil.copyfile(os.path.join(args.work, f"seed_{seed}", "summary.json"),
                        os.path.join(args.out, f"seed_{seed}.json"))
    text = table(per_seed, results)
    write_atomic(os.path.join(args.out, "table.md"),
                 f"`make demo` over seeds ({results['encoder']}): held-out masked-word accuracy, percent\n\n{text}\n")
    write_results_file(results_path, results)
    print(text)


if __name__ == "__main__":
    main()
