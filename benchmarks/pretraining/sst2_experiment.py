#!/usr/bin/env python
"""SST-2 with a few thousand training sentences: a pre-trained spanbert checkpoint against random initialisation.

Both arms use the checkpoint's encoder size and tokenizer (the data folder it
was pre-trained on), the same slice of SST-2 train, the full dev set (872) and
the same hyper-parameters; only ``--finetune-from-model`` differs. With
``--lr-grid``, each arm instead gets the learning rate of the grid that scores
best on the last ``--heldout`` rows of the training slice (one run per lr with
the first seed, trained on the other rows), as a practitioner would tune a
pre-trained model and a randomly initialised one separately; dev is not used
to choose. Every run
records the dev accuracy after each epoch, and the accuracy of its final model
on the training slice (``spanbert-predict-classification --split train``), so
the train-dev gap is measured on one model.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/pretraining/sst2_experiment.py \
        --checkpoint demo_out/checkpoints/checkpoint_last.pt --out benchmarks/pretraining/sst2/demo_1200 --force

Prepared data, checkpoints and one JSON file per finished run go to ``--work``
(default ``benchmarks/out/glue_work``): an interrupted experiment resumes
there, and ``benchmarks/regularisers/glue_ad_drop.py`` reuses runs with the same command
(its plain SST-2 arm is this script's pre-trained arm at the same settings).
``--out`` receives ``results.csv`` (one row per run), ``summary.json`` (mean and
standard deviation per arm), ``commands.txt`` and a plot, written all at once.

The helpers here (prepare a GLUE task, fine-tune, predict, summarise) are
shared with ``benchmarks/regularisers/glue_ad_drop.py``.
"""
import argparse
import csv
import hashlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
from command_output import relative_to_root  # noqa: E402
GLUE = os.path.join(ROOT, "..", "shared", "data", "glue")
BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
DEFAULT_WORK = os.path.join(ROOT, "benchmarks", "out", "glue_work")
SIZE_KEYS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads", "max_positions")
# columns of the GLUE files as distributed; RTE's index column becomes the prediction id
GLUE_COLUMNS = {
    "SST-2": ["--text-columns", "sentence", "--label-column", "label"],
    "RTE": ["--text-columns", "sentence1,sentence2", "--label-column", "label", "--id-column", "index"],
}
ARMS = ("pretrained", "random")


@dataclass
class FinetuneSettings:
    """Hyper-parameters shared by every arm of an experiment."""

    max_epoch: int = 6
    lr: float = 1e-3
    batch_size: int = 32
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    dropout: float = 0.1


def checkpoint_model(checkpoint):
    """(architecture flags, data folder) recorded in a pre-training checkpoint."""
    import spanbert_plugin.registry  # noqa: F401  (registers the plugin, safe-loading allowlist)
    import torch

    cfg = torch.load(checkpoint, map_location="cpu", weights_only=True)["cfg"]
    flags = ["--arch", cfg["model"]["_name"]]
    for key in SIZE_KEYS:
        flags += ["--" + key.replace("_", "-"), str(cfg["model"][key])]
    data = cfg["task"]["data"].split(os.pathsep)[0]
    return flags, data if os.path.isabs(data) else os.path.join(os.path.dirname(os.path.dirname(checkpoint)), data)


def checkpoint_updates(checkpoint):
    """Number of updates the checkpoint was trained for."""
    import spanbert_plugin.registry  # noqa: F401  (registers the plugin, safe-loading allowlist)
    import torch

    return int(torch.load(checkpoint, map_location="cpu", weights_only=True)["optimizer_history"][-1]["num_updates"])


def run_logged(command, log):
    """Run ``command`` (a list) from the repository root; append it to ``log``; its output, or exit with its tail."""
    log.append(relative_to_root(shlex.join(command)))
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        sys.exit(f"command failed (exit {proc.returncode}): {shlex.join(command)}\n{tail}")
    return proc.stdout + proc.stderr


def prepare_glue(work, task, tokenizer_folder, train_size, max_seq_length, log, heldout=0):
    """Prepared folder of GLUE ``task``: the first ``train_size`` training rows (all when 0) and the full dev set;
    with ``heldout`` N, the last N of those rows become the validation split and train keeps the others."""
    name = f"{task}_{train_size or 'all'}_{max_seq_length}" + (f"_heldout{heldout}" if heldout else "")
    folder = os.path.join(work, "data", name)
    source = os.path.join(GLUE, task)
    train, valid = os.path.join(source, "train.tsv"), os.path.join(source, "dev.tsv")
    if train_size:
        log.append(f"head -n {train_size - heldout + 1} {train} > {os.path.join(work, 'data', name + '.train.tsv')}")
        if heldout:
            log.append(f"(head -n 1 {train}; head -n {train_size + 1} {train} | tail -n {heldout}) > "
                       f"{os.path.join(work, 'data', name + '.valid.tsv')}")
            valid = os.path.join(work, "data", f"{name}.valid.tsv")
        train = os.path.join(work, "data", f"{name}.train.tsv")
    command = [os.path.join(BIN, "spanbert-prepare-classification"), "--train", train,
               "--valid", valid, "--tokenizer-from", tokenizer_folder, "--destdir", folder,
               *GLUE_COLUMNS[task], "--max-seq-length", str(max_seq_length)]
    if os.path.isfile(os.path.join(folder, "classification.json")):
        log.append(relative_to_root(shlex.join(command)))
        return folder
    if train_size:
        with open(os.path.join(source, "train.tsv"), encoding="utf-8") as f:
            lines = f.readlines()
        if train_size > len(lines) - 1:
            sys.exit(f"--train-size {train_size}: {source}/train.tsv has only {len(lines) - 1} rows")
        os.makedirs(os.path.dirname(train), exist_ok=True)
        with open(train, "w", encoding="utf-8") as f:
            f.writelines(lines[: train_size - heldout + 1])  # header and the first rows (the file is shuffled)
        if heldout:
            with open(valid, "w", encoding="utf-8") as f:
                f.writelines([lines[0], *lines[train_size - heldout + 1: train_size + 1]])
    run_logged(command, log)
    return folder


def train_command(data, arch, checkpoint, seed, settings: FinetuneSettings, train_size, save_dir, extra=()):
    """fairseq-train arguments of one fine-tuning run (``checkpoint`` None: random initialisation)."""
    updates = settings.max_epoch * -(-train_size // settings.batch_size)
    command = [os.path.join(BIN, "fairseq-train"), data, "--user-dir", os.path.join(ROOT, "user_dir"),
               "--task", "sentence_classification", "--criterion", "sentence_classification", *arch,
               "--dropout", str(settings.dropout), "--attention-dropout", str(settings.dropout),
               "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6",
               "--weight-decay", str(settings.weight_decay), "--clip-norm", "1.0",
               "--lr", str(settings.lr), "--lr-scheduler", "polynomial_decay", "--total-num-update", str(updates),
               "--warmup-updates", str(max(1, round(updates * settings.warmup_ratio))),
               "--batch-size", str(settings.batch_size), "--max-epoch", str(settings.max_epoch), "--seed", str(seed),
               "--cpu", "--num-workers", "0", "--log-format", "json", "--log-interval", "1000",
               "--save-dir", save_dir, "--no-epoch-checkpoints", "--no-save-optimizer-state",
               "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", *extra]
    if checkpoint:
        command += ["--finetune-from-model", os.path.abspath(checkpoint)]
    return command


def epoch_stats(output, tag):
    """{epoch: stats} of fairseq's JSON log lines tagged ``tag`` ('train' or 'valid')."""
    stats = {}
    for match in re.finditer(r"\| " + tag + r" \| (\{.*\})", output):
        record = json.loads(match.group(1))
        stats[int(record["epoch"])] = record
    return stats


def finetune_run(work, name, command, log):
    """Run (or reuse) one fine-tuning run and score its final model on the training split; a dict of results.

    Runs are cached in ``work/runs`` under a hash of the command, so an
    interrupted experiment resumes and two scripts share identical runs.
    """
    key = hashlib.sha1(json.dumps(command).encode()).hexdigest()[:12]
    cached = os.path.join(work, "runs", f"{name}-{key}.json")
    if os.path.isfile(cached):
        with open(cached) as f:
            result = json.load(f)
        log.extend(result["commands"])
        return result
    commands = []
    save_dir = command[command.index("--save-dir") + 1]
    if os.path.isdir(save_dir):
        # a run of this script stopped before its result was cached: fairseq would resume from its last checkpoint
        # (after the last epoch, training nothing), so it starts again
        shutil.rmtree(save_dir)
    started = time.time()
    output = run_logged(command, commands)
    train_seconds = time.time() - started
    valid, train = epoch_stats(output, "valid"), epoch_stats(output, "train")
    predicted = os.path.join(save_dir, "predict_train")
    run_logged([os.path.join(BIN, "spanbert-predict-classification"), "--checkpoint",
                os.path.join(save_dir, "checkpoint_last.pt"), "--split", "train", "--out", predicted, "--force",
                "--batch-size", "128", "--cpu"], commands)
    with open(os.path.join(predicted, "eval.json")) as f:
        train_accuracy = json.load(f)["accuracy"]
    last = max(valid)
    result = {
        "dev_accuracy_per_epoch": [float(valid[e]["valid_accuracy"]) for e in sorted(valid)],
        "ad_drop_rate_per_epoch": [float(train[e].get("train_ad_drop_rate", 0.0)) for e in sorted(train)],
        "dev_accuracy": float(valid[last]["valid_accuracy"]),
        "best_dev_accuracy": max(float(v["valid_accuracy"]) for v in valid.values()),
        "train_accuracy": float(train_accuracy),
        "train_seconds": round(train_seconds, 1),
        "commands": commands,
    }
    result["train_dev_gap"] = result["train_accuracy"] - result["dev_accuracy"]
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    with open(cached + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(cached + ".tmp", cached)  # a run counts as done only once its file is whole
    log.extend(commands)
    for leftover in ("checkpoint_last.pt", "checkpoint_best.pt"):  # 18 MB each, not needed again
        if os.path.isfile(os.path.join(save_dir, leftover)):
            os.remove(os.path.join(save_dir, leftover))
    return result


RESULT_COLUMNS = ("dev_accuracy", "best_dev_accuracy", "train_accuracy", "train_dev_gap")


def mean_sd(values):
    """{'mean', 'sd', 'runs'} of a list (sd 0 for a single value)."""
    return {"mean": round(statistics.mean(values), 2),
            "sd": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0, "runs": values}


def summarise(rows, group_keys):
    """{group: {column: mean_sd}} over ``rows`` grouped by the values of ``group_keys``."""
    groups = {}
    for row in rows:
        groups.setdefault(" / ".join(str(row[k]) for k in group_keys), []).append(row)
    return {group: {column: mean_sd([r[column] for r in members]) for column in RESULT_COLUMNS}
            for group, members in groups.items()}


def paired_by_seed(rows, column):
    """({arm: {seed: value}}, the seeds both arms ran, pre-trained minus random for each of them)."""
    by_arm = {init: {r["seed"]: r[column] for r in rows if r["init"] == init} for init in ARMS}
    seeds = sorted(set(by_arm["pretrained"]) & set(by_arm["random"]))
    return by_arm, seeds, [by_arm["pretrained"][s] - by_arm["random"][s] for s in seeds]


def pretrained_minus_random(rows, column="dev_accuracy"):
    """``column`` of the pre-trained arm minus the random arm, paired by seed: mean, 95% t-interval, the paired
    t-test's and Welch's two-sided p-values (None below two pairs)."""
    from scipy import stats

    by_arm, seeds, diffs = paired_by_seed(rows, column)
    result = {"seeds": seeds, "mean": round(statistics.mean(diffs), 2) if diffs else None,
              "ci95": None, "paired_t_p": None, "welch_p": None}
    if len(diffs) > 1:
        half = float(stats.t.ppf(0.975, len(diffs) - 1)) * statistics.stdev(diffs) / len(diffs) ** 0.5
        result["ci95"] = [round(result["mean"] - half, 2), round(result["mean"] + half, 2)]
        result["paired_t_p"] = round(float(stats.ttest_rel([by_arm["pretrained"][s] for s in seeds],
                                                           [by_arm["random"][s] for s in seeds]).pvalue), 4)
        result["welch_p"] = round(float(stats.ttest_ind(list(by_arm["pretrained"].values()),
                                                        list(by_arm["random"].values()), equal_var=False).pvalue), 4)
    return result


def write_results(out, force, inputs, rows, summary, log, plot, invocation):
    """results.csv, summary.json, commands.txt and the plot into ``out``, all at once."""
    from spanbert_plugin.core.file_utils import atomic_directory

    with atomic_directory(out, os.path.basename(sys.argv[0]), inputs, force, "--out") as folder:
        with open(os.path.join(folder, "results.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        with open(os.path.join(folder, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        with open(os.path.join(folder, "commands.txt"), "w") as f:
            f.write("# the experiment\n" + invocation + "\n\n# the commands it ran (cached runs included)\n")
            f.write("\n".join(line.replace(ROOT + os.sep, "") for line in dict.fromkeys(log)) + "\n")
        plot(rows, folder)


def result_row(labels, result):
    """One CSV row: ``labels`` then the run's measurements (percent, two decimals)."""
    row = dict(labels)
    row.update({column: round(result[column], 2) for column in RESULT_COLUMNS})
    row["dev_accuracy_per_epoch"] = " ".join(f"{v:.2f}" for v in result["dev_accuracy_per_epoch"])
    row["ad_drop_rate_per_epoch"] = " ".join(f"{v:.4f}" for v in result["ad_drop_rate_per_epoch"])
    row["train_seconds"] = result["train_seconds"]
    return row


def strip_plot(axis, rows, group_key, groups, column, ylabel, reference=None):
    """Each run as a dot and each group's mean +- sd as a bar, per value of ``group_key``."""
    for x, group in enumerate(groups):
        values = [r[column] for r in rows if r[group_key] == group]
        step = min(0.08, 0.45 / len(values))  # many seeds stay inside their group's column
        axis.scatter([x + step * (i - (len(values) - 1) / 2) for i in range(len(values))], values, s=18, zorder=3)
        mean = statistics.mean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        axis.errorbar([x + 0.3], [mean], yerr=[sd], fmt="s", color="black", capsize=4)
    if reference is not None:
        axis.axhline(reference, color="grey", linestyle="--", linewidth=1)
    axis.set_xticks(range(len(groups)))
    axis.set_xticklabels(groups)
    axis.set_xlim(-0.5, len(groups) - 0.3)
    axis.set_ylabel(ylabel)


def majority_share(task):
    """Dev accuracy (percent) of always predicting the most frequent dev label."""
    with open(os.path.join(GLUE, task, "dev.tsv"), encoding="utf-8") as f:
        labels = [line.rstrip("\n").split("\t")[-1] for line in f.readlines()[1:]]
    return 100 * max(labels.count(label) for label in set(labels)) / len(labels)


def experiment_parser(description, default_out):
    """Parser with the shared experiment flags: checkpoint, work/out folders, seeds and FinetuneSettings."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = FinetuneSettings()
    parser.add_argument("--checkpoint", default=os.path.join(ROOT, "demo_out", "checkpoints", "checkpoint_last.pt"),
                        help="pre-trained spanbert checkpoint (default: the make demo one)")
    parser.add_argument("--out", default=default_out, help="results folder (written all at once)")
    parser.add_argument("--work", default=DEFAULT_WORK, help="scratch folder: prepared data, checkpoints, finished runs")
    parser.add_argument("--force", action="store_true", help="replace an earlier output of this script in --out")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--max-seq-length", type=int, default=128, help="tokens per example with [CLS]/[SEP]")
    parser.add_argument("--max-epoch", type=int, default=defaults.max_epoch, help="fine-tuning epochs")
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate (linear warm-up and decay)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="examples per update")
    return parser


def settings_from(args):
    """FinetuneSettings of the parsed flags."""
    return FinetuneSettings(max_epoch=args.max_epoch, lr=args.lr, batch_size=args.batch_size)


def check_inputs(args, tasks):
    """Exit with a one-line message when the checkpoint or a GLUE folder is missing or --out may not be written."""
    from spanbert_plugin.core.file_utils import OutputError, check_destination

    if not os.path.isfile(args.checkpoint):
        sys.exit(f"--checkpoint {args.checkpoint}: no such file (run make demo first)")
    for task in tasks:
        if not os.path.isdir(os.path.join(GLUE, task)):
            sys.exit(f"{os.path.join(GLUE, task)}: GLUE {task} files not present")
    try:
        check_destination(args.out, os.path.basename(sys.argv[0]), [args.checkpoint], args.force, "--out")
    except OutputError as err:
        sys.exit(f"{os.path.basename(sys.argv[0])}: error: {err}")


def pyplot():
    """matplotlib.pyplot on the file-only backend, without its debug logging."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sst2(rows, folder):
    plt = pyplot()
    figure, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    strip_plot(axes[0], rows, "init", ARMS, "dev_accuracy", "dev accuracy (%), final model", majority_share("SST-2"))
    paired_difference_plot(axes[1], rows)
    strip_plot(axes[2], rows, "init", ARMS, "train_dev_gap", "train - dev accuracy (points)")
    figure.suptitle(f"SST-2, {rows[0]['train_size']} training sentences, dev 872 (dashed: majority class)")
    save_figure(plt, figure, os.path.join(folder, "sst2_pretrained_vs_random.png"))


def paired_difference_plot(axis, rows):
    """Pre-trained minus random dev accuracy per seed, with the mean and its 95% interval: the difference the
    first panel's scale hides."""
    _, seeds, diffs = paired_by_seed(rows, "dev_accuracy")
    difference = pretrained_minus_random(rows)
    axis.scatter(seeds, diffs, s=18, zorder=3)
    axis.axhline(0, color="grey", linestyle="--", linewidth=1)
    if difference["ci95"]:
        axis.axhspan(*difference["ci95"], color="tab:blue", alpha=0.15, label="mean, 95% interval")
        axis.axhline(difference["mean"], color="tab:blue", linewidth=1)
        axis.legend(loc="best", fontsize=8)
    axis.set_xlabel("seed")
    axis.set_ylabel("pre-trained - random (points)")


def save_figure(plt, figure, path):
    """Lay out, write and close ``figure``."""
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def choose_learning_rates(args, settings, arch, tokenizer_folder, log):
    """{arm: lr}: for each arm, the lr of ``--lr-grid`` whose run (the first seed, trained on the training slice
    without its last ``--heldout`` rows) scores best on those rows; and one row per grid run."""
    data = prepare_glue(args.work, "SST-2", tokenizer_folder, args.train_size, args.max_seq_length, log,
                        heldout=args.heldout)
    seed, examples = int(args.seeds.split(",")[0]), args.train_size - args.heldout
    chosen, grid_rows = {}, []
    for init in ARMS:
        scores = {}
        for lr in args.lr_grid:
            name = f"SST-2_heldout{args.heldout}_{init}_lr{lr:g}_{seed}"
            command = train_command(data, arch, args.checkpoint if init == "pretrained" else None, seed,
                                    replace(settings, lr=lr), examples, os.path.join(args.work, "checkpoints", name))
            scores[lr] = finetune_run(args.work, name, command, log)["dev_accuracy"]
            grid_rows.append({"init": init, "lr": lr, "seed": seed, "heldout_accuracy": round(scores[lr], 2)})
            print(json.dumps(grid_rows[-1]), flush=True)
        chosen[init] = max(args.lr_grid, key=lambda lr: (scores[lr], -lr))  # a tie goes to the smaller lr
    return chosen, grid_rows


def parse_lr_grid(text):
    try:
        grid = [float(v) for v in text.split(",")]
    except ValueError:
        grid = []
    if not grid or any(lr <= 0 for lr in grid):
        sys.exit(f"--lr-grid {text}: expected comma-separated positive learning rates, e.g. 1e-4,3e-4,1e-3")
    return grid


def main():
    parser = experiment_parser(__doc__, os.path.join(ROOT, "benchmarks", "pretraining", "sst2", "demo_1200"))
    parser.add_argument("--train-size", type=int, default=2000, help="first N sentences of SST-2 train")
    parser.add_argument("--lr-grid", type=parse_lr_grid, default=None,
                        help="choose each arm's lr among these (comma-separated) on --heldout training rows, "
                             "instead of --lr for both")
    parser.add_argument("--heldout", type=int, default=5000,
                        help="with --lr-grid: the last N rows of the training slice score the grid (never dev)")
    args = parser.parse_args()
    if args.lr_grid and not 0 < args.heldout < args.train_size:
        parser.error(f"--heldout {args.heldout}: expected between 0 and --train-size ({args.train_size}), exclusive")
    check_inputs(args, ["SST-2"])
    settings = settings_from(args)
    log = []
    arch, tokenizer_folder = checkpoint_model(args.checkpoint)
    lrs, grid_rows = {init: settings.lr for init in ARMS}, []
    if args.lr_grid:
        lrs, grid_rows = choose_learning_rates(args, settings, arch, tokenizer_folder, log)
    data = prepare_glue(args.work, "SST-2", tokenizer_folder, args.train_size, args.max_seq_length, log)
    rows = []
    for init in ARMS:
        for seed in [int(s) for s in args.seeds.split(",")]:
            tag = f"SST-2_{init}_{seed}" + (f"_lr{lrs[init]:g}" if args.lr_grid else "")
            save_dir = os.path.join(args.work, "checkpoints", tag)
            command = train_command(data, arch, args.checkpoint if init == "pretrained" else None, seed,
                                    replace(settings, lr=lrs[init]), args.train_size, save_dir)
            result = finetune_run(args.work, tag, command, log)
            rows.append(result_row({"init": init, "seed": seed, "train_size": args.train_size, "lr": lrs[init]},
                                   result))
            print(json.dumps(rows[-1]), flush=True)
    summary = {"checkpoint": os.path.abspath(args.checkpoint), "checkpoint_updates": checkpoint_updates(args.checkpoint),
               "task": "SST-2", "train_size": args.train_size,
               "dev_size": 872, "max_seq_length": args.max_seq_length, **asdict(settings),
               "majority_class_dev_accuracy": round(majority_share("SST-2"), 2), "arms": summarise(rows, ["init"]),
               "pretrained_minus_random": pretrained_minus_random(rows)}
    if args.lr_grid:
        summary.update(lr=None, lr_chosen=lrs, lr_selection={"heldout_rows": args.heldout, "grid": grid_rows})
    write_results(args.out, args.force, [args.checkpoint], rows, summary, log, plot_sst2,
                  "OMP_NUM_THREADS=1 .venv/bin/python " + shlex.join(sys.argv))
    print(json.dumps(summary["arms"]))


if __name__ == "__main__":
    main()
