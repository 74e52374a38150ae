#!/usr/bin/env python
"""AD-DROP on GLUE (SST-2 slice and RTE): plain fine-tuning against AD-DROP (GA) and the RD and AA baselines.

Every arm fine-tunes the same pre-trained checkpoint on the same data with the
same hyper-parameters and seeds; the arms differ only in the ``--ad-drop-*``
options: ``plain`` (none), ``GA`` (``--ad-drop-attribution gradient``, AD-DROP),
``RD`` (``random``) and ``AA`` (``attention``), all with ``--ad-drop-p``,
``--ad-drop-q`` and ``--ad-drop-layers`` as given and cross-tuning (AD-DROP on
epochs 2, 4, ...: at least 2 epochs are needed for any AD-DROP epoch). Each run
records dev accuracy after every epoch, the accuracy of its final model on its
own training data (``spanbert-predict-classification --split train``) and the
train-dev gap (train minus dev accuracy of that final model: the paper's claim
is that AD-DROP overfits less).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/regularisers/glue_ad_drop.py \
        --checkpoint demo_out/checkpoints/checkpoint_last.pt --out benchmarks/regularisers/glue_ad_drop --force

Runs are cached in ``--work`` (shared with ``benchmarks/pretraining/sst2_experiment.py``: the
plain SST-2 arm at the same settings is that script's pre-trained arm).
``--out`` receives ``results.csv``, ``summary.json`` (mean and standard
deviation per task and arm), ``commands.txt`` and ``glue_ad_drop.png``.
"""
import json
import os
import shlex
import sys
from dataclasses import asdict, replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pretraining"))
from sst2_experiment import (  # noqa: E402  (the shared experiment helpers)
    RESULT_COLUMNS, ROOT, check_inputs, checkpoint_model, checkpoint_updates, experiment_parser, finetune_run,
    majority_share, mean_sd, prepare_glue, pyplot, result_row, save_figure, settings_from, strip_plot, summarise,
    train_command, write_results,
)

ATTRIBUTION_OF_ARM = {"plain": None, "GA": "gradient", "RD": "random", "AA": "attention"}
TASKS = ("SST-2", "RTE")


def ad_drop_flags(arm, args):
    """The ``--ad-drop-*`` options of one arm (none for plain)."""
    attribution = ATTRIBUTION_OF_ARM[arm]
    if attribution is None:
        return []
    flags = ["--ad-drop-p", str(args.ad_drop_p), "--ad-drop-q", str(args.ad_drop_q),
             "--ad-drop-layers", args.ad_drop_layers, "--ad-drop-attribution", attribution]
    return flags + (["--ad-drop-every-epoch"] if args.ad_drop_every_epoch else [])


def paired_differences(rows):
    """{task / arm: {column: mean_sd}} of (arm - plain) per seed: the seed fixes data order and head initialisation."""
    plain = {(r["task"], r["seed"]): r for r in rows if r["arm"] == "plain"}
    differences = {}
    for row in rows:
        base = plain.get((row["task"], row["seed"]))
        if row["arm"] == "plain" or base is None:
            continue
        group = differences.setdefault(f"{row['task']} / {row['arm']} - plain", {c: [] for c in RESULT_COLUMNS})
        for column in RESULT_COLUMNS:
            group[column].append(round(row[column] - base[column], 2))
    return {group: {c: mean_sd(v) for c, v in columns.items()} for group, columns in differences.items()}


def plot_glue(rows, folder):
    plt = pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    figure, axes = plt.subplots(2, len(tasks), figsize=(4.2 * len(tasks), 6.4), squeeze=False)
    for column, task in enumerate(tasks):
        task_rows = [r for r in rows if r["task"] == task]
        size = task_rows[0]["train_size"]
        strip_plot(axes[0][column], task_rows, "arm", arms, "dev_accuracy", "dev accuracy (%), final model",
                   majority_share(task))
        axes[0][column].set_title(f"{task} ({size} training examples; dashed: majority class)", fontsize=9)
        strip_plot(axes[1][column], task_rows, "arm", arms, "train_dev_gap", "train - dev accuracy (points)")
    save_figure(plt, figure, os.path.join(folder, "glue_ad_drop.png"))


def main():
    parser = experiment_parser(__doc__, os.path.join(ROOT, "benchmarks", "regularisers", "glue_ad_drop"))
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated GLUE tasks: SST-2, RTE")
    parser.add_argument("--arms", default=",".join(ATTRIBUTION_OF_ARM),
                        help="comma-separated arms: plain, GA (gradient), RD (random), AA (attention)")
    parser.add_argument("--sst2-train-size", type=int, default=2000, help="first N sentences of SST-2 train")
    parser.add_argument("--rte-train-size", type=int, default=0, help="first N pairs of RTE train (0: all 2,490)")
    parser.add_argument("--rte-max-seq-length", type=int, help="tokens per RTE pair (default: --max-seq-length)")
    parser.add_argument("--rte-seeds", help="comma-separated seeds for RTE (default: --seeds)")
    parser.add_argument("--rte-max-epoch", type=int, default=4, help="fine-tuning epochs on RTE (its epochs are longer)")
    parser.add_argument("--ad-drop-p", type=float, default=0.3, help="share of each attention row that are candidates")
    parser.add_argument("--ad-drop-q", type=float, default=0.5, help="drop probability of a candidate")
    parser.add_argument("--ad-drop-layers", default="0", help="layers AD-DROP applies to")
    parser.add_argument("--ad-drop-every-epoch", action="store_true", help="AD-DROP every epoch (default: cross-tuning)")
    args = parser.parse_args()
    tasks = args.tasks.split(",")
    arms = args.arms.split(",")
    unknown = [t for t in tasks if t not in TASKS] + [a for a in arms if a not in ATTRIBUTION_OF_ARM]
    if unknown:
        parser.error(f"unknown task or arm {unknown[0]!r}")
    check_inputs(args, tasks)
    settings = settings_from(args)
    log = []
    arch, tokenizer_folder = checkpoint_model(args.checkpoint)
    rows = []
    for task in tasks:
        train_size = args.sst2_train_size if task == "SST-2" else args.rte_train_size
        max_seq_length = args.max_seq_length
        if task == "RTE" and args.rte_max_seq_length:
            max_seq_length = args.rte_max_seq_length
        task_settings = replace(settings, max_epoch=args.rte_max_epoch) if task == "RTE" else settings
        data = prepare_glue(args.work, task, tokenizer_folder, train_size, max_seq_length, log)
        with open(os.path.join(data, "classification.json")) as f:
            examples = json.load(f)["splits"]["train"]["examples"]
        for arm in arms:
            seeds = args.rte_seeds if task == "RTE" and args.rte_seeds else args.seeds
            for seed in [int(s) for s in seeds.split(",")]:
                # the plain arm's name matches sst2_experiment.py's pre-trained arm, so the run is shared
                name = f"{task}_pretrained_{seed}" if arm == "plain" else f"{task}_{arm}_{seed}"
                save_dir = os.path.join(args.work, "checkpoints", name)
                command = train_command(data, arch, args.checkpoint, seed, task_settings, examples, save_dir,
                                        ad_drop_flags(arm, args))
                result = finetune_run(args.work, name, command, log)
                rows.append(result_row({"task": task, "arm": arm, "seed": seed, "train_size": examples}, result))
                print(json.dumps(rows[-1]), flush=True)
    summary = {"checkpoint": os.path.abspath(args.checkpoint), "checkpoint_updates": checkpoint_updates(args.checkpoint),
               "max_seq_length": args.max_seq_length,
               "rte_max_seq_length": args.rte_max_seq_length or args.max_seq_length, **asdict(settings),
               "rte_max_epoch": args.rte_max_epoch,
               "ad_drop": {"p": args.ad_drop_p, "q": args.ad_drop_q, "layers": args.ad_drop_layers,
                           "cross_tuning": not args.ad_drop_every_epoch},
               "majority_class_dev_accuracy": {task: round(majority_share(task), 2) for task in tasks},
               "arms": summarise(rows, ["task", "arm"]), "paired_differences": paired_differences(rows)}
    write_results(args.out, args.force, [args.checkpoint], rows, summary, log, plot_glue,
                  "OMP_NUM_THREADS=1 .venv/bin/python " + shlex.join(sys.argv))
    print(json.dumps(summary["arms"]))


if __name__ == "__main__":
    main()
