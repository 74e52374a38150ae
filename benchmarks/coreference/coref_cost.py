#!/usr/bin/env python
"""Coreference cost by document length: seconds and peak memory per document, training and prediction.

Documents of 1k, 2k, 4k, 8k and 16k words are made by concatenating LitBank
documents (whole sentences, clusters kept), prepared with the BERT uncased
vocabulary (segments of 384 tokens), and run through a random-init spanbert of
the chosen shape with the coreference head: one training step (forward,
backward, Adam) or one prediction (forward, no gradients). Every measurement
runs in a fresh process, so its peak resident memory (and, on CUDA, peak
allocated GPU memory) is its own.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/coreference/coref_cost.py --shapes tiny,base \
        --sizes 1000,2000,4000,8000,16000 --out benchmarks/coreference/coref_cost

Writes ``results.json``, ``results.md`` (a table, and the growth factor per
doubling of the document) and ``results.png`` (time and memory against length)
to ``--out``. ``--from-results FOLDER`` measures nothing: it writes the table and
plot of FOLDER's ``results.json`` (its rows too) to ``--out``, which may be FOLDER
itself. ``--steps`` repeats each measurement in its process and reports the
median after ``--warmup`` untimed ones (base shapes on a CPU: ``--warmup 0``, a
step takes minutes). ``--mention-loss-weight W`` trains with the mention loss
(default 0: the antecedent loss alone). ``--max-training-segments N``
measures training as c2f-coref trains long documents (a window of N segments).
"""
import argparse
import json
import math
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from command_output import relative_to_root, save_figure_atomic  # noqa: E402
SHARED = os.path.join(ROOT, "..", "shared", "data")
COMMAND = "coref_cost.py"  # recorded in --out's manifest: --force replaces only this script's output
SHAPES = {  # layers, hidden, ffn, heads, head FFNN size (SpanBERT's c2f uses 3000 with base/large)
    "tiny": (2, 128, 512, 2, 150),
    "base": (12, 768, 3072, 12, 3000),
}


def concatenated_document(litbank: str, words: int) -> dict:
    """A JSON-lines document of ``words`` words: LitBank documents in name order, cut at a sentence end."""
    from spanbert_plugin.coref.conll import read_documents

    names = sorted(n for n in os.listdir(os.path.join(litbank, "coref")) if n.endswith(".conll"))
    sentences, clusters, offset = [], [], 0
    for name in names * 100:  # repeated when 100 documents are not enough
        doc = read_documents(os.path.join(litbank, "coref", name))[0]
        kept = 0
        for s in range(int(doc.sentence_ids[-1]) + 1):
            sentence = [w for w, i in zip(doc.words, doc.sentence_ids) if i == s]
            if offset + kept + len(sentence) > words:
                break
            sentences.append(sentence)
            kept += len(sentence)
        clusters += [[[offset + a, offset + b] for a, b in c if b < kept] for c in doc.clusters]
        offset += kept
        if kept < len(doc.words):
            break
    return {"doc_key": f"litbank_{words}", "sentences": sentences, "clusters": [c for c in clusters if c]}


def prepare(words: int, work: str, litbank: str, vocab: str) -> str:
    """A coreference data folder holding the one document of ``words`` words (cached in ``work``)."""
    from spanbert_plugin.cli.prepare_coref import main as prepare_coref
    from spanbert_plugin.cli.prepare import main as prepare_tokenizer

    tok = os.path.join(work, "tok")
    if not os.path.isdir(tok):
        text = os.path.join(work, "t.txt")
        with open(text, "w") as f:
            f.write("tokenizer folder\n")
        assert prepare_tokenizer(["--train", text, "--valid", text, "--destdir", tok, "--tokenizer", "wordpiece",
                                  "--wordpiece-vocab", vocab, "--lowercase"]) == 0
    data = os.path.join(work, f"doc{words}")
    if not os.path.isdir(data):
        path = os.path.join(work, f"doc{words}.jsonl")
        with open(path, "w") as f:
            f.write(json.dumps(concatenated_document(litbank, words)) + "\n")
        assert prepare_coref(["--train", path, "--tokenizer-from", tok, "--destdir", data]) == 0
    return data


def mode_label(mode: str, max_training_segments: int, mention_loss_weight: float) -> str:
    """The mode as the results name it: training's window and mention loss spelled out."""
    if mode == "train" and max_training_segments:
        mode = f"train ({max_training_segments} segments)"
    if mode.startswith("train") and mention_loss_weight:
        mode += f", mention loss {mention_loss_weight:g}"
    return mode


def measure(data: str, shape: str, mode: str, steps: int, cpu: bool, warmup: int = 1, max_training_segments: int = 0,
            mention_loss_weight: float = 0.0) -> dict:
    """Seconds (median of ``steps`` after ``warmup`` untimed steps) and peak memory of one document, in this process."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    layers, hidden, ffn, heads, head_ffnn = SHAPES[shape]
    args = options.parse_args_and_arch(options.get_training_parser(), [
        data, "--user-dir", os.path.join(ROOT, "user_dir"), "--task", "coreference", "--criterion", "coreference",
        "--arch", "spanbert_base", "--encoder-layers", str(layers), "--encoder-embed-dim", str(hidden),
        "--encoder-ffn-embed-dim", str(ffn), "--encoder-attention-heads", str(heads),
        "--coref-ffnn-size", str(head_ffnn), "--max-training-segments", str(max_training_segments),
        "--mention-loss-weight", str(mention_loss_weight),
        "--batch-size", "1", "--optimizer", "adam", "--lr", "1e-5",
        *(["--cpu"] if cpu else [])])
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(0)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    device = torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    model.to(device)
    task.load_dataset("train", training=True)
    dataset = task.dataset("train")
    from fairseq import utils

    sample = utils.apply_to_sample(lambda t: t.to(device), dataset.collater([dataset[0]]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    times = []
    for _ in range(steps + warmup):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        if mode == "train":
            model.train()
            loss, _, _ = criterion(model, sample)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            model.eval()
            with torch.no_grad():
                criterion(model, sample)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    result = {"shape": shape, "mode": mode_label(mode, max_training_segments, mention_loss_weight),
              "words": int(dataset.arrays["doc_words"][0]),
              "tokens": int(dataset.sizes[0]), "segments": int(len(dataset.arrays["segment_lengths"])),
              "seconds": statistics.median(times[warmup:]),
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "device": device.type}
    if device.type == "cuda":
        result["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
    return result


ROW_KEYS = ("shape", "mode", "words")
MEASURED_KEYS = ("tokens", "seconds", "peak_rss_mib")


def check_rows(results, source: str) -> None:
    """UsageError naming ``source`` unless it holds this script's rows: a list of measured or failed sizes."""
    from spanbert_plugin.core.errors import UsageError

    if not isinstance(results, list) or not results:
        raise UsageError(f"--from-results {source}: expected a list of this script's rows")
    for number, row in enumerate(results, 1):
        needed = ROW_KEYS + (("error",) if isinstance(row, dict) and "error" in row else MEASURED_KEYS)
        if not isinstance(row, dict) or not set(needed) <= set(row):
            raise UsageError(f"--from-results {source}: row {number} is not one of this script's "
                             f"(an object with {', '.join(needed)})")


def per_doubling(before: dict, after: dict, key: str) -> float:
    """The factor ``key`` grows by per doubling of the words between two rows (their word counts differ by any ratio)."""
    return (after[key] / before[key]) ** (1 / math.log2(after["words"] / before["words"]))


def table(results) -> str:
    """The measured rows (a GPU column where a row ran on one), then a line for each size that failed."""
    done = [r for r in results if "error" not in r]
    gpu = any("peak_gpu_mib" in r for r in done)
    lines = ["| shape | mode | words | tokens | s / document | peak RSS (MiB) | " + ("peak GPU (MiB) | " if gpu else "")
             + "x time per doubling | x memory per doubling |",
             "| --- | --- | --- | --- | --- | --- | " + ("--- | " if gpu else "") + "--- | --- |"]
    previous = {}
    for r in done:
        key = (r["shape"], r["mode"])
        before = previous.get(key)
        grew = before is not None and r["words"] > before["words"]  # a size measured twice has no doubling
        growth_t = f"{per_doubling(before, r, 'seconds'):.2f}" if grew else ""
        growth_m = f"{per_doubling(before, r, 'peak_rss_mib'):.2f}" if grew else ""
        gpu_cell = (f"{r['peak_gpu_mib']:,.0f} | " if "peak_gpu_mib" in r else "– | ") if gpu else ""
        lines.append(f"| {r['shape']} | {r['mode']} | {r['words']:,} | {r['tokens']:,} | {r['seconds']:.2f} | "
                     f"{r['peak_rss_mib']:,.0f} | {gpu_cell}{growth_t} | {growth_m} |")
        previous[key] = r
    failed = [f"- {r['shape']} {r['mode']} {r['words']:,} words: failed: {r['error']}" for r in results if "error" in r]
    return "\n".join(lines + ([""] + failed if failed else [])) + "\n"


def plot(results, path: str) -> None:
    """Seconds and peak memory per document against its words, log-log, a line per shape and mode; a size that
    failed is marked on the memory panel beside its line's last point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    lines = {}
    for r in results:
        lines.setdefault((r["shape"], r["mode"]), []).append(r)
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (shape, mode), rows in lines.items():
        done = [r for r in rows if "error" not in r]
        if not done:
            continue
        style = dict(marker="o", linestyle="-" if shape == "base" else "--", label=f"{shape}, {mode}")
        drawn = time_ax.plot([r["words"] for r in done], [r["seconds"] for r in done], **style)[0]
        memory_ax.plot([r["words"] for r in done], [r["peak_rss_mib"] / 1024 for r in done], color=drawn.get_color(),
                       **style)
        for r in rows:
            if "error" in r:
                memory_ax.annotate(f"{r['words']:,} words:\nfailed", (done[-1]["words"], done[-1]["peak_rss_mib"] / 1024),
                                   xytext=(8, -2), textcoords="offset points", ha="left", va="top", fontsize=8,
                                   color=drawn.get_color())
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:,g}")
    for ax, label in ((time_ax, "seconds per document"), (memory_ax, "peak resident memory (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.set_xlabel("document length (words)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = time_ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Coreference cost by document length: one training step or one prediction per document", fontsize=10)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure_atomic(fig, path)


def write_outputs(out: str, results: list, command: str, source: str = "") -> None:
    """results.json, results.md and results.png in ``out``; ``source``: the results.json the rows were read from."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    origin = f"The rows of `{source}` as it was, drawn by:" if source else "Command:"
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(table(results) + f"\n{origin}\n\n    {command}\n")
    plot(results, os.path.join(out, "results.png"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="tiny,base")
    parser.add_argument("--sizes", default="1000,2000,4000,8000,16000")
    parser.add_argument("--modes", default="train,predict")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per measurement (the median is reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--max-training-segments", type=int, default=0,
                        help="train on a random window of this many segments (c2f-coref's max_training_sentences)")
    parser.add_argument("--mention-loss-weight", type=float, default=0.0,
                        help="training with the mention loss (the documents hold LitBank's singletons); 0: without")
    parser.add_argument("--out", help="folder for results.json and results.md (default: print only)")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "spanbert_coref_cost"))
    parser.add_argument("--litbank", default=os.path.join(SHARED, "litbank"))
    parser.add_argument("--vocab", default=os.path.join(SHARED, "bert_uncased_vocab", "vocab.txt"))
    parser.add_argument("--cpu", action="store_true", help="measure on the CPU even where CUDA is available")
    parser.add_argument("--from-results", metavar="FOLDER",
                        help="measure nothing: write the table and plot of FOLDER/results.json to --out")
    parser.add_argument("--one", nargs=3, metavar=("DATA", "SHAPE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(measure(*args.one, steps=args.steps, cpu=args.cpu, warmup=args.warmup,
                                             max_training_segments=args.max_training_segments,
                                             mention_loss_weight=args.mention_loss_weight)))
        return 0
    from spanbert_plugin.core.file_utils import OutputError, atomic_directory, check_destination, read_json
    from spanbert_plugin.core.errors import UsageError

    command = relative_to_root(shlex.join([os.path.abspath(__file__), *(sys.argv[1:] if argv is None else argv)]))
    if args.from_results:
        if not args.out:
            parser.error("--from-results needs --out (a new folder, or an earlier one of this script with --force)")
        source = os.path.join(args.from_results, "results.json")
        try:
            results = read_json(source, "--from-results")
            check_rows(results, source)
            # read whole before the swap: --out may be the folder it came from, which it then replaces
            with atomic_directory(args.out, COMMAND, [], args.force, "--out") as out:
                write_outputs(out, results, command, relative_to_root(os.path.abspath(source)))
        except UsageError as err:
            sys.exit(f"coref_cost: {err}")
        print(table(results), end="")
        return 0
    inputs = [args.litbank, args.vocab, args.work]
    if args.out:
        try:  # before minutes of measurements: an --out this script may not replace is refused now
            check_destination(args.out, COMMAND, inputs, args.force, "--out")
        except OutputError as err:
            sys.exit(f"coref_cost: {err}")
    os.makedirs(args.work, exist_ok=True)
    results = []
    for shape in args.shapes.split(","):
        for mode in args.modes.split(","):
            for words in map(int, args.sizes.split(",")):
                data = prepare(words, args.work, args.litbank, args.vocab)
                proc = subprocess.run([sys.executable, __file__, "--one", data, shape, mode, "--steps", str(args.steps),
                                       "--warmup", str(args.warmup), "--max-training-segments", str(args.max_training_segments),
                                       "--mention-loss-weight", str(args.mention_loss_weight)]
                                      + (["--cpu"] if args.cpu else []), capture_output=True, text=True)
                line = next((out for out in proc.stdout.splitlines() if out.startswith("RESULT ")), None)
                if line is None:  # e.g. out of memory: recorded, the larger sizes of this shape and mode are skipped
                    results.append({"shape": shape, "words": words, "error": proc.stderr.strip()[-300:],
                                    "mode": mode_label(mode, args.max_training_segments, args.mention_loss_weight)})
                    print(f"{shape} {mode} {words}: failed: {proc.stderr.strip()[-300:]}", flush=True)
                    break
                results.append(json.loads(line[len("RESULT "):]))
                print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.out:
        try:
            with atomic_directory(args.out, COMMAND, inputs, args.force, "--out") as out:
                write_outputs(out, results, command)
        except OutputError as err:
            sys.exit(f"coref_cost: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
