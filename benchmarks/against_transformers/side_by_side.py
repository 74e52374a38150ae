#!/usr/bin/env python
"""Fine-tune a real pre-trained encoder (all-MiniLM-L6-v2) here and with transformers, side by side.

The same weights, data, hyper-parameters and seeds on every side:

* ``ours``: ``spanbert-import-hf`` of the fetched folder, then ``fairseq-train --arch spanbert_base
  --finetune-from-model imported/model.pt`` (shape from the checkpoint; fairseq batches by length);
* ``transformers``: ``BertForSequenceClassification`` / ``BertForQuestionAnswering`` loaded from the same
  folder, trained in a plain PyTorch loop that does what ``Trainer``'s defaults do (``transformers``' Trainer
  needs ``accelerate``, which is not installed here): a random permutation cut into batches of
  ``--batch-size``, each padded to its longest example (``DataCollatorWithPadding``), ``torch.optim.AdamW``
  with the same betas, eps and weight decay, gradients clipped at 1.0, and the learning rate set by the
  same linear warm-up/decay schedule (fairseq's ``polynomial_decay`` object, stepped as fairseq steps it).
  ``--group-by-length`` orders each random megabatch of 50 batches by length first, as
  ``Trainer(group_by_length=True)``'s ``LengthGroupedSampler`` does. Both read the examples ours prepared
  (same token ids, token types, labels and QA windows);
  with ``--bf16-autocast`` ours trains with the plugin's ``--bf16-autocast`` and the loop runs forward, loss and
  evaluation under ``torch.autocast(device, dtype=torch.bfloat16)`` with fp32 weights and no loss scaler, as
  ``Trainer(bf16=True)`` does (rows labelled ``... + bf16 autocast``, beside the fp32 rows of the same settings);
* ``random-init``: ours with the same shape (6 x 384, FFN 1536, 12 heads) from random initialisation.

Tasks: ``sst2`` and ``rte`` (GLUE dev accuracy; ``--train-size`` keeps the first N training rows), ``squad``
(SQuAD 1.1 dev split by article as benchmarks/pretraining/qa_quality.py does: the first ``--train-articles`` train,
the rest evaluate; EM/F1 with the official metrics). Per run: the dev score after every epoch, the
training time of every epoch (training steps only, no validation), and the achieved FLOP/s:
6 x non-embedding parameters per real (unpadded) token plus attention (12 x layers x hidden x length^2
per example), over the time, next to this machine's fp32 matmul peak on the same threads (a 2048 x 2048
``torch.mm``, best of 5).

    .venv/bin/python benchmarks/against_transformers/side_by_side.py --task sst2 --train-size 2000 --max-epoch 1 --seeds 1
    .venv/bin/python benchmarks/against_transformers/side_by_side.py --task sst2 --seeds 1 2 3          # full size: 67,349 rows x 3 epochs
    .venv/bin/python benchmarks/against_transformers/side_by_side.py --task squad --train-articles 38 --max-epoch 2
    python benchmarks/against_transformers/side_by_side.py --task squad --device cuda ...   # on a GPU (benchmarks/gpu/real_encoder.sh)
    .venv/bin/python benchmarks/against_transformers/side_by_side.py --task squad ... --report-only   # summary.md from runs.jsonl

Results (``--out``, default benchmarks/against_transformers/results/TASK): ``runs.jsonl`` (one line per run, appended
as runs finish; later seeds can be added by another invocation with the same settings), ``summary.md`` (mean
and sample sd per side over every run of these settings, wall-time ratios, FLOP/s), ``commands.md``, and
``score_tests.json`` / ``score_tests.md``: Welch's t-test (``scipy.stats.ttest_ind``, unequal variances) of the
last-epoch dev scores of each side of ours (``ours``, ``ours (torch_adamw)``, ``random-init``) against each
``transformers`` side of the same precision, both with at least two runs, per settings in ``runs.jsonl``, and
``score_tests.png``, those sides' scores by seed. ``--score-tests`` trains and prepares nothing: it writes those
three files from ``--out``'s ``runs.jsonl``:

    .venv/bin/python benchmarks/against_transformers/side_by_side.py --task sst2 --score-tests \
        --out benchmarks/against_transformers/results/sst2_full_1epoch
"""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.dirname(sys.executable)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
SIDES = ("ours", "transformers", "random-init")
GROUPED = "transformers (group_by_length)"  # the label of transformers rows run with --group-by-length
FUSED = "ours (torch_adamw)"  # the label of ours rows run with --optimizer torch_adamw
BF16 = " + bf16 autocast"  # appended to the label of rows run with --bf16-autocast
EQUIVALENCE_MARGIN = 0.5  # points of dev score: bf16 autocast and fp32 are called equal within it (TOST)


def _script(path, name):
    """A sibling benchmark script as a module (its helpers are reused, not copied)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch = _script(os.path.join(HERE, "fetch_minilm.py"), "fetch_minilm")
qa_quality = _script(os.path.join(ROOT, "benchmarks", "pretraining", "qa_quality.py"), "qa_quality")
sst2_experiment = _script(os.path.join(ROOT, "benchmarks", "pretraining", "sst2_experiment.py"), "sst2_experiment")
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
import results_file  # noqa: E402
from command_output import CommandLog, relative_to_root, save_figure_atomic, write_atomic  # noqa: E402
from paired_stats import paired_difference  # noqa: E402

GLUE_TASKS = {"sst2": "SST-2", "rte": "RTE"}


# ----------------------------------------------------------------------------- inputs
def imported_checkpoint(work, log):
    """The fetched folder and its spanbert-import-hf output (made once per --work)."""
    import spanbert_plugin.registry  # noqa: F401 - the tasks the import builds its model with
    from spanbert_plugin.hf.interop import import_hf

    folder = fetch.fetch_minilm()
    out = os.path.join(work, "imported")
    log.append(f"spanbert-import-hf --hf {folder} --out {out}")
    if not os.path.isfile(os.path.join(out, "model.pt")):
        report = import_hf(folder, out)
        for note in report.get("notes", []):
            print(f"   import: {note}", flush=True)
    return folder, out


def prepared_data(args, imported, log):
    """The prepared training/validation folder of the task (one per settings under --work)."""
    if args.task in GLUE_TASKS:
        return sst2_experiment.prepare_glue(args.work, GLUE_TASKS[args.task], imported, args.train_size,
                                            args.max_seq_length, log)
    folder = os.path.join(args.work, "data", f"squad_{args.train_articles}_{args.eval_articles or 'rest'}_"
                                             f"{args.max_seq_length}_{args.doc_stride}")
    if not os.path.isfile(os.path.join(folder, "qa_config.json")):
        os.makedirs(os.path.join(args.work, "data"), exist_ok=True)
        paths = qa_quality.split_by_article(os.path.join(SHARED, "squad", "dev-v1.1.json"), args.train_articles,
                                            os.path.join(args.work, "data"))
        if args.eval_articles:  # a smaller budget: only the first held-out articles evaluate
            with open(paths["eval"], encoding="utf-8") as f:
                held_out = json.load(f)
            held_out["data"] = held_out["data"][:args.eval_articles]
            write_atomic(paths["eval"], json.dumps(held_out, ensure_ascii=False))
        sst2_experiment.run_logged([os.path.join(BIN, "spanbert-prepare-qa"), "--train", paths["train"], "--valid",
                                    paths["eval"], "--tokenizer-from", imported, "--destdir", folder,
                                    "--max-seq-length", str(args.max_seq_length), "--doc-stride", str(args.doc_stride)],
                                   log)
    return folder


def task_options(args):
    if args.task in GLUE_TASKS:
        return ["--task", "sentence_classification", "--criterion", "sentence_classification",
                "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric"]
    return ["--task", "extractive_qa", "--criterion", "extractive_qa", "--best-checkpoint-metric", "f1",
            "--maximize-best-checkpoint-metric"]


def common_options(args, seed):
    """fairseq-train options of every side (the transformers loop reads the same ones); a schedule over
    ``args.updates_per_epoch`` x epochs, 10% warm-up."""
    total = args.max_epoch * args.updates_per_epoch
    return ["--user-dir", os.path.join(ROOT, "user_dir"), *task_options(args), "--arch", "spanbert_base",
            "--dropout", "0.1", "--attention-dropout", "0.1", "--optimizer", args.optimizer, "--adam-betas", "(0.9,0.999)",
            "--adam-eps", "1e-6", "--weight-decay", "0.01", "--clip-norm", "1.0", "--lr", str(args.lr),
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(max(1, round(total / 10))),
            "--total-num-update", str(total), "--max-epoch", str(args.max_epoch), "--batch-size", str(args.batch_size),
            "--seed", str(seed), *(["--cpu"] if args.device == "cpu" else []), "--num-workers", "0",
            "--log-format", "json", "--log-interval", "1000"]


RANDOM_INIT_SHAPE = ["--encoder-layers", "6", "--encoder-embed-dim", "384", "--encoder-ffn-embed-dim", "1536",
                     "--encoder-attention-heads", "12"]  # the imported encoder's


def train_argv(data, args, seed, side, imported, save_dir):
    """fairseq-train's command line for ``side``."""
    keep = args.keep_checkpoint and side == "ours"
    if keep and os.path.isfile(os.path.join(save_dir, "checkpoint_last.pt")):  # fairseq-train would resume from it
        sys.exit(f"{save_dir}: holds a checkpoint_last.pt already; --keep-checkpoint writes a fresh one (move it away)")
    saving = ["--no-epoch-checkpoints", "--no-save-optimizer-state"] if keep else ["--no-save"]
    argv = [os.path.join(BIN, "fairseq-train"), data, *common_options(args, seed), "--save-dir", save_dir, *saving]
    if args.bf16_autocast:
        argv.append("--bf16-autocast")
    if side == "random-init":
        return argv + RANDOM_INIT_SHAPE
    return argv + ["--finetune-from-model", os.path.join(imported, "model.pt")]


def fairseq_task(data, args, seed):
    """(cfg, task) of the common options, both splits loaded (the data and schedule; the model is not built)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [data, *common_options(args, seed), *RANDOM_INIT_SHAPE]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    for split in ("train", "valid"):
        task.load_dataset(split, training=split == "train")
    return cfg, task


# ----------------------------------------------------------------------------- cost
def flops_per_epoch(sizes, layers=6, hidden=384, ffn=1536):
    """Training FLOPs of one pass over examples of these real lengths: 6 x non-embedding parameters per token
    (forward 2, backward 4) plus attention scores and mixing (12 x layers x hidden x length^2 per example)."""
    import numpy as np

    per_layer = 4 * hidden * hidden + 2 * hidden * ffn + 9 * hidden + ffn  # Q, K, V, O, FFN and their biases, LNs
    lengths = np.asarray(sizes, dtype=np.float64)
    return 6 * layers * per_layer * lengths.sum() + 12 * layers * hidden * (lengths ** 2).sum()


def padding_lines(cfg, task, args):
    """Tokens computed in one training epoch, padding included, under each batching (no model needed):
    fairseq's length-ordered batches, Trainer's random batches and Trainer(group_by_length=True)'s."""
    import numpy as np
    import torch

    sizes = task.dataset("train").sizes
    real = int(sizes.sum())
    iterator = task.get_batch_iterator(dataset=task.dataset("train"), max_sentences=args.batch_size,
                                       required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
                                       seed=cfg.common.seed, epoch=1, disable_iterator_cache=True)
    batchings = {"ours (fairseq's batches)": [np.asarray(b) for b in iterator.frozen_batches]}
    for name, grouped in (("Trainer default (random batches)", False), ("Trainer(group_by_length=True)", True)):
        generator = torch.Generator().manual_seed(cfg.common.seed)
        batchings[name] = [np.asarray(b) for b in _trainer_batches(sizes, args.batch_size, generator, grouped)]
    lines = [f"Real tokens per training epoch: {real:,}."]
    for name, batches in batchings.items():
        computed = sum(len(b) * int(sizes[b].max()) for b in batches)
        lines.append(f"{name}: {computed:,} tokens computed with padding ({computed / real:.2f}x the real ones)")
    return lines


def matmul_peak(threads, device="cpu", n=2048, repeats=5):
    """fp32 FLOP/s of the best of ``repeats`` n x n torch matmuls on ``threads`` threads (on a GPU: 8192 x 8192)."""
    import torch

    torch.set_num_threads(threads)
    n = 8192 if device != "cpu" else n
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b), device) for _ in range(repeats))
    return 2 * n ** 3 / best


def _synchronize(device):
    """Wait for the GPU's queued work, so wall-clock times cover it (nothing to wait for on a CPU)."""
    import torch

    if device != "cpu":
        torch.cuda.synchronize(device)


def _timed(fn, device="cpu"):
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- the sides
def ours_run(data, args, seed, side, imported, log):
    """fairseq-train's dev score and training seconds per epoch (its train_wall is cumulative over the run)."""
    import numpy as np

    save_dir = os.path.join(args.work, "runs", f"{args.task}-{side}-{seed}{'-bf16' if args.bf16_autocast else ''}")
    argv = train_argv(data, args, seed, side, imported, save_dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    output = CommandLog().run(argv, f"{side}, seed {seed}", env)
    log.append(" ".join(argv))
    valid, train = sst2_experiment.epoch_stats(output, "valid"), sst2_experiment.epoch_stats(output, "train")
    metric = "valid_accuracy" if args.task in GLUE_TASKS else "valid_f1"
    epochs = sorted(valid)
    return {"score_per_epoch": [float(valid[e][metric]) for e in epochs],
            "em_per_epoch": [float(valid[e]["valid_em"]) for e in epochs] if args.task == "squad" else None,
            "epoch_seconds": [float(x) for x in np.diff([0.0] + [float(train[e]["train_wall"]) for e in sorted(train)])]}


def _trainer_batches(sizes, batch_size, generator, group_by_length):
    """Index batches as Trainer's samplers draw them: a random permutation cut into batches; with
    ``group_by_length``, megabatches of 50 batches each ordered by decreasing length first."""
    import torch

    order = torch.randperm(len(sizes), generator=generator).tolist()
    if group_by_length:
        mega = 50 * batch_size
        order = [i for lo in range(0, len(order), mega)
                 for i in sorted(order[lo:lo + mega], key=lambda i: -int(sizes[i]))]
    return [order[lo:lo + batch_size] for lo in range(0, len(order), batch_size)]


def transformers_run(data, args, seed, hf_dir):
    import torch
    from fairseq.optim.lr_scheduler import build_lr_scheduler
    from tqdm import tqdm
    from transformers import BertForQuestionAnswering, BertForSequenceClassification

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg, task = fairseq_task(data, args, seed)
    pad = task.source_dictionary.pad()
    train, valid = task.dataset("train"), task.dataset("valid")
    torch.manual_seed(seed)  # the fresh head and dropout
    if args.task in GLUE_TASKS:
        model = BertForSequenceClassification.from_pretrained(hf_dir, num_labels=task.num_classes)
    else:
        model = BertForQuestionAnswering.from_pretrained(hf_dir)
    model.to(device)
    betas = tuple(float(x) for x in cfg.optimizer.adam_betas.strip("()").split(","))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimization.lr[0], betas=betas,
                                  eps=cfg.optimizer.adam_eps, weight_decay=cfg.optimizer.weight_decay)
    scheduler = build_lr_scheduler(cfg.lr_scheduler, qa_quality._scheduler_view(optimizer))
    scheduler.step_update(0)
    generator = torch.Generator().manual_seed(seed)
    precision = _autocast(args, torch)
    updates, scores, ems, seconds = 0, [], [], []
    for _ in range(args.max_epoch):
        model.train()
        _synchronize(args.device)
        start = time.perf_counter()
        batches = _trainer_batches(train.sizes, args.batch_size, generator, args.group_by_length)
        for indices in tqdm(batches, desc=f"transformers seed {seed}, epoch {len(scores) + 1}", mininterval=30):
            batch = train.collater([train[i] for i in indices])
            inputs = qa_quality._hf_inputs(batch, pad, device)
            with precision():
                if args.task in GLUE_TASKS:
                    loss = model(**inputs, labels=batch["target"].to(device)).loss
                else:
                    loss = model(**inputs, start_positions=batch["start_positions"].to(device),
                                 end_positions=batch["end_positions"].to(device)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimization.clip_norm)
            optimizer.step()
            optimizer.zero_grad()
            updates += 1
            scheduler.step_update(updates)
        _synchronize(args.device)
        seconds.append(time.perf_counter() - start)
        with precision():  # Trainer(bf16=True) evaluates under autocast too
            score, em = _transformers_eval(model, task, valid, pad, args, torch)
        scores.append(score)
        ems.append(em)
        print(f"   transformers seed {seed}: epoch {len(scores)}, {seconds[-1]:.1f} s, dev {score:.2f}", flush=True)
    return {"score_per_epoch": scores, "em_per_epoch": ems if args.task == "squad" else None, "epoch_seconds": seconds}


def _autocast(args, torch):
    """The loop's precision context: bf16 autocast on the training device, or nothing (fp32)."""
    import contextlib

    if args.bf16_autocast:
        return lambda: torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def _transformers_eval(model, task, valid, pad, args, torch):
    """Dev accuracy (GLUE) or (F1, EM) with the plugin's post-processing and the official SQuAD metrics."""
    model.eval()
    device = next(model.parameters()).device
    batches = [list(range(lo, min(lo + 128, len(valid)))) for lo in range(0, len(valid), 128)]
    with torch.no_grad():
        if args.task in GLUE_TASKS:
            correct = 0
            for indices in batches:
                batch = valid.collater([valid[i] for i in indices])
                logits = model(**qa_quality._hf_inputs(batch, pad, device)).logits
                correct += int((logits.argmax(-1).cpu() == batch["target"]).sum())
            return 100.0 * correct / len(valid), None
        scores = qa_quality.hf_qa_scores(model, task, pad)
        return scores["f1"], scores["exact"]


# ----------------------------------------------------------------------------- report
def _mean_sd(values):
    return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)


def summary(rows, args, peak, flops):
    metric = "accuracy" if args.task in GLUE_TASKS else "F1"
    peak = max([r["peak_flops"] for r in rows if r.get("peak_flops")] or [peak])  # measured where the runs ran
    where = f"on {args.threads} thread(s)" if args.device == "cpu" else f"(8192 x 8192) on {args.device_name}"
    lines = [f"# {args.task}: all-MiniLM-L6-v2, ours vs transformers", "",
             f"Settings: {args.settings}", "",
             f"Peak: fp32 matmul {where}: {peak / 1e9:.1f} GFLOP/s. "
             f"Training FLOPs per epoch (real tokens): {flops / 1e12:.3f} TFLOP.", "",
             f"| side | runs | dev {metric} after the last epoch (mean ± sd) | seconds per epoch (mean) | "
             "GFLOP/s | share of peak |", "|---|---|---|---|---|---|"]
    seconds = {}
    for side in [label + precision for precision in ("", BF16) for label in (*SIDES, FUSED, GROUPED)]:
        runs = [r for r in rows if r["side"] == side]
        if not runs:
            continue
        mean, sd = _mean_sd([r["score_per_epoch"][-1] for r in runs])
        seconds[side] = statistics.mean(s for r in runs for s in r["epoch_seconds"])
        rate = flops / seconds[side]
        lines.append(f"| {side} | {len(runs)} | {mean:.2f} ± {sd:.2f} | {seconds[side]:.1f} | {rate / 1e9:.1f} | "
                     f"{100 * rate / peak:.0f}% |")
    for precision in ("", BF16):
        for ours in ("ours" + precision, FUSED + precision):
            for peer, batching in (("transformers", " (Trainer-default random batches)"), (GROUPED, "")):
                if ours in seconds and peer + precision in seconds:
                    lines += ["", f"Wall time per epoch, {ours} / {peer + precision}{batching}: "
                                  f"{seconds[ours] / seconds[peer + precision]:.2f}x"]
    for side in (*SIDES, FUSED, GROUPED):
        if side in seconds and side + BF16 in seconds:
            lines += ["", f"Wall time per epoch, {side + BF16} / {side} (fp32): {seconds[side + BF16] / seconds[side]:.2f}x"]
            lines += bf16_equivalence(rows, side, metric)
    return "\n".join(lines) + "\n"


def score_tests(rows, metric):
    """Welch's t-test of the last-epoch dev scores, ours' sides against the transformers sides of the same precision
    (unpaired: different sides of a seed share no draws), per settings; pairs with fewer than two runs a side are
    left out."""
    from scipy import stats

    tests = []
    for settings in dict.fromkeys(r["settings"] for r in rows):
        scores = {}
        for r in rows:
            if r["settings"] == settings:
                scores.setdefault(r["side"], []).append((r["seed"], r["score_per_epoch"][-1]))
        for ours in scores:
            for peer in scores:
                if (not ours.startswith(("ours", "random-init")) or not peer.startswith("transformers")
                        or ours.endswith(BF16) != peer.endswith(BF16) or min(len(scores[ours]), len(scores[peer])) < 2):
                    continue
                a, b = [v for _, v in scores[ours]], [v for _, v in scores[peer]]
                welch = stats.ttest_ind(a, b, equal_var=False)
                tests.append({"settings": settings, "metric": metric, "side": ours, "peer": peer,
                              "side_seeds": [s for s, _ in scores[ours]], "peer_seeds": [s for s, _ in scores[peer]],
                              "side_scores": a, "peer_scores": b, "side_mean": statistics.mean(a),
                              "peer_mean": statistics.mean(b), "difference": statistics.mean(a) - statistics.mean(b),
                              "welch_t": float(welch.statistic), "welch_df": float(welch.df), "p": float(welch.pvalue)})
    return tests


def write_score_tests(out, task):
    """score_tests.json and score_tests.md in ``out`` from its runs.jsonl (every settings in it)."""
    metric = "accuracy" if task in GLUE_TASKS else "F1"
    with open(os.path.join(out, "runs.jsonl"), encoding="utf-8") as f:
        tests = score_tests([json.loads(line) for line in f if line.strip()], metric)
    command = " ".join(["benchmarks/against_transformers/side_by_side.py", "--task", task, "--score-tests",
                        "--out", os.path.relpath(os.path.abspath(out), ROOT)])
    lines = [f"# Dev {metric}: ours against transformers, Welch's t-test", "",
             f"Written by `{command}` from `runs.jsonl` (the last epoch's dev score of each run; "
             "scipy.stats.ttest_ind with equal_var=False, two-sided).", ""]
    for settings in dict.fromkeys(t["settings"] for t in tests):
        lines += [f"Settings: {settings}", "", f"| side | peer | side {metric} (seeds) | peer {metric} (seeds) | "
                  "difference of means | Welch's t | df | p |", "|---|---|---|---|---|---|---|---|"]
        for t in (t for t in tests if t["settings"] == settings):
            listed = lambda values, seeds: " / ".join(f"{v:.2f}" for v in values) + f" ({', '.join(map(str, seeds))})"  # noqa: E731
            p = f"{t['p']:.2f}" if t["p"] >= 0.01 else f"{t['p']:.1e}"
            lines.append(f"| {t['side']} | {t['peer']} | {listed(t['side_scores'], t['side_seeds'])} | "
                         f"{listed(t['peer_scores'], t['peer_seeds'])} | {t['difference']:+.2f} | {t['welch_t']:.2f} | "
                         f"{t['welch_df']:.2f} | {p} |")
        lines.append("")
    if not tests:
        lines.append("No pair of sides with at least two runs each.")
    write_atomic(os.path.join(out, "score_tests.json"), json.dumps({"command": command, "tests": tests}, indent=1) + "\n")
    write_atomic(os.path.join(out, "score_tests.md"), "\n".join(lines).rstrip("\n") + "\n")
    if tests:
        plot_score_tests(tests, metric, os.path.join(out, "score_tests.png"))
    return tests


def plot_score_tests(tests, metric, path):
    """One panel per settings: each compared side's dev scores, one dot per seed, its mean a bar."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_settings = {}
    for t in tests:
        sides = by_settings.setdefault(t["settings"], {})
        sides[t["side"]], sides[t["peer"]] = t["side_scores"], t["peer_scores"]
    fig, axes = plt.subplots(len(by_settings), 1, figsize=(7.5, 2.4 * len(by_settings) + 0.4), squeeze=False)
    order = lambda side: (not side.startswith("ours"), side.startswith("random"), side)  # noqa: E731
    for ax, (settings, sides) in zip(axes[:, 0], by_settings.items()):
        sides = {side: sides[side] for side in sorted(sides, key=order)}  # ours, transformers, random initialisation
        for x, (side, scores) in enumerate(sides.items()):
            colour = "tab:blue" if side.startswith("ours") else "tab:gray" if side.startswith("random") else "tab:orange"
            ax.scatter([x] * len(scores), scores, color=colour, zorder=3)
            ax.hlines(statistics.mean(scores), x - 0.25, x + 0.25, color=colour)
            ax.annotate(f"{statistics.mean(scores):.2f}", (x + 0.27, statistics.mean(scores)), va="center", fontsize=8)
        ax.set_xticks(range(len(sides)), list(sides), fontsize=8)
        ax.set_xlim(-0.5, len(sides) - 0.2)
        ax.set_ylabel(f"dev {metric}", fontsize=8)
        ax.set_title(textwrap.fill(settings, 100), fontsize=7, loc="left")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure_atomic(fig, path)


def bf16_equivalence(rows, side, metric, margin=EQUIVALENCE_MARGIN):
    """bf16 autocast minus fp32 on the seeds both ran (same data order and initialisation): the paired mean, its
    95% interval, and a two-one-sided t-test (TOST) against +-``margin`` points: equal when both one-sided
    p-values are below 0.05 (the 90% interval lies inside the margin)."""
    last = {(r["side"], r["seed"]): r["score_per_epoch"][-1] for r in rows}
    seeds = sorted(seed for (name, seed) in last if name == side and (side + BF16, seed) in last)
    if len(seeds) < 2:
        return []
    differences = [last[(side + BF16, seed)] - last[(side, seed)] for seed in seeds]
    paired = paired_difference(differences, margin)
    mean, low, high = paired["mean"], paired["low"], paired["high"]
    if low == high:
        return ["", f"{side}: bf16 autocast - fp32, dev {metric}, seeds {seeds}: {mean:+.2f} on every seed"]
    verdict = "equal within" if paired["tost_p"] < 0.05 else "not shown equal within"
    return ["", f"{side}: bf16 autocast - fp32, dev {metric}, paired by seed {seeds}: "
                f"{', '.join(f'{d:+.2f}' for d in differences)}; mean {mean:+.2f} (95% interval {low:+.2f} to {high:+.2f}); "
                f"TOST against ±{margin}: p = {paired['tost_p']:.3f}, {verdict} ±{margin} points"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("sst2", "rte", "squad"), required=True)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--train-size", type=int, default=0, help="GLUE: first N training rows (0: all)")
    parser.add_argument("--train-articles", type=int, default=38, help="SQuAD: first N dev articles train, the rest evaluate")
    parser.add_argument("--eval-articles", type=int, default=0, help="SQuAD: evaluate on the first N held-out articles (0: all)")
    parser.add_argument("--max-epoch", type=int, default=None, help="epochs (default: 3 GLUE/SST-2, 10 RTE, 2 SQuAD)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-seq-length", type=int, default=None, help="default 128 (GLUE), 384 (SQuAD)")
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--group-by-length", action="store_true", help="transformers side: Trainer(group_by_length=True)")
    parser.add_argument("--padding-only", action="store_true",
                        help="print the tokens each batching computes per epoch (padding included) and stop")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on every side")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where every side trains (cuda: the first GPU; ours then runs fairseq-train without --cpu)")
    parser.add_argument("--optimizer", choices=("adam", "torch_adamw"), default="adam",
                        help="ours: fairseq's adam, or the plugin's fused torch_adamw (rows labelled 'ours (torch_adamw)')")
    parser.add_argument("--bf16-autocast", action="store_true",
                        help="every side trains under bf16 autocast (ours: --bf16-autocast; transformers: as Trainer(bf16=True))")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: rewrite summary.md from the runs.jsonl rows of these settings")
    parser.add_argument("--score-tests", action="store_true",
                        help="train and prepare nothing: write score_tests.json and score_tests.md (Welch's t-test of the "
                             "dev scores, ours against transformers) from --out's runs.jsonl")
    parser.add_argument("--keep-checkpoint", action="store_true",
                        help="ours: keep the fine-tuned model (WORK/runs/TASK-ours-SEED/checkpoint_last.pt), e.g. for qa_inference.py")
    parser.add_argument("--work", default="/tmp/real_encoder", help="scratch folder (imported model, data, runs)")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/against_transformers/results/TASK)")
    args = parser.parse_args()
    args.max_epoch = args.max_epoch or {"sst2": 3, "rte": 10, "squad": 2}[args.task]
    args.max_seq_length = args.max_seq_length or (384 if args.task == "squad" else 128)
    args.out = args.out or os.path.join(HERE, "results", args.task + ("_group_by_length" if args.group_by_length else ""))
    foreign = results_file.unmarked_folder(args.out, "--out", ("runs.jsonl",))  # its summary.md would be replaced
    if foreign:
        sys.exit(f"side_by_side: {foreign}")
    if args.score_tests:
        if not os.path.isfile(os.path.join(args.out, "runs.jsonl")):
            sys.exit(f"side_by_side: --score-tests: no runs.jsonl in --out {args.out}")
        tests = write_score_tests(args.out, args.task)
        print(open(os.path.join(args.out, "score_tests.md"), encoding="utf-8").read() if tests else
              f"side_by_side: {args.out}: no pair of sides with two runs each; score_tests.md says so")
        return
    squad = f", {args.train_articles} training articles, {args.eval_articles or 'all other'} evaluated"
    args.settings = (f"task {args.task}, train size {args.train_size or 'all'}{squad if args.task == 'squad' else ''}, "
                     f"{args.max_epoch} epoch(s), batch {args.batch_size}, lr {args.lr} (10% warm-up, linear decay), "
                     f"max_seq_length {args.max_seq_length}, {args.threads} thread(s)")
    args.device_name, base_settings = "CPU", args.settings
    if args.device == "cuda":
        import torch

        args.device_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "a GPU"
        args.settings += f", device cuda ({args.device_name})"
    log = []
    hf_dir, imported = imported_checkpoint(args.work, log)
    data = prepared_data(args, imported, log)
    args.updates_per_epoch = 1  # counted next, from fairseq's own batches
    cfg, task = fairseq_task(data, args, seed=1)
    args.updates_per_epoch = len(list(qa_quality._epoch_batches(task, cfg, 1)))
    flops = flops_per_epoch(task.dataset("train").sizes)
    padding = padding_lines(cfg, task, args)
    print("\n".join(padding), flush=True)
    if args.padding_only:
        return
    os.makedirs(args.out, exist_ok=True)
    peak = 0.0 if args.report_only else matmul_peak(args.threads, args.device)
    rows, noted = [], None  # noted: how many of log's commands commands.md has (None: not even this invocation yet)

    def note_commands():
        """commands.md gets this invocation (first) and each command as its run finishes, so that a stopped
        invocation's rows have their commands too."""
        nonlocal noted
        lines = ([" ".join(sys.argv)] if noted is None else []) + log[noted or 0:]
        with open(os.path.join(args.out, "commands.md"), "a", encoding="utf-8") as f:
            f.write("".join(f"    {relative_to_root(c)}\n" for c in lines))
        noted = len(log)

    for seed in ([] if args.report_only else args.seeds):
        for side in args.sides:
            if side == "transformers":
                result = transformers_run(data, args, seed, hf_dir)
            else:
                result = ours_run(data, args, seed, side, imported, log)
            label = GROUPED if side == "transformers" and args.group_by_length else side
            label = FUSED if side == "ours" and args.optimizer == "torch_adamw" else label
            label += BF16 if args.bf16_autocast else ""
            rows.append({"side": label, "seed": seed, "settings": args.settings, **result, "peak_flops": peak})
            with open(os.path.join(args.out, "runs.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps(rows[-1]) + "\n")
            note_commands()
            print(f"{side}, seed {seed}: {result}", flush=True)
    with open(os.path.join(args.out, "runs.jsonl"), encoding="utf-8") as f:  # earlier seeds of the same settings too
        rows = [row for row in map(json.loads, f) if row["settings"] == args.settings
                or (args.report_only and row["settings"].startswith(f"{base_settings}, device {args.device}"))]
    if not rows:
        sys.exit(f"{args.out}/runs.jsonl: no runs of these settings ({args.settings})")
    if args.device == "cuda":  # the GPU the rows ran on (a report may be written on another machine)
        args.device_name = rows[-1]["settings"].rsplit("(", 1)[-1].rstrip(")")
    text = summary(rows, args, peak, flops) + "\n" + "\n".join(f"- {line}" for line in padding) + "\n"
    write_atomic(os.path.join(args.out, "summary.md"), text)
    write_score_tests(args.out, args.task)
    if noted is not None:  # every invocation's commands, so sides run apart (or at once) are all listed
        with open(os.path.join(args.out, "commands.md"), "a", encoding="utf-8") as f:
            f.write("\n")
    print(text)


if __name__ == "__main__":
    main()
