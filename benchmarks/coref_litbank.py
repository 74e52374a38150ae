#!/usr/bin/env python
"""LitBank coreference, one cross-validation fold: a pre-trained spanbert checkpoint against random initialisation.

Both arms prepare the fold with the checkpoint's tokenizer (its data folder),
use its encoder size, and fine-tune with the coreference recipe
``configs/coref/tiny_cpu.yaml`` (two learning rates: encoder and head, fairseq's
composite optimizer); only ``checkpoint.finetune_from_model`` differs. The
checkpoint with the best dev ``conll_f1`` predicts the fold's test documents
(``spanbert-predict-coref``), whose eval.json gives the reported numbers.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/coref_litbank.py \
        --checkpoint demo_out/checkpoints/checkpoint_last.pt --out benchmarks/coref_litbank --seeds 1,2,3

``--train-docs N`` keeps the first N training documents (smoke tests). Finished
runs are kept in ``--work`` and reused; ``--out`` gets ``results.csv``,
``summary.md`` and ``commands.txt``.
"""
import argparse
import csv
import json
import os
import shlex
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BIN = os.path.dirname(sys.executable)
LITBANK = os.path.join(ROOT, "..", "shared", "data", "litbank")
SIZE_KEYS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads", "max_positions")
METRICS = ("muc", "bcub", "ceafe")


def run(command, log):
    log.append(shlex.join(command))
    print("$", log[-1], flush=True)
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {log[-1]}\n{proc.stderr[-3000:]}")
    return proc


def checkpoint_settings(checkpoint):
    """(model sizes, the data folder with its tokenizer) of a pre-trained checkpoint."""
    from fairseq import checkpoint_utils

    import spanbert_plugin.registry  # noqa: F401  (registers the plugin, safe-loading allowlist)
    from spanbert_plugin.model.hub_interface import resolve_data_dir

    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    model = state["cfg"]["model"]
    return {key: model[key] for key in SIZE_KEYS}, resolve_data_dir(checkpoint, None, state)


def prepare_fold(args, tokenizer_from, max_segment_length, log):
    folder = os.path.join(args.work, f"fold{args.fold}_seg{max_segment_length}_n{args.train_docs or 'all'}")
    if os.path.isdir(folder):
        return folder
    splits = os.path.join(args.litbank, "splits", f"fold{args.fold}")
    train = os.path.join(splits, "train.txt")
    if args.train_docs:
        base = os.path.dirname(train)
        with open(train) as f:
            kept = [os.path.join(base, line.strip()) for line in f if line.strip()][:args.train_docs]
        train = os.path.join(args.work, f"fold{args.fold}_train{args.train_docs}.txt")
        with open(train, "w") as f:
            f.write("\n".join(kept) + "\n")
    run([os.path.join(BIN, "spanbert-prepare-coref"), "--train", train, "--valid", os.path.join(splits, "dev.txt"),
         "--test", os.path.join(splits, "test.txt"), "--tokenizer-from", tokenizer_from, "--destdir", folder,
         "--max-segment-length", str(max_segment_length)], log)
    return folder


def finetune_and_test(args, data, sizes, arm, seed, log):
    name = f"{arm}_seed{seed}"
    result_path = os.path.join(args.work, "runs", name + ".json")
    if os.path.isfile(result_path):
        return json.load(open(result_path))
    save_dir = os.path.join(args.work, "runs", name)
    command = [os.path.join(BIN, "fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs", "coref"),
               "--config-name", "tiny_cpu", f"task.data={data}", f"checkpoint.save_dir={save_dir}",
               f"common.seed={seed}", f"optimization.max_epoch={args.epochs}", "common.log_format=json",
               f"optimizer.groups.default.lr_float={args.encoder_lr}",
               f"optimizer.groups.coref_head.lr_float={args.head_lr}",
               f"task.coref_ffnn_size={args.ffnn_size}"]
    command += [f"model.{key}={value}" for key, value in sizes.items()] + args.override
    if arm == "pretrained":
        command.append(f"checkpoint.finetune_from_model={os.path.abspath(args.checkpoint)}")
    proc = run(command, log)
    dev = [json.loads(line[line.index("{"):]) for line in (proc.stdout + proc.stderr).splitlines()
           if "valid_conll_f1" in line and "{" in line]
    out = os.path.join(args.work, "runs", name + "_test")
    run([os.path.join(BIN, "spanbert-predict-coref"), "--checkpoint", os.path.join(save_dir, "checkpoint_best.pt"),
         "--split", "test", "--out", out, "--force"], log)
    scores = json.load(open(os.path.join(out, "eval.json")))
    result = {"arm": arm, "seed": seed, "best_dev_conll_f1": max(float(d["valid_conll_f1"]) for d in dev),
              "dev_conll_f1_per_epoch": [float(d["valid_conll_f1"]) for d in dev],
              **{f"test_{m}_f1": scores[m]["f1"] for m in METRICS}, "test_conll_f1": scores["conll_f1"]}
    with open(result_path, "w") as f:
        json.dump(result, f, indent=2)
    return result


def summary(results):
    lines = ["| arm | runs | best dev CoNLL F1 | test MUC F1 | test B3 F1 | test CEAF-e F1 | test CoNLL F1 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for arm in dict.fromkeys(r["arm"] for r in results):
        rows = [r for r in results if r["arm"] == arm]

        def cell(key, rows=rows):
            values = [r[key] for r in rows]
            if len(values) == 1:
                return f"{values[0]:.1f}"
            return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"

        lines.append(f"| {arm} | {len(rows)} | {cell('best_dev_conll_f1')} | {cell('test_muc_f1')} | "
                     f"{cell('test_bcub_f1')} | {cell('test_ceafe_f1')} | {cell('test_conll_f1')} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="pre-trained spanbert checkpoint")
    parser.add_argument("--out", required=True)
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--arms", default="pretrained,random")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--encoder-lr", type=float, default=2e-5)
    parser.add_argument("--head-lr", type=float, default=2e-4)
    parser.add_argument("--ffnn-size", type=int, default=150)
    parser.add_argument("--max-segment-length", type=int, default=384)
    parser.add_argument("--train-docs", type=int, help="keep the first N training documents (smoke tests)")
    parser.add_argument("--override", nargs="*", default=[],
                        help="hydra overrides appended to every fine-tuning run, e.g. task.max_training_segments=3")
    parser.add_argument("--litbank", default=LITBANK)
    parser.add_argument("--work", default=os.path.join(ROOT, "benchmarks", "out", "coref_work"))
    args = parser.parse_args()
    os.makedirs(os.path.join(args.work, "runs"), exist_ok=True)
    sizes, tokenizer_from = checkpoint_settings(args.checkpoint)
    log = []
    data = prepare_fold(args, tokenizer_from, min(args.max_segment_length, int(sizes["max_positions"])), log)
    results = [finetune_and_test(args, data, sizes, arm, int(seed), log)
               for seed in args.seeds.split(",") for arm in args.arms.split(",")]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.csv"), "w", newline="") as f:
        fields = [k for k in results[0] if k != "dev_conll_f1_per_epoch"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(summary(results))
    with open(os.path.join(args.out, "commands.txt"), "w") as f:
        f.write("\n".join(log) + "\n")
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
