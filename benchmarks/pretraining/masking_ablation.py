#!/usr/bin/env python
"""The SpanBERT paper's masking ablation (Tables 6 and 7) as one command.

Pre-trains the same architecture with the same budget under each masking scheme, then
fine-tunes every pre-trained model on four tasks, over several seeds, and prints (and plots)
the table: rows are schemes, columns tasks, cells mean ± sample sd over the seeds.

Schemes (``--schemes``): ``subword`` (BERT), ``word`` (whole words), ``named_entity``,
``noun_phrase`` (spaCy spans, half the draws), ``span`` (geometric spans) — all without the
span boundary objective, as in Table 6 — and ``span+sbo`` (Table 7's SpanBERT); ``none`` adds the
baseline row without pre-training (the imported encoder as it is with ``--from-model``, random
initialisation otherwise). Tasks
(``--tasks``): ``squad`` (SQuAD 1.1 dev split by article, as ``benchmarks/pretraining/qa_quality.py``: F1),
``sst2`` (GLUE SST-2, accuracy on dev), ``tacred`` (TACRED-style JSON, by default the sample in
``../shared/data/tacred_sample``, or SemEval/TACRED files via ``--re-data``: F1) and ``coref``
(LitBank, fold ``--fold``: CoNLL F1).

Pre-training text: LitBank's novels (``../shared/data/litbank/novels``) except those whose
excerpts are in the coreference evaluation fold (dev and test lists of ``--fold``; the files share
the numeric prefix), prepared once with ``spanbert-prepare --join-wrapped-lines --annotate spacy``
(needs ``pip install -e .[linguistic]``) and the BERT uncased WordPiece vocabulary, so every
scheme reads the same blocks.

Settings:

* ``--setting cpu``: ``spanbert_tiny``, 128-token blocks, a few hundred updates per scheme and per
  fine-tuning run (minutes each on a laptop CPU);
* ``--setting gpu``: a ``spanbert_base``-sized model, 512-token blocks, 20k pre-training updates of
  256 blocks (``--update-freq``), fine-tuning as the paper's recipes at small scale; run it where a GPU is;
* ``--from-model DIR``: continued pre-training of an imported encoder (a ``spanbert-import-hf``
  folder: ``model.pt`` and its ``vocab.txt``) under each scheme, then the same fine-tuning — the
  cheapest setting where the schemes can differ measurably. The corpus is then prepared with that
  folder's vocabulary, the model's size is the imported one, and the learning rates are 1e-4
  (continued pre-training) and 5e-5 (fine-tuning) unless given. ``--freeze-encoder-updates N``
  trains the fresh MLM/SBO heads alone first; the experiment keeps its first invocation's N and lr, and an
  invocation with another N adds arms ``SCHEME_freezeN`` (their own pre-training), paired with the scheme's rows to measure
  whether the heads' warm-up matters, and another ``--pretrain-lr`` (e.g. each scheme's choice on the lr grid) arms
  ``SCHEME_lrX``, paired with the scheme's rows and with each other; ``--heldout-mlm`` adds, per scheme that trained an MLM
  head, the masked-token loss on text of the novels of the fold's **test** documents (``--heldout-chars``
  from the middle of each), every scheme under the same subword masks (task ``heldout_mlm``, bits per
  masked token; lower is better). ``--lr-grid LR [LR ...]`` chooses the pre-training lr on validation loss
  instead of running the experiment: each scheme at each peak lr on the experiment's schedule, stopped after
  ``--lr-grid-updates``, scored under its own objective on the validation split (training novels that
  ``spanbert-prepare`` held out); ``lr_grid.csv``, ``lr_grid.png``, ``lr_grid_commands.md``. An arm pre-trained
  at a grid point's lr starts from that point's run where its configuration is the same but for where it stops
  (its first updates; fairseq-train resumes it).

Coreference (``coref``) is LitBank as it is scored (singletons kept, ``benchmarks/coreference/coref_litbank.py``):
the ``litbank`` recipe with ``--coref-epochs``, ``--coref-ffnn-size`` and ``--coref-head-lr``, the
checkpoint with the best dev CoNLL F1, its score on the fold's test documents. ``--bf16-autocast``
runs every pre-training and fine-tuning under bfloat16 autocast; an arm run in both precisions gets one row per
precision in the table, and arms are compared within one precision where both ran in it.

``--device cuda`` runs any setting on a GPU (``benchmarks/gpu/continued_pretraining.sh`` runs the --from-model
experiment there, its invocations side by side): pre-training and the SQuAD/SST-2/TACRED fine-tuning under fairseq's
``--fp16`` unless ``--bf16-autocast``, LitBank fine-tuning in fp32; its rows are labelled ``fp16``.

Every budget can be overridden (``--pretrain-updates``, ``--finetune-updates``, ``--novels``,
``--seeds`` …). Results: ``--results`` (default ``benchmarks/pretraining/masking_ablation``): ``results.csv``
(columns ``arm,task,seed,score,metric``: one row per scheme, task and seed, kept across runs with the
same settings), ``table.md``, ``table.png`` and ``commands.md``. A ``--results`` folder holding another
experiment (other settings) is refused before anything is written to it (``--fresh`` replaces its results), and
so is a folder of files this script did not write. An arm's rows are one encoder's: where an arm is pre-trained again
(its --work gone) and its loss curve differs from the one recorded in ``pretrain_curves.csv`` (another machine's
kernels or a code change draw other numbers), its scores are not added to the earlier encoder's; ``--retire ARM``
moves the earlier rows to ``retired.csv`` (and their LitBank records to ``coref_runs/retired/``) so the new encoder
is scored afresh.

The continued-pre-training experiment (all-MiniLM-L6-v2 on fold 0's training novels, LitBank with 3
seeds, a SQuAD split with 2, held-out MLM loss):

    .venv/bin/python benchmarks/pretraining/masking_ablation.py --from-model imported --novels 0 \
        --schemes none subword span span+sbo --tasks coref squad --seeds 1 2 3 --heldout-mlm \
        --pretrain-updates 2000 --bf16-autocast --results benchmarks/pretraining/continued_pretraining

    .venv/bin/python benchmarks/pretraining/masking_ablation.py --setting cpu [--seeds 1 2 3] [--novels 20]
    .venv/bin/python benchmarks/pretraining/masking_ablation.py --setting cpu --smoke --results /tmp/smoke   # the plumbing only
"""
import argparse
import csv
import hashlib
import json
import os
import re
import statistics
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # qa_quality beside it
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "coreference"))  # coref_litbank: the LitBank runs
from command_output import CommandLog, train_progress, write_atomic  # noqa: E402
from qa_quality import split_by_article  # noqa: E402
from results_file import unmarked_folder  # noqa: E402

BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
SHARED = os.environ.get("SPANBERT_SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")
LITBANK = os.path.join(SHARED, "litbank")
BERT_VOCAB = os.path.join(SHARED, "bert_uncased_vocab", "vocab.txt")
SCHEMES = {  # name: (--mask-scheme, --sbo-weight)
    "subword": ("subword", 0.0),
    "word": ("word", 0.0),
    "named_entity": ("named_entity", 0.0),
    "noun_phrase": ("noun_phrase", 0.0),
    "span": ("span", 0.0),
    "span+sbo": ("span", 1.0),
}
NO_PRETRAINING = "none"  # the baseline row: the imported encoder as it is (--from-model), else random initialisation
TASKS = {"squad": "f1", "sst2": "accuracy", "tacred": "f1", "coref": "conll_f1"}
SETTINGS = {
    "cpu": dict(arch="spanbert_tiny", tokens=128, pretrain_updates=600, batch=16, update_freq=1, pretrain_lr=1e-3,
                finetune_updates=300, finetune_lr=1e-3, finetune_batch=16, novels=20, cpu=True),
    "gpu": dict(arch="spanbert_base", tokens=512, pretrain_updates=20000, batch=32, update_freq=8, pretrain_lr=5e-4,
                finetune_updates=2000, finetune_lr=3e-5, finetune_batch=32, novels=0, cpu=False),
}
# precision: "bf16_autocast" or "fp32", the run's pre-training and fine-tuning (a per-run choice: a CPU without native
# bfloat16 trains several times faster in fp32); "fp16" on a GPU without --bf16-autocast, where pre-training and the
# SQuAD/SST-2/TACRED fine-tuning run under fairseq's --fp16 (LitBank fine-tuning stays fp32); empty in files
# written before the column
FIELDS = ["arm", "task", "seed", "score", "metric", "precision"]
HELDOUT = "heldout_mlm"  # the masked-token loss on the fold's test novels (--heldout-mlm)
DEV_THRESHOLD = "_dev_threshold"  # LitBank rows scored at the singleton threshold chosen on dev (--singleton-thresholds)
# coreference's rows are named by their LitBank fold (litbank_fold0); the order is the table's
METRIC_OF = {**{f"litbank_fold{fold}{kind}": "conll_f1" for fold in range(10) for kind in ("", DEV_THRESHOLD)},
             **TASKS, HELDOUT: "mlm_bits"}


def result_task(task, fold):
    """The ``task`` column of results.csv: coreference is named by its LitBank fold (``litbank_fold0``)."""
    return f"litbank_fold{fold}" if task == "coref" else task


def read_rows(path):
    """results.csv rows in FIELDS' names (files written before the rename said scheme and value)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [{"arm": r.get("arm", r.get("scheme")), "task": r["task"], "seed": r["seed"],
             "score": r.get("score", r.get("value")), "metric": r["metric"], "precision": r.get("precision") or ""}
            for r in rows]


def write_csv_atomic(path, fieldnames, rows):
    """``rows`` (dicts) as a CSV file with a header, replacing ``path`` whole."""
    with open(path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(path + ".tmp", path)


FREEZE_VARIANT = "_freeze"  # an arm pre-trained with another --freeze-encoder-updates: SCHEME_freezeN
LR_VARIANT = "_lr"  # an arm pre-trained at another peak lr (--pretrain-lr): SCHEME_lrX
VARIANT_SETTINGS = ("freeze_encoder_updates", "pretrain_lr")  # kept from the experiment's first invocation


def variant_arm(scheme, cfg, experiment):
    """The arm a scheme's runs are recorded under: the scheme at the experiment's --freeze-encoder-updates and
    --pretrain-lr (its first invocation's); at another N or lr its own pre-training, ``SCHEME_freezeN``,
    ``SCHEME_lrX`` or both, paired with the scheme's rows."""
    if scheme == NO_PRETRAINING:
        return scheme
    arm = scheme
    if cfg.get("freeze_encoder_updates") != experiment.get("freeze_encoder_updates"):
        arm += f"{FREEZE_VARIANT}{cfg['freeze_encoder_updates']}"
    if cfg.get("pretrain_lr") != experiment.get("pretrain_lr"):
        arm += f"{LR_VARIANT}{cfg['pretrain_lr']:g}"
    return arm


def experiment_settings(stored, settings):
    """This invocation's settings with the stored experiment's pre-training variant settings (another
    --freeze-encoder-updates or --pretrain-lr adds variant arms to the experiment instead of starting another)."""
    if stored is None:
        return settings
    return {**settings, **{k: stored[k] for k in VARIANT_SETTINGS if k in stored and k in settings}}


def scheme_of(arm):
    """The masking scheme of an arm (``span+sbo_freeze0`` and ``span+sbo_lr0.0004`` -> ``span+sbo``)."""
    return arm.split(FREEZE_VARIANT)[0].split(LR_VARIANT)[0]


# span+sbo against subword (SpanBERT against BERT's masking), against span (the SBO's own effect: the paper's +2.7
# coreference F1), span against subword (span masking's own effect), word against subword (whole-word masking's, as
# BERT-wwm) and span against word (random spans against whole words, the paper's Table 6 rows)
SCHEME_PAIRS = (("span+sbo", "subword"), ("span+sbo", "span"), ("span", "subword"), ("word", "subword"),
                ("span", "word"))


def is_lr_variant(arm):
    """An arm pre-trained at another peak lr only (same --freeze-encoder-updates as the experiment)."""
    return LR_VARIANT in arm and FREEZE_VARIANT not in arm


def precision_of(cfg):
    """The ``precision`` column of this invocation's runs."""
    return "bf16_autocast" if cfg["bf16_autocast"] else "fp32" if cfg["cpu"] else "fp16"


def coref_record_name(arm, seed, precision):
    """A LitBank run's record in the results folder: ``coref_runs/ARM_seedS_PRECISION.json``."""
    return os.path.join("coref_runs", f"{arm}_seed{seed}_{precision or 'not_recorded'}.json")


TASK_OWN_SETTINGS = ("coref_epochs", "coref_ffnn_size", "coref_head_lr", "coref_encoder_lr")


def same_settings(stored, current):
    """The same experiment: equal settings, a task's own (coreference's) compared only where both invocations ran it."""
    def shared(settings, other):
        return {k: v for k, v in settings.items() if k not in TASK_OWN_SETTINGS or k in other}

    return shared(stored, current) == shared(current, stored)


def differing_settings(stored, current):
    """The settings two invocations disagree on (those ``same_settings`` compares), sorted."""
    keys = {k for k in set(stored) | set(current) if k not in TASK_OWN_SETTINGS or (k in stored and k in current)}
    return sorted(k for k in keys if stored.get(k) != current.get(k))


def run_key(row):
    """What identifies a run in results.csv: arm, task, seed and precision."""
    return row["arm"], row["task"], int(row["seed"]), row["precision"]


def eval_fold_prefixes(fold):
    """Numeric prefixes of the novels whose excerpts are in the fold's dev and test lists."""
    prefixes = set()
    for split in ("dev", "test"):
        with open(os.path.join(LITBANK, "splits", f"fold{fold}", f"{split}.txt")) as f:
            prefixes |= {os.path.basename(line).split("_", 1)[0] for line in f if line.strip()}
    return prefixes


def test_novels(fold):
    """The novels whose excerpts are the fold's test documents (held-out text for the MLM loss)."""
    with open(os.path.join(LITBANK, "splits", f"fold{fold}", "test.txt")) as f:
        prefixes = {os.path.basename(line).split("_", 1)[0] for line in f if line.strip()}
    return sorted(os.path.join(LITBANK, "novels", n) for n in os.listdir(os.path.join(LITBANK, "novels"))
                  if n.split("_", 1)[0] in prefixes)


def heldout_text(fold, chars, folder):
    """Files of ``chars`` characters from the middle of each of the fold's test novels (whole paragraphs; the
    middle, away from the Project Gutenberg header and front matter), written once into ``folder``."""
    import gzip

    os.makedirs(folder, exist_ok=True)
    paths = []
    for novel in test_novels(fold):
        path = os.path.join(folder, os.path.basename(novel).replace(".gz", ""))
        if not os.path.isfile(path):
            with gzip.open(novel, "rt", encoding="utf-8") as f:
                text = f.read()
            start = text.find("\n\n", len(text) // 2) + 2
            end = text.rfind("\n\n", start, start + chars)
            write_atomic(path, text[start:end if end > start else start + chars].strip() + "\n")
        paths.append(path)
    return paths


def check_flags(args):
    """One line and exit 1 for values that would fail only after minutes of work: before any of it."""
    if not os.path.isfile(os.path.join(LITBANK, "splits", f"fold{args.fold}", "test.txt")):
        sys.exit(f"masking_ablation: --fold {args.fold}: no such LitBank fold in {LITBANK}/splits (LitBank has 0-9)")
    for flag, values in (("--seeds", args.seeds), ("--pretrain-seed", [args.pretrain_seed])):
        if any(seed < 0 for seed in values):
            sys.exit(f"masking_ablation: {flag} {' '.join(map(str, values))}: seeds are whole numbers >= 0")
    for flag in ("novels", "pretrain_updates", "finetune_updates", "freeze_encoder_updates"):
        value = getattr(args, flag)
        least = 0 if flag in ("novels", "freeze_encoder_updates") else 1
        if value is not None and value < least:
            sys.exit(f"masking_ablation: --{flag.replace('_', '-')} {value}: expected at least {least}")
    if args.from_model and not os.path.isfile(os.path.join(args.from_model, "model.pt")):
        sys.exit(f"masking_ablation: --from-model {args.from_model}: no model.pt (expected a spanbert-import-hf folder)")


def corpus_inputs(novels, vocab, annotate, from_model=None):
    """What a prepared pre-training corpus was made from, and for which encoder: --work (its corpus and the
    encoders pre-trained on it) is reused only for the same."""
    with open(vocab, "rb") as f:
        vocab_sha256 = hashlib.sha256(f.read()).hexdigest()
    return {"novels": [os.path.basename(n) for n in novels], "vocab_sha256": vocab_sha256, "annotated": annotate,
            "from_model": os.path.abspath(from_model) if from_model else None}


def pretraining_novels(fold, limit):
    """The novels pre-training may read: all but the evaluation fold's; the first ``limit`` (0: all) by name."""
    held = eval_fold_prefixes(fold)
    names = sorted(n for n in os.listdir(os.path.join(LITBANK, "novels")) if n.split("_", 1)[0] not in held)
    return [os.path.join(LITBANK, "novels", n) for n in (names[:limit] if limit else names)], held


def last_valid(output, metric):
    """The last validation value of ``metric`` in fairseq-train's json log."""
    values = [json.loads(line[line.index("{"):]) for line in output.splitlines() if f'"valid_{metric}"' in line]
    if not values:
        sys.exit(f"no valid_{metric} in fairseq-train's output:\n{output[-3000:]}")
    return float(values[-1][f"valid_{metric}"])


def common_train_args(cfg, updates, lr, batch, seed, stop_at=None, log_interval=50):
    """The schedule of an ``updates``-long run (10% warm-up, linear decay), stopped at ``stop_at`` when given."""
    return ["--user-dir", os.path.join(ROOT, "user_dir"), "--optimizer", "adam", "--adam-betas", "(0.9,0.999)",
            "--adam-eps", "1e-8", "--weight-decay", "0.01", "--clip-norm", "1.0", "--lr", str(lr),
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", str(max(1, updates // 10)),
            "--total-num-update", str(updates), "--max-update", str(stop_at or updates), "--batch-size", str(batch),
            "--seed", str(seed), "--num-workers", "0", "--log-format", "json", "--log-interval", str(log_interval),
            *(["--cpu"] if cfg["cpu"] else [] if cfg.get("bf16_autocast") else ["--fp16"]),
            *(["--bf16-autocast"] if cfg.get("bf16_autocast") else [])]


def model_args(args, cfg):
    """The architecture: the setting's, or with --from-model the imported encoder's (--from-model-arch)."""
    return ["--arch", args.from_model_arch if args.from_model else cfg["arch"]]


def pretrain(log, args, cfg, data, scheme, env, lr=None, stop_at=None, save_dir=None):
    """Pre-train (or continue pre-training) under ``scheme``; return the checkpoint. ``lr``, ``stop_at`` and
    ``save_dir`` (the lr grid's runs): another peak lr, the same schedule stopped after ``stop_at`` updates."""
    if scheme == NO_PRETRAINING:
        return os.path.join(os.path.abspath(args.from_model), "model.pt") if args.from_model else None
    mask_scheme, sbo_weight = SCHEMES[scheme]
    save_dir = save_dir or os.path.join(args.work, "pretrain", scheme)
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    finished = checkpoint + ".done"  # a stopped run is started again with the same command: fairseq resumes it
    if os.path.isfile(finished) and not args.fresh:
        return checkpoint
    os.makedirs(save_dir, exist_ok=True)
    argv = [os.path.join(BIN, "fairseq-train"), data, "--task", "spanbert_pretraining", "--criterion", "span_bert",
            *model_args(args, cfg), "--tokens-per-sample", str(cfg["tokens"]), "--mask-scheme", mask_scheme,
            "--sbo-weight", str(sbo_weight), "--update-freq", str(cfg["update_freq"]), "--save-dir", save_dir,
            "--no-epoch-checkpoints", "--save-interval-updates", str(max(1, min(250, stop_at or cfg["pretrain_updates"]))),
            "--keep-interval-updates", "1", "--disable-validation",
            *common_train_args(cfg, cfg["pretrain_updates"], cfg["pretrain_lr"] if lr is None else lr, cfg["batch"],
                               args.pretrain_seed, stop_at=stop_at)]
    if args.from_model:
        argv += ["--finetune-from-model", os.path.join(os.path.abspath(args.from_model), "model.pt"),
                 "--freeze-encoder-updates", str(args.freeze_encoder_updates)]
        if args.freeze_encoder_updates and "--fp16" in argv:  # fairseq's flat fp32 copy cannot leave weights out
            argv.append("--fp16-no-flatten-grads")
    what = (f"pre-train {os.path.basename(save_dir)}" if lr is None  # the arm: the scheme, or a variant of it
            else f"pre-train {scheme}, peak lr {lr:g}, {stop_at} updates")
    if lr is None and not os.path.isfile(checkpoint) and not args.fresh:
        start_from_lr_grid(log, args, cfg, scheme, save_dir, argv)
    log.run(argv, what, env, log_path=os.path.join(save_dir, "train.log"),
            progress=train_progress(stop_at or cfg["pretrain_updates"]))
    open(finished, "w").close()
    return checkpoint


# where a grid run's configuration may differ from that of the full run whose first updates it is
GRID_PREFIX_DIFFERENCES = {("checkpoint", "save_dir"), ("checkpoint", "save_interval_updates"),
                           ("optimization", "max_update")}


def fairseq_train_config(argv):
    """{(section, key): value} of the configuration fairseq-train builds from ``argv`` (its options, no program)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    namespace = options.parse_args_and_arch(options.get_training_parser(), argv)
    return flat_config(OmegaConf.to_container(convert_namespace_to_omegaconf(namespace)))


def flat_config(config):
    """{(section, key): value}; the model section by its architecture only (the imported encoder's sizes are written
    into a checkpoint's model section when it loads, and the architecture and --finetune-from-model fix them)."""
    return {(section, key): value for section, values in config.items() if isinstance(values, dict)
            for key, value in values.items() if section != "model" or key == "_name"}


def lr_grid_dir(args, cfg, scheme, lr, updates):
    """The folder of a grid run: the scheme at peak ``lr`` on the experiment's schedule, stopped after ``updates``
    (a glob pattern for ``updates="*"``)."""
    return os.path.join(args.work, "pretrain_lr_grid",
                        f"{scheme}_lr{lr:g}_{updates}of{cfg['pretrain_updates']}_{precision_of(cfg)}")


def start_from_lr_grid(log, args, cfg, scheme, save_dir, argv):
    """Start a pre-training from the lr grid's longest finished run of the same configuration (the same command but
    for where it stops and saves: its updates are this run's first ones, so its checkpoint and log are copied into
    ``save_dir`` and fairseq-train resumes from them, as from its own stopped run)."""
    import glob
    import shutil

    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    grids = [folder for folder in glob.glob(lr_grid_dir(args, cfg, scheme, cfg["pretrain_lr"], "*"))
             if os.path.isfile(os.path.join(folder, "checkpoint_last.pt.done"))]
    if not grids:
        return
    wanted = fairseq_train_config(argv[1:])
    best, best_updates = None, 0
    for folder in grids:
        state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(folder, "checkpoint_last.pt"))
        grid = flat_config(OmegaConf.to_container(state["cfg"]))  # fairseq loads it as a DictConfig
        updates = state["optimizer_history"][-1]["num_updates"]
        same = all(grid.get(k) == wanted.get(k) for k in set(grid) | set(wanted) if k not in GRID_PREFIX_DIFFERENCES)
        if same and best_updates < updates < cfg["pretrain_updates"]:
            best, best_updates = folder, updates
    if best is None:
        return
    os.makedirs(save_dir, exist_ok=True)
    for name in ("checkpoint_last.pt", "train.log"):  # whole files only: a stopped copy leaves no checkpoint_last.pt
        shutil.copyfile(os.path.join(best, name), os.path.join(save_dir, name + ".tmp"))
        os.replace(os.path.join(save_dir, name + ".tmp"), os.path.join(save_dir, name))
    log.lines.append((f"start {os.path.basename(save_dir)} from the lr grid's run of its configuration "
                      f"({best_updates} updates)", f"cp {best}/checkpoint_last.pt {best}/train.log {save_dir}/"))
    print(f"== {log.lines[-1][0]}: {log.lines[-1][1]}", flush=True)


def validate(log, args, cfg, corpus, subset, checkpoint, overrides, what, env):
    """fairseq-validate of ``checkpoint`` on ``subset`` of ``corpus``; the last logged record. fairseq-validate builds
    task and criterion from the checkpoint's config: ``overrides`` fix the text, the masks (seed 1), the block
    length and fp32, so that runs are scored alike."""
    overrides = {"data": corpus, "seed": 1, "tokens_per_sample": cfg["tokens"], "bf16_autocast": False,
                 "freeze_encoder_updates": 0, **overrides}
    output = log.run([os.path.join(BIN, "fairseq-validate"), corpus, "--task", "spanbert_pretraining", "--path",
                      checkpoint, "--user-dir", os.path.join(ROOT, "user_dir"), "--valid-subset", subset,
                      "--batch-size", str(cfg["batch"]), "--num-workers", "0", *(["--cpu"] if cfg["cpu"] else []),
                      "--log-format", "json", "--model-overrides", repr(overrides)], what, env)
    values = [json.loads(line[line.index("{"):]) for line in output.splitlines() if "mlm_loss" in line and "{" in line]
    if not values:
        sys.exit(f"no mlm_loss in fairseq-validate's output:\n{output[-3000:]}")
    return {key.split("_", 1)[1] if key.startswith(f"{subset}_") else key: value for key, value in values[-1].items()}


def heldout_mlm_bits(log, args, cfg, heldout, checkpoint, env):
    """Masked-token loss (bits per masked token) of ``checkpoint`` on the held-out corpus, subword masks of seed 1,
    the MLM loss alone, for every scheme."""
    record = validate(log, args, cfg, heldout, "train", checkpoint, {"mask_scheme": "subword", "sbo_weight": 0.0},
                      f"held-out MLM loss of {os.path.basename(os.path.dirname(checkpoint))}", env)
    return float(record["mlm_loss"])


LR_GRID_FIELDS = ["arm", "lr", "updates", "schedule_updates", "valid_loss", "valid_mlm_loss", "precision"]


def lr_grid(log, args, cfg, data, env):
    """--lr-grid: each pre-trained scheme at each peak lr, on the experiment's schedule (--pretrain-updates long, 10%
    warm-up) stopped after --lr-grid-updates; scored on the pre-training corpus' validation split (whole training
    novels that spanbert-prepare held out) under the scheme's own objective, masks of seed 1. Rows go to lr_grid.csv
    (kept across invocations; several may run side by side, one scheme each), with the commands in
    lr_grid_commands.md; lr_grid.png is drawn from every row on disk as an invocation ends; the lr with
    the lowest validation loss of each scheme is printed."""
    import fcntl

    path, precision = os.path.join(args.results, "lr_grid.csv"), precision_of(cfg)
    commands_path = os.path.join(args.results, "lr_grid_commands.md")

    def key(row):
        return row["arm"], float(row["lr"]), int(row["updates"]), int(row["schedule_updates"]), row["precision"]

    def rows_on_disk():
        if not os.path.isfile(path):
            return []
        with open(path, newline="") as f:
            return list(csv.DictReader(f))

    def save(row, commands):
        row = {k: str(v) for k, v in row.items()}  # as the rows read back from the file
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            write_csv_atomic(path, LR_GRID_FIELDS, [r for r in rows_on_disk() if key(r) != key(row)] + [row])
            earlier = ""
            if os.path.isfile(commands_path):
                with open(commands_path, encoding="utf-8") as f:
                    earlier = f.read()
            write_atomic(commands_path, earlier + "".join(f"- {what}: `{command}`\n" for what, command in commands))

    done = {key(r) for r in rows_on_disk()}
    for scheme in (s for s in args.schemes if s != NO_PRETRAINING):
        for lr in args.lr_grid:
            row = {"arm": scheme, "lr": lr, "updates": args.lr_grid_updates, "schedule_updates": cfg["pretrain_updates"],
                   "precision": precision}
            if key(row) in done:
                continue
            save_dir = lr_grid_dir(args, cfg, scheme, lr, args.lr_grid_updates)
            start = len(log.lines)  # this row's commands (a finished pre-training runs none)
            checkpoint = pretrain(log, args, cfg, data, scheme, env, lr=lr, stop_at=args.lr_grid_updates,
                                  save_dir=save_dir)
            record = validate(log, args, cfg, data, "valid", checkpoint, {}, f"validation loss of {scheme}, lr {lr:g}",
                              env)
            row.update(valid_loss=record["loss"], valid_mlm_loss=record["mlm_loss"])
            print(f"   -> {scheme}, lr {lr:g}, {args.lr_grid_updates} updates: validation loss {row['valid_loss']} bits",
                  flush=True)
            save(row, log.lines[start:])
    rows = rows_on_disk()
    if rows:
        plot_lr_grid(args, rows)  # every grid on disk, this invocation's and those run beside it
    rows = [r for r in rows if int(r["updates"]) == args.lr_grid_updates
            and int(r["schedule_updates"]) == cfg["pretrain_updates"] and r["precision"] == precision]
    for scheme in sorted({r["arm"] for r in rows}):
        best = min((r for r in rows if r["arm"] == scheme), key=lambda r: float(r["valid_loss"]))
        print(f"{scheme}: lowest validation loss {float(best['valid_loss']):.3f} bits at lr {float(best['lr']):g}",
              flush=True)


def plot_lr_grid(args, rows):
    """lr_grid.png: validation loss against peak lr, one panel per scheme (its own objective, so its own scale),
    one line per grid length and precision; the lowest point of each line ringed."""
    plt = _pyplot()
    if plt is None:
        return
    schemes = sorted({r["arm"] for r in rows})
    fig, axes = plt.subplots(1, len(schemes), figsize=(3.2 * len(schemes), 3.2), sharex=True, squeeze=False)
    for ax, scheme in zip(axes[0], schemes):
        for label in sorted({(r["updates"], r["precision"]) for r in rows if r["arm"] == scheme}):
            points = sorted((float(r["lr"]), float(r["valid_loss"])) for r in rows
                            if (r["arm"], r["updates"], r["precision"]) == (scheme, *label))
            line, = ax.plot(*zip(*points), marker="o", label=f"{label[0]} updates, {label[1]}")
            ax.scatter(*min(points, key=lambda point: point[1]), s=160, facecolors="none",
                       edgecolors=line.get_color())
        ax.set_xscale("log")
        lrs = sorted({float(r["lr"]) for r in rows})
        ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs], fontsize=7)
        ax.minorticks_off()
        ax.set_title(scheme, fontsize=9)
        ax.set_xlabel("peak learning rate")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("validation loss (bits, own objective)")
    fig.tight_layout()
    fig.savefig(os.path.join(args.results, "lr_grid.png"), dpi=120)
    plt.close(fig)


def prepare_tasks(log, args, cfg, tokenizer_from, env):
    """Each task's prepared folder (built once), and the fairseq-train options of its fine-tuning."""
    out, work = {}, os.path.join(args.work, "tasks")
    os.makedirs(work, exist_ok=True)
    seq = str(cfg["tokens"])
    if "squad" in args.tasks:
        files = split_by_article(os.path.join(SHARED, "squad", "dev-v1.1.json"), args.squad_train_articles, work)
        dest = os.path.join(work, "squad")
        log.run([os.path.join(BIN, "spanbert-prepare-qa"), "--train", files["train"], "--valid", files["eval"],
                 "--tokenizer-from", tokenizer_from, "--destdir", dest, "--max-seq-length", seq, "--doc-stride", str(cfg["tokens"] // 2),
                 "--max-query-length", str(cfg["tokens"] // 4), "--force"], "prepare squad", env)
        out["squad"] = (dest, ["--task", "extractive_qa", "--criterion", "extractive_qa"])
    if "sst2" in args.tasks:
        train = os.path.join(work, "sst2_train.tsv")
        with open(os.path.join(SHARED, "glue", "SST-2", "train.tsv"), encoding="utf-8") as f:
            lines = f.readlines()
        write_atomic(train, "".join(lines[: args.sst2_train_examples + 1]))  # header + the first N examples
        dest = os.path.join(work, "sst2")
        log.run([os.path.join(BIN, "spanbert-prepare-classification"), "--train", train, "--valid",
                 os.path.join(SHARED, "glue", "SST-2", "dev.tsv"), "--tokenizer-from", tokenizer_from, "--destdir", dest,
                 "--text-columns", "sentence", "--label-column", "label", "--max-seq-length", seq, "--force"],
                "prepare sst2", env)
        out["sst2"] = (dest, ["--task", "sentence_classification", "--criterion", "sentence_classification"])
    if "tacred" in args.tasks:
        dest, labels = os.path.join(work, "tacred"), os.path.join(work, "tacred_labels.txt")
        names = set()
        for split in ("train", "dev"):  # a small sample's dev split has relations its train split lacks
            with open(os.path.join(args.re_data, f"{split}.json"), encoding="utf-8") as f:
                names |= {example["relation"] for example in json.load(f)}
        write_atomic(labels, "".join(f"{name}\n" for name in sorted(names)))
        log.run([os.path.join(BIN, "spanbert-prepare-re"), "--train", os.path.join(args.re_data, "train.json"),
                 "--valid", os.path.join(args.re_data, "dev.json"), "--tokenizer-from", tokenizer_from, "--destdir", dest,
                 "--labels", labels, "--max-seq-length", seq, "--force"], "prepare tacred", env)
        out["tacred"] = (dest, ["--task", "relation_extraction", "--criterion", "relation_extraction"])
    return out


def litbank_run(log, args, cfg, checkpoint, seed, env):
    """benchmarks/coreference/coref_litbank.py on the fold: the litbank recipe, best dev checkpoint, test CoNLL F1 with singletons
    (``test_conll_f1``); with --singleton-thresholds also the test score at the threshold with the best dev CoNLL F1
    (``test_conll_f1_dev_threshold``; a finished run gets it added). Returns the run's record.

    The record (dev CoNLL F1 per epoch, every test score, its commands) is copied into the results folder
    (``coref_runs/ARM_seedS_PRECISION.json``) and its commands go to commands.md."""
    import coref_litbank

    name = os.path.basename(os.path.dirname(checkpoint)) if checkpoint != args.from_model_checkpoint else NO_PRETRAINING
    options = argparse.Namespace(
        checkpoint=checkpoint, recipe=os.path.join(ROOT, "configs", "finetune", "litbank.yaml"), epochs=args.coref_epochs,
        encoder_lr=args.coref_encoder_lr, head_lr=args.coref_head_lr, ffnn_size=args.coref_ffnn_size,
        max_segment_length=384, bf16_autocast=bool(cfg.get("bf16_autocast")), cpu=cfg["cpu"], train_docs=2 if args.smoke else None,
        eval_docs=2 if args.smoke else None,
        litbank=LITBANK, singleton_thresholds=args.singleton_thresholds,
        override=["dataset.num_workers=0"], work=os.path.join(args.work, "coref", name, precision_of(cfg)))
    os.makedirs(os.path.join(options.work, "runs"), exist_ok=True)
    sizes, tokenizer_from = coref_litbank.checkpoint_settings(checkpoint)
    data, prepare_command = coref_litbank.prepare_fold(options, args.fold, tokenizer_from,
                                                       min(384, int(sizes["max_positions"])))
    old_environ = dict(os.environ)
    os.environ.update(env)  # the fine-tuning processes inherit the thread setting
    try:
        result = coref_litbank.finetune_and_test(options, args.fold, data, sizes, "pretrained", seed)
    finally:
        os.environ.clear()
        os.environ.update(old_environ)
    os.makedirs(os.path.join(args.results, "coref_runs"), exist_ok=True)
    write_atomic(os.path.join(args.results, coref_record_name(name, seed, precision_of(cfg))),
                 json.dumps(result, indent=2) + "\n")
    log.lines += [(f"LitBank fold {args.fold}, {name}, seed {seed}", command)
                  for command in [prepare_command, *result["commands"]]]
    return result


def finetune(log, args, cfg, task, prepared, checkpoint, seed, env):
    data, task_args = prepared
    start = ["--finetune-from-model", os.path.abspath(checkpoint)] if checkpoint else []  # None: random initialisation
    argv = [os.path.join(BIN, "fairseq-train"), data, *task_args, *model_args(args, cfg), *start,
            "--no-save", "--save-dir", os.path.join(args.work, "finetune_checkpoints"),  # not ./checkpoints (resumed from)
            "--validate-interval", "1000000",
            *common_train_args(cfg, cfg["finetune_updates"], cfg["finetune_lr"], cfg["finetune_batch"], seed)]
    origin = os.path.basename(os.path.dirname(checkpoint)) if checkpoint else "random initialisation"
    output = log.run(argv, f"fine-tune {task}, seed {seed}, from {origin}", env,
                     progress=train_progress(cfg["finetune_updates"]))
    return last_valid(output, TASKS[task])


def write_table(rows, args, settings):
    """table.md (mean ± sd per arm and task, then the paired differences), table.png and the pre-training curves."""
    # every scheme and task with results so far (earlier invocations' too), in the canonical order
    present = {(row["arm"], row["task"]) for row in rows}
    asked = {result_task(t, args.fold) for t in args.tasks}
    tasks = [t for t in METRIC_OF if t in asked or any(t == task for _, task in present)]
    schemes = [s for s in (NO_PRETRAINING, *SCHEMES) if s in args.schemes or any(s == scheme for scheme, _ in present)]
    schemes = [arm for s in schemes for arm in [s, *sorted({a for a, _ in present if a != s and scheme_of(a) == s})]]
    rows = labelled_by_precision(rows)
    schemes = [label for s in schemes for label in sorted({r["label"] for r in rows if r["arm"] == s}) or [s]]
    cells = {}
    for row in rows:
        cells.setdefault((row["label"], row["task"]), []).append(float(row["score"]))

    def cell(values):
        if not values:
            return "–"
        sd = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
        return f"{statistics.mean(values):.1f}{sd}"

    header = "| arm (scheme) | " + " | ".join(f"{t} ({METRIC_OF[t]})" for t in tasks) + " | precision |"
    lines = [header, "|" + "---|" * (len(tasks) + 2)]
    for scheme in schemes:
        precisions = ", ".join(sorted({r["precision"] or "not recorded" for r in rows if r["label"] == scheme})) or "–"
        lines.append(f"| {scheme} | " + " | ".join(cell(cells.get((scheme, t), [])) for t in tasks) + f" | {precisions} |")
    seeds = sorted({int(r["seed"]) for r in rows})
    title = (f"Continued pre-training of {os.path.basename(os.path.normpath(settings['from_model']))} under each masking "
             "scheme" if settings.get("from_model") else f"Masking ablation ({settings['setting']} setting)")
    text = "\n".join(lines) + paired_differences(rows, tasks, schemes, args.equivalence_margin)
    print("\n" + text, flush=True)
    write_atomic(os.path.join(args.results, "table.md"),
                 f"# {title}\n\nmean ± sample sd over seeds {seeds}; "
                 f"settings: `{json.dumps(settings)}`\n\n{text}\n")
    plot_table(args, tasks, schemes, cells)
    pretraining_curves(args)


def labelled_by_precision(rows):
    """The rows with their ``label``, the row of the table they go to: the arm, or ``ARM (PRECISION)`` for an arm that
    ran in more than one precision (each its own row, paired with the others like an arm)."""
    precisions = {}
    for row in rows:
        precisions.setdefault(row["arm"], set()).add(row["precision"] or "not recorded")
    return [{**row, "label": f"{row['arm']} ({row['precision'] or 'not recorded'})" if len(precisions[row["arm"]]) > 1
             else row["arm"]} for row in rows]


def write_commands(path, earlier, log):
    """commands.md: the earlier invocations' sections, then this one's (every command it ran); returns this one's."""
    invocation = f"\n## `{' '.join(sys.argv)}`\n\n" + "".join(f"- {what}: `{command}`\n" for what, command in log.lines)
    write_atomic(path, earlier + invocation)
    return invocation


def _pyplot():
    """matplotlib's pyplot on the file backend, or None where matplotlib is not installed (no plots then)."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def train_inner_losses(log_path, keys):
    """{update: (float of each key, None where the run does not log it)} from a fairseq-train json log's train_inner
    records (the last record of an update wins, as when a stopped run was resumed); {} when the log is not there."""
    by_update = {}
    if os.path.isfile(log_path):
        with open(log_path, encoding="utf-8") as f:
            for line in f:
                if "| train_inner |" in line:
                    record = json.loads(line[line.index("{"):])
                    by_update[int(record["num_updates"])] = tuple(float(record[k]) if k in record else None for k in keys)
    return by_update


def pretraining_precision(log_path):
    """The ``precision`` of the pre-training a fairseq-train log records (its configuration, printed at every start):
    "bf16_autocast", "fp16", "fp32", or "mixed" when a resumed run changed it."""
    with open(log_path, encoding="utf-8") as f:
        text = f.read()
    bf16 = set(re.findall(r"'bf16_autocast': (True|False)", text))
    fp16 = set(re.findall(r"'common': \{.*?'fp16': (True|False)", text))
    if len(bf16) > 1 or len(fp16) > 1:
        return "mixed"
    return "bf16_autocast" if bf16 == {"True"} else "fp16" if fp16 == {"True"} else "fp32"


def recorded_curves(results):
    """{(arm, precision): [(update, mlm_loss, sbo_loss)]} as ``pretrain_curves.csv`` in the results folder holds them
    (sbo_loss None where empty; precision "not recorded" in files written before the column)."""
    path, curves = os.path.join(results, "pretrain_curves.csv"), {}
    if os.path.isfile(path):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                curves.setdefault((row["arm"], row.get("precision") or "not recorded"), []).append(
                    (int(row["update"]), float(row["mlm_loss"]), float(row["sbo_loss"]) if row["sbo_loss"] else None))
    return curves


def departure_from(recorded, log_path):
    """The first update where a pre-training's MLM loss (its train.log) differs from ``recorded``, the curve recorded
    for its arm as {update: mlm_loss}: (update, recorded loss, this run's), or None where they agree at every update
    both have. The same code on the same kind of machine logs the same numbers; other random draws (another machine's
    kernels, a code change) do not."""
    for update, (mlm_loss,) in sorted(train_inner_losses(log_path, ("mlm_loss",)).items()):
        if update in recorded and recorded[update] != mlm_loss:
            return update, recorded[update], mlm_loss
    return None


def retire_rows(args, rows, arm, precision):
    """Move an arm's rows in one precision from results.csv to ``retired.csv`` (appended; same columns) and its
    LitBank records to ``coref_runs/retired/``: scores of an encoder that is no longer there, kept apart from those of
    the encoder that replaces it. ``rows`` (the invocation's) loses them too; an invocation started beside it, before
    the move, still holds them and would write them back: start the others after the move is printed."""
    import fcntl

    def of_arm(row):
        return row["arm"] == arm and row["precision"] == precision

    csv_path, retired_path = os.path.join(args.results, "results.csv"), os.path.join(args.results, "retired.csv")
    with open(csv_path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        on_disk = read_rows(csv_path) if os.path.isfile(csv_path) else []
        leaving = [r for r in on_disk if of_arm(r)]
        earlier = read_rows(retired_path) if os.path.isfile(retired_path) else []
        write_csv_atomic(retired_path, FIELDS, earlier + leaving)
        write_csv_atomic(csv_path, FIELDS, [r for r in on_disk if not of_arm(r)])
        for row in leaving:
            record = os.path.join(args.results, coref_record_name(arm, row["seed"], precision))
            if os.path.isfile(record):
                os.makedirs(os.path.join(args.results, "coref_runs", "retired"), exist_ok=True)
                os.replace(record, os.path.join(args.results, "coref_runs", "retired", os.path.basename(record)))
    rows[:] = [r for r in rows if not of_arm(r)]
    return len(leaving)


def pretraining_curves(args):
    """{(arm, precision): [(update, mlm_loss, sbo_loss)]} from each pre-training's train.log in --work (the last
    record of an update when a stopped run was resumed; sbo_loss None for the arms without SBO), written to
    ``pretrain_curves.csv`` (sbo_loss empty there) and plotted in ``pretrain_loss.png``. A curve from an earlier --work
    (another machine, a cleared /tmp) stays unless this --work holds the same arm in the same precision."""
    import glob

    curves = {}
    for log_path in sorted(glob.glob(os.path.join(args.work, "pretrain", "*", "train.log"))):
        by_update = train_inner_losses(log_path, ("mlm_loss", "sbo_loss"))
        if by_update:
            key = (os.path.basename(os.path.dirname(log_path)), pretraining_precision(log_path))
            curves[key] = [(u, *by_update[u]) for u in sorted(by_update)]
    curves.update({key: points for key, points in recorded_curves(args.results).items() if key not in curves})
    if not curves:
        return curves
    csv_path = os.path.join(args.results, "pretrain_curves.csv")
    lines = ["arm,precision,update,mlm_loss,sbo_loss"] + [
        f"{arm},{precision},{u},{m},{'' if b is None else b}"
        for (arm, precision), points in curves.items() for u, m, b in points]
    write_atomic(csv_path, "\n".join(lines) + "\n")
    plt = _pyplot()
    if plt is None:
        return curves
    several = {arm for arm, n in Counter(arm for arm, _ in curves).items() if n > 1}  # named with their precision
    arms = sorted({arm for arm, _ in curves})
    fig, ax = plt.subplots(figsize=(6, 4))
    for (arm, precision), points in sorted(curves.items()):
        name = f"{arm} ({precision})" if arm in several else arm
        # one colour per arm; a bf16 curve is a wide pale band under its fp32 twin, which it mostly overlaps
        style = {"color": f"C{arms.index(arm) % 10}",
                 **({"linewidth": 4, "alpha": 0.35} if precision == "bf16_autocast" else {"linewidth": 1.3})}
        ax.plot([p[0] for p in points], [p[1] for p in points], label=f"{name}: MLM loss", **style)
        if all(p[2] is not None for p in points):
            ax.plot([p[0] for p in points], [p[2] for p in points], linestyle="--", label=f"{name}: SBO loss", **style)
    ax.set_xlabel("update")
    ax.set_ylabel("bits per masked token")
    ax.set_title("pre-training loss (training batches; each arm its own masks)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.results, "pretrain_loss.png"), dpi=120)
    plt.close(fig)
    return curves


def paired_differences(rows, tasks, schemes, margin=None):
    """Each pre-trained arm against ``none`` (and SCHEME_PAIRS: span+sbo against subword and span, span against
    subword and word, word against subword; an arm at another --freeze-encoder-updates or --pretrain-lr against its
    scheme, and SCHEME_PAIRS between the arms at other lrs), in one precision where both ran in it, and each arm's
    precisions against each other, per task:
    the mean difference over the fine-tuning seeds both arms ran (paired by seed) with its 95% t-interval, and with
    ``margin`` a TOST p-value against +-margin points; a markdown table, or "" without pairs."""
    from paired_stats import interval_text, paired_difference

    score = {(r["label"], r["task"], int(r["seed"])): float(r["score"]) for r in rows}
    arm_of = {r["label"]: r["arm"] for r in rows}
    precision_of_label = {r["label"]: r["precision"] for r in rows}

    def arm_of_label(label):
        return arm_of.get(label, label)

    def labels(arm):  # an arm's rows of the table (one per precision where it ran in several)
        return [s for s in schemes if arm_of_label(s) == arm]

    precisions_of_arm = {}
    for r in rows:
        precisions_of_arm.setdefault(r["arm"], set()).add(r["precision"])

    def comparable(a, b):  # two arms in one precision; across precisions only where neither ran in the other's
        precision_a, precision_b = precision_of_label.get(a), precision_of_label.get(b)
        return precision_a == precision_b or (precision_b not in precisions_of_arm.get(arm_of_label(a), ()) and
                                              precision_a not in precisions_of_arm.get(arm_of_label(b), ()))

    pairs = [(arm, base) for arm in schemes if arm_of_label(arm) != NO_PRETRAINING for base in labels(NO_PRETRAINING)]
    pairs += [(a, b) for arm, base in SCHEME_PAIRS for a in labels(arm) for b in labels(base)]
    # the same comparisons between the arms pre-trained at other peak lrs (each scheme at its validation choice)
    pairs += [(a, b) for arm, base in SCHEME_PAIRS
              for a in schemes if is_lr_variant(arm_of_label(a)) and scheme_of(arm_of_label(a)) == arm
              for b in schemes if is_lr_variant(arm_of_label(b)) and scheme_of(arm_of_label(b)) == base]
    for label in schemes:  # an arm at another --freeze-encoder-updates or lr against its scheme (the variant's effect)
        scheme = scheme_of(arm_of_label(label))
        if scheme != arm_of_label(label):
            pairs += [(label, base) for base in labels(scheme)]
    pairs = [(a, b) for a, b in pairs if comparable(a, b)]
    pairs += [(a, b) for arm in (NO_PRETRAINING, *SCHEMES) for a in labels(arm) for b in labels(arm)  # precision's effect
              if a != b and (precision_of_label.get(a), precision_of_label.get(b)) == ("fp32", "bf16_autocast")]
    lines = []
    for task in tasks:
        if task == HELDOUT:
            continue
        for arm, base in pairs:
            seeds = sorted(s for a, t, s in score if a == arm and t == task and (base, task, s) in score)
            if not seeds:
                continue
            paired = paired_difference([score[(arm, task, s)] - score[(base, task, s)] for s in seeds], margin)
            interval = interval_text(paired)
            tost = "" if margin is None else (" – |" if paired["tost_p"] is None else f" {paired['tost_p']:.3f} |")
            lines.append(f"| {task} | {arm} − {base} | {', '.join(map(str, seeds))} | {paired['mean']:+.2f} | {interval} |"
                         + tost)
    if not lines:
        return ""
    header = "| task | difference | seeds | mean | 95% interval |" + ("" if margin is None else f" TOST p, ±{margin:g} |")
    note = ("" if margin is None else f" A TOST p below 0.05 says the two arms are equal within ±{margin:g} points "
            "(the 90% interval lies inside the margin); above it, equality is not shown.")
    return (f"\n\nPaired by fine-tuning seed (the seeds both arms ran).{note}\n\n"
            + header + "\n|" + "---|" * (header.count("|") - 1) + "\n" + "\n".join(lines))


def plot_table(args, tasks, schemes, cells):
    plt = _pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        means = [statistics.mean(cells.get((s, task), [0])) for s in schemes]
        sds = [statistics.stdev(cells[(s, task)]) if len(cells.get((s, task), [])) > 1 else 0 for s in schemes]
        ax.bar(range(len(schemes)), means, yerr=sds, capsize=3)
        ax.set_xticks(range(len(schemes)), schemes, rotation=45, ha="right")
        ax.set_title(f"{task} ({METRIC_OF[task]})")
    fig.tight_layout()
    fig.savefig(os.path.join(args.results, "table.png"), dpi=120)


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=list(SETTINGS), default="cpu")
    parser.add_argument("--from-model", help="spanbert-import-hf folder: continued pre-training of that encoder")
    parser.add_argument("--from-model-arch", default="spanbert_base", help="architecture of the --from-model encoder")
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=[*SCHEMES, NO_PRETRAINING],
                        help=f"masking schemes; '{NO_PRETRAINING}': no (continued) pre-training, the baseline row")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3],
                        help="fine-tuning seeds (none: pre-train and score the held-out MLM loss only)")
    parser.add_argument("--pretrain-seed", type=int, default=1)
    parser.add_argument("--novels", type=int, help="pre-training novels (0: all but the evaluation fold's)")
    parser.add_argument("--pretrain-updates", type=int)
    parser.add_argument("--pretrain-batch", type=int, help="pre-training sequences per update (default: the setting's, 16 on "
                        "the cpu setting); a larger batch at the same updates gives more pre-training tokens")
    parser.add_argument("--finetune-updates", type=int)
    parser.add_argument("--pretrain-lr", type=float, help="pre-training peak lr (default: the setting's; 1e-4 with --from-model); another "
                        "than the experiment's first invocation's adds arms SCHEME_lrX")
    parser.add_argument("--finetune-lr", type=float, help="fine-tuning peak lr (default: the setting's; 5e-5 with --from-model)")
    parser.add_argument("--fold", type=int, default=0, help="LitBank fold whose dev/test novels pre-training leaves out")
    parser.add_argument("--squad-train-articles", type=int, default=38)
    parser.add_argument("--sst2-train-examples", type=int, default=5000)
    parser.add_argument("--re-data", default=os.path.join(SHARED, "tacred_sample"), help="folder with train.json and dev.json")
    parser.add_argument("--workers", type=int, default=1, help="spanbert-prepare --workers")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (OMP_NUM_THREADS)")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="where every run trains (default: the setting's; --from-model takes --setting's)")
    parser.add_argument("--smoke", action="store_true", help="a tiny budget that only checks the plumbing (numbers mean nothing)")
    parser.add_argument("--work", default="/tmp/masking_ablation")
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "pretraining", "masking_ablation"))
    parser.add_argument("--fresh", action="store_true", help="discard earlier checkpoints and results")
    parser.add_argument("--freeze-encoder-updates", type=int, default=0,
                        help="with --from-model: the fresh MLM/SBO heads train alone for the first N updates")
    parser.add_argument("--heldout-mlm", action="store_true",
                        help="add each pre-trained scheme's masked-token loss on the fold's test novels (subword masks)")
    parser.add_argument("--heldout-chars", type=int, default=100000,
                        help="characters of held-out text per test novel (from its middle) for the MLM loss")
    parser.add_argument("--bf16-autocast", action="store_true", help="every training run under bfloat16 autocast")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: write table.md, the plots, pretrain_curves.csv and coref_runs/ from what is there")
    parser.add_argument("--coref-epochs", type=int, default=10, help="LitBank fine-tuning epochs (80 documents each)")
    parser.add_argument("--coref-ffnn-size", type=int, default=150, help="coreference head's hidden size")
    parser.add_argument("--coref-head-lr", type=float, default=1e-4)
    parser.add_argument("--coref-encoder-lr", type=float, default=2e-5)
    parser.add_argument("--singleton-thresholds", type=lambda text: [float(t) for t in text.split(",")],
                        help="LitBank: also score each run at the singleton threshold among these (e.g. 0.1,0.2,0.3,0.5) "
                             "with the best dev CoNLL F1 (rows litbank_foldN_dev_threshold; finished runs get them too)")
    parser.add_argument("--equivalence-margin", type=float, default=None, metavar="POINTS",
                        help="add to the paired differences a two-one-sided t-test against +-POINTS (e.g. 2.7, the "
                             "paper's coreference gain from SBO): the arms are called equal within it only where p < 0.05")
    parser.add_argument("--retire", nargs="+", default=[], metavar="ARM",
                        help="arms whose rows came from a pre-training this one does not reproduce (its loss curve "
                             "differs: another machine, a code change): their rows move to retired.csv, and this "
                             "pre-training's encoder is scored in their place (without it such an invocation stops)")
    parser.add_argument("--lr-grid", type=float, nargs="+", metavar="LR",
                        help="choose the pre-training lr on validation loss: run only the grid (each scheme at each "
                             "peak lr, --lr-grid-updates long) and write lr_grid.csv; then run with --pretrain-lr")
    parser.add_argument("--lr-grid-updates", type=int, default=500,
                        help="updates of each grid run (the experiment's schedule, stopped there)")
    args = parser.parse_args(argv)
    if args.lr_grid and (min(args.lr_grid) <= 0 or args.lr_grid_updates < 1):
        sys.exit("masking_ablation: --lr-grid: learning rates must be > 0 and --lr-grid-updates >= 1")
    check_flags(args)
    args.from_model_checkpoint = os.path.join(os.path.abspath(args.from_model), "model.pt") if args.from_model else None
    cfg = dict(SETTINGS[args.setting])
    if args.smoke:
        cfg.update(pretrain_updates=4, finetune_updates=3, novels=2, batch=4, finetune_batch=4)
        args.coref_epochs, args.heldout_chars = 1, 2000  # coref: over the first 2 training documents
        args.sst2_train_examples, args.squad_train_articles = min(args.sst2_train_examples, 64), 46
    if args.from_model:  # a real encoder: the learning rates of continued pre-training and of fine-tuning it
        cfg.update(arch=args.from_model_arch, pretrain_lr=1e-4, finetune_lr=5e-5)
    for key in ("novels", "pretrain_updates", "finetune_updates", "pretrain_lr", "finetune_lr"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.pretrain_batch is not None:
        if args.pretrain_batch < 1:
            sys.exit(f"masking_ablation: --pretrain-batch {args.pretrain_batch}: expected at least 1 sequence")
        cfg["batch"] = args.pretrain_batch
    cfg["bf16_autocast"] = args.bf16_autocast
    if args.device:
        cfg["cpu"] = args.device == "cpu"
    if args.heldout_mlm:
        cfg["heldout_chars"] = args.heldout_chars
    if args.from_model:
        cfg["freeze_encoder_updates"] = args.freeze_encoder_updates
    if "coref" in args.tasks:
        cfg.update(coref_epochs=args.coref_epochs, coref_ffnn_size=args.coref_ffnn_size,
                   coref_head_lr=args.coref_head_lr, coref_encoder_lr=args.coref_encoder_lr)
    foreign = unmarked_folder(args.results, "--results", ("settings.json", "lr_grid.csv"))
    if foreign:
        sys.exit(f"masking_ablation: {foreign}")
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.results, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    log = CommandLog()

    novels, held = pretraining_novels(args.fold, cfg["novels"])
    vocab = os.path.join(args.from_model, "vocab.txt") if args.from_model else BERT_VOCAB
    data = os.path.join(args.work, "pretrain_data")
    needs_spans = {"named_entity", "noun_phrase"} & set(args.schemes)
    stats = os.path.join(data, "prepare_stats.json")
    annotated = os.path.isfile(stats) and "annotator" in _read_json(stats)
    if args.report_only and not os.path.isfile(stats):
        sys.exit(f"masking_ablation: --report-only: {args.work} holds no prepared corpus (the run's --work folder?)")
    # the corpus in --work is reused only when made from the same novels (so never from the fold's dev and test
    # novels of another --fold) and vocabulary; spans are added when needed
    made_from = os.path.join(args.work, "pretrain_data.inputs.json")
    wanted = corpus_inputs(novels, vocab, bool(needs_spans) or annotated, args.from_model)
    if os.path.isfile(stats) and not args.fresh:
        recorded = _read_json(made_from) if os.path.isfile(made_from) else None
        if recorded is None or {**recorded, "annotated": wanted["annotated"]} != wanted:
            what = ("was prepared without a record of its novels" if recorded is None else
                    "was prepared from other novels, another vocabulary or for another encoder (another --fold, "
                    "--novels or --from-model)")
            sys.exit(f"masking_ablation: --work {args.work}: its pre-training corpus {what}; use another --work, or "
                     "--fresh to prepare it again (which also discards the encoders pre-trained on it)")
    if args.fresh or not os.path.isfile(stats) or (needs_spans and not annotated):
        write_atomic(made_from, json.dumps(wanted, indent=2) + "\n")  # first: an invocation beside it reads it
        log.run([os.path.join(BIN, "spanbert-prepare"), "--train", *novels, "--join-wrapped-lines", "--wordpiece-vocab", vocab,
                 "--lowercase", *(["--annotate", "spacy"] if needs_spans else []), "--workers", str(args.workers),
                 "--valid-fraction", "0.05", "--destdir", data, "--force"], "prepare the pre-training corpus", env)
    corpus = _read_json(stats)
    if args.lr_grid:
        if args.lr_grid_updates > cfg["pretrain_updates"]:
            sys.exit(f"masking_ablation: --lr-grid-updates {args.lr_grid_updates}: at most --pretrain-updates "
                     f"({cfg['pretrain_updates']})")
        os.makedirs(args.results, exist_ok=True)
        lr_grid(log, args, cfg, data, env)
        return
    precision = precision_of(cfg)  # per row, not part of the settings
    settings = {"setting": args.setting, "from_model": args.from_model, "smoke": args.smoke,
                **{k: v for k, v in cfg.items() if k != "bf16_autocast"},
                "novels_used": len(novels), "novels_left_out": sorted(held), "train_tokens": corpus["train"]["tokens"],
                "pretrain_seed": args.pretrain_seed}
    print(json.dumps(settings), flush=True)
    settings_path, csv_path = os.path.join(args.results, "settings.json"), os.path.join(args.results, "results.csv")
    stored = _read_json(settings_path) if os.path.isfile(settings_path) else None
    settings = experiment_settings(stored, settings)  # another N or lr makes variant arms
    same = stored is not None and same_settings(stored, settings)
    if stored is not None and not same and not args.fresh:  # its rows would be dropped: refused, nothing written
        sys.exit(f"masking_ablation: --results {args.results}: holds another experiment (settings differ in "
                 f"{', '.join(differing_settings(stored, settings))}); choose another --results, or pass --fresh to "
                 "replace its results")
    if same:  # an invocation without coref keeps the stored coref settings
        settings = {**stored, **settings}
    arms = [variant_arm(scheme, cfg, settings) for scheme in args.schemes if scheme != NO_PRETRAINING]
    unknown = [arm for arm in args.retire if arm not in arms]
    if unknown:
        sys.exit(f"masking_ablation: --retire {' '.join(unknown)}: not an arm this invocation pre-trains "
                 f"({', '.join(arms) or 'none'})")
    rows = []
    if same and not args.fresh and os.path.isfile(csv_path):
        rows = read_rows(csv_path)
    commands_path = os.path.join(args.results, "commands.md")  # earlier invocations' commands, kept with their rows
    # other settings' commands (or a --fresh start's predecessors): kept aside, not mixed in. Not merely "no rows
    # yet": invocations of one experiment started side by side all find no rows, and each writes its own section
    if (not same or args.fresh) and os.path.isfile(commands_path):
        os.replace(commands_path, commands_path + ".old")
    write_atomic(settings_path, json.dumps(settings, indent=2) + "\n")
    if args.report_only:
        for row in rows:  # the LitBank runs' records, as litbank_run keeps them (runs finished before it did)
            run = os.path.join(args.work, "coref", row["arm"], row["precision"], "runs",
                               f"fold{args.fold}_pretrained_seed{row['seed']}.json")
            kept = os.path.join(args.results, coref_record_name(row["arm"], row["seed"], row["precision"]))
            if row["task"] == result_task("coref", args.fold) and os.path.isfile(run) and not os.path.isfile(kept):
                os.makedirs(os.path.dirname(kept), exist_ok=True)
                with open(run, encoding="utf-8") as f:
                    write_atomic(kept, f.read())
        write_table(rows, args, settings)  # a report runs no command: commands.md stays as it was
        print(f"wrote table.md, table.png, pretrain_curves.csv and pretrain_loss.png in {args.results}")
        return

    prepared = prepare_tasks(log, args, cfg, data, env)
    heldout = None
    if args.heldout_mlm:  # the fold's test novels, never pre-trained on, with the same vocabulary
        heldout = os.path.join(args.work, "heldout_data")
        if args.fresh or not os.path.isfile(os.path.join(heldout, "prepare_stats.json")):
            texts = heldout_text(args.fold, args.heldout_chars, os.path.join(args.work, "heldout_text"))
            log.run([os.path.join(BIN, "spanbert-prepare"), "--train", *texts, "--join-wrapped-lines",
                     "--wordpiece-vocab", vocab, "--lowercase", "--valid-fraction", "0.1", "--destdir", heldout,
                     "--force"], "prepare the held-out text (the fold's test novels)", env)

    written = {"section": None}  # this invocation's section of commands.md as last written

    def commands_of_others():
        """commands.md as on disk without this invocation's own section (it is written again, longer)."""
        if not os.path.isfile(commands_path):
            return ""
        with open(commands_path, encoding="utf-8") as f:
            text = f.read()
        return text.replace(written["section"], "") if written["section"] else text

    def save(new_row=None):
        """results.csv (with ``new_row``), the table, the plots and commands.md, under a lock: invocations with the
        same settings may run side by side (one arm each, one per core), so the rows on disk are read again and
        extended, and neither invocation overwrites the other's."""
        import fcntl

        with open(csv_path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.isfile(csv_path):
                known = {run_key(r) for r in rows}
                rows.extend(r for r in read_rows(csv_path) if run_key(r) not in known)
            if new_row is not None:
                rows.append(new_row)
                write_csv_atomic(csv_path, FIELDS, rows)
            write_table(rows, args, settings)
            written["section"] = write_commands(commands_path, commands_of_others(), log)

    def record(scheme, task, seed, score):
        print(f"   -> {scheme} / {task} / seed {seed}: {METRIC_OF[task]} {score:.2f}", flush=True)
        save({"arm": scheme, "task": task, "seed": seed, "score": score, "metric": METRIC_OF[task],
              "precision": precision})

    def done(scheme, task, seed):  # in this invocation's precision: another precision's run is another replicate
        return any(run_key(r) == (scheme, task, seed, precision) for r in rows)

    # {(arm, precision): {update: mlm_loss}}, read before this invocation writes its --work's curves there
    recorded = {key: {update: mlm_loss for update, mlm_loss, _ in points}
                for key, points in recorded_curves(args.results).items()}
    for scheme in args.schemes:
        arm = variant_arm(scheme, cfg, settings)
        checkpoint = pretrain(log, args, cfg, data, scheme, env, save_dir=os.path.join(args.work, "pretrain", arm))
        # an arm's rows are one encoder's: a pre-training that cannot be rerun the same (the first one's --work is
        # gone) does not add its scores to the earlier encoder's
        has_rows = scheme != NO_PRETRAINING and any(r["arm"] == arm and r["precision"] == precision for r in rows)
        departure = has_rows and departure_from(recorded.get((arm, precision), {}),
                                                os.path.join(args.work, "pretrain", arm, "train.log"))
        if departure and arm not in args.retire:
            update, before, now = departure
            sys.exit(f"masking_ablation: {arm} ({precision}): this pre-training is another encoder than the one its rows "
                     f"in {csv_path} came from (MLM loss {now} at update {update}, {before} recorded); pass --retire "
                     f"{arm} to move those rows to retired.csv and score this one, or choose another --results")
        if departure:
            print(f"{arm} ({precision}): {retire_rows(args, rows, arm, precision)} rows of the earlier pre-training "
                  "moved to retired.csv", flush=True)
        elif arm in args.retire:
            print(f"{arm} ({precision}): --retire: this pre-training is the recorded one (or nothing is recorded "
                  "to compare); no row moved", flush=True)
        if heldout and scheme != NO_PRETRAINING and not done(arm, HELDOUT, args.pretrain_seed):
            record(arm, HELDOUT, args.pretrain_seed, heldout_mlm_bits(log, args, cfg, heldout, checkpoint, env))
        for task in args.tasks:
            for seed in args.seeds:
                if task != "coref":
                    if not done(arm, result_task(task, args.fold), seed):
                        record(arm, result_task(task, args.fold), seed,
                               finetune(log, args, cfg, task, prepared.get(task), checkpoint, seed, env))
                    continue
                # one LitBank run gives both rows (its commands go to commands.md once)
                scores = {result_task(task, args.fold): "test_conll_f1"}
                if args.singleton_thresholds:
                    scores[result_task(task, args.fold) + DEV_THRESHOLD] = "test_conll_f1_dev_threshold"
                missing = {row_task: key for row_task, key in scores.items() if not done(arm, row_task, seed)}
                if not missing:
                    continue
                if checkpoint is None:
                    sys.exit("coref from random initialisation: run benchmarks/coreference/coref_litbank.py --arms random")
                run = litbank_run(log, args, cfg, checkpoint, seed, env)
                for row_task, key in missing.items():
                    record(arm, row_task, seed, run[key])
    save()


if __name__ == "__main__":
    main()
