#!/usr/bin/env python
"""SpanDrop's low-data claim on real QA: SQuAD 1.1 dev split by article, small training subsets.

The last ``--test-articles`` articles of SQuAD 1.1 dev are the evaluation set
(whole articles, so no passage is shared with training); training subsets of
``--sizes`` questions are drawn, per seed, from the other articles. Every
method fine-tunes the same pre-trained checkpoint (``make demo``'s by default)
on the same subset with the same seed and hyper-parameters, so differences
between methods are paired within a seed:

* baseline: no SpanDrop;
* SpanDrop (p) and Beta-SpanDrop (p, gamma = 1) with token and sentence units;
* SpanMask (p, token units): the same draws, masked instead of removed.

Each run's EM/F1 on the evaluation set goes to ``OUT/results.csv`` as soon as
it finishes (a rerun with ``--resume`` skips finished runs); ``OUT/summary.md``
holds the table (mean +- sd over seeds and the paired difference with the
baseline) and ``OUT/f1_vs_size.png`` the plot. ``--budget-minutes`` stops
starting new runs once that much wall time has passed (runs are ordered seed
by seed, so a cut leaves whole seeds). ``OUT`` must be new or empty; with ``--resume``
it may hold only those three files.

    .venv/bin/python benchmarks/regularisers/span_drop_squad.py --out benchmarks/regularisers/span_drop_squad \
        [--checkpoint demo_out/checkpoints/checkpoint_last.pt --sizes 500,2000 --seeds 1,2,3 --p 0.1]
"""
import argparse
import csv
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SQUAD_DEV = os.path.join(ROOT, "..", "shared", "data", "squad", "dev-v1.1.json")
BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
FIELDS = ("seed", "size", "method", "em", "f1", "updates", "seconds")
OUTPUTS = ("results.csv", "summary.md", "f1_vs_size.png")  # all this script writes into --out


def out_problem(out, resume):
    """Why ``out`` may not receive this script's files (one line), or None."""
    if not os.path.lexists(out):
        return None
    if os.path.islink(out) or not os.path.isdir(out):
        return f"--out {out}: exists and is not a folder"
    present = sorted(os.listdir(out))
    foreign = [name for name in present if name not in OUTPUTS]
    if foreign:
        return f"--out {out}: holds files this script did not write ({', '.join(foreign[:3])}); choose another --out"
    if present and not resume:
        return f"--out {out}: holds an earlier run's results: pass --resume to continue it or choose another --out"
    return None


def methods(p):
    """Method name -> its --span-drop-* flags."""
    drop = ["--span-drop-p", str(p)]
    return {
        "baseline": [],
        "SpanDrop token": drop + ["--span-drop-unit", "token"],
        "SpanDrop sentence": drop + ["--span-drop-unit", "sentence"],
        "Beta-SpanDrop token": drop + ["--span-drop-unit", "token", "--span-drop-gamma", "1"],
        "Beta-SpanDrop sentence": drop + ["--span-drop-unit", "sentence", "--span-drop-gamma", "1"],
        "SpanMask token": drop + ["--span-drop-unit", "token", "--span-drop-mode", "mask"],
    }


def model_flags(checkpoint):
    """(--arch and size flags, pre-training data folder) of a spanbert checkpoint."""
    sys.path.insert(0, ROOT)
    import torch

    import spanbert_plugin.registry  # noqa: F401  (registers the plugin, safe-loading allowlist)

    model = torch.load(checkpoint, map_location="cpu", weights_only=True)["cfg"]
    flags = ["--arch", model["model"]["_name"]]
    for key in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads",
                "max_positions"):
        flags += [f"--{key.replace('_', '-')}", str(model["model"][key])]
    return flags, model["task"]["data"].split(os.pathsep)[0]


def split_by_article(test_articles):
    """(training articles, evaluation articles) of SQuAD 1.1 dev: the last ``test_articles`` are held out."""
    with open(SQUAD_DEV, encoding="utf-8") as f:
        data = json.load(f)["data"]
    return data[:-test_articles], data[-test_articles:]


def subset(articles, size, seed):
    """SQuAD JSON holding ``size`` questions drawn at random from ``articles`` (paragraphs kept whole)."""
    where = [(a, p, q) for a, art in enumerate(articles) for p, par in enumerate(art["paragraphs"])
             for q in range(len(par["qas"]))]
    chosen = sorted(random.Random(seed).sample(where, size))
    data = {}
    for a, p, q in chosen:
        paragraph = data.setdefault(a, {}).setdefault(p, {"context": articles[a]["paragraphs"][p]["context"], "qas": []})
        paragraph["qas"].append(articles[a]["paragraphs"][p]["qas"][q])
    return {"version": "1.1", "data": [{"title": articles[a]["title"], "paragraphs": list(ps.values())}
                                       for a, ps in data.items()]}


def prepare(out, tokenizer, train_json, test_json, name, args):
    """A spanbert-prepare-qa folder under ``out`` with ``train_json`` and the evaluation set (made once per subset)."""
    from spanbert_plugin.qa.prepare import QAConfig, prepare_qa

    folder = os.path.join(out, name)
    if not os.path.isfile(os.path.join(folder, "qa_config.json")):
        paths = {}
        for split, content in (("train", train_json), ("valid", test_json)):
            paths[split] = os.path.join(out, f"{name}.{split}.json")
            with open(paths[split], "w", encoding="utf-8") as f:
                json.dump(content, f)
        prepare_qa(paths, tokenizer, folder, QAConfig(args.max_seq_length, args.doc_stride, args.max_query_length),
                   force=True)
    return folder


def train(folder, checkpoint, arch_flags, method_flags, seed, epochs, total_updates, args):
    """Fine-tune once; (EM, F1, updates) of the evaluation set after the last epoch."""
    command = [os.path.join(BIN, "fairseq-train"), folder, "--user-dir", os.path.join(ROOT, "user_dir"),
               "--task", "extractive_qa", "--criterion", "extractive_qa", *arch_flags,
               "--finetune-from-model", checkpoint, "--optimizer", "adam", "--adam-betas", "(0.9,0.999)",
               "--lr", str(args.lr), "--lr-scheduler", "polynomial_decay", "--warmup-updates", "0",
               "--total-num-update", str(total_updates),
               "--weight-decay", "0.01", "--batch-size", str(args.batch_size), "--max-epoch", str(epochs),
               "--validate-interval", str(epochs), "--cpu", "--num-workers", "0", "--seed", str(seed),
               "--no-save", "--save-dir", os.path.join(args.work, "checkpoints"),  # not ./checkpoints, which fairseq resumes from
               "--log-format", "json", "--log-interval", "1000", *method_flags]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{output[-3000:]}")
    last = [json.loads(m.group(1)) for m in re.finditer(r"\| valid \| (\{.*\})", output)][-1]
    return float(last["valid_em"]), float(last["valid_f1"]), int(last["valid_num_updates"])


def summarise(rows, out, names):
    """summary.md (mean +- sd over seeds, paired difference with the baseline) and f1_vs_size.png."""
    sizes = sorted({int(r["size"]) for r in rows})
    by = {(int(r["size"]), r["method"], int(r["seed"])): r for r in rows}
    lines = ["| method | " + " | ".join(f"{s} questions: EM / F1 | F1 - baseline" for s in sizes) + " |",
             "| --- |" + " --- | --- |" * len(sizes)]
    stats = {}
    for name in names:
        cells = []
        for size in sizes:
            seeds = sorted(seed for (s, m, seed) in by if s == size and m == name)
            em = [float(by[size, name, k]["em"]) for k in seeds]
            f1 = [float(by[size, name, k]["f1"]) for k in seeds]
            diff = [float(by[size, name, k]["f1"]) - float(by[size, "baseline", k]["f1"])
                    for k in seeds if (size, "baseline", k) in by]
            if not seeds:
                cells += ["-", "-"]
                continue
            def sd(v):
                return statistics.stdev(v) if len(v) > 1 else 0.0
            stats[name, size] = (statistics.mean(f1), sd(f1))
            cells.append(f"{statistics.mean(em):.1f} ± {sd(em):.1f} / {statistics.mean(f1):.1f} ± {sd(f1):.1f} (n={len(seeds)})")
            cells.append("" if name == "baseline" else f"{statistics.mean(diff):+.1f} ± {sd(diff):.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    temporary = os.path.join(out, f".summary.md.tmp{os.getpid()}")
    with open(temporary, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(temporary, os.path.join(out, "summary.md"))
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(names):
        points = [(s, *stats[name, s]) for s in sizes if (name, s) in stats]
        if points:
            xs, means, sds = zip(*points)
            ax.errorbar([x * (1 + 0.02 * (i - 2.5)) for x in xs], means, yerr=sds, marker="o", capsize=3, label=name)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("training questions (SQuAD 1.1 dev, other articles)")
    ax.set_ylabel("F1 on held-out articles (mean ± sd over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "f1_vs_size.png"), dpi=120)
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=os.path.join(ROOT, "demo_out", "checkpoints", "checkpoint_last.pt"),
                        help="pre-trained spanbert checkpoint (its data folder gives the tokenizer)")
    parser.add_argument("--out", required=True, help="results folder")
    parser.add_argument("--work", default=os.path.join(ROOT, "benchmarks", "out", "span_drop_squad"),
                        help="folder for the prepared subsets (kept for reruns)")
    parser.add_argument("--resume", action="store_true", help="keep OUT/results.csv and skip the runs it holds")
    parser.add_argument("--sizes", default="500,2000", help="training subset sizes (questions)")
    parser.add_argument("--seeds", default="1,2,3", help="seeds (subset and training)")
    parser.add_argument("--methods", default=None, help="comma-separated method names (default: all)")
    parser.add_argument("--p", type=float, default=0.1, help="SpanDrop / SpanMask drop ratio")
    parser.add_argument("--test-articles", type=int, default=3, help="last SQuAD dev articles held out for evaluation")
    parser.add_argument("--updates", type=int, default=120, help="about this many updates per run (epochs rounded up)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--doc-stride", type=int, default=64)
    parser.add_argument("--max-query-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="OMP threads per run")
    parser.add_argument("--budget-minutes", type=float, default=25.0, help="start no run after this much wall time")
    args = parser.parse_args(argv)
    if not os.path.isfile(SQUAD_DEV):
        parser.error(f"{SQUAD_DEV}: not found")
    if not os.path.isfile(args.checkpoint):
        parser.error(f"--checkpoint {args.checkpoint}: no such file (run `make demo`)")
    problem = out_problem(args.out, args.resume)
    if problem:
        sys.exit(f"span_drop_squad: {problem}")
    results = os.path.join(args.out, "results.csv")
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    all_methods = methods(args.p)
    names = list(all_methods) if not args.methods else [m.strip() for m in args.methods.split(",")]
    unknown = [m for m in names if m not in all_methods]
    if unknown:
        parser.error(f"--methods: unknown {unknown[0]!r}; choose from {', '.join(all_methods)}")
    arch_flags, tokenizer = model_flags(args.checkpoint)
    train_articles, test_articles = split_by_article(args.test_articles)
    test_json = {"version": "1.1", "data": test_articles}
    rows = list(csv.DictReader(open(results))) if os.path.exists(results) else []
    done = {(int(r["seed"]), int(r["size"]), r["method"]) for r in rows}
    began = time.time()
    for seed in (int(s) for s in args.seeds.split(",")):
        for size in (int(s) for s in args.sizes.split(",")):
            folder = prepare(args.work, tokenizer, subset(train_articles, size, seed), test_json, f"n{size}_s{seed}", args)
            with open(os.path.join(folder, "prepare_stats.json")) as f:
                windows = json.load(f)["train"]["windows"]
            per_epoch = -(-windows // args.batch_size)
            epochs = max(1, -(-args.updates // per_epoch))
            for name in names:
                if (seed, size, name) in done:
                    continue
                if time.time() - began > args.budget_minutes * 60:
                    print(f"budget of {args.budget_minutes} minutes spent; stopping before seed {seed}, {size}, {name}")
                    return summarise(rows, args.out, names)
                start = time.time()
                em, f1, updates = train(folder, args.checkpoint, arch_flags, all_methods[name], seed, epochs,
                                         epochs * per_epoch, args)
                row = {"seed": seed, "size": size, "method": name, "em": f"{em:.2f}", "f1": f"{f1:.2f}",
                       "updates": updates, "seconds": f"{time.time() - start:.0f}"}
                rows.append(row)
                new = not os.path.exists(results)
                with open(results, "a", newline="") as f:
                    writer = csv.DictWriter(f, FIELDS)
                    if new:
                        writer.writeheader()
                    writer.writerow(row)
                print(json.dumps(row), flush=True)
    table = summarise(rows, args.out, names)
    print(table)
    return table


if __name__ == "__main__":
    main()
