#!/usr/bin/env python
"""LitBank coreference cross-validation: fine-tune a spanbert checkpoint on each fold, score its test documents.

Each fold (``../shared/data/litbank/splits/foldN``: 80 training, 10 dev, 10 test
documents) is prepared with the checkpoint's tokenizer, fine-tuned with the
recipe ``configs/finetune/litbank.yaml`` (the encoder's shape from the
checkpoint), and the checkpoint with the best dev CoNLL F1 (with singletons)
predicts the fold's test documents twice with ``spanbert-predict-coref``: as
trained (singletons predicted) and with ``--no-singletons``. The arm ``random``
trains the same recipe from random initialisation (the checkpoint's shape).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/coreference/coref_litbank.py --checkpoint imported/model.pt \
        --folds 0-9 --seeds 1 --out benchmarks/coreference/coref_litbank/results/minilm_10fold

Resumable: a finished run (``--work``/runs/foldF_ARM_seedS.json) and a prepared
fold are kept and reused, so the command can be stopped and started again; a
fine-tuning run that was stopped resumes from its checkpoint_last.pt. ``--out``
gets ``results.csv`` (one row per run), ``folds.csv`` (per fold, mean over
seeds), ``summary.md`` (mean ± sd over folds beside the published figures),
``commands.txt`` (every command behind every row), ``runs.jsonl`` (each run's record: its dev CoNLL F1 per epoch
and per singleton threshold too) and ``folds.png``.
``--paired-with OUT [OUT ...]`` adds, in ``paired.csv`` and ``summary.md``, this run minus another run of the command
(its ``--out``, or several whose runs together make it), paired by fold and seed, with the 95% interval and a TOST
against ``--equivalence-margin``, for each of ``--paired-metrics`` (results.csv columns).
``--include OUT ...`` takes finished runs from earlier ``--out`` folders of this command (their runs.jsonl and
commands.txt) instead of training them, so that runs made elsewhere (another machine, a GPU call) join one summary:
a run of ``--folds`` x ``--seeds`` x ``--arms`` found there is not trained, and its fold is not prepared.
``--train-docs N`` keeps the first N training documents, ``--eval-docs N`` the first N dev and test documents
(smoke tests). ``--out`` must be new, empty, or an earlier ``--out`` of this command (``--force`` replaces it): it
is checked before any work and written all at once when the runs are done.
"""
import argparse
import csv
import hashlib
import json
import logging
import os
import re
import shlex
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
from command_output import log_record, relative_to_root, run_streaming  # noqa: E402
from paired_stats import interval_text, paired_difference  # noqa: E402
from spanbert_plugin.core.file_utils import OutputError, atomic_directory, check_destination  # noqa: E402
# OTHER_METRICS: in eval.json since 2026-12-01 (a resumed earlier run's lacks them)
from spanbert_plugin.coref.metrics import METRICS, OTHER_METRICS  # noqa: E402
from spanbert_plugin.core.run_config import hydra_override  # noqa: E402
BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
LITBANK = os.path.join(os.environ.get("SPANBERT_SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data"), "litbank")
SIZE_KEYS = ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads", "max_positions")
# importing fairseq sets the root logger to DEBUG, and matplotlib (imported by the plugin) then logs its set-up
logging.getLogger("matplotlib").setLevel(logging.WARNING)
COMMAND = "coref_litbank.py"  # recorded in --out's manifest: --force replaces only this command's output
# published LitBank CoNLL F1 (with singletons, mean over the 10 folds), drawn beside ours
PUBLISHED = {"Bamman et al. 2020, BERT-base (110M)": 68.1, "Maverick 2024, DeBERTa-v3-large (435M), end to end": 78.3}


def run(command, commands, progress=None):
    """Run ``command`` (recorded in ``commands``); ``progress`` maps an output line to a line for the console, or
    None: a fine-tuning shows each epoch's dev score as it comes."""
    commands.append(relative_to_root(shlex.join(command)))
    print("$", commands[-1], flush=True)
    returncode, output = run_streaming(command, ROOT, progress=progress)
    if returncode != 0:
        raise SystemExit(f"failed ({returncode}): {commands[-1]}\n{output[-3000:]}")


def epoch_progress(epochs):
    """``progress`` for a LitBank fine-tuning: each epoch's dev CoNLL F1 from fairseq's validation record."""
    def progress(line):
        record = log_record(line, '"valid_conll_f1"')
        if record is None:
            return None
        return f"   epoch {record['epoch']}/{epochs}: dev CoNLL F1 {float(record['valid_conll_f1']):.2f}"
    return progress


def parse_folds(text):
    """'0-9' or '0,3,5' -> [0, ..., 9] / [0, 3, 5]; SystemExit naming the flag for a range that runs backwards."""
    folds = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        if not low or int(high or low) < int(low):
            sys.exit(f"coref_litbank: --folds {text!r}: {part!r} is not a range from a lower to a higher fold")
        folds += list(range(int(low), int(high or low) + 1))
    return folds


ARMS = ("pretrained", "random")


def check_run_flags(args):
    """One line and exit 1 for folds LitBank lacks, seeds that are not whole numbers >= 0 and unknown arms:
    before any preparation or training."""
    for fold in parse_folds(args.folds):
        if not os.path.isfile(os.path.join(args.litbank, "splits", f"fold{fold}", "train.txt")):
            sys.exit(f"coref_litbank: --folds {args.folds}: no fold {fold} in {args.litbank}/splits (LitBank has 0-9)")
    for seed in args.seeds.split(","):
        if not seed.isdigit():
            sys.exit(f"coref_litbank: --seeds {args.seeds}: {seed!r} is not a seed (whole numbers >= 0, comma-separated)")
    for arm in args.arms.split(","):
        if arm not in ARMS:
            sys.exit(f"coref_litbank: --arms {args.arms}: {arm!r} is not an arm (pretrained and/or random)")


def run_settings(args, arm):
    """Everything besides the fold and seed that decides a run's result: a finished run in --work is reused only
    under the same settings (another checkpoint, recipe or budget is another run)."""
    given = vars(args)  # benchmarks/pretraining/masking_ablation.py calls with a namespace of its own, without every option
    settings = {"arm": arm, "recipe": os.path.abspath(args.recipe), "recipe_sha256": file_sha256(args.recipe),
                **{key: given.get(key) for key in ("epochs", "encoder_lr", "head_lr", "ffnn_size",
                                                   "max_segment_length", "bf16_autocast", "cpu", "train_docs",
                                                   "eval_docs")},
                "override": list(given.get("override") or []),
                "litbank": os.path.abspath(given.get("litbank") or LITBANK)}
    if arm == "pretrained":
        settings.update(checkpoint=os.path.abspath(args.checkpoint), checkpoint_sha256=file_sha256(args.checkpoint))
    return settings


def file_sha256(path, _cache={}):
    """The content hash of a file (once per file and modification per process)."""
    key = (os.path.abspath(path), os.stat(path).st_mtime_ns, os.stat(path).st_size)
    if key not in _cache:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _cache[key] = digest.hexdigest()
    return _cache[key]


def checkpoint_settings(checkpoint):
    """(model sizes, the data folder with its tokenizer) of a pre-trained checkpoint."""
    from fairseq import checkpoint_utils

    import spanbert_plugin.registry  # noqa: F401  (registers the plugin, safe-loading allowlist)
    from spanbert_plugin.model.hub_interface import resolve_data_dir

    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    model = state["cfg"]["model"]
    return {key: model[key] for key in SIZE_KEYS}, resolve_data_dir(checkpoint, None, state)


def prepare_fold(args, fold, tokenizer_from, max_segment_length):
    """The fold's prepared folder (made once) and the command that made it."""
    folder = os.path.join(args.work, f"fold{fold}_seg{max_segment_length}_n{args.train_docs or 'all'}"
                          + (f"_eval{args.eval_docs}" if args.eval_docs else ""))
    command_file = folder + ".command.txt"
    if os.path.isdir(folder):
        with open(command_file) as f:
            return folder, f.read().strip()
    splits = os.path.join(args.litbank, "splits", f"fold{fold}")
    lists = {split: first_documents(args.work, fold, os.path.join(splits, f"{split}.txt"), keep)
             for split, keep in (("train", args.train_docs), ("dev", args.eval_docs), ("test", args.eval_docs))}
    commands = []
    run([os.path.join(BIN, "spanbert-prepare-coref"), "--train", lists["train"], "--valid", lists["dev"],
         "--test", lists["test"], "--tokenizer-from", tokenizer_from, "--destdir", folder,
         "--max-segment-length", str(max_segment_length)], commands)
    with open(command_file, "w") as f:
        f.write(commands[0] + "\n")
    return folder, commands[0]


def first_documents(work, fold, split_list, keep):
    """``split_list`` itself, or with ``keep`` a list of its first ``keep`` documents written under ``work``."""
    if not keep:
        return split_list
    base = os.path.dirname(split_list)
    with open(split_list) as f:
        kept = [os.path.join(base, line.strip()) for line in f if line.strip()][:keep]
    name = os.path.basename(split_list)[:-len(".txt")]
    path = os.path.join(work, f"fold{fold}_{name}{keep}.txt")
    with open(path, "w") as f:
        f.write("\n".join(kept) + "\n")
    return path


def training_documents(data):
    with open(os.path.join(data, "prepare_stats.json")) as f:
        return json.load(f)["train"]["documents"]


def finetune_command(args, data, sizes, arm, seed, save_dir):
    updates = args.epochs * training_documents(data)
    command = [os.path.join(BIN, "fairseq-hydra-train"), "--config-dir", os.path.dirname(args.recipe),
               "--config-name", os.path.basename(args.recipe)[:-len(".yaml")], hydra_override("task.data", data),
               hydra_override("checkpoint.save_dir", save_dir), f"common.seed={seed}", f"optimization.max_epoch={args.epochs}",
               "common.log_format=json", "common.log_interval=10", f"common.cpu={str(args.cpu).lower()}",
               f"task.bf16_autocast={str(args.bf16_autocast).lower()}", f"task.coref_ffnn_size={args.ffnn_size}",
               f"optimizer.groups.default.lr_float={args.encoder_lr}",
               f"optimizer.groups.coref_head.lr_float={args.head_lr}",
               f"optimizer.groups.default.lr_scheduler.warmup_updates={round(updates / 10)}",
               f"optimizer.groups.default.lr_scheduler.total_num_update={updates}",
               f"optimizer.groups.coref_head.lr_scheduler.total_num_update={updates}"]
    if arm == "pretrained":
        command.append(hydra_override("checkpoint.finetune_from_model", os.path.abspath(args.checkpoint)))
    else:  # random initialisation of the checkpoint's shape
        command += [f"++model.{key}={value}" for key, value in sizes.items()]
    return command + args.override


def test_scores(eval_json):
    with open(eval_json) as f:
        scores = json.load(f)
    row = {f"test_{m}_f1": scores["with_singletons"][m]["f1"] for m in METRICS}
    row.update(test_conll_f1=scores["with_singletons"]["conll_f1"],
               test_mentions_f1=scores["with_singletons"]["mentions"]["f1"],
               test_conll_f1_without_singletons=scores["without_singletons"]["conll_f1"])
    row.update({f"test_{m}_f1": scores["with_singletons"][m]["f1"] for m in OTHER_METRICS if m in scores["with_singletons"]})
    return row, scores["documents"]


def run_name(args, fold, arm, seed):
    """(the run's name in --work, its settings): keyed by every setting that decides the result."""
    settings = run_settings(args, arm)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return f"fold{fold}_{arm}_seed{seed}_{key}", settings


def finetune_and_test(args, fold, data, sizes, arm, seed):
    name, settings = run_name(args, fold, arm, seed)
    result_path = os.path.join(args.work, "runs", name + ".json")
    save_dir = os.path.join(args.work, "runs", name)
    if os.path.isfile(result_path):
        with open(result_path) as f:
            result = json.load(f)
        if result.get("settings") != settings:  # a key collision, or a record edited by hand: never reused
            sys.exit(f"coref_litbank: {result_path}: a finished run of other settings under this run's key; "
                     "move it away or use another --work")
        if getattr(args, "singleton_thresholds", None) and "singleton_threshold_dev" not in result:  # added to a finished run
            tune_singleton_threshold(args, name, save_dir, result)
            with open(result_path, "w") as f:
                json.dump(result, f, indent=2)
        return result
    # the training commands (a stopped run is started again with the same command and resumes from
    # checkpoint_last.pt); train_command.txt.done marks a finished training
    command_file = os.path.join(save_dir, "train_command.txt")
    if not os.path.isfile(command_file + ".done"):
        command = finetune_command(args, data, sizes, arm, seed, save_dir)
        os.makedirs(save_dir, exist_ok=True)
        with open(command_file, "a") as f:
            f.write(relative_to_root(shlex.join(command)) + "\n")
        run(command, [], progress=epoch_progress(args.epochs))
        open(command_file + ".done", "w").close()
    with open(command_file) as f:
        commands = [line.strip() for line in f if line.strip()]
    with open(os.path.join(save_dir, "hydra", "hydra_train.log")) as f:
        records = [json.loads(line[line.index("{"):]) for line in f if "{" in line and '"valid_conll_f1"' in line
                   or '"train_num_updates"' in line]
    dev = [float(r["valid_conll_f1"]) for r in records if "valid_conll_f1" in r]
    epochs = [r for r in records if "train_num_updates" in r]  # end-of-epoch summaries: that epoch's training time
    result = {"fold": fold, "arm": arm, "seed": seed, "settings": settings,
              "best_dev_conll_f1": max(dev), "dev_conll_f1_per_epoch": dev,
              # seconds of training per update (one document window each), from fairseq's own clock
              "train_seconds_per_document": sum(float(r["train_train_wall"]) for r in epochs)
              / float(epochs[-1]["train_num_updates"])}
    for variant, extra in (("", []), ("_no_singleton_output", ["--no-singletons"])):
        out = os.path.join(args.work, "runs", f"{name}_test{variant}")
        start = time.perf_counter()
        run([os.path.join(BIN, "spanbert-predict-coref"), "--checkpoint", os.path.join(save_dir, "checkpoint_best.pt"),
             "--split", "test", "--out", out, "--force", *(["--cpu"] if args.cpu else []), *extra], commands)
        seconds = time.perf_counter() - start
        row, documents = test_scores(os.path.join(out, "eval.json"))
        if variant:
            result["test_conll_f1_no_singleton_output"] = row["test_conll_f1"]
            result["test_conll_f1_no_singleton_output_without_singletons"] = row["test_conll_f1_without_singletons"]
        else:
            result.update(row)
            result["predict_seconds_per_document"] = seconds / documents  # the whole command: start-up included
    result["commands"] = commands
    if getattr(args, "singleton_thresholds", None):
        tune_singleton_threshold(args, name, save_dir, result)
    with open(result_path, "w") as f:
        json.dump(result, f, indent=2)
    return result


def tune_singleton_threshold(args, name, save_dir, result):
    """The singleton threshold with the best dev CoNLL F1 (with singletons) among --singleton-thresholds, and the
    test scores at it (``test_conll_f1`` stays the checkpoint's own threshold)."""
    checkpoint = os.path.join(save_dir, "checkpoint_best.pt")
    device = ["--cpu"] if args.cpu else []
    out = os.path.join(args.work, "runs", f"{name}_dev_thresholds")
    run([os.path.join(BIN, "spanbert-predict-coref"), "--checkpoint", checkpoint, "--split", "valid", "--out", out,
         "--force", "--singleton-threshold-sweep", ",".join(f"{t:g}" for t in args.singleton_thresholds), *device],
        result["commands"])
    with open(os.path.join(out, "singleton_thresholds.json")) as f:
        swept = json.load(f)
    dev = {t: swept[f"{t:g}"]["with_singletons"]["conll_f1"] for t in args.singleton_thresholds}
    best = max(dev, key=dev.get)
    out = os.path.join(args.work, "runs", f"{name}_test_threshold{best:g}")
    run([os.path.join(BIN, "spanbert-predict-coref"), "--checkpoint", checkpoint, "--split", "test", "--out", out,
         "--force", "--singleton-threshold", str(best), *device], result["commands"])
    row = test_scores(os.path.join(out, "eval.json"))[0]
    result.update(singleton_threshold_dev=best, dev_conll_f1_per_threshold={f"{t:g}": v for t, v in dev.items()},
                  test_conll_f1_dev_threshold=row["test_conll_f1"],
                  test_mentions_f1_dev_threshold=row["test_mentions_f1"])


RUN_HEADER = re.compile(r"# fold (\d+), (\S+), seed (\d+)")  # a run's section in commands.txt


def included_runs(folders):
    """{(fold, arm, seed): record with its commands} from earlier --out folders of this command, and the lines that
    say where they came from; a run found in two of them is refused."""
    runs, origin, preamble = {}, {}, []
    for folder in folders:
        paths = [os.path.join(folder, name) for name in ("runs.jsonl", "commands.txt")]
        if not all(os.path.isfile(path) for path in paths):
            sys.exit(f"coref_litbank: --include {folder}: expected an --out folder of this command (runs.jsonl and "
                     "commands.txt)")
        commands, section = {}, None
        with open(paths[1]) as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        preamble.append(f"# runs included from {folder}, whose commands.txt begins:")
        for line in lines:
            if match := RUN_HEADER.fullmatch(line):
                section = commands.setdefault((int(match[1]), match[2], int(match[3])), [])
            elif section is None:
                preamble.append(line if line.startswith("#") else f"#   {line}")
            else:
                section.append(line)
        with open(paths[0]) as f:
            for record in (json.loads(line) for line in f if line.strip()):
                key = (int(record["fold"]), record["arm"], int(record["seed"]))
                if key in runs:
                    sys.exit(f"coref_litbank: --include {folder}: fold {key[0]}, {key[1]}, seed {key[2]} is also in "
                             f"{origin[key]}")
                runs[key], origin[key] = dict(record, commands=commands.get(key, [])), folder
    return runs, origin, preamble


def taken_text(taken):
    """summary.md's line on the runs --include took, {folder: [(fold, arm, seed), ...]}."""
    def run(fold, arm, seed):
        return f"fold {fold} seed {seed}" + ("" if arm == "pretrained" else f" ({arm})")

    return "\nRuns taken from earlier outputs of this command (not trained here): " + "; ".join(
        f"`{os.path.relpath(folder, ROOT)}`: " + ", ".join(run(*key) for key in keys)
        for folder, keys in taken.items()) + "\n"


def mean_sd(values):
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def fold_means(results):
    """One row per (arm, fold): the mean over its seeds."""
    rows = []
    for arm in dict.fromkeys(r["arm"] for r in results):
        for fold in sorted({r["fold"] for r in results if r["arm"] == arm}):
            runs = [r for r in results if r["arm"] == arm and r["fold"] == fold]
            row = {"arm": arm, "fold": fold, "seeds": len(runs)}
            for key in ("best_dev_conll_f1", "test_conll_f1", "test_conll_f1_without_singletons", "test_mentions_f1"):
                row[key] = statistics.mean(r[key] for r in runs)
            rows.append(row)
    return rows


def summary(results, folds):
    lines = ["Test scores, mean ± sd over folds (each fold: the mean over its seeds); CoNLL F1 with singletons as "
             "LitBank is scored, and without (OntoNotes convention).", "",
             "| arm | folds | seeds per fold | CoNLL F1 | without singletons | mentions F1 | best dev CoNLL F1 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for arm in dict.fromkeys(r["arm"] for r in folds):
        rows = [r for r in folds if r["arm"] == arm]
        lines.append(f"| {arm} | {len(rows)} | {'/'.join(str(r['seeds']) for r in rows)} | "
                     f"{mean_sd([r['test_conll_f1'] for r in rows])} | "
                     f"{mean_sd([r['test_conll_f1_without_singletons'] for r in rows])} | "
                     f"{mean_sd([r['test_mentions_f1'] for r in rows])} | "
                     f"{mean_sd([r['best_dev_conll_f1'] for r in rows])} |")
    lines += ["", "Per run (test, with singletons unless said):", "",
              "| fold | arm | seed | MUC F1 | B3 F1 | CEAF-e F1 | CoNLL F1 | no singleton output | without singletons "
              "| s/train doc | s/test doc |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        train_cost = r.get("train_seconds_per_document")
        lines.append(f"| {r['fold']} | {r['arm']} | {r['seed']} | {r['test_muc_f1']:.1f} | {r['test_bcub_f1']:.1f} | "
                     f"{r['test_ceafe_f1']:.1f} | {r['test_conll_f1']:.1f} | "
                     f"{r['test_conll_f1_no_singleton_output']:.1f} | {r['test_conll_f1_without_singletons']:.1f} | "
                     f"{'' if train_cost is None else f'{train_cost:.2f}'} | {r['predict_seconds_per_document']:.2f} |")
    tuned = [r for r in results if "singleton_threshold_dev" in r]
    if tuned:
        lines += ["", "Singleton threshold chosen on dev CoNLL F1 (with singletons), test scored at it:", "",
                  "| fold | arm | seed | dev CoNLL F1 per threshold | chosen | test CoNLL F1 | test mentions F1 |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in tuned:
            per = ", ".join(f"{t}: {v:.1f}" for t, v in r["dev_conll_f1_per_threshold"].items())
            lines.append(f"| {r['fold']} | {r['arm']} | {r['seed']} | {per} | {r['singleton_threshold_dev']:g} | "
                         f"{r['test_conll_f1_dev_threshold']:.1f} | {r['test_mentions_f1_dev_threshold']:.1f} |")
        values = [r["test_conll_f1_dev_threshold"] for r in tuned]
        lines += ["", f"Mean over these runs: {mean_sd(values)} (at 0.5: "
                      f"{mean_sd([r['test_conll_f1'] for r in tuned])})"]
    lines += ["", "Published (10-fold mean, with singletons): " + "; ".join(f"{k}: {v}" for k, v in PUBLISHED.items())]
    return "\n".join(lines) + "\n"


PAIRED_METRICS = ("test_conll_f1", "test_conll_f1_dev_threshold")


def read_baseline(baseline_csvs):
    """{(fold, arm, seed): row} of other runs of this command (their results.csv files, whose runs together make the
    baseline); a run in two of them is refused."""
    baseline = {}
    for path in baseline_csvs:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                key = (int(row["fold"]), row["arm"], int(row["seed"]))
                if key in baseline:
                    sys.exit(f"coref_litbank: --paired-with {os.path.dirname(path)}: fold {key[0]}, {key[1]}, seed "
                             f"{key[2]} is also in another of its folders")
                baseline[key] = row
    return baseline


def paired_with(results, baseline, margin, metrics=PAIRED_METRICS):
    """Each of ``metrics`` minus the same fold, arm and seed in the ``baseline`` runs (``read_baseline``'s): the
    paired mean, its 95% interval and a TOST p against +-``margin``, over the pairs both hold."""
    rows = []
    for metric in metrics:
        pairs = [(r, baseline[key]) for r in results
                 if (key := (int(r["fold"]), r["arm"], int(r["seed"]))) in baseline
                 and r.get(metric) not in (None, "") and baseline[key].get(metric) not in (None, "")]
        if not pairs:
            continue
        stats = paired_difference([float(r[metric]) - float(b[metric]) for r, b in pairs], margin)
        rows.append({"metric": metric, "pairs": " ".join(f"{r['fold']}/{r['seed']}" for r, _ in pairs),
                     "mean": stats["mean"], "low": stats["low"], "high": stats["high"], "tost_p": stats["tost_p"],
                     "margin": margin})
    return rows


def paired_text(rows, baselines):
    lines = ["", f"Paired with `{'`, `'.join(baselines)}` (this run minus it, same fold and seed; pairs as fold/seed; TOST: equal "
             f"within the margin when p < 0.05):", "",
             "| metric | pairs | mean difference | 95% interval | TOST p | margin |", "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        tost = "–" if row["tost_p"] is None else f"{row['tost_p']:.3f}"
        lines.append(f"| {row['metric']} | {row['pairs']} | {row['mean']:+.2f} | {interval_text(row)} | {tost} | "
                     f"±{row['margin']:g} |")
    return "\n".join(lines) + "\n"


def plot(folds, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    arms = list(dict.fromkeys(r["arm"] for r in folds))
    for i, arm in enumerate(arms):
        rows = [r for r in folds if r["arm"] == arm]
        ax.plot([r["fold"] + (i - (len(arms) - 1) / 2) * 0.15 for r in rows], [r["test_conll_f1"] for r in rows], "o",
                label=f"{arm} (mean {statistics.mean(r['test_conll_f1'] for r in rows):.1f})")
    for (label, value), style in zip(PUBLISHED.items(), ("--", ":")):
        ax.axhline(value, color="grey", linestyle=style, label=f"{label}: {value}")
    ax.set_xlabel("LitBank fold")
    ax.set_ylabel("test CoNLL F1 (with singletons)")
    ax.set_xticks(sorted({r["fold"] for r in folds}))
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_outputs(out, results, folds, paired, text, preamble):
    """results.csv, folds.csv, paired.csv (with ``paired``), summary.md, runs.jsonl, commands.txt and folds.png."""
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        fields = list(dict.fromkeys(k for r in results for k in r
                                    if k not in ("dev_conll_f1_per_epoch", "commands", "dev_conll_f1_per_threshold",
                                                 "settings")))
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
    with open(os.path.join(out, "folds.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(folds[0]))
        writer.writeheader()
        writer.writerows(folds)
    if paired is not None:
        with open(os.path.join(out, "paired.csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["metric", "pairs", "mean", "low", "high", "tost_p", "margin"])
            writer.writeheader()
            writer.writerows(paired)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "runs.jsonl"), "w") as f:  # with each run's dev curves (commands.txt: commands)
        f.writelines(json.dumps({k: v for k, v in r.items() if k != "commands"}) + "\n" for r in results)
    with open(os.path.join(out, "commands.txt"), "w") as f:
        f.write("".join(f"{line}\n" for line in preamble))
        for r in results:
            f.write(f"# fold {r['fold']}, {r['arm']}, seed {r['seed']}\n" + "".join(f"{c}\n" for c in r["commands"]))
    plot(folds, os.path.join(out, "folds.png"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="pre-trained spanbert checkpoint (e.g. spanbert-import-hf)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this command")
    parser.add_argument("--folds", default="0", help="folds to run: '0-9', '0,3' (default 0)")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--arms", default="pretrained", help="pretrained and/or random, comma-separated")
    parser.add_argument("--recipe", default=os.path.join(ROOT, "configs", "finetune", "litbank.yaml"))
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--encoder-lr", type=float, default=2e-5)
    parser.add_argument("--head-lr", type=float, default=2e-4)
    parser.add_argument("--ffnn-size", type=int, default=3000)
    parser.add_argument("--max-segment-length", type=int, default=384)
    parser.add_argument("--bf16-autocast", action="store_true", help="fine-tune under bfloat16 autocast")
    parser.add_argument("--cpu", action="store_true", help="train and predict on the CPU even where CUDA is available")
    parser.add_argument("--singleton-thresholds", type=lambda text: [float(t) for t in text.split(",")],
                        help="also choose the singleton threshold among these (e.g. 0.3,0.4,0.5,0.6) by dev CoNLL F1 "
                        "and score test at it (results: test_conll_f1_dev_threshold)")
    parser.add_argument("--train-docs", type=int, help="keep the first N training documents (smoke tests)")
    parser.add_argument("--eval-docs", type=int, help="keep the first N dev and test documents (smoke tests)")
    parser.add_argument("--override", nargs="*", default=[], help="hydra overrides appended to every fine-tuning run")
    parser.add_argument("--litbank", default=LITBANK)
    parser.add_argument("--work", default=os.path.join(ROOT, "benchmarks", "out", "coref_work"))
    parser.add_argument("--paired-with", metavar="OUT", nargs="+", default=[],
                        help="another --out of this command (e.g. the encoder as it came), or several whose runs "
                        "together make the baseline: paired differences by fold and seed in paired.csv and summary.md")
    parser.add_argument("--paired-metrics", type=lambda text: text.split(","), default=list(PAIRED_METRICS),
                        help="results.csv columns to pair (default test_conll_f1,test_conll_f1_dev_threshold; e.g. "
                        "also test_conll_f1_no_singleton_output)")
    parser.add_argument("--include", nargs="+", default=[], metavar="OUT",
                        help="earlier --out folders of this command: their finished runs are taken from there, not "
                        "trained (runs made on another machine join this summary)")
    parser.add_argument("--equivalence-margin", type=float, default=2.7,
                        help="margin of the TOST in the paired differences (default 2.7, SpanBERT's SBO gain)")
    args = parser.parse_args()
    if not re.fullmatch(r"[0-9,\-]+", args.folds):
        sys.exit(f"coref_litbank: --folds {args.folds!r}: expected folds such as 0-9 or 0,3")
    check_run_flags(args)
    for folder in args.paired_with:
        if not os.path.isfile(os.path.join(folder, "results.csv")):
            sys.exit(f"coref_litbank: --paired-with {folder}: expected a folder with this command's results.csv")
    baseline = read_baseline([os.path.join(folder, "results.csv") for folder in args.paired_with])
    if baseline and (missing := [m for m in args.paired_metrics if not any(m in row for row in baseline.values())]):
        sys.exit(f"coref_litbank: --paired-metrics {','.join(missing)}: not a column of the --paired-with results.csv")
    included, origin, prepared = included_runs(args.include)
    inputs = [args.checkpoint, args.work, args.litbank, args.recipe, *args.paired_with, *args.include]
    try:  # before hours of fine-tuning: an --out this command may not replace is refused now
        check_destination(args.out, COMMAND, inputs, args.force, "--out")
    except OutputError as err:
        sys.exit(f"coref_litbank: {err}")
    if not os.path.isfile(args.checkpoint):
        sys.exit(f"coref_litbank: --checkpoint {args.checkpoint}: no such file (expected a spanbert checkpoint)")
    os.makedirs(os.path.join(args.work, "runs"), exist_ok=True)
    sizes, tokenizer_from = checkpoint_settings(args.checkpoint)
    invocation = shlex.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    results, taken = [], {}
    for fold in parse_folds(args.folds):
        keys = [(fold, arm, int(seed)) for seed in args.seeds.split(",") for arm in args.arms.split(",")]
        if not all(key in included for key in keys):
            data, command = prepare_fold(args, fold, tokenizer_from, min(args.max_segment_length,
                                                                         int(sizes["max_positions"])))
            prepared.append(command)
        for key in keys:
            if key in included:
                results.append(included[key])
                taken.setdefault(origin[key], []).append(key)
            else:
                results.append(finetune_and_test(args, fold, data, sizes, key[1], key[2]))
    folds = fold_means(results)
    text = summary(results, folds)
    if taken:
        text += taken_text(taken)
    paired = None
    if args.paired_with:
        paired = paired_with(results, baseline, args.equivalence_margin, args.paired_metrics)
        text += paired_text(paired, [os.path.relpath(folder, ROOT) for folder in args.paired_with])
    with atomic_directory(args.out, COMMAND, inputs, args.force, "--out") as out:
        write_outputs(out, results, folds, paired, text, [f"# {invocation}", *prepared])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
