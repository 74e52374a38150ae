"""spanbert-prepare against fairseq's own recipe, end to end, at equal workers: time and peak memory.

Input: LitBank's Project Gutenberg novels (gzip, hard-wrapped), the first ``--novels`` of them.

* ours: ``spanbert-prepare --train NOVELS --join-wrapped-lines --workers N`` (sentencepiece
  training + encoding, or a WordPiece vocab.txt), one item per document.
* fairseq's recipe, sentencepiece: decompress and join the wrapped paragraphs (one per line),
  train sentencepiece with the same options, encode to pieces with the sentencepiece Python API
  (``spm_encode``'s work, ``num_threads=N``), then ``fairseq-preprocess --only-source --workers N``.
* fairseq's recipe, WordPiece: the same text encoded to WordPiece tokens with ``tokenizers``
  (``RAYON_NUM_THREADS=N``) and ``fairseq-preprocess --only-source --srcdict`` (the BERT vocabulary)
  ``--workers N``.

Each side runs as child processes; its peak memory is the largest total resident memory of
its process tree (sampled every 20 ms). Sides alternate (``benchmarks/common/timing.py``); the ratio
is fairseq's time over ours (above 1: ours is faster).

    .venv/bin/python benchmarks/corpus_preparation/prepare_throughput.py --novels 10 --workers 2 --runs 3
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
from timing import alternating_runs, ratio_line, time_line  # noqa: E402

BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
NOVELS = os.path.join(ROOT, "..", "shared", "data", "litbank", "novels")
BERT_VOCAB = os.path.join(ROOT, "..", "shared", "data", "bert_uncased_vocab", "vocab.txt")

# the fairseq recipe's text step and encoder, in one child process (argv: kind, out, vocab-or-size, workers, files...)
_RECIPE_ENCODE = r"""
import gzip, os, sys
kind, out, setting, workers, files = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
text = os.path.join(out, "train.txt")
with open(text, "w", encoding="utf-8") as f:
    for path in files:
        paragraph = []
        with gzip.open(path, "rt", encoding="utf-8-sig") as g:
            for line in g:
                line = line.strip()
                if line:
                    paragraph.append(line)
                elif paragraph:
                    f.write(" ".join(paragraph) + "\n")
                    paragraph = []
        if paragraph:
            f.write(" ".join(paragraph) + "\n")
with open(text, encoding="utf-8") as f:
    lines = f.read().splitlines()
if kind == "sentencepiece":
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(out, "spm"), vocab_size=int(setting),
                                   character_coverage=0.9995, input_sentence_size=2_000_000, shuffle_input_sentence=True,
                                   num_threads=workers, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=os.path.join(out, "spm.model"))
    encode = lambda batch: [" ".join(p) for p in sp.encode(batch, out_type=str, num_threads=workers)]
else:
    from tokenizers import BertWordPieceTokenizer
    tok = BertWordPieceTokenizer(setting, lowercase=True)
    encode = lambda batch: [" ".join(e.tokens) for e in tok.encode_batch(batch, add_special_tokens=False)]
    with open(setting, encoding="utf-8") as v, open(os.path.join(out, "dict.txt"), "w", encoding="utf-8") as d:
        d.writelines(f"{w.rstrip(chr(10))} 1\n" for w in v)
with open(os.path.join(out, "train.tok"), "w", encoding="utf-8") as f:
    for start in range(0, len(lines), 10000):
        f.writelines(t + "\n" for t in encode(lines[start : start + 10000]))
"""


def _tree_rss(root_pid):
    """Resident memory (bytes) of a process and all its descendants, from /proc."""
    children, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def run_measured(command, env=None):
    """Run ``command``; return its peak process-tree memory in bytes. Fails loudly on a non-zero exit."""
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({proc.returncode}): {err.strip()[-2000:]}")
    return peak[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--novels", type=int, default=100, help="how many LitBank novels (sorted by name)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizer", choices=["sentencepiece", "wordpiece", "both"], default="both")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--wordpiece-vocab", default=BERT_VOCAB, help="BERT vocab.txt (default: the uncased one in shared data)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    files = [os.path.join(NOVELS, n) for n in sorted(os.listdir(NOVELS))[: args.novels]]
    megabytes = sum(_gunzipped_size(f) for f in files) / 1e6
    print(f"corpus: {len(files)} novels, {megabytes:.1f} MB of text; {args.workers} workers; {os.cpu_count()} cores")
    kinds = ["sentencepiece", "wordpiece"] if args.tokenizer == "both" else [args.tokenizer]
    work = tempfile.mkdtemp(prefix="prepare_throughput_")
    try:
        for kind in kinds:
            setting = str(args.vocab_size) if kind == "sentencepiece" else args.wordpiece_vocab
            ours_options = ["--vocab-size", setting] if kind == "sentencepiece" else ["--wordpiece-vocab", setting, "--lowercase"]
            peaks = {"ours": [], "fairseq": []}

            def ours(step, kind=kind, ours_options=ours_options, peaks=peaks):
                out = os.path.join(work, f"ours_{kind}")
                env = dict(os.environ, RAYON_NUM_THREADS="1")  # N processes of one thread each
                peaks["ours"].append(run_measured(
                    [os.path.join(BIN, "spanbert-prepare"), "--train", *files, "--join-wrapped-lines", "--workers",
                     str(args.workers), "--destdir", out, "--force", *ours_options], env))

            def fairseq(step, kind=kind, setting=setting, peaks=peaks):
                out = os.path.join(work, f"fairseq_{kind}")
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(out)
                env = dict(os.environ, RAYON_NUM_THREADS=str(args.workers))
                peak = run_measured([sys.executable, "-c", _RECIPE_ENCODE, kind, out, setting, str(args.workers), *files], env)
                dict_option = ["--srcdict", os.path.join(out, "dict.txt")] if kind == "wordpiece" else []
                peak = max(peak, run_measured(
                    [os.path.join(BIN, "fairseq-preprocess"), "--only-source", "--trainpref", os.path.join(out, "train.tok"),
                     "--destdir", os.path.join(out, "bin"), "--workers", str(args.workers), "--dataset-impl", "mmap",
                     *dict_option], env))
                peaks["fairseq"].append(peak)

            times = alternating_runs({"ours": ours, "fairseq": fairseq}, args.runs, warmup=0)
            print(f"\n{kind}:")
            for name in ("ours", "fairseq"):
                print("  " + time_line(name, times[name], unit="s", scale=1.0, places=1)
                      + f"; peak memory {max(peaks[name]) / 2**20:.0f} MiB; {megabytes / min(times[name]):.2f} MB/s at best")
            print("  " + ratio_line("speed-up (fairseq time / ours)", times["fairseq"], times["ours"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _gunzipped_size(path):
    import gzip

    with gzip.open(path, "rb") as f:
        return sum(len(block) for block in iter(lambda: f.read(1 << 20), b""))


if __name__ == "__main__":
    main()
