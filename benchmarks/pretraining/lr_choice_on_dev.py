#!/usr/bin/env python
"""Choose each arm's pre-training learning rate on LitBank dev, across masking_ablation.py results folders.

``masking_ablation.py --pretrain-lr`` runs one experiment per learning rate (or records the others as ``ARM_lrX``
variants); its lr grid chooses on the pre-training validation loss. This report chooses instead on what the
experiment is for: each arm's LitBank dev CoNLL F1 (the best epoch's, as fine-tuning picks its checkpoint),
averaged over the fine-tuning seeds, among the rates the given folders ran. It then compares the arms at their
chosen rates on test, paired by seed, with the same intervals and TOST as the experiment's own table.

    benchmarks/pretraining/lr_choice_on_dev.py --runs benchmarks/pretraining/continued_pretraining:fp32 \\
        benchmarks/pretraining/continued_pretraining_gpu:fp16 --out benchmarks/pretraining/continued_pretraining/lr_choice_on_dev

Each ``--runs`` entry is a results folder and the fine-tuning precision of its runs to use
(``coref_runs/ARM_seedS_PRECISION.json``); an arm's rate is its ``_lrX`` suffix, else the folder's
``settings.json`` ``pretrain_lr``. Writes ``lr_choice.csv`` (one row per arm and candidate), ``lr_choice.md`` and
``lr_choice.png`` in ``--out``, all at once; ``--out`` must be new, empty, or an earlier output of this script
(``--force`` replaces it).
"""
import argparse
import csv
import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # masking_ablation beside it
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))  # the shared helpers
from masking_ablation import LR_VARIANT, NO_PRETRAINING, SCHEME_PAIRS  # noqa: E402
from paired_stats import interval_text, paired_difference  # noqa: E402

from spanbert_plugin.core.file_utils import OutputError, atomic_directory  # noqa: E402

RECORD = re.compile(r"^(?P<arm>.+)_seed(?P<seed>\d+)_(?P<precision>[a-z0-9_]+)\.json$")
FIELDS = ("arm", "pretrain_lr", "source", "precision", "seeds", "dev_conll_f1_mean", "dev_conll_f1_sd",
          "test_conll_f1_mean", "test_conll_f1_sd", "chosen")
COMMAND = "lr_choice_on_dev.py"  # recorded in --out's manifest: --force replaces only this script's output
MARGIN = 2.7  # the SBO's published coreference gain (SpanBERT Table 7), as the experiment's table uses


def fail(message):
    sys.exit(f"lr_choice_on_dev.py: {message}")


def read_candidates(entries):
    """{(arm, lr, folder, precision): {seed: record}} from every ``FOLDER:PRECISION`` entry."""
    candidates = {}
    for entry in entries:
        folder, _, precision = entry.rpartition(":")
        if not folder or not precision:
            fail(f"--runs {entry}: expected FOLDER:PRECISION (e.g. benchmarks/pretraining/continued_pretraining:fp32)")
        settings_path, runs = os.path.join(folder, "settings.json"), os.path.join(folder, "coref_runs")
        if not os.path.isfile(settings_path) or not os.path.isdir(runs):
            fail(f"--runs {entry}: {folder} is not a masking_ablation.py results folder "
                 "(expected settings.json and coref_runs/)")
        with open(settings_path, encoding="utf-8") as f:
            default_lr = json.load(f)["pretrain_lr"]
        found = 0
        for name in sorted(os.listdir(runs)):
            match = RECORD.match(name)
            if not match or match["precision"] != precision:
                continue
            arm, _, lr = match["arm"].partition(LR_VARIANT)
            lr = None if arm == NO_PRETRAINING else float(lr) if lr else float(default_lr)
            with open(os.path.join(runs, name), encoding="utf-8") as f:
                record = json.load(f)
            candidates.setdefault((arm, lr, folder, precision), {})[int(match["seed"])] = record
            found += 1
        if not found:
            fail(f"--runs {entry}: no coref_runs/*_{precision}.json in {folder}")
    return candidates


def summarise(candidates):
    """One row per candidate, and each arm's choice: the candidate with the highest mean dev CoNLL F1."""
    rows = []
    for key, runs in sorted(candidates.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
        arm, lr, source, precision = key
        dev = [runs[s]["best_dev_conll_f1"] for s in sorted(runs)]
        test = [runs[s]["test_conll_f1"] for s in sorted(runs)]
        rows.append({"arm": arm, "pretrain_lr": "" if lr is None else f"{lr:g}", "source": source,
                     "precision": precision, "seeds": " ".join(map(str, sorted(runs))),
                     "dev_conll_f1_mean": statistics.mean(dev),
                     "dev_conll_f1_sd": statistics.stdev(dev) if len(dev) > 1 else float("nan"),
                     "test_conll_f1_mean": statistics.mean(test),
                     "test_conll_f1_sd": statistics.stdev(test) if len(test) > 1 else float("nan"),
                     "chosen": False, "_key": key})
    for arm in {r["arm"] for r in rows}:
        max((r for r in rows if r["arm"] == arm), key=lambda r: r["dev_conll_f1_mean"])["chosen"] = True
    return rows


def comparisons(candidates, rows):
    """Paired test differences between the arms at their chosen rates: each against none, and SCHEME_PAIRS."""
    chosen = {r["arm"]: candidates[r["_key"]] for r in rows if r["chosen"]}
    pairs = [(arm, NO_PRETRAINING) for arm in sorted(chosen) if arm != NO_PRETRAINING] + list(SCHEME_PAIRS)
    lines = []
    for arm, base in pairs:
        if arm not in chosen or base not in chosen:
            continue
        seeds = sorted(set(chosen[arm]) & set(chosen[base]))
        if not seeds:
            continue
        paired = paired_difference([chosen[arm][s]["test_conll_f1"] - chosen[base][s]["test_conll_f1"]
                                    for s in seeds], MARGIN)
        interval = interval_text(paired)
        tost = "–" if paired["tost_p"] is None else f"{paired['tost_p']:.3f}"
        lines.append(f"| {arm} − {base} | {', '.join(map(str, seeds))} | {paired['mean']:+.2f} | {interval} | {tost} |")
    return lines


def write_report(out, rows, lines, entries):
    with open(os.path.join(out, "lr_choice.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)

    def cell(mean, sd):
        return f"{mean:.1f}" if math.isnan(sd) else f"{mean:.1f} ± {sd:.1f}"

    table = ["| arm | pre-training lr | results folder (precision) | seeds | LitBank dev CoNLL F1 | test CoNLL F1 | chosen |",
             "|---|---|---|---|---|---|---|"]
    table += [f"| {r['arm']} | {r['pretrain_lr'] or '–'} | {r['source']} ({r['precision']}) | {r['seeds']} | "
              f"{cell(r['dev_conll_f1_mean'], r['dev_conll_f1_sd'])} | "
              f"{cell(r['test_conll_f1_mean'], r['test_conll_f1_sd'])} | {'yes' if r['chosen'] else ''} |"
              for r in rows]
    text = ("# Pre-training learning rate chosen on LitBank dev\n\n"
            f"`benchmarks/pretraining/lr_choice_on_dev.py --runs {' '.join(entries)}`\n\n"
            "Each arm at the rate (and results folder) with the highest mean dev CoNLL F1 over its fine-tuning seeds "
            "(the best epoch's dev score, singletons scored); mean ± sample sd over seeds. Candidates from different "
            "folders may differ in more than the rate (device, precision): see each folder's settings.json.\n\n"
            + "\n".join(table)
            + f"\n\nTest CoNLL F1 at the chosen rates, paired by fine-tuning seed; a TOST p below 0.05 says equal "
            f"within ±{MARGIN:g} points.\n\n| difference | seeds | mean | 95% interval | TOST p, ±{MARGIN:g} |\n"
            "|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    with open(os.path.join(out, "lr_choice.md"), "w", encoding="utf-8") as f:
        f.write(text)
    plot(out, rows)
    return text


def plot(out, rows):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows)), 3.8))
    labels = [f"{r['arm']}\n{r['pretrain_lr'] or '–'}" + (" *" if r["chosen"] else "") for r in rows]
    positions = range(len(rows))
    for offset, split in ((-0.2, "dev"), (0.2, "test")):
        sds = [0 if math.isnan(r[f"{split}_conll_f1_sd"]) else r[f"{split}_conll_f1_sd"] for r in rows]
        ax.bar([p + offset for p in positions], [r[f"{split}_conll_f1_mean"] for r in rows], 0.4, yerr=sds,
               capsize=3, label=split)
    ax.set_xticks(list(positions), labels, fontsize=8)
    ax.set_ylabel("LitBank CoNLL F1")
    ax.set_title("Pre-training lr per arm (* chosen on dev)")
    ax.legend()
    low = min(r["test_conll_f1_mean"] for r in rows)
    ax.set_ylim(max(0, low - 10), None)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "lr_choice.png"), dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, metavar="FOLDER:PRECISION",
                        help="masking_ablation.py results folders and the fine-tuning precision of their runs to use")
    parser.add_argument("--out", required=True, help="folder for lr_choice.csv, lr_choice.md and lr_choice.png")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    args = parser.parse_args(argv)
    candidates = read_candidates(args.runs)
    rows = summarise(candidates)
    inputs = [entry.rpartition(":")[0] for entry in args.runs]
    try:
        with atomic_directory(args.out, COMMAND, inputs, args.force, "--out") as out:
            text = write_report(out, rows, comparisons(candidates, rows), args.runs)
    except OutputError as err:
        fail(str(err))
    print(text)


if __name__ == "__main__":
    main()
