#!/usr/bin/env python
"""Zeroing a freshly allocated 47 MB tensor (MiniLM's word-embedding gradient: 30,522 x 384 fp32) under glibc
malloc's defaults against after the plugin's malloc setting (``spanbert_plugin/core/cpu_paths.py``:
``keep_freed_memory``, which a CPU training run calls at its first update).

glibc serves an allocation above its memory-map threshold (at most 32 MB) from a fresh memory map and unmaps it
when freed, so every new tensor of that size is zeroed in new pages (a page fault per 4 KB page); after the plugin's
``mallopt`` calls it comes from the heap, where the previous one's memory stays mapped. Each child process does, per
iteration, what an update does with the gradient: ``torch.empty`` (allocate), ``zero_()`` (the ``fill_`` of the
backward pass or ``zero_grad``), ``del`` (free), timing each; ``--warmup`` iterations first, untimed. The two settings
run in alternating child processes (the order flips every round), one thread each; per process the median of its
``--iterations``, then the median of those over the ``--rounds`` processes with their range, and the per-round
ratio default / plugin.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_speed/malloc_zeroing.py \\
        --out benchmarks/cpu_speed/malloc_zeroing/results.json

Writes the JSON file ``--out`` and a table beside it (``.md`` for ``.json``); an existing ``--out`` is replaced only
with ``--force``, and only when it is an earlier result of this script. Linux with glibc only.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
from results_file import add_json_out_options, check_json_out, write_results_file  # noqa: E402

RESULT_KEYS = ("shape", "rounds", "iterations", "settings", "ratios", "machine")
SETTINGS = ("glibc default", "plugin's malloc setting")
PHASES = ("allocate", "zero", "free")


def child(setting, rows, cols, warmup, iterations):
    """One process: ``iterations`` timed allocate / zero / free cycles of a rows x cols fp32 tensor."""
    import torch

    torch.set_num_threads(1)
    tuned = None
    if setting == SETTINGS[1]:
        from spanbert_plugin.core import cpu_paths

        tuned = cpu_paths.keep_freed_memory(torch.zeros(1))
    times = {phase: [] for phase in PHASES}
    for step in range(warmup + iterations):
        start = time.perf_counter()
        tensor = torch.empty(rows, cols)
        allocated = time.perf_counter()
        tensor.zero_()
        zeroed = time.perf_counter()
        del tensor
        freed = time.perf_counter()
        if step >= warmup:
            for phase, seconds in zip(PHASES, (allocated - start, zeroed - allocated, freed - zeroed)):
                times[phase].append(seconds * 1000)
    return {"setting": setting, "malloc_tuned": tuned, "ms": {p: statistics.median(v) for p, v in times.items()}}


def machine():
    """What ran it: the CPU's model name and flags of note, cores, glibc, torch, the load before the run."""
    import torch

    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and model in ("", platform.machine(), platform.processor()):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = [flag for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if flag in line.split()]
                    break
    except OSError:
        pass
    return {"cpu": model, "cpu_flags": flags, "cores": os.cpu_count(), "glibc": "-".join(platform.libc_ver()),
            "torch": torch.__version__, "platform": platform.platform(), "loadavg_1min_before": os.getloadavg()[0]}


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_table(result, path):
    rows, cols = result["shape"]
    lines = [f"Allocating, zeroing and freeing a {rows:,} x {cols} fp32 tensor ({rows * cols * 4 / 1e6:.1f} MB) in a "
             f"loop, one thread; per process the median of {result['iterations']} iterations (after "
             f"{result['warmup']} untimed), then over {result['rounds']} alternating processes per setting the median "
             f"(range). Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
             f"{result['machine']['glibc']}, torch {result['machine']['torch']}; load average before the run "
             f"{result['machine']['loadavg_1min_before']:.2f}, after {result['loadavg_1min_after']:.2f}. Written by "
             f"`{result['command']}`.", "",
             "| setting | allocate ms | zero ms | free ms |", "| --- | --- | --- | --- |"]
    for setting in SETTINGS:
        cells = [f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})" for s in
                 (result["settings"][setting][phase] for phase in PHASES)]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    zero = result["ratios"]["zero"]
    lines += ["", f"Zeroing, glibc default / plugin's setting, per round: {zero['median']:.1f}x "
                  f"(range {zero['min']:.1f}-{zero['max']:.1f}x). The plugin's setting took effect in "
                  f"{result['malloc_tuned_processes']} of {result['rounds']} processes."]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=30522, help="BERT's uncased WordPiece vocabulary")
    parser.add_argument("--cols", type=int, default=384, help="all-MiniLM-L6-v2's hidden size")
    parser.add_argument("--rounds", type=int, default=10, help="child processes per setting, alternating")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=50)
    add_json_out_options(parser, required=False)  # a --child run writes none
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("MALLOC_ZEROING " + json.dumps(child(args.child, args.rows, args.cols, args.warmup, args.iterations)))
        return
    table_path = check_json_out(parser, args, "malloc_zeroing.py", RESULT_KEYS)
    for name in ("rounds", "warmup", "iterations", "rows", "cols"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name} must be at least {0 if name == 'warmup' else 1}")
    if not platform.libc_ver()[0] == "glibc":
        sys.exit("malloc_zeroing.py: needs glibc (its malloc is what is measured)")
    # the children run with glibc's defaults: a MALLOC_* variable would change them and make the plugin leave malloc alone
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]))
    about = machine()
    records = []
    for round_ in range(args.rounds):
        for setting in (SETTINGS if round_ % 2 == 0 else SETTINGS[::-1]):
            process = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", setting, "--rows",
                                      str(args.rows), "--cols", str(args.cols), "--warmup", str(args.warmup),
                                      "--iterations", str(args.iterations)], capture_output=True, text=True, env=env)
            lines = [line for line in process.stdout.splitlines() if line.startswith("MALLOC_ZEROING ")]
            if process.returncode or not lines:
                sys.exit(f"malloc_zeroing.py: the {setting} child failed ({process.returncode}):\n{process.stderr[-2000:]}")
            record = {"round": round_, **json.loads(lines[-1][len("MALLOC_ZEROING "):])}
            records.append(record)
            print(f"[{round_ + 1}/{args.rounds}] {setting}: " + ", ".join(
                f"{phase} {ms:.2f} ms" for phase, ms in record["ms"].items()), flush=True)
    by = {s: [r for r in records if r["setting"] == s] for s in SETTINGS}
    per_round = {phase: [d["ms"][phase] / p["ms"][phase] for d, p in zip(by[SETTINGS[0]], by[SETTINGS[1]])]
                 for phase in PHASES}
    command = " ".join(["benchmarks/cpu_speed/malloc_zeroing.py", *sys.argv[1:]])
    result = {"shape": [args.rows, args.cols], "rounds": args.rounds, "warmup": args.warmup,
              "iterations": args.iterations, "machine": about, "loadavg_1min_after": os.getloadavg()[0],
              "settings": {s: {phase: spread([r["ms"][phase] for r in by[s]]) for phase in PHASES} for s in SETTINGS},
              "ratios": {phase: spread(values) for phase, values in per_round.items()},
              "malloc_tuned_processes": sum(bool(r["malloc_tuned"]) for r in by[SETTINGS[1]]),
              "command": command, "records": records}
    write_results_file(args.out, result)
    print("\n".join(write_table(result, table_path)))


if __name__ == "__main__":
    main()
