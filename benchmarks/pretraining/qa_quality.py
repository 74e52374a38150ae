#!/usr/bin/env python
"""Extractive-QA quality on a by-article split of SQuAD 1.1 dev: pre-trained vs random init vs a transformers peer.

SQuAD 1.1 dev (48 articles) is split by article: the first ``--train-articles``
train, the rest evaluate (files written under ``--work``, never in the repo).
Both are prepared once with ``spanbert-prepare-qa`` and the demo's tokenizer
(``make demo``'s ``demo_out/data``), so the demo's pre-trained checkpoint applies.
Three set-ups, each over ``--seeds``, with one set of hyper-parameters:

* ``pretrained``: ``fairseq-train --task extractive_qa --finetune-from-model demo_out/checkpoints/checkpoint_last.pt``;
* ``random-init``: the same command without ``--finetune-from-model``;
* ``transformers``: the checkpoint exported with ``spanbert-export-hf`` and loaded with
  ``BertForQuestionAnswering.from_pretrained`` (``qa_outputs`` freshly initialised), trained
  in a plain PyTorch loop on the same prepared windows, batched by the same fairseq batch
  iterator (same seed, so the same batches in the same order), ``torch.optim.AdamW`` with
  the same betas, eps and decoupled weight decay (fairseq's ``adam`` decays every parameter
  the same way), gradients clipped at the same norm, and the learning rate set by fairseq's
  own ``polynomial_decay`` scheduler object, stepped as ``fairseq-train`` steps it. Its logits
  on the evaluation windows are scored by the plugin's ``postprocess`` and the official SQuAD
  metrics (``evaluation.squad.evaluate``), which is what fairseq's validation computes for the
  other two.

Results go to ``--results`` (default ``benchmarks/pretraining/qa_quality``): ``results.csv`` (one row per
set-up and seed, written after each run; finished rows are kept when the script is run again
with the same settings, and a folder of other settings is refused unless ``--fresh``),
``summary.md`` (mean and sample standard deviation per set-up), ``em_f1.png`` and
``commands.md`` (the exact commands that ran).

    .venv/bin/python benchmarks/pretraining/qa_quality.py [--seeds 1 2 3] [--max-update 600] [--setups pretrained random-init transformers]
"""
import argparse
import csv
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
from command_output import CommandLog, write_atomic  # noqa: E402
from results_file import unmarked_folder  # noqa: E402

BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
SQUAD_DEV = os.path.join(ROOT, "..", "shared", "data", "squad", "dev-v1.1.json")
SETUPS = ("pretrained", "random-init", "transformers")
FIELDS = ["setup", "seed", "em", "f1", "questions", "updates", "train_seconds"]


def split_by_article(source, train_articles, work):
    """Write the first ``train_articles`` articles to train.json and the rest to eval.json; return their paths."""
    with open(source, encoding="utf-8") as f:
        squad = json.load(f)
    paths = {}
    for name, articles in (("train", squad["data"][:train_articles]), ("eval", squad["data"][train_articles:])):
        paths[name] = os.path.join(work, f"{name}.json")
        write_atomic(paths[name], json.dumps({"version": squad["version"], "data": articles}, ensure_ascii=False))
    return paths


def finetune_args(args):
    """fairseq-train options shared by every set-up (the transformers loop reads the same ones)."""
    return ["--user-dir", os.path.join(ROOT, "user_dir"), "--task", "extractive_qa", "--criterion", "extractive_qa",
            "--arch", "spanbert_tiny", "--max-positions", str(args.max_seq_length), "--dropout", "0.1",
            "--attention-dropout", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-8",
            "--weight-decay", "0.01", "--clip-norm", "1.0", "--lr", str(args.lr), "--lr-scheduler", "polynomial_decay",
            "--warmup-updates", str(args.warmup_updates), "--total-num-update", str(args.max_update),
            "--max-update", str(args.max_update), "--batch-size", str(args.batch_size), "--cpu", "--num-workers", "0",
            "--validate-interval", "1000000", "--no-save", "--log-format", "json", "--log-interval", "50"]


def run_argv(prepared, setup, seed, args):
    """The command line of one run (transformers: this script, which trains it in-process)."""
    if setup == "transformers":
        return [sys.executable, os.path.relpath(os.path.abspath(__file__), ROOT), *sys.argv[1:]]
    argv = [os.path.join(BIN, "fairseq-train"), prepared, *finetune_args(args), "--seed", str(seed),
            "--save-dir", os.path.join(args.work, "checkpoints")]  # --no-save; not ./checkpoints, which fairseq resumes from
    if setup == "pretrained":
        argv += ["--finetune-from-model", os.path.abspath(args.checkpoint)]
    return argv


def fairseq_run(log, argv, setup, seed, env):
    """Fine-tune with fairseq-train; EM/F1 from the validation it runs after the last update."""
    start = time.perf_counter()
    output = log.run(argv, f"{setup}, seed {seed}", env)
    seconds = time.perf_counter() - start
    valid = [json.loads(line[line.index("{"):]) for line in output.splitlines() if "valid_f1" in line and "{" in line]
    if not valid:
        sys.exit(f"{setup}, seed {seed}: no validation line in fairseq-train's output:\n{output[-3000:]}")
    last = valid[-1]
    return {"em": float(last["valid_em"]), "f1": float(last["valid_f1"]), "updates": int(last["valid_num_updates"]),
            "train_seconds": round(seconds, 1)}


def _scheduler_view(optimizer):
    """A FairseqOptimizer over a torch optimizer, so that fairseq's lr schedulers can drive its learning rate."""
    from fairseq.optim import FairseqOptimizer

    view = FairseqOptimizer(None)
    view._optimizer = optimizer
    return view


def _fairseq_setup(prepared, seed, args):
    """(cfg, task) for ``finetune_args``, both splits loaded."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, [prepared, *finetune_args(args), "--seed", str(seed)]))
    task = tasks.setup_task(cfg.task)
    for split in ("train", "valid"):
        task.load_dataset(split, training=split == "train")
    return cfg, task


def _epoch_batches(task, cfg, epoch):
    """The training batches of ``epoch`` as fairseq-train draws them (Trainer.get_train_iterator, one worker)."""
    from fairseq import utils

    max_positions = utils.resolve_max_positions(task.max_positions(), cfg.model.max_positions)
    iterator = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size,
        max_positions=max_positions, ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
        num_workers=0, epoch=epoch, disable_iterator_cache=True,
    )
    return iterator.next_epoch_itr(shuffle=True)


def _hf_inputs(batch, pad, device="cpu"):
    net = batch["net_input"]
    return dict(input_ids=net["src_tokens"].to(device), token_type_ids=net["segment_labels"].to(device),
                attention_mask=net["src_tokens"].ne(pad).long().to(device))


def transformers_run(prepared, hf_dir, seed, args):
    """Fine-tune BertForQuestionAnswering in a plain PyTorch loop; score with postprocess + evaluate."""
    import torch
    from fairseq.optim.lr_scheduler import build_lr_scheduler
    from transformers import BertForQuestionAnswering

    torch.set_num_threads(args.threads)
    cfg, task = _fairseq_setup(prepared, seed, args)
    pad = task.source_dictionary.pad()
    torch.manual_seed(seed)  # the fresh qa_outputs and dropout
    model = BertForQuestionAnswering.from_pretrained(hf_dir)
    betas = tuple(float(x) for x in cfg.optimizer.adam_betas.strip("()").split(","))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimization.lr[0], betas=betas,
                                  eps=cfg.optimizer.adam_eps, weight_decay=cfg.optimizer.weight_decay)
    scheduler = build_lr_scheduler(cfg.lr_scheduler, _scheduler_view(optimizer))
    scheduler.step_update(0)  # as fairseq's Trainer does before the first update
    updates, epoch, start = 0, 1, time.perf_counter()
    model.train()
    while updates < cfg.optimization.max_update:
        for batch in _epoch_batches(task, cfg, epoch):
            loss = model(**_hf_inputs(batch, pad), start_positions=batch["start_positions"],
                         end_positions=batch["end_positions"]).loss  # (CE(start) + CE(end)) / 2, mean over windows
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimization.clip_norm)
            optimizer.step()
            optimizer.zero_grad()
            updates += 1
            scheduler.step_update(updates)
            if updates % 50 == 0:
                print(f"   transformers seed {seed}: update {updates}, loss {loss.item():.3f}", flush=True)
            if updates >= cfg.optimization.max_update:
                break
        epoch += 1
    seconds = time.perf_counter() - start
    scores = hf_qa_scores(model, task, pad)
    return {"em": scores["exact"], "f1": scores["f1"], "updates": updates, "train_seconds": round(seconds, 1)}


def hf_qa_scores(model, task, pad):
    """Official SQuAD scores of a transformers QA model on the task's prepared valid windows (the plugin's post-processing)."""
    import numpy as np
    import torch

    from spanbert_plugin.qa.postprocess import postprocess
    from spanbert_plugin.qa.squad_metrics import evaluate

    model.eval()
    device = next(model.parameters()).device
    valid, split = task.dataset("valid"), task.qa_split("valid")
    lowest = np.finfo(np.float32).min  # padding never wins, as in the criterion's qa_logits
    starts = np.full((len(valid), int(valid.sizes.max())), lowest, dtype=np.float32)
    ends = starts.copy()
    with torch.no_grad():
        for lo in range(0, len(valid), 128):
            batch = valid.collater([valid[i] for i in range(lo, min(lo + 128, len(valid)))])
            out = model(**_hf_inputs(batch, pad, device))
            padding = batch["net_input"]["src_tokens"].eq(pad)
            rows, width = batch["id"].numpy(), padding.size(1)
            starts[rows, :width] = out.start_logits.float().cpu().masked_fill(padding, lowest).numpy()
            ends[rows, :width] = out.end_logits.float().cpu().masked_fill(padding, lowest).numpy()
    result = postprocess(split, np.arange(len(valid)), starts, ends)
    scores = evaluate(split.questions, result.predictions)
    assert scores["missing"] == 0 and scores["total"] == split.num_questions
    return scores


def read_rows(path):
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_rows(path, rows):
    lines = [",".join(FIELDS)] + [",".join(str(row[k]) for k in FIELDS) for row in rows]
    write_atomic(path, "\n".join(lines) + "\n")


def summarize(rows, settings, results):
    """summary.md (mean, sample sd, per seed) and em_f1.png from the rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = ["| set-up | seeds | EM | F1 | F1 per seed | wall seconds per run (median) |", "| --- | --- | --- | --- | --- | --- |"]
    present = [s for s in SETUPS if any(r["setup"] == s for r in rows)]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, setup in enumerate(present):
        mine = sorted((r for r in rows if r["setup"] == setup), key=lambda r: int(r["seed"]))
        em, f1 = [float(r["em"]) for r in mine], [float(r["f1"]) for r in mine]

        def spread(values):
            return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"

        table.append(f"| {setup} | {len(mine)} | {spread(em)} | {spread(f1)} | {', '.join(f'{v:.2f}' for v in f1)} | "
                     f"{statistics.median(float(r['train_seconds']) for r in mine):.0f} |")
        for offset, values, colour, label in ((-0.18, em, "tab:blue", "EM"), (0.18, f1, "tab:orange", "F1")):
            ax.bar(i + offset, statistics.mean(values), width=0.34, color=colour, alpha=0.55, label=label if i == 0 else None)
            ax.scatter([i + offset] * len(values), values, color=colour, edgecolor="black", zorder=3, s=18)
    ax.set_xticks(range(len(present)), present)
    ax.set_ylabel("score on the held-out articles (%)")
    ax.set_title(f"SQuAD 1.1 dev by article: {settings['train_articles']} train / {settings['eval_articles']} eval articles, "
                 f"spanbert_tiny, {settings['max_update']} updates", fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(results, "em_f1.png"), dpi=120)
    plt.close(fig)
    settings_lines = [f"- `{k}`: {v}" for k, v in settings.items()]
    write_atomic(os.path.join(results, "summary.md"),
                 "Mean ± sample standard deviation over seeds (`results.csv` has every run). Wall seconds "
                 "(`train_seconds`) are the whole fairseq-train process for the fairseq set-ups (start-up, training, "
                 "the final validation) and only the training loop for transformers, on a shared machine: not a speed "
                 "comparison (see qa_step_time.py for that).\n\n" + "\n".join(table)
                 + "\n\nSettings:\n\n" + "\n".join(settings_lines) + "\n")
    print("\n".join(table))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/qa_quality", help="folder for the split files, prepared data and export")
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "pretraining", "qa_quality"), help="results folder")
    parser.add_argument("--checkpoint", default="demo_out/checkpoints/checkpoint_last.pt", help="pre-trained checkpoint")
    parser.add_argument("--tokenizer-from", default="demo_out/data", help="the checkpoint's data folder")
    parser.add_argument("--train-articles", type=int, default=38, help="first N dev articles train, the rest evaluate")
    parser.add_argument("--max-seq-length", type=int, default=128, help="tokens per window (the demo model has 128 positions)")
    parser.add_argument("--doc-stride", type=int, default=64, help="passage tokens between window starts")
    parser.add_argument("--max-query-length", type=int, default=32, help="question tokens kept")
    parser.add_argument("--batch-size", type=int, default=32, help="windows per update")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--max-update", type=int, default=600, help="updates per run")
    parser.add_argument("--warmup-updates", type=int, default=60, help="linear warm-up, then linear decay to 0")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds of every set-up")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=SETUPS, help="set-ups to run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (OMP_NUM_THREADS)")
    parser.add_argument("--fresh", action="store_true", help="discard the earlier results in --results")
    args = parser.parse_args()
    needed = [(SQUAD_DEV, "the shared SQuAD 1.1 dev set"), (os.path.join(args.tokenizer_from, "dict.txt"), "run `make demo` first")]
    uses_checkpoint = set(args.setups) & {"pretrained", "transformers"}
    if uses_checkpoint:
        needed.append((args.checkpoint, "run `make demo` first"))
    for path, what in needed:
        if not os.path.isfile(path):
            sys.exit(f"{path}: no such file ({what})")
    settings_path = os.path.join(args.results, "settings.json")
    foreign = unmarked_folder(args.results, "--results", ("settings.json",))
    if foreign:
        sys.exit(f"qa_quality: {foreign}")
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.results, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    log = CommandLog()

    files = split_by_article(SQUAD_DEV, args.train_articles, args.work)
    prepared = os.path.join(args.work, f"prepared_{args.max_seq_length}_{args.doc_stride}_{args.max_query_length}")
    log.run([os.path.join(BIN, "spanbert-prepare-qa"), "--train", files["train"], "--valid", files["eval"],
             "--tokenizer-from", args.tokenizer_from, "--destdir", prepared, "--max-seq-length", str(args.max_seq_length),
             "--doc-stride", str(args.doc_stride), "--max-query-length", str(args.max_query_length), "--force"],
            "prepare", env)
    hf_dir = os.path.join(args.work, "hf_export")
    if uses_checkpoint:
        log.run([os.path.join(BIN, "spanbert-export-hf"), "--checkpoint", args.checkpoint, "--out", hf_dir, "--force"],
                "export", env)
    with open(os.path.join(prepared, "prepare_stats.json")) as f:
        stats = json.load(f)
    settings = {"train_articles": args.train_articles, "eval_articles": 48 - args.train_articles,
                "train_questions": stats["train"]["questions"], "train_windows": stats["train"]["windows"],
                "eval_questions": stats["valid"]["questions"], "eval_windows": stats["valid"]["windows"],
                "max_seq_length": args.max_seq_length, "doc_stride": args.doc_stride,
                "max_query_length": args.max_query_length, "batch_size": args.batch_size, "lr": args.lr,
                "warmup_updates": args.warmup_updates, "max_update": args.max_update, "threads": args.threads,
                "checkpoint": args.checkpoint}
    csv_path = os.path.join(args.results, "results.csv")
    stored = None
    if os.path.isfile(settings_path):
        with open(settings_path, encoding="utf-8") as f:
            stored = json.load(f)
    same = stored == settings
    if stored is not None and not same and not args.fresh:  # its rows would be dropped: refused, nothing written
        differing = sorted(k for k in set(stored) | set(settings) if stored.get(k) != settings.get(k))
        sys.exit(f"qa_quality: --results {args.results}: holds results of other settings (they differ in "
                 f"{', '.join(differing)}); choose another --results, or pass --fresh to replace them")
    rows = read_rows(csv_path) if same and not args.fresh else []
    write_atomic(settings_path, json.dumps(settings, indent=2) + "\n")
    print(json.dumps(settings), flush=True)

    for seed in args.seeds:
        for setup in args.setups:
            argv = run_argv(prepared, setup, seed, args)
            if any(r["setup"] == setup and int(r["seed"]) == seed for r in rows):
                log.lines.append((f"{setup}, seed {seed} (result kept from an earlier run)", log.quote(argv)))
                continue
            if setup == "transformers":
                log.lines.append((f"transformers, seed {seed} (trained in this script's process)", log.quote(argv)))
                result = transformers_run(prepared, hf_dir, seed, args)
            else:
                result = fairseq_run(log, argv, setup, seed, env)
            rows.append({"setup": setup, "seed": seed, "questions": settings["eval_questions"], **result})
            print(f"   -> {setup} seed {seed}: EM {result['em']:.2f} F1 {result['f1']:.2f} "
                  f"({result['train_seconds']} s)", flush=True)
            write_rows(csv_path, rows)
            write_report(rows, settings, args, log)  # after every run: an interrupted experiment keeps its summary
    write_report(rows, settings, args, log)


def write_report(rows, settings, args, log):
    """summary.md, em_f1.png and commands.md of the rows so far."""
    if rows:
        summarize(rows, settings, args.results)
    commands = ["# Commands of the last `benchmarks/pretraining/qa_quality.py` run", "", "Run from the repository root; "
                f"`OMP_NUM_THREADS={args.threads}` for every command.", ""]
    for what, line in log.lines:
        commands += [f"{what}:", "", "```bash", line, "```", ""]
    write_atomic(os.path.join(args.results, "commands.md"), "\n".join(commands))


if __name__ == "__main__":
    main()
