#!/usr/bin/env python
"""What preparing SpanBERT's corpus would take, on paper from two measured sizes.

Two corpora cut from LitBank's 100 novels (``--sizes`` in MB of text, whole novels in name order, a document each,
as ``--join-wrapped-lines`` reads a file) are prepared by ``spanbert-prepare`` (WordPiece, BERT uncased vocabulary,
``--workers``), each in a fresh process: wall seconds and peak resident memory (of the process and the workers it
waited for). A line through the two points, time = a + b x tokens and memory = c + d x tokens, is read at
Wikipedia + BookCorpus (3.3 billion words, SpanBERT's corpus, at this corpus's tokens per word) and at ten times
that. What starting a training rank on such a corpus takes is ``startup_memory.py``'s (measured up to 1.6 billion
tokens: it needs no text).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scale/scale_estimate.py --workers 2 --out benchmarks/scale/scale_estimate

Writes ``results.json`` and ``table.md``; an existing ``--out`` is replaced only with ``--force`` and only when it
is this script's.
"""
import argparse
import gzip
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from command_output import write_atomic  # noqa: E402
from results_file import add_results_options, claim_outputs, write_results_file  # noqa: E402
from timing import run_measured  # noqa: E402

BIN = os.path.join(ROOT, ".venv", "bin")
NOVELS = os.path.join(ROOT, "..", "shared", "data", "litbank", "novels")
VOCAB = os.path.join(ROOT, "..", "shared", "data", "bert_uncased_vocab", "vocab.txt")
SPANBERT_WORDS = 3.3e9  # Wikipedia (2.5 B) + BookCorpus (0.8 B) words, as BERT and SpanBERT report them
WORK_MARK = "scale_estimate.work"


def measured(command: list) -> dict:
    status, output, seconds, peak_gb = run_measured(command, ROOT, dict(os.environ, OMP_NUM_THREADS="1"))
    if status != 0:
        sys.exit(f"scale_estimate.py: {' '.join(command)} failed:\n{output[-3000:]}")
    return {"seconds": round(seconds, 1), "peak_gb": round(peak_gb, 3)}


def corpus(work: str, megabytes: float) -> tuple:
    """A folder of novels in name order, one file (one document) each, up to ``megabytes`` of text (train), and the
    first novel's opening as valid text."""
    train = os.path.join(work, f"novels_{megabytes:g}MB")
    valid = os.path.join(work, "valid.txt")
    os.makedirs(train, exist_ok=True)
    names = sorted(n for n in os.listdir(NOVELS) if n.endswith(".txt.gz"))
    written, words = 0, 0
    for name in names:
        with gzip.open(os.path.join(NOVELS, name), "rt", encoding="utf-8") as f:
            text = f.read()
        if written and written + len(text.encode()) > megabytes * 1e6:
            break
        with open(os.path.join(train, name[:-len(".gz")]), "w", encoding="utf-8") as out:
            out.write(text)
        written += len(text.encode())
        words += len(text.split())
    with gzip.open(os.path.join(NOVELS, names[0]), "rt", encoding="utf-8") as f, \
            open(valid, "w", encoding="utf-8") as out:
        out.write(f.read()[:200_000])
    return train, valid, written, words


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="15,60", help="two corpus sizes, MB of text")
    parser.add_argument("--workers", type=int, default=2)
    add_results_options(parser, "/tmp/scale_estimate")
    args = parser.parse_args(argv)
    results_path = claim_outputs(args, "scale_estimate.py", ("points", "estimates"), WORK_MARK)
    points = []
    for megabytes in (float(size) for size in args.sizes.split(",")):
        train, valid, size, words = corpus(args.work, megabytes)
        data = os.path.join(args.work, f"data_{megabytes:g}MB")
        prepare = measured([os.path.join(BIN, "spanbert-prepare"), "--train", train, "--valid", valid,
                            "--join-wrapped-lines", "--tokenizer", "wordpiece", "--wordpiece-vocab", VOCAB,
                            "--lowercase", "--workers", str(args.workers), "--destdir", data, "--force"])
        with open(os.path.join(data, "prepare_stats.json"), encoding="utf-8") as f:
            tokens = json.load(f)["train"]["tokens"]
        points.append({"megabytes": round(size / 1e6, 1), "words": words, "tokens": tokens, "prepare": prepare})
        print(json.dumps(points[-1]), flush=True)
    (p, q) = points
    if q["tokens"] <= p["tokens"]:
        sys.exit(f"scale_estimate.py: --sizes {args.sizes}: the second corpus is not larger than the first (whole "
                 "novels are taken); choose sizes further apart, the larger second")
    tokens_per_word = q["tokens"] / q["words"]
    estimates = {}
    for name, words in (("wikipedia_bookcorpus", SPANBERT_WORDS), ("ten_times", 10 * SPANBERT_WORDS)):
        tokens = words * tokens_per_word
        row = {"words": words, "tokens": round(tokens)}
        for stage in ("prepare",):
            for key in ("seconds", "peak_gb"):
                slope = (q[stage][key] - p[stage][key]) / (q["tokens"] - p["tokens"])
                row[f"{stage}_{key}"] = round(p[stage][key] + slope * (tokens - p["tokens"]), 1)
                row[f"{stage}_{key}_per_billion_tokens"] = round(slope * 1e9, 3)
        estimates[name] = row
    write_results_file(results_path, {"points": points, "estimates": estimates, "workers": args.workers,
                                      "tokens_per_word": round(tokens_per_word, 3)})
    lines = ["| corpus | words | WordPiece tokens | prepare: seconds | prepare: peak GB |",
             "| --- | --- | --- | --- | --- |"]
    for point in points:
        lines.append(f"| {point['megabytes']} MB of novels (measured) | {point['words']:,} | {point['tokens']:,} | "
                     f"{point['prepare']['seconds']} | {point['prepare']['peak_gb']} |")
    for name, row in estimates.items():
        lines.append(f"| {name.replace('_', ' ')} (line through the two) | {row['words']:,.0f} | {row['tokens']:,} | "
                     f"{row['prepare_seconds']:,.0f} | {row['prepare_peak_gb']} |")
    write_atomic(os.path.join(args.out, "table.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
