#!/usr/bin/env python
"""Seconds per fine-tuning epoch, ours against ``transformers``, from the ``runs.jsonl`` and ``summary.md`` that
``side_by_side.py`` wrote: the README's "Wall time per epoch" table, with a plot.

    .venv/bin/python benchmarks/against_transformers/wall_time_per_epoch.py \
        --out benchmarks/against_transformers/results/wall_time_per_epoch.json

Each row reads one results folder: a side's seconds per epoch are the mean over its runs (those of the seeds the
row names) and their epochs; each ratio divides two such means (ours over the other side). The padding factor of
``Trainer``'s default random batches (tokens computed over real tokens) is the one ``summary.md`` reports. Reads
files only. Writes ``--out``, a table beside it (``.md``) and a plot (``.png``); an existing ``--out`` is replaced
only with ``--force``, and only when it is an earlier result of this script.
"""
import argparse
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from command_output import save_figure_atomic, write_atomic  # noqa: E402
from results_file import add_json_out_options, check_json_out, write_results_file  # noqa: E402

RESULT_KEYS = ("rows", "command")
OURS, GROUPED, DEFAULT = "ours", "transformers (group_by_length)", "transformers"
SIDES = (OURS, GROUPED, DEFAULT)
SIDE_LABELS = {OURS: "ours", GROUPED: "transformers, group_by_length", DEFAULT: "transformers, Trainer default"}
# (machine, data, results folder, seeds; None: every seed the folder holds). The SQuAD CPU row takes seed 1 of each
# side, which ran at the same time, one per core; both sides' seed 2 ran later beside other jobs.
ROWS = (
    ("CPU, 1 thread", "SST-2, all 67,349 sentences", "sst2_full_1epoch", None),
    ("CPU, 1 thread", "SQuAD dev, 38 training articles", "squad_38articles_1epoch", (1,)),
    ("H100", "SST-2, all 67,349 sentences", "h100_sst2_1epoch_alone", None),
    ("H100", "SQuAD dev, 38 training articles", "h100_squad_38articles_1epoch_alone", None),
    ("CPU, 1 thread", "RTE, 2,490 pairs", "rte_3epochs", None),
)
PADDING = re.compile(r"^- Trainer default \(random batches\): [\d,]+ tokens computed with padding \((?P<factor>[\d.]+)x")


def side_seconds(runs, side, seeds):
    """{"seconds": mean seconds per epoch, "seeds": its runs' seeds, "epochs": epochs counted} of ``side``, or None."""
    chosen = [run for run in runs if run["side"] == side and (seeds is None or run["seed"] in seeds)]
    if not chosen:
        return None
    epochs = [seconds for run in chosen for seconds in run["epoch_seconds"]]
    return {"seconds": statistics.fmean(epochs), "seeds": sorted(run["seed"] for run in chosen), "epochs": len(epochs)}


def padding_factor(summary_path):
    with open(summary_path, encoding="utf-8") as f:
        for line in f:
            match = PADDING.match(line)
            if match:
                return float(match["factor"])
    return None


def read_row(machine, data, folder, seeds, results):
    where = os.path.join(results, folder)
    with open(os.path.join(where, "runs.jsonl"), encoding="utf-8") as f:
        runs = [json.loads(line) for line in f if line.strip()]
    row = {"machine": machine, "data": data, "folder": os.path.relpath(where, ROOT),
           "sides": {side: side_seconds(runs, side, seeds) for side in SIDES},
           "default_padding": padding_factor(os.path.join(where, "summary.md"))}
    if row["sides"][OURS] is None:
        sys.exit(f"wall_time_per_epoch.py: {where}/runs.jsonl: no run of side '{OURS}'")
    for side in (GROUPED, DEFAULT):
        if row["sides"][side] is not None:
            row[f"ours_over_{'group_by_length' if side == GROUPED else 'default'}"] = (
                row["sides"][OURS]["seconds"] / row["sides"][side]["seconds"])
    return row


def seconds_cell(entry):
    if entry is None:
        return "not run"
    runs = len(entry["seeds"])
    return f"{entry['seconds']:,.1f} s ({runs} seed{'s' if runs > 1 else ''}, {entry['epochs']} epoch{'s' if entry['epochs'] > 1 else ''})"


def table(rows, command):
    lines = [f"Seconds per epoch (mean over the runs and epochs shown), written by `{command}`.", "",
             "| machine | data | ours | `group_by_length` | **ours / `group_by_length`** | `Trainer` default "
             "(tokens computed / real) | ours / default |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        sides = row["sides"]
        default = seconds_cell(sides[DEFAULT])
        if sides[DEFAULT] is not None and row["default_padding"] is not None:
            default += f", {row['default_padding']:.2f}x"
        ratio = lambda key: f"{row[key]:.2f}x" if key in row else "–"  # noqa: E731
        lines.append(f"| {row['machine']} | {row['data']} | {seconds_cell(sides[OURS])} | {seconds_cell(sides[GROUPED])} "
                     f"| **{ratio('ours_over_group_by_length')}** | {default} | {ratio('ours_over_default')} |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    """One panel per row: each side's seconds per epoch as a bar, labelled; below 1.0x ours is faster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {OURS: "tab:blue", GROUPED: "tab:orange", DEFAULT: "tab:gray"}
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 1.45 * len(rows) + 0.6))
    for ax, row in zip(axes, rows):
        sides = [side for side in SIDES if row["sides"][side] is not None]
        seconds = [row["sides"][side]["seconds"] for side in sides]
        ax.barh(range(len(sides)), seconds, color=[colours[side] for side in sides])
        ax.set_yticks(range(len(sides)), [SIDE_LABELS[side] for side in sides], fontsize=8)
        ax.invert_yaxis()
        for y, value in enumerate(seconds):
            ax.text(value, y, f" {value:,.0f} s", va="center", fontsize=8)
        ax.set_xlim(0, max(seconds) * 1.22)
        ratio = row.get("ours_over_group_by_length", row.get("ours_over_default"))
        against = "group_by_length" if "ours_over_group_by_length" in row else "Trainer default"
        ax.set_title(f"{row['machine']}: {row['data']} (ours / {against}: {ratio:.2f}x)", fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=8)
    axes[-1].set_xlabel("seconds per epoch (all-MiniLM-L6-v2, batch 32)")
    fig.tight_layout()
    save_figure_atomic(fig, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=os.path.join(HERE, "results"),
                        help="the folder holding side_by_side.py's results folders")
    add_json_out_options(parser)
    args = parser.parse_args()
    table_path = check_json_out(parser, args, "wall_time_per_epoch.py", RESULT_KEYS)
    try:
        rows = [read_row(machine, data, folder, seeds, args.results) for machine, data, folder, seeds in ROWS]
    except OSError as error:  # a --results folder without side_by_side.py's folders
        sys.exit(f"wall_time_per_epoch.py: --results {args.results}: {error.strerror}: {error.filename}")
    command = " ".join(["benchmarks/against_transformers/wall_time_per_epoch.py", "--out",
                        os.path.relpath(os.path.abspath(args.out), ROOT), *(["--force"] if args.force else [])])
    write_results_file(args.out, {"command": command, "rows": rows})
    text = table(rows, command)
    write_atomic(table_path, text)
    plot(rows, args.out[:-len(".json")] + ".png")
    print(text, end="")


if __name__ == "__main__":
    main()
