#!/usr/bin/env python
"""Extractive QA inference, ours against transformers, on the same fine-tuned weights.

From raw SQuAD JSON to answers, as a user runs each side:

* ``ours``: ``spanbert-prepare-qa --valid`` (windows of 384 tokens, doc stride 128) then
  ``spanbert-predict-qa`` (fairseq batches windows by length);
* ``transformers``: ``BertForQuestionAnswering`` on the ``spanbert-export-hf`` export of the same checkpoint,
  with the feature building and post-processing of transformers' ``run_qa`` example, written out here (the
  pinned transformers 5.x has no question-answering pipeline): the fast tokenizer with
  ``truncation="only_second"``, ``max_length=384``, ``stride=128`` (tokens shared by neighbouring windows),
  ``padding="max_length"`` (the example's default), batches of 8 (its default evaluation batch); per
  question the best start + end logit over every window's 20 best starts and ends, answers of at most 30
  tokens, text cut from the context by the offset mapping.

Each side runs as its own process (imports and loading included) and is timed from outside; the sides
alternate for ``--rounds`` rounds. ``--bf16`` adds both sides under bfloat16 autocast, and with
``--fp32-recheck-margin M`` ours with ``spanbert-predict-qa --bf16 --fp32-recheck-margin M``; ``--sides`` runs a
subset. With ours in fp32 and bf16, a sweep over M is simulated from their outputs (bf16's answer, or fp32's
where bf16's leads by less than M): table and ``fp32_recheck_sweep.png``. Prints and writes
(``--out``) questions per second, the speed over transformers in fp32, EM/F1 of each side with the official
SQuAD 1.1 metrics, and the share of questions whose answer string is identical to transformers' in fp32, with a
plot of the speeds (``questions_per_second.png``). ``--from-results FOLDER`` measures nothing: it writes the table
and plots of FOLDER's ``results.json`` to ``--out``, which may be FOLDER itself.

    .venv/bin/python benchmarks/against_transformers/qa_inference.py --checkpoint CKPT --tokenizer-from IMPORTED \\
        --skip-articles 5 --questions 1000 --threads 1 --out benchmarks/against_transformers/results/qa_inference

``CKPT``: an extractive_qa checkpoint fine-tuned from the imported encoder (``side_by_side.py --task squad
--keep-checkpoint``); ``IMPORTED``: the spanbert-import-hf folder it was prepared with. ``--skip-articles``
leaves out the dev articles the checkpoint was trained on.
"""
import argparse
import collections
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COMMAND = "qa_inference.py"  # recorded in --out's manifest: --force replaces only this script's output
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.dirname(sys.executable)
SQUAD_DEV = os.path.join(os.path.dirname(ROOT), "shared", "data", "squad", "dev-v1.1.json")
sys.path.insert(0, ROOT)


def held_out_questions(squad: str, skip_articles: int, questions: int, path: str) -> int:
    """Write the SQuAD file of the first ``questions`` questions after ``skip_articles`` articles (0: all)."""
    with open(squad, encoding="utf-8") as f:
        data = json.load(f)
    kept, total = [], 0
    for article in data["data"][skip_articles:]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = paragraph["qas"][:questions - total] if questions else paragraph["qas"]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
                total += len(qas)
        if paragraphs:
            kept.append({**article, "paragraphs": paragraphs})
        if questions and total >= questions:
            break
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": data.get("version", "1.1"), "data": kept}, f)
    return total


def transformers_side(hf_dir: str, squad: str, out: str, threads: int, bf16: bool = False, batch_size: int = 8,
                      max_length: int = 384, stride: int = 128, n_best: int = 20, max_answer_length: int = 30) -> None:
    """run_qa's evaluation path: features, logits, post-processing; writes {id: answer} to ``out``.

    ``bf16``: the model under bfloat16 autocast, as ours runs with ``spanbert-predict-qa --bf16``."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer, BertForQuestionAnswering

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = BertForQuestionAnswering.from_pretrained(hf_dir).eval()
    with open(squad, encoding="utf-8") as f:
        examples = [(qa["id"], qa["question"].lstrip(), p["context"])
                    for a in json.load(f)["data"] for p in a["paragraphs"] for qa in p["qas"]]
    features = tokenizer([q for _, q, _ in examples], [c for _, _, c in examples], truncation="only_second",
                         max_length=max_length, stride=stride, return_overflowing_tokens=True,
                         return_offsets_mapping=True, padding="max_length")
    example_of = features["overflow_to_sample_mapping"]
    names = [n for n in ("input_ids", "token_type_ids", "attention_mask") if n in features]
    starts, ends = [], []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for lo in range(0, len(example_of), batch_size):
            batch = {n: torch.tensor(features[n][lo:lo + batch_size]) for n in names}
            output = model(**batch)
            starts.append(output.start_logits.float().numpy())
            ends.append(output.end_logits.float().numpy())
    starts, ends = np.concatenate(starts), np.concatenate(ends)
    windows = collections.defaultdict(list)
    for feature, example in enumerate(example_of):
        windows[example].append(feature)
    answers = {}
    for e, (qid, _, context) in enumerate(examples):
        best, text = -np.inf, ""
        for feature in windows[e]:
            in_context = np.array(features.sequence_ids(feature)) == 1
            offsets = features["offset_mapping"][feature]
            start_logits, end_logits = starts[feature], ends[feature]
            best_ends = np.argsort(end_logits)[::-1][:n_best]
            for s in np.argsort(start_logits)[::-1][:n_best]:
                for t in best_ends:
                    if not (in_context[s] and in_context[t]) or t < s or t - s + 1 > max_answer_length:
                        continue
                    score = start_logits[s] + end_logits[t]
                    if score > best:
                        best, text = score, context[offsets[s][0]:offsets[t][1]]
        answers[qid] = text
    with open(out, "w", encoding="utf-8") as f:
        json.dump(answers, f)


def timed(argv, env) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def scores(squad: str, predictions: dict) -> dict:
    """EM and F1 (percent) with the official SQuAD 1.1 metrics."""
    from spanbert_plugin.qa.squad_metrics import evaluate

    with open(squad, encoding="utf-8") as f:
        questions = [{"id": qa["id"], "answers": [a["text"] for a in qa["answers"]]}
                     for a in json.load(f)["data"] for p in a["paragraphs"] for qa in p["qas"]]
    official = evaluate(questions, predictions)
    return {"exact_match": official["exact"], "f1": official["f1"]}


MARGINS = (0, 0.01, 0.02, 0.04, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 4)


def recheck_sweep(nbest_bf16: dict, bf16: dict, fp32: dict, reference: dict) -> list:
    """Per margin M: the share of questions whose bf16 answer leads by less than M, and the identity of the answers
    when those take fp32's answer (what ``--fp32-recheck-margin M`` does, up to fp32 rounding of other batches)."""
    from spanbert_plugin.qa.predict import answer_lead

    lead = {qid: answer_lead(entries) for qid, entries in nbest_bf16.items()}
    rows = []
    for margin in MARGINS:
        mixed = {qid: fp32[qid] if lead[qid] < margin else answer for qid, answer in bf16.items()}
        rows.append({"margin": margin, "rechecked": sum(lead[q] < margin for q in bf16) / len(bf16),
                     "identical_to_transformers_fp32": sum(mixed.get(k) == v for k, v in reference.items()) / len(reference),
                     "identical_to_ours_fp32": sum(mixed[k] == v for k, v in fp32.items()) / len(fp32)})
    return rows


def plot_sweep(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    rechecked = [100 * r["rechecked"] for r in rows]
    for key, label in (("identical_to_transformers_fp32", "vs transformers fp32"), ("identical_to_ours_fp32", "vs ours fp32")):
        ax.plot(rechecked, [100 * r[key] for r in rows], marker="o", label=label)
    for r, x in zip(rows, rechecked):
        ax.annotate(f"{r['margin']:g}", (x, 100 * r["identical_to_ours_fp32"]), fontsize=7, xytext=(2, 4),
                    textcoords="offset points")
    ax.axhline(99, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("questions computed again in fp32 (%)")
    ax.set_ylabel("answers identical (%)")
    ax.set_title("--bf16 --fp32-recheck-margin M (labels: M, logits)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_speed(result: dict, path: str) -> None:
    """Questions per second of each side, labelled with its speed over transformers in fp32 and the share of its
    answers identical to transformers' in fp32."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = list(result["questions_per_second"])
    rates = [result["questions_per_second"][s] for s in sides]
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.5 * len(sides)))
    ax.barh(range(len(sides)), rates, color=["tab:blue" if s.startswith("ours") else "tab:grey" for s in sides])
    ax.set_yticks(range(len(sides)), sides)
    ax.invert_yaxis()
    for y, (side, rate) in enumerate(zip(sides, rates)):
        ax.annotate(f" {rate:.1f}/s, {result['speed_over_transformers_fp32'][side]:.2f}x, "
                    f"{100 * result['identical_to_transformers_fp32'][side]:.2f}% identical", (rate, y),
                    va="center", fontsize=8)
    ax.set_xlim(0, 1.7 * max(rates))
    ax.set_xlabel(f"questions per second (median of {rounds(result)} round(s))")
    ax.set_title(f"QA inference, {result['questions']:,} SQuAD 1.1 dev questions, {result['threads']} thread(s)\n"
                 "labels: questions/s; speed and answers identical, against transformers fp32", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rounds(result: dict) -> int:
    return len(result["seconds"]["transformers"])


def summary(result: dict) -> str:
    """The markdown table of a results.json (the same from a run and from --from-results)."""
    n = result["questions"]
    identical = {s: round(share * n) for s, share in result["identical_to_transformers_fp32"].items()}
    text = (f"# QA inference, ours vs transformers ({n:,} SQuAD 1.1 dev questions, {result['threads']} thread(s), "
            f"{rounds(result)} round(s))\n\n| side | seconds (median) | questions/s | speed over transformers fp32 | "
            "answers identical to transformers fp32 | EM | F1 |\n|---|---|---|---|---|---|---|\n"
            + "".join(f"| {s} | {statistics.median(t):.1f} | {result['questions_per_second'][s]:.2f} | "
                      f"{result['speed_over_transformers_fp32'][s]:.2f}x | {identical[s]:,} ({100 * identical[s] / n:.2f}%) | "
                      f"{result['scores'][s]['exact_match']:.2f} | {result['scores'][s]['f1']:.2f} |\n"
                      for s, t in result["seconds"].items()))
    if "fp32_recheck_sweep" in result:
        text += ("\n## `--bf16 --fp32-recheck-margin M`, simulated: ours bf16, with ours fp32's answer where the bf16 "
                 "answer leads by less than M\n\n| M | questions rechecked | identical to transformers fp32 | "
                 "identical to ours fp32 |\n|---|---|---|---|\n"
                 + "".join(f"| {row['margin']:g} | {100 * row['rechecked']:.2f}% | {100 * row['identical_to_transformers_fp32']:.2f}% "
                           f"| {100 * row['identical_to_ours_fp32']:.2f}% |\n" for row in result["fp32_recheck_sweep"]))
    return text


RESULT_KEYS = ("questions", "threads", "seconds", "questions_per_second", "speed_over_transformers_fp32",
               "identical_to_transformers_fp32", "scores")


def read_results(folder: str) -> tuple:
    """FOLDER's results.json, checked to be this script's, and the command its summary.md says measured it."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.file_utils import read_json

    source = os.path.join(folder, "results.json")
    result = read_json(source, "--from-results")
    if not (isinstance(result, dict) and set(RESULT_KEYS) <= set(result) and "transformers" in result["seconds"]):
        raise UsageError(f"--from-results {source}: not this script's results (an object with "
                         f"{', '.join(RESULT_KEYS)}, transformers among the sides)")
    measured_by = result.get("command")
    if measured_by is None:  # written before results.json recorded it: the summary's first indented line gives it
        try:
            with open(os.path.join(folder, "summary.md"), encoding="utf-8") as f:
                lines = [line for line in f.read().splitlines() if line.startswith("    ")]
            measured_by = lines[0].strip() if lines else None
        except OSError:
            pass
    return result, measured_by


def write_outputs(out: str, result: dict, measured_by, drawn_by: str = "") -> None:
    """results.json, summary.md (the table and the command that measured it) and the plots, in ``out``."""
    if "fp32_recheck_sweep" in result:
        plot_sweep(result["fp32_recheck_sweep"], os.path.join(out, "fp32_recheck_sweep.png"))
    plot_speed(result, os.path.join(out, "questions_per_second.png"))
    with open(os.path.join(out, "results.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(summary(result) + "\n    " + (measured_by or "(the command that measured it was not recorded)") + "\n")
        if drawn_by:
            f.write(f"\nTable and plots drawn again from its results.json by:\n\n    {drawn_by}\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="extractive_qa checkpoint (.pt) fine-tuned from the imported encoder")
    parser.add_argument("--tokenizer-from", help="the spanbert-import-hf folder the checkpoint's data was prepared with")
    parser.add_argument("--squad", default=SQUAD_DEV, help="SQuAD 1.1 JSON (default: the shared dev set)")
    parser.add_argument("--skip-articles", type=int, default=0, help="leave out the first N articles (trained on)")
    parser.add_argument("--questions", type=int, default=0, help="first N questions after them (0: all)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of ours, transformers")
    parser.add_argument("--work", default="/tmp/qa_inference", help="scratch folder")
    parser.add_argument("--out", help="results folder (summary.md, results.json)")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    parser.add_argument("--bf16", action="store_true",
                        help="also both sides under bfloat16 autocast (ours: spanbert-predict-qa --bf16)")
    parser.add_argument("--fp32-recheck-margin", type=float, default=0.0,
                        help="with --bf16, also ours under bf16 with spanbert-predict-qa --fp32-recheck-margin M")
    parser.add_argument("--sides", nargs="+", help="run only these sides (names as in the table; default: all)")
    parser.add_argument("--from-results", metavar="FOLDER",
                        help="measure nothing: write the table and plots of FOLDER/results.json to --out")
    parser.add_argument("--transformers-side", nargs=3, metavar=("HF_DIR", "SQUAD", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.transformers_side:
        transformers_side(*args.transformers_side, threads=args.threads, bf16=args.bf16)
        return 0
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.file_utils import OutputError, atomic_directory, check_destination

    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
    from command_output import relative_to_root

    command = relative_to_root(shlex.join([os.path.abspath(__file__), *sys.argv[1:]]))
    if args.from_results:
        if not args.out:
            parser.error("--from-results needs --out (a new folder, or an earlier one of this script with --force)")
        try:
            result, measured_by = read_results(args.from_results)
            # read whole before the swap: --out may be the folder it came from, which it then replaces
            with atomic_directory(args.out, COMMAND, [], args.force, "--out") as out:
                write_outputs(out, result, measured_by, command)
        except (UsageError, OutputError) as err:
            sys.exit(f"qa_inference: {err}")
        return 0
    if not (args.checkpoint and args.tokenizer_from):
        parser.error("--checkpoint and --tokenizer-from are required")

    inputs = [args.checkpoint, args.tokenizer_from, args.squad, args.work]
    if args.out:
        try:  # before the runs: an --out this script may not replace is refused now
            check_destination(args.out, COMMAND, inputs, args.force, "--out")
        except OutputError as err:
            sys.exit(f"qa_inference: {err}")
    os.makedirs(args.work, exist_ok=True)
    squad = os.path.join(args.work, "questions.json")
    n = held_out_questions(args.squad, args.skip_articles, args.questions, squad)
    hf_dir = os.path.join(args.work, "hf")
    if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        subprocess.run([os.path.join(BIN, "spanbert-export-hf"), "--checkpoint", args.checkpoint, "--out", hf_dir], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    data = os.path.join(args.work, "ours_data")
    prepare = [os.path.join(BIN, "spanbert-prepare-qa"), "--valid", squad, "--tokenizer-from", args.tokenizer_from,
               "--destdir", data, "--max-seq-length", "384", "--doc-stride", "128", "--force"]
    sides = {}  # name: (commands, the predictions file they write)
    for precision in ("fp32", "bf16") if args.bf16 else ("fp32",):
        flag = ["--bf16"] if precision == "bf16" else []
        suffix = "" if precision == "fp32" else " (bf16)"
        predicted = os.path.join(args.work, f"ours_out_{precision}")
        sides["ours" + suffix] = ([prepare, [os.path.join(BIN, "spanbert-predict-qa"), "--checkpoint", args.checkpoint,
                                             "--data", data, "--split", "valid", "--out", predicted, "--cpu", "--force",
                                             *flag]], os.path.join(predicted, "predictions.json"))
        theirs_file = os.path.join(args.work, f"transformers_predictions_{precision}.json")
        sides["transformers" + suffix] = ([[sys.executable, __file__, "--threads", str(args.threads), *flag,
                                            "--transformers-side", hf_dir, squad, theirs_file]], theirs_file)
    if args.bf16 and args.fp32_recheck_margin > 0:
        margin = f"{args.fp32_recheck_margin:g}"
        predicted = os.path.join(args.work, f"ours_out_bf16_recheck_{margin}")
        sides[f"ours (bf16, fp32 recheck {margin})"] = (
            [prepare, [os.path.join(BIN, "spanbert-predict-qa"), "--checkpoint", args.checkpoint, "--data", data,
                       "--split", "valid", "--out", predicted, "--cpu", "--force", "--bf16", "--fp32-recheck-margin",
                       margin]], os.path.join(predicted, "predictions.json"))
    if args.sides:
        unknown = sorted(set(args.sides) - set(sides))
        if unknown or "transformers" not in args.sides:
            parser.error(f"--sides: unknown {unknown} (known: {sorted(sides)}); 'transformers' is the reference")
        sides = {name: side for name, side in sides.items() if name in args.sides}
    seconds = {side: [] for side in sides}
    for r in range(args.rounds):
        for side, (commands, _) in sides.items():
            seconds[side].append(sum(timed(c, env) for c in commands))
        print(f"round {r + 1}: " + ", ".join(f"{side} {t[-1]:.1f} s" for side, t in seconds.items()), flush=True)
    answers = {}
    for side, (_, path) in sides.items():
        with open(path, encoding="utf-8") as f:
            answers[side] = json.load(f)
    reference = answers["transformers"]  # identical answers are counted against transformers in fp32

    def same(side):
        return sum(answers[side].get(k) == v for k, v in reference.items())

    result = {"questions": n, "threads": args.threads, "seconds": seconds,
              "questions_per_second": {s: n / statistics.median(t) for s, t in seconds.items()},
              "speed_over_transformers_fp32": {s: statistics.median(seconds["transformers"]) / statistics.median(t)
                                               for s, t in seconds.items()},
              "identical_to_transformers_fp32": {s: same(s) / n for s in sides},
              "scores": {s: scores(squad, answers[s]) for s in sides}}
    if "ours (bf16)" in answers and "ours" in answers:
        result["ours_bf16_identical_to_ours_fp32"] = sum(answers["ours (bf16)"].get(k) == v
                                                         for k, v in answers["ours"].items()) / n
        with open(os.path.join(args.work, "ours_out_bf16", "nbest_predictions.json"), encoding="utf-8") as f:
            result["fp32_recheck_sweep"] = recheck_sweep(json.load(f), answers["ours (bf16)"], answers["ours"], reference)
    result["command"] = command
    text = summary(result)
    print(text)
    if args.out:
        try:
            with atomic_directory(args.out, COMMAND, inputs, args.force, "--out") as out:
                write_outputs(out, result, command)
        except OutputError as err:
            sys.exit(f"qa_inference: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
