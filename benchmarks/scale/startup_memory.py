#!/usr/bin/env python
"""What a pre-training rank holds when it starts, at corpus sizes up to billions of tokens, and where it grows.

Starting ``fairseq-train`` does not look at the text, only at how many documents and tokens the prepared split
has: so the splits here are made, in seconds, as ``spanbert-prepare`` lays them out (its ``dict.txt`` for the BERT
uncased vocabulary, fairseq's memory-mapped ``train.bin/.idx`` of uint16 token ids), with random word ids and
document lengths drawn around ``--document-tokens`` (Wikipedia's articles: about 4.4 billion WordPiece tokens in
about 6 million documents with BookCorpus's books). Each size starts ``spanbert_tiny`` with the base recipe's
data settings (512-token blocks, batch 16, ``--num-workers 2``) up to its first update in a fresh process
(``first_update_probe.py``): the anonymous memory of the rank's main process and of its data loader's workers
(what a rank holds), the file-backed pages (the memory-mapped corpus, which the kernel can drop), the peak, and
the seconds, at each start-up stage. A line through the sizes gives the growth per billion tokens and the
estimate at Wikipedia + BookCorpus and at ten times that.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scale/startup_memory.py --out benchmarks/scale/startup_memory

Writes ``results.json`` and ``table.md``; an existing ``--out`` is replaced only with ``--force`` and only when it
is this script's. ``--work`` holds the generated splits, each removed once measured (the largest is 2 bytes a token).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from command_output import relative_to_root, write_atomic  # noqa: E402
from results_file import add_results_options, claim_outputs, write_results_file  # noqa: E402

BIN = os.path.join(ROOT, ".venv", "bin")
VOCAB = os.path.join(ROOT, "..", "shared", "data", "bert_uncased_vocab", "vocab.txt")
NOVEL = os.path.join(ROOT, "..", "shared", "data", "litbank", "novels")
SPANBERT_TOKENS = 4.38e9  # Wikipedia + BookCorpus, 3.3 billion words at LitBank's 1.33 WordPiece tokens a word
WORK_MARK = "startup_memory.work"
TRAIN = ["--user-dir", "user_dir", "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch",
         "spanbert_tiny", "--tokens-per-sample", "512", "--batch-size", "16", "--num-workers", "2", "--optimizer",
         "torch_adamw", "--lr", "1e-4", "--cpu", "--max-update", "1", "--disable-validation", "--no-save",
         "--log-format", "json", "--log-interval", "1"]


def small_folder(work: str) -> str:
    """A real prepared folder (dict.txt and a valid split) from a novel's opening, for the generated train splits."""
    folder = os.path.join(work, "prepared")
    if os.path.exists(os.path.join(folder, "dict.txt")):
        return folder
    import gzip

    name = sorted(n for n in os.listdir(NOVEL) if n.endswith(".txt.gz"))[0]
    text = os.path.join(work, "opening.txt")
    with gzip.open(os.path.join(NOVEL, name), "rt", encoding="utf-8") as f, open(text, "w", encoding="utf-8") as out:
        out.write(f.read()[:200_000])
    subprocess.run([os.path.join(BIN, "spanbert-prepare"), "--train", text, "--valid", text, "--join-wrapped-lines",
                    "--tokenizer", "wordpiece", "--wordpiece-vocab", VOCAB, "--lowercase", "--destdir", folder,
                    "--force"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return folder


def generated_split(work: str, prepared: str, tokens: int, document_tokens: int, seed: int) -> tuple:
    """A folder with ``prepared``'s dictionary and valid split and a train split of about ``tokens`` random word
    ids in documents of exponentially distributed length (mean ``document_tokens``, at least 10)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset, data_file_path, index_file_path

    folder = os.path.join(work, f"tokens_{tokens}")
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(prepared):  # the dictionary, the tokenizer's record, the valid split
        if not name.startswith("train."):
            shutil.copy(os.path.join(prepared, name), folder)
    with open(os.path.join(prepared, "dict.txt"), encoding="utf-8") as f:
        symbols = sum(1 for _ in f)
    rng = np.random.default_rng(seed)
    sizes = np.maximum(10, rng.exponential(document_tokens, size=int(1.2 * tokens / document_tokens))).astype(np.int64)
    sizes = sizes[: np.searchsorted(np.cumsum(sizes), tokens) + 1]
    prefix = os.path.join(folder, "train")
    with open(data_file_path(prefix), "wb") as out:
        for start in range(0, len(sizes), 100_000):
            count = int(sizes[start : start + 100_000].sum())
            # ids past the 4 special symbols and the dictionary's first rows: words, so every block masks
            out.write(rng.integers(1000, 4 + symbols - 10, size=count, dtype=np.uint16).tobytes())
    with MMapIndexedDataset.Index.writer(index_file_path(prefix), np.uint16) as index:
        index.write(sizes)
    return folder, int(sizes.sum()), len(sizes)


def probe(folder: str, record: str) -> list:
    command = [os.path.join(BIN, "python"), os.path.join(ROOT, "benchmarks", "scale", "first_update_probe.py"), record,
               "--", folder, *TRAIN, "--save-dir", os.path.join(folder, "checkpoints")]  # not ./checkpoints
    done = subprocess.run(command, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists(record):
        sys.exit(f"startup_memory.py: {' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    with open(record, encoding="utf-8") as f:
        return json.load(f)


def summary(readings: list) -> dict:
    """Per stage: the main process's and the workers' proportional anonymous and file-backed MB, the main
    process's peak."""
    rows = {}
    for reading in readings:
        workers = reading["workers"]
        rows[reading["stage"]] = {
            "seconds": reading["seconds"],
            "main_anon_mb": reading["main"]["Pss_Anon"],
            "main_file_mb": reading["main"]["Pss_File"],
            "main_peak_mb": reading["main"]["VmHWM"],
            "workers": len(workers),
            "workers_anon_mb": round(sum(w["Pss_Anon"] for w in workers), 1),
            "workers_file_mb": round(sum(w["Pss_File"] for w in workers), 1),
        }
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="0.1,0.4,1.6", help="train split sizes, billions of tokens")
    parser.add_argument("--document-tokens", type=int, default=730, help="mean tokens per document")
    add_results_options(parser, "/tmp/startup_memory")
    args = parser.parse_args(argv)
    results_path = claim_outputs(args, "startup_memory.py", ("points", "growth"), WORK_MARK)
    prepared = small_folder(args.work)
    points = []
    for billions in (float(size) for size in args.tokens.split(",")):
        folder, tokens, documents = generated_split(args.work, prepared, int(billions * 1e9), args.document_tokens, 0)
        stages = summary(probe(folder, os.path.join(args.work, f"record_{tokens}.json")))
        shutil.rmtree(folder)
        points.append({"tokens": tokens, "documents": documents, "stages": stages})
        print(json.dumps(points[-1]), flush=True)
    first, last = points[0], points[-1]
    # growth is read when the first batch is in hand: start-up is done, and the update's own activations (which
    # depend on the batch drawn, not on the corpus) are not yet counted
    ready = "first batch in hand"
    for point in points:
        row = point["stages"][ready]
        row["rank_anon_mb"] = round(row["main_anon_mb"] + row["workers_anon_mb"], 1)
    growth = {}
    for key in ("rank_anon_mb", "main_anon_mb", "workers_anon_mb", "main_file_mb", "seconds"):
        slope = (last["stages"][ready][key] - first["stages"][ready][key]) / (last["tokens"] - first["tokens"])
        growth[key] = {
            "per_billion_tokens": round(slope * 1e9, 2),
            "wikipedia_bookcorpus": round(first["stages"][ready][key] + slope * (SPANBERT_TOKENS - first["tokens"]), 1),
            "ten_times": round(first["stages"][ready][key] + slope * (10 * SPANBERT_TOKENS - first["tokens"]), 1),
        }
    write_results_file(results_path, {
        "points": points, "growth": growth, "document_tokens": args.document_tokens,
        "command": relative_to_root(" ".join(["benchmarks/scale/startup_memory.py", *(argv if argv is not None else sys.argv[1:])])),
        "train_arguments": TRAIN,
    })
    lines = ["| train tokens | documents | stage | seconds | main: anonymous MB | workers: anonymous MB | "
             "main: file-backed MB | main: peak MB |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for point in points:
        for stage, row in point["stages"].items():
            lines.append(f"| {point['tokens']:,} | {point['documents']:,} | {stage} | {row['seconds']} | "
                         f"{row['main_anon_mb']} | {row['workers_anon_mb']} ({row['workers']}) | {row['main_file_mb']} | "
                         f"{row['main_peak_mb']} |")
    lines += ["", "| with the first batch in hand, MB or s | per billion tokens | Wikipedia + BookCorpus (4.4 B tokens) "
              "| ten times |",
              "| --- | --- | --- | --- |"]
    for key, row in growth.items():
        lines.append(f"| {key} | {row['per_billion_tokens']} | {row['wikipedia_bookcorpus']} | {row['ten_times']} |")
    write_atomic(os.path.join(args.out, "table.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
