#!/usr/bin/env python
"""SST-2 with a few thousand training sentences: a pre-trained spanbert checkpoint against random initialisation.

Both runs use the checkpoint's encoder size and tokenizer (the data folder it
was pre-trained on), the same slice of SST-2 train, the full dev set and the
same hyper-parameters; only ``--finetune-from-model`` differs. Each seed's
best dev accuracy is written to ``OUT/results.csv`` and the mean and standard
deviation per initialisation to ``OUT/summary.json``.

    .venv/bin/python benchmarks/sst2_experiment.py --checkpoint demo_out/checkpoints/checkpoint_last.pt \
        --out benchmarks/sst2_results [--train-size 4000 --seeds 1,2,3 --max-epoch 3 --lr 1e-4]
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLUE = os.path.join(ROOT, "..", "shared", "data", "glue", "SST-2")
BIN = os.path.dirname(sys.executable)
SIZE_KEYS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads", "max_positions")


def checkpoint_model(checkpoint):
    """(architecture flags, data folder) recorded in a pre-training checkpoint."""
    sys.path.insert(0, ROOT)
    import spanbert_plugin  # noqa: F401  (safe-loading allowlist)
    import torch

    cfg = torch.load(checkpoint, map_location="cpu", weights_only=True)["cfg"]
    flags = ["--arch", cfg["model"]["_name"]]
    for key in SIZE_KEYS:
        flags += ["--" + key.replace("_", "-"), str(cfg["model"][key])]
    return flags, cfg["task"]["data"].split(os.pathsep)[0]


def prepare(out, tokenizer_folder, train_size):
    folder = os.path.join(out, "data")
    if os.path.isfile(os.path.join(folder, "classification.json")):
        return folder
    with open(os.path.join(GLUE, "train.tsv"), encoding="utf-8") as f:
        lines = f.readlines()
    train = os.path.join(out, f"train_{train_size}.tsv")
    with open(train, "w", encoding="utf-8") as f:
        f.writelines(lines[: train_size + 1])  # header and the first sentences
    subprocess.run([os.path.join(BIN, "spanbert-prepare-classification"), "--train", train, "--valid",
                    os.path.join(GLUE, "dev.tsv"), "--tokenizer-from", tokenizer_folder, "--destdir", folder,
                    "--text-columns", "sentence", "--label-column", "label", "--max-seq-length", "64"], check=True)
    return folder


def best_accuracy(output):
    accuracies = [float(json.loads(m.group(1))["valid_accuracy"]) for m in re.finditer(r"\| valid \| (\{.*\})", output)]
    return max(accuracies)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="pre-trained spanbert checkpoint")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "sst2_results"), help="results folder")
    parser.add_argument("--train-size", type=int, default=4000, help="first N sentences of SST-2 train")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--max-epoch", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if not os.path.isdir(GLUE):
        sys.exit(f"{GLUE}: SST-2 files not present")
    os.makedirs(args.out, exist_ok=True)
    arch, tokenizer_folder = checkpoint_model(args.checkpoint)
    data = prepare(args.out, tokenizer_folder, args.train_size)
    rows = []
    for init in ("pretrained", "random"):
        for seed in [int(s) for s in args.seeds.split(",")]:
            command = [os.path.join(BIN, "fairseq-train"), data, "--user-dir", os.path.join(ROOT, "user_dir"),
                       "--task", "sentence_classification", "--criterion", "sentence_classification", *arch,
                       "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--weight-decay", "0.01",
                       "--lr", str(args.lr), "--lr-scheduler", "polynomial_decay",
                       "--batch-size", str(args.batch_size), "--max-epoch", str(args.max_epoch), "--seed", str(seed),
                       "--cpu", "--num-workers", "0", "--log-format", "json", "--no-save"]
            total = args.max_epoch * -(-args.train_size // args.batch_size)
            command += ["--total-num-update", str(total), "--warmup-updates", str(max(1, total * 6 // 100))]
            if init == "pretrained":
                command += ["--finetune-from-model", os.path.abspath(args.checkpoint)]
            proc = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
            rows.append({"init": init, "seed": seed, "best_dev_accuracy": best_accuracy(proc.stdout + proc.stderr)})
            print(rows[-1], flush=True)
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {"checkpoint": os.path.abspath(args.checkpoint), "train_size": args.train_size, "dev_size": 872,
               "max_epoch": args.max_epoch, "lr": args.lr}
    for init in ("pretrained", "random"):
        values = [r["best_dev_accuracy"] for r in rows if r["init"] == init]
        summary[init] = {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                         "runs": values}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
