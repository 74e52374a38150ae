#!/usr/bin/env python
"""The first pre-training updates under ``--bf16-autocast`` and in fp32: the same run twice, loss per update.

Both runs continue the pre-training of an imported encoder (span masking + SBO) from the same weights, over the
same batches and masks (same seed), with the learning-rate schedule of a ``--schedule-updates`` run (the
continued-pre-training experiment's 2,000 by default) cut at ``--updates``; the encoder trains from
the first update (no head-only updates), so every update exercises bf16 through the whole network. Writes to ``--out``:

* ``loss_curve.csv``: ``precision,update,loss,mlm_loss,sbo_loss`` (bits, each update's training batch);
* ``loss_curve.png``: both curves, and their difference per update;
* ``summary.json``: per precision the wall time and the mean losses of the last 50 updates, and the mean and
  largest |bf16 - fp32| difference per update;
* ``commands.md``: both fairseq-train commands.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_speed/bf16_autocast_loss_curve.py --from-model IMPORTED \\
        --data PRETRAIN_DATA --out benchmarks/cpu_speed/bf16_autocast/loss_curve

A finished run (its log reaches ``--updates``) is not run again. ``--out`` is written all at once and must be
new, empty, or an earlier output of this script (``--force`` replaces it), checked before any training.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "pretraining"))  # masking_ablation
from masking_ablation import _pyplot, _read_json, common_train_args, train_inner_losses  # noqa: E402
from command_output import CommandLog  # noqa: E402

from spanbert_plugin.core.file_utils import OutputError, atomic_directory, check_destination  # noqa: E402

COMMAND = "bf16_autocast_loss_curve.py"  # recorded in --out's manifest: --force replaces only this script's output
BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
PRECISIONS = ("fp32", "bf16_autocast")
LOSSES = ("loss", "mlm_loss", "sbo_loss")
TAIL = 50  # updates whose losses summarise each run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--from-model", required=True, help="spanbert-import-hf folder (the encoder to continue)")
    parser.add_argument("--from-model-arch", default="spanbert_base")
    parser.add_argument("--data", required=True, help="spanbert-prepare folder with the imported model's vocabulary")
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    parser.add_argument("--work", default="/tmp/bf16_loss_curve", help="fairseq-train logs")
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--schedule-updates", type=int, default=2000, help="the run whose lr schedule is followed")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if not 1 <= args.updates <= args.schedule_updates:
        sys.exit("bf16_autocast_loss_curve: --updates must be between 1 and --schedule-updates")
    for flag, path in (("--from-model", os.path.join(args.from_model, "model.pt")),
                       ("--data", os.path.join(args.data, "prepare_stats.json"))):
        if not os.path.isfile(path):
            sys.exit(f"bf16_autocast_loss_curve: {flag}: {path} not found")
    inputs = [args.from_model, args.data, args.work]
    try:  # before the training runs: an --out this script may not replace is refused now
        check_destination(args.out, COMMAND, inputs, args.force, "--out")
    except OutputError as err:
        sys.exit(f"bf16_autocast_loss_curve: {err}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    log = CommandLog()
    curves, wall = {}, {}
    summary_path = os.path.join(args.out, "summary.json")  # an earlier output's: the wall times of finished runs
    earlier = _read_json(summary_path) if os.path.isfile(summary_path) else {}
    commands_path = os.path.join(args.out, "commands.md")  # kept when nothing runs again
    commands = None
    if os.path.isfile(commands_path):
        with open(commands_path, encoding="utf-8") as f:
            commands = f.read()
    for precision in PRECISIONS:
        work = os.path.join(args.work, precision)
        log_path = os.path.join(work, "train.log")
        curve = train_inner_losses(log_path, LOSSES)
        if max(curve, default=0) < args.updates:
            os.makedirs(work, exist_ok=True)
            if os.path.isfile(log_path):
                os.replace(log_path, log_path + ".incomplete")  # a stopped run starts again from the start
            cfg = {"cpu": True, "bf16_autocast": precision == "bf16_autocast"}
            argv = [os.path.join(BIN, "fairseq-train"), args.data, "--task", "spanbert_pretraining",
                    "--criterion", "span_bert", "--arch", args.from_model_arch, "--tokens-per-sample", str(args.tokens),
                    "--mask-scheme", "span", "--sbo-weight", "1.0", "--no-save", "--disable-validation",
                    "--save-dir", os.path.join(work, "checkpoints"),  # not ./checkpoints, which fairseq resumes from
                    "--finetune-from-model", os.path.join(os.path.abspath(args.from_model), "model.pt"),
                    *common_train_args(cfg, args.schedule_updates, args.lr, args.batch, args.seed,
                                       stop_at=args.updates, log_interval=1)]
            start = time.perf_counter()
            log.run(argv, f"{args.updates} updates, {precision}", env, log_path=log_path)
            wall[precision] = time.perf_counter() - start
            curve = train_inner_losses(log_path, LOSSES)
        else:
            wall[precision] = earlier.get(precision, {}).get("wall_seconds")
        curves[precision] = curve

    updates = sorted(set(curves["fp32"]) & set(curves["bf16_autocast"]))
    rows = ["precision,update,loss,mlm_loss,sbo_loss"] + [
        f"{p},{u},{','.join(map(str, curves[p][u]))}" for p in PRECISIONS for u in sorted(curves[p])]
    differences = [curves["bf16_autocast"][u][0] - curves["fp32"][u][0] for u in updates]
    tail = updates[-TAIL:]
    summary = {
        "updates": args.updates, "schedule_updates": args.schedule_updates, "batch": args.batch, "tokens": args.tokens,
        "lr": args.lr, "seed": args.seed, "threads": args.threads,
        **{p: {"wall_seconds": wall[p],
               **{f"{k}_last_{TAIL}": statistics.mean(curves[p][u][i] for u in tail)
                  for i, k in enumerate(LOSSES)}} for p in PRECISIONS},
        "mean_abs_loss_difference": statistics.mean(abs(d) for d in differences),
        "max_abs_loss_difference": max(abs(d) for d in differences),
        f"mean_loss_difference_last_{TAIL}": statistics.mean(differences[-len(tail):]),
    }
    try:
        with atomic_directory(args.out, COMMAND, inputs, args.force, "--out") as out:
            if log.lines:
                commands = f"## `{' '.join(sys.argv)}`\n\n" + "".join(f"- {w}: `{c}`\n" for w, c in log.lines)
            write_outputs(out, rows, summary, commands, curves, updates, differences, args.updates)
    except OutputError as err:
        sys.exit(f"bf16_autocast_loss_curve: {err}")
    print(json.dumps(summary))


def write_outputs(out, rows, summary, commands, curves, updates, differences, updates_run):
    """loss_curve.csv, summary.json, commands.md (when there are commands) and loss_curve.png into ``out``."""
    with open(os.path.join(out, "loss_curve.csv"), "w", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(summary, indent=2) + "\n")
    if commands is not None:
        with open(os.path.join(out, "commands.md"), "w", encoding="utf-8") as f:
            f.write(commands)
    plt = _pyplot()
    if plt is not None:
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
        for precision, style in zip(PRECISIONS, ("-", "--")):
            top.plot(updates, [curves[precision][u][0] for u in updates], style, linewidth=1, label=precision)
        top.set_ylabel("training loss (MLM + SBO, bits)")
        top.set_title(f"continued span + SBO pre-training, first {updates_run} updates, same batches", fontsize=10)
        top.legend()
        bottom.plot(updates, differences, linewidth=1, color="grey")
        bottom.axhline(0, color="black", linewidth=0.5)
        bottom.set_xlabel("update")
        bottom.set_ylabel("bf16 − fp32")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "loss_curve.png"), dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    main()
