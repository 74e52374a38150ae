#!/usr/bin/env python
"""Coreference of whole novels: cost against length, exact against bounded-memory prediction, and quality.

``scaling``: the opening of a novel (default: *Bleak House* from ../shared/data/litbank/novels) cut at
10k, 40k, 80k, 160k words and whole, each predicted by ``spanbert-predict-coref --text`` in a fresh process with
``--coref-prediction exact`` (up to ``--exact-up-to`` words: past it the exact head needs more memory than this
machine has) and ``bounded``; wall seconds of the command and of the prediction alone, peak resident memory.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/coreference/novel_coref.py scaling \\
        --checkpoint CK --out benchmarks/coreference/coref_novel/scaling

``quality``: on LitBank fold 0 with the same checkpoint, (1) the bounded mode's ``--max-antecedent-distance`` on
the dev excerpts (the best is used below), (2) test CoNLL F1 of bounded (forced) against exact, paired by document,
and (3) the ten
test excerpts concatenated into one ~20k-word document (predicted in bounded memory, as ``auto`` does past 10,000
words) scored against the concatenated gold, beside the excerpts predicted one by one and concatenated; predicted
clusters with mentions in two excerpts are counted.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/coreference/novel_coref.py quality \\
        --checkpoint CK --data PREPARED_FOLD0 --out benchmarks/coreference/coref_novel/quality

Both write ``results.json`` (resumed: finished rows are kept) and ``table.md``; ``scaling`` also ``scaling.png``.
"""
import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from results_file import claim_work_folder, unmarked_folder, write_results_file  # noqa: E402
from timing import run_measured  # noqa: E402

BIN = os.path.join(ROOT, ".venv", "bin")
NOVEL = os.path.join(ROOT, "..", "shared", "data", "litbank", "novels", "1023_bleak_house.txt.gz")
LITBANK = os.path.join(ROOT, "..", "shared", "data", "litbank")
DISTANCES = (250, 500, 1000, 2000)
MARGIN = 1.0  # CoNLL F1 points the concatenation may lose against the excerpts one by one (stated before the run)


def relative(path: str) -> str:
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


WORK_MARK = "novel_coref.work"  # in --work: the folder is this script's (its texts and outputs are replaced)


def load_results(out: str, what: str) -> dict:
    """The earlier results of ``novel_coref.py WHAT`` in ``out`` (continued), or {}; exits with one line when ``out``
    holds anything else."""
    script = f"novel_coref.py {what}"
    refused = unmarked_folder(out, "--out", ("results.json",))
    if refused:
        sys.exit(f"novel_coref.py: {refused}")
    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        return {"script": script}
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = None
    if not isinstance(results, dict) or results.get("script") != script:
        sys.exit(f"novel_coref.py: --out {out}: its results.json is not one of {script}; choose another folder")
    return results


def save_results(out: str, results: dict) -> None:
    write_results_file(os.path.join(out, "results.json"), results)


# -- scaling ----------------------------------------------------------------------------------------------------
def opening(text: str, words: int) -> str:
    """The text up to the end of its ``words``-th word (as spanbert-predict-coref counts words)."""
    from spanbert_plugin.coref.predict import _WORD

    for count, match in enumerate(_WORD.finditer(text), 1):
        if count == words:
            return text[:match.end()] + "\n"
    return text


def measure(command: list) -> dict:
    """Run ``command``; its wall seconds and peak resident memory (GB), from the kernel's accounting of that child."""
    status, output, seconds, peak_gb = run_measured(command, ROOT)
    if status != 0:
        raise SystemExit(f"novel_coref.py: {' '.join(command)} failed ({status}):\n{output[-3000:]}")
    return {"wall_seconds": round(seconds, 1), "peak_gb": round(peak_gb, 3),
            "notice": [line for line in output.splitlines() if "bounded-memory prediction" in line][:1]}


def scaling(args) -> None:
    with gzip.open(args.novel, "rt", encoding="utf-8") as f:
        novel = f.read()
    results = load_results(args.out, "scaling")
    claim_work_folder(args.work, "--work", WORK_MARK, "novel_coref.py")
    rows = results.setdefault("rows", [])
    done = {(r["words_asked"], r["mode"]) for r in rows}
    work = os.path.join(args.work, "scaling")
    os.makedirs(work, exist_ok=True)
    commands = []
    for size in args.sizes.split(","):
        text = novel if size == "all" else opening(novel, int(size))
        path = os.path.join(work, f"opening_{size}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        for mode in ("exact", "bounded"):
            if mode == "exact" and (size == "all" or int(size) > args.exact_up_to):
                continue
            out = os.path.join(work, f"out_{size}_{mode}")
            command = [os.path.join(BIN, "spanbert-predict-coref"), "--checkpoint", args.checkpoint, "--text", path,
                       "--join-wrapped-lines", "--coref-prediction", mode, "--cpu", "--out", out, "--force"]
            commands.append(" ".join(relative(c) if os.sep in c else c for c in command))
            if (size, mode) in done:
                continue
            print(f"== {size} words, {mode}", flush=True)
            row = {"words_asked": size, "mode": mode, **measure(command)}
            with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
                summary = json.load(f)
            row.update({key: summary[key] for key in ("words", "clusters", "mentions", "seconds")})
            row["ms_per_1000_words"] = round(1000 * summary["seconds"] / summary["words"] * 1000, 1)
            rows.append(row)
            results["threads"] = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
            results["checkpoint"] = relative(args.checkpoint)
            results["novel"] = relative(args.novel)
            save_results(args.out, results)
            print(json.dumps(row), flush=True)
    results["commands"] = commands
    save_results(args.out, results)
    write_scaling_table(args.out, results)


def write_scaling_table(out: str, results: dict) -> None:
    rows = sorted(results["rows"], key=lambda r: (r["words"], r["mode"]))
    lines = ["| words | prediction | seconds (prediction) | seconds (command) | ms per 1,000 words | peak memory GB "
             "| clusters | mentions |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['words']:,} | {r['mode']} | {r['seconds']:.1f} | {r['wall_seconds']:.1f} | "
                     f"{r['ms_per_1000_words']:,.0f} | {r['peak_gb']:.2f} | {r['clusters']:,} | {r['mentions']:,} |")
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (memory, seconds) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, marker in (("exact", "s"), ("bounded", "o")):
        mine = [r for r in rows if r["mode"] == mode]
        words = [r["words"] / 1000 for r in mine]
        memory.plot(words, [r["peak_gb"] for r in mine], marker=marker, label=mode)
        seconds.plot(words, [r["seconds"] for r in mine], marker=marker, label=mode)
    memory.axhline(4, color="grey", linestyle=":", label="4 GB")
    memory.set(xlabel="words (thousands)", ylabel="peak resident memory (GB)", title="memory")
    seconds.set(xlabel="words (thousands)", ylabel="prediction seconds", title="time")
    for ax in (memory, seconds):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"spanbert-predict-coref --text on {os.path.basename(results['novel'])}, "
                 f"{results.get('threads', 1)} thread(s)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "scaling.png"), dpi=120)


# -- quality ----------------------------------------------------------------------------------------------------
def conll_f1(gold: list, predicted: list) -> float:
    from spanbert_plugin.coref.predict import evaluation

    return evaluation(gold, predicted, "with_singletons")["conll_f1"]


def predict(model, task, split: str, **options) -> tuple:
    from spanbert_plugin.coref.predict import apply_prediction_options, predict_documents

    apply_prediction_options(task, **options)
    predicted, gold, _ = predict_documents(model, task, split, (), lambda line: None)
    return predicted, gold


def paired(differences: list) -> dict:
    from scipy import stats

    d = np.asarray(differences, dtype=float)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 and d.std() > 0 else 0.0
    return {"mean": round(float(d.mean()), 3), "ci95": [round(float(d.mean() - half), 3),
                                                        round(float(d.mean() + half), 3)], "n": len(d)}


def concatenated_conll(split_file: str, path: str) -> list:
    """One CoNLL document of every document listed in ``split_file`` in order (cluster ids made distinct); returns
    each excerpt's number of words."""
    from spanbert_plugin.coref.conll import read_documents

    folder = os.path.dirname(split_file)
    with open(split_file, encoding="utf-8") as f:
        names = [os.path.normpath(os.path.join(folder, line.strip())) for line in f if line.strip()]
    lines, sizes = ["#begin document (fold0_test_concatenated); part 0"], []
    for number, name in enumerate(names):
        sizes.append(len(read_documents(name)[0].words))
        with open(name, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if line.startswith("#"):
                    continue
                if not line.strip():
                    lines.append("")
                    continue
                columns = line.split("\t")
                columns[0] = "fold0_test_concatenated"
                if columns[-1] not in ("", "-", "_"):
                    columns[-1] = re.sub(r"\d+", lambda m: str(1000 * number + int(m.group(0))), columns[-1])
                lines.append("\t".join(columns))
    lines.append("#end document")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return sizes


def quality(args) -> None:
    import torch

    from spanbert_plugin.core.finetune_io import load_finetuned_checkpoint

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    results = load_results(args.out, "quality")
    claim_work_folder(args.work, "--work", WORK_MARK, "novel_coref.py")
    model, task, _ = load_finetuned_checkpoint(args.checkpoint, "coreference", args.data, True)
    results.update({"checkpoint": relative(args.checkpoint), "data": relative(args.data), "margin": MARGIN})
    if "dev_distance" not in results:
        dev = {}
        for distance in DISTANCES:
            predicted, gold = predict(model, task, "valid", coref_prediction="bounded",
                                      max_antecedent_distance=distance)
            dev[str(distance)] = round(conll_f1(gold, predicted), 3)
            print(f"dev, --max-antecedent-distance {distance}: CoNLL F1 {dev[str(distance)]}", flush=True)
        predicted, gold = predict(model, task, "valid", coref_prediction="exact")
        results["dev_distance"] = {"bounded": dev, "exact": round(conll_f1(gold, predicted), 3)}
        save_results(args.out, results)
    dev = results["dev_distance"]["bounded"]
    chosen = int(max(dev, key=lambda distance: (dev[distance], -int(distance))))  # the best dev F1, then the shortest
    results["chosen_on_dev"] = chosen
    if "test" not in results:
        exact, gold = predict(model, task, "test", coref_prediction="exact")
        bounded, _ = predict(model, task, "test", coref_prediction="bounded", max_antecedent_distance=chosen)
        per_document = [conll_f1([g], [b]) - conll_f1([g], [e]) for g, e, b in zip(gold, exact, bounded)]
        results["test"] = {"exact": round(conll_f1(gold, exact), 3), "bounded": round(conll_f1(gold, bounded), 3),
                           "identical_documents": sum(e == b for e, b in zip(exact, bounded)),
                           "documents": len(gold), "bounded_minus_exact_per_document": paired(per_document),
                           "max_antecedent_distance": chosen}
        save_results(args.out, results)
        print("test:", json.dumps(results["test"]), flush=True)
    if "concatenation" not in results:
        results["concatenation"] = concatenation(args, model, task, chosen)
        save_results(args.out, results)
        print("concatenation:", json.dumps(results["concatenation"]), flush=True)
    write_quality_table(args.out, results)


def concatenation(args, model, excerpts_task, max_antecedent_distance: int) -> dict:
    from spanbert_plugin.core.finetune_io import load_finetuned_checkpoint

    work = os.path.join(args.work, "concatenation")
    os.makedirs(work, exist_ok=True)
    conll = os.path.join(work, "fold0_test_concatenated.conll")
    sizes = concatenated_conll(os.path.join(LITBANK, "splits", "fold0", "test.txt"), conll)
    prepared = os.path.join(work, "prepared")
    with open(os.path.join(args.data, "coref_meta.json"), encoding="utf-8") as f:
        segment = json.load(f)["max_segment_length"]  # segmented as the excerpts are (and as the model's positions allow)
    subprocess.run([os.path.join(BIN, "spanbert-prepare-coref"), "--test", conll, "--tokenizer-from", args.data,
                    "--destdir", prepared, "--force", "--max-segment-length", str(segment)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    one_by_one, _ = predict(model, excerpts_task, "test", coref_prediction="exact")
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    as_one = [[(s + int(offsets[n]), e + int(offsets[n])) for s, e in c] for n, doc in enumerate(one_by_one)
              for c in doc]
    _, concat_task, _ = load_finetuned_checkpoint(args.checkpoint, "coreference", prepared, True)
    excerpt_of = np.searchsorted(offsets, np.arange(offsets[-1]), side="right") - 1
    with open(os.path.join(prepared, "test.docs.jsonl"), encoding="utf-8") as f:
        words = json.loads(f.readline())["words"]
    result = {"words": int(offsets[-1]), "excerpts": len(sizes)}
    # the exact head on the same long document: what the bounded mode is an approximation of
    for mode, options in (("bounded", {"coref_prediction": "auto", "max_antecedent_distance": max_antecedent_distance}),
                          ("exact", {"coref_prediction": "exact"})):
        started = time.perf_counter()
        predicted, gold = predict(model, concat_task, "test", **options)
        seconds = time.perf_counter() - started
        crossing = [c for c in predicted[0] if len({int(excerpt_of[s]) for s, _ in c}) > 1]
        split = [part for c in predicted[0] for part in split_at(c, excerpt_of)]
        result[mode] = {
            "conll_f1": round(conll_f1(gold, predicted), 3), "clusters": len(predicted[0]),
            "clusters_across_excerpts": len(crossing),
            "conll_f1_split_at_excerpts": round(conll_f1(gold, [split]), 3),
            "crossing_clusters_commonest_mention": [most_common_mention(c, words) for c in crossing],
            "prediction_seconds": round(seconds, 1)}
    result["conll_f1_excerpts_one_by_one"] = round(conll_f1(gold, [as_one]), 3)
    result["difference"] = round(result["bounded"]["conll_f1"] - result["conll_f1_excerpts_one_by_one"], 3)
    result["within_margin"] = result["difference"] >= -MARGIN
    result["bounded_minus_exact"] = round(result["bounded"]["conll_f1"] - result["exact"]["conll_f1"], 3)
    return result


def split_at(cluster: list, excerpt_of) -> list:
    """A cluster cut into its parts in each excerpt."""
    parts = {}
    for s, e in cluster:
        parts.setdefault(int(excerpt_of[s]), []).append((s, e))
    return list(parts.values())


def most_common_mention(cluster: list, words: list) -> str:
    from collections import Counter

    texts = Counter(" ".join(words[s:e + 1]).lower() for s, e in cluster)
    text, count = texts.most_common(1)[0]
    return f"{text} ({count} of {len(cluster)})"


def write_quality_table(out: str, results: dict) -> None:
    dev, test, concat = results["dev_distance"], results["test"], results["concatenation"]
    b, e = concat["bounded"], concat["exact"]
    d = test["bounded_minus_exact_per_document"]
    lines = [
        "LitBank fold 0, one checkpoint, CoNLL F1 with singletons.", "",
        "| dev: --max-antecedent-distance | " + " | ".join(dev["bounded"]) + " | exact |",
        "| --- |" + " --- |" * (len(dev["bounded"]) + 1),
        "| bounded | " + " | ".join(f"{v:.2f}" for v in dev["bounded"].values()) + f" | {dev['exact']:.2f} |", "",
        "| test (10 excerpts) | CoNLL F1 |", "| --- | --- |",
        f"| exact | {test['exact']:.2f} |",
        f"| bounded, --max-antecedent-distance {test['max_antecedent_distance']} | {test['bounded']:.2f} |",
        f"| bounded - exact, per document (mean, 95% CI) | {d['mean']:+.2f} [{d['ci95'][0]:+.2f}, "
        f"{d['ci95'][1]:+.2f}] |",
        f"| documents with identical clusters | {test['identical_documents']} of {test['documents']} |", "",
        f"| the ten test excerpts as one {concat['words']:,}-word document | bounded | exact |",
        "| --- | --- | --- |",
        f"| CoNLL F1 of the concatenation | {b['conll_f1']:.2f} | {e['conll_f1']:.2f} |",
        f"| ... with clusters cut at excerpt boundaries | {b['conll_f1_split_at_excerpts']:.2f} | "
        f"{e['conll_f1_split_at_excerpts']:.2f} |",
        f"| predicted clusters across two excerpts | {b['clusters_across_excerpts']} of {b['clusters']} | "
        f"{e['clusters_across_excerpts']} of {e['clusters']} |",
        f"| prediction seconds | {b['prediction_seconds']:.1f} | {e['prediction_seconds']:.1f} |",
        f"| the excerpts predicted one by one (exact), concatenated | {concat['conll_f1_excerpts_one_by_one']:.2f} | |",
        f"| bounded concatenation - one by one (margin: -{results['margin']}) | {concat['difference']:+.2f} | |",
    ]
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scaling")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--novel", default=NOVEL)
    s.add_argument("--sizes", default="10000,40000,80000,160000,all")
    s.add_argument("--exact-up-to", type=int, default=80000)
    s.add_argument("--work", default="/tmp/novel_coref")
    s.add_argument("--out", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--checkpoint", required=True)
    q.add_argument("--data", required=True, help="spanbert-prepare-coref output of LitBank fold 0")
    q.add_argument("--work", default="/tmp/novel_coref")
    q.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    (scaling if args.what == "scaling" else quality)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
