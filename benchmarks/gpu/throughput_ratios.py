#!/usr/bin/env python
"""Updates/s ratios of ``bash benchmarks/gpu/throughput.sh`` from its console output: each round's ``span`` (MLM +
SBO) and ``mlm_only`` (``--sbo-weight 0``) runs over that round's ``roberta`` run, with fairseq's end-of-run
``train_ups`` of each run (which include the run's first updates) and its peak GPU memory.

    .venv/bin/python benchmarks/gpu/throughput_ratios.py --console benchmarks/gpu/logs/throughput_console.txt \
        --out benchmarks/gpu/logs/throughput_ratios.json

Reads the console only (no GPU). Writes the JSON file ``--out`` and a table beside it (``--out`` with ``.md`` for
``.json``); an existing ``--out`` is replaced only with ``--force``, and only when it is an earlier result of this
script.
"""
import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from command_output import write_atomic  # noqa: E402
from results_file import add_json_out_options, check_json_out, write_results_file  # noqa: E402

RESULT_KEYS = ("console", "runs", "rounds")
HEADER = re.compile(r"^== (?P<side>span|mlm_only|roberta)_r(?P<round>\d+)\b")
MEMORY = re.compile(r"peak GPU memory (?P<mib>\d+) MiB")
TRAIN = re.compile(r"\| train \| (?P<record>\{.*\})\s*$")


def parse_console(text):
    """{(side, round): {"train_ups", "peak_gpu_mib"}} from the run helper's lines: a ``== NAME`` header, its exit
    line with the peak memory, and fairseq's end-of-run ``train`` record."""
    runs, current = {}, None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header:
            current = (header["side"], int(header["round"]))
            runs[current] = {}
            continue
        if line.startswith("== "):
            current = None
        elif current and MEMORY.search(line):
            runs[current]["peak_gpu_mib"] = int(MEMORY.search(line)["mib"])
        elif current and TRAIN.search(line):
            runs[current]["train_ups"] = float(json.loads(TRAIN.search(line)["record"])["train_ups"])
    return {key: run for key, run in runs.items() if "train_ups" in run}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--console", default=os.path.join(ROOT, "benchmarks", "gpu", "logs", "throughput_console.txt"),
                        help="console output of benchmarks/gpu/throughput.sh")
    add_json_out_options(parser)
    args = parser.parse_args()
    table_path = check_json_out(parser, args, "throughput_ratios.py", RESULT_KEYS)
    with open(args.console, encoding="utf-8") as f:
        runs = parse_console(f.read())
    rounds = []
    for number in sorted({r for _, r in runs}):
        roberta = runs.get(("roberta", number))
        if not roberta:
            continue
        row = {"round": number, "roberta_ups": roberta["train_ups"]}
        for side in ("span", "mlm_only"):
            if (side, number) in runs:
                row[f"{side}_ups"] = runs[(side, number)]["train_ups"]
                row[f"{side}_over_roberta"] = runs[(side, number)]["train_ups"] / roberta["train_ups"]
        rounds.append(row)
    if not rounds:
        sys.exit(f"throughput_ratios.py: {args.console}: no round with a roberta run's train_ups")
    spread = {side: [min(r[f"{side}_over_roberta"] for r in rounds if f"{side}_over_roberta" in r),
                     max(r[f"{side}_over_roberta"] for r in rounds if f"{side}_over_roberta" in r)]
              for side in ("span", "mlm_only") if any(f"{side}_over_roberta" in r for r in rounds)}
    console = os.path.relpath(os.path.abspath(args.console), ROOT)
    command = " ".join(["benchmarks/gpu/throughput_ratios.py", "--console", console, "--out",
                        os.path.relpath(os.path.abspath(args.out), ROOT), *(["--force"] if args.force else [])])
    result = {"console": console, "command": command,
              "runs": [{"side": side, "round": number, **run} for (side, number), run in sorted(runs.items())],
              "rounds": rounds, "range_over_rounds": spread}
    write_results_file(args.out, result)
    lines = [f"Updates/s (fairseq's end-of-run `train_ups`, first updates included) from `{console}`, written by "
             f"`{command}`.", "",
             "| round | MLM + SBO | MLM only | roberta | MLM + SBO / roberta | MLM only / roberta |",
             "| --- | --- | --- | --- | --- | --- |"]
    cell = lambda row, key, form: form.format(row[key]) if key in row else "–"  # noqa: E731
    for row in rounds:
        lines.append(f"| {row['round']} | {cell(row, 'span_ups', '{:.2f}')} | {cell(row, 'mlm_only_ups', '{:.2f}')} | "
                     f"{row['roberta_ups']:.2f} | {cell(row, 'span_over_roberta', '{:.2f}x')} | "
                     f"{cell(row, 'mlm_only_over_roberta', '{:.2f}x')} |")
    lines += [""] + [f"Range over rounds, {'MLM + SBO' if side == 'span' else 'MLM only'} / roberta: "
                     f"{low:.2f}-{high:.2f}x" for side, (low, high) in spread.items()]
    memory = {side: runs[(side, 1)].get("peak_gpu_mib") for side in ("span", "mlm_only", "roberta") if (side, 1) in runs}
    lines += ["", "Peak GPU memory, round 1 (MiB): " + ", ".join(f"{side} {mib}" for side, mib in memory.items())]
    write_atomic(table_path, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
