#!/usr/bin/env python
"""`make demo`: the embedded corpus -> spanbert-prepare -> masked examples -> a short CPU pre-training run.

Works offline with no user data: the corpus is generated from the standard
library's docstrings. Pass --train/--valid to use your own text instead.

The output folder is the demo's own: a second run starts over in it, removing only the
files an earlier demo run wrote there (its manifest lists them); a folder holding anything
else is refused with one line and left as it is.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BIN = os.path.dirname(sys.executable)
COMMAND = "demo"
# what the demo writes inside --out: everything under these belongs to it
OWN_ENTRIES = ("corpus.train.txt", "corpus.valid.txt", "data", "checkpoints")


def claim_output(out, inputs):
    """Make ``out`` the demo's (an earlier demo output is emptied), or exit with one line, nothing touched."""
    from spanbert_plugin.core.file_utils import MANIFEST, OutputError, check_destination, read_manifest

    try:
        check_destination(out, COMMAND, inputs, force=True, flag="--out")
    except OutputError as err:
        sys.exit(f"demo: error: {err}")
    manifest = read_manifest(out)
    if manifest is not None:
        print(f"== {out} holds an earlier demo run: starting over (removing the {len(manifest['files'])} files it wrote)")
        for name in manifest["files"]:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                os.rmdir(path)  # an empty folder check_destination listed
            else:
                os.remove(path)
        os.remove(os.path.join(out, MANIFEST))
        for root, _, _ in os.walk(out, topdown=False):  # the folders those files were in, deepest first
            if root != out and not os.listdir(root):
                os.rmdir(root)
    os.makedirs(out, exist_ok=True)
    record_output(out)  # from now on the folder is the demo's, also if this run is interrupted


def record_output(out):
    """Write the manifest: every file under the demo's own entries (what fairseq wrote into checkpoints/ too)."""
    from spanbert_plugin.core.file_utils import MANIFEST

    files = []
    for entry in OWN_ENTRIES:
        path = os.path.join(out, entry)
        if os.path.isfile(path):
            files.append(entry)
        for root, dirs, names in os.walk(path):
            files += [os.path.relpath(os.path.join(root, n), out) for n in names]
            if not dirs and not names:
                files.append(os.path.relpath(root, out) + os.sep)
    with open(os.path.join(out, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"command": COMMAND, "files": sorted(files)}, f, indent=2)


def show_masked_examples(data_dir, n=2, width=60):
    """Print a few span-masked blocks from the prepared data."""
    from spanbert_plugin.pretraining.span_masked_lm import SpanMaskedLMConfig, SpanBertMaskedLMTask
    from spanbert_plugin.core.tokenization import load_tokenizer

    task = SpanBertMaskedLMTask.setup_task(SpanMaskedLMConfig(data=data_dir, tokens_per_sample=128, seed=1))
    task.load_dataset("valid")
    ds, d, tok = task.dataset("valid"), task.dictionary, load_tokenizer(data_dir)
    print("\n== Span-masked examples (SpanBERT masking: whole-word geometric spans, 15%) ==")
    for i in range(min(n, len(ds))):
        item = ds[i]
        src, tgt = item["source"].numpy(), item["target"].numpy()
        masked = tgt != d.pad()
        print(f"\n-- block {i}: {len(src)} tokens, {masked.sum()} masked in "
              f"{len(np.unique(item['span_left'].numpy()[masked]))} spans")
        # masked tokens show as [MASK], or <token> where a span was replaced/kept
        shown = (d[t] if not m else "[MASK]" if t == d.mask_index else f"<{d[t]}>"
                 for t, m in zip(src[1:width], masked[1:width]))
        print("input   :", " ".join(shown))
        positions = np.flatnonzero(masked)
        spans = dict.fromkeys(zip(item["span_left"].numpy()[positions], item["span_right"].numpy()[positions]))
        for left, right in list(spans)[:4]:
            print(f"  span {left + 1}..{right - 1}: target {tok.decode(tgt[left + 1:right])!r}, "
                  f"boundaries {d[src[left]]!r} | {d[src[right]]!r}")


def held_out_sentences(path, n=3, seed=1):
    """``n`` sentences of 8 to 30 words from the text file (the validation text: never trained on), fixed by ``seed``."""
    with open(path, encoding="utf-8-sig") as f:
        text = " ".join(f.read().split())
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if 8 <= len(s.split()) <= 30 and s[:1].isupper()]
    rng = np.random.default_rng(seed)
    return [sentences[i] for i in sorted(rng.choice(len(sentences), size=min(n, len(sentences)), replace=False))]


def show_predictions(save_dir, text_file, n=3, seed=1):
    """What the model learned, as a person can see it: a span of held-out sentences masked, the trained model's
    guess for each masked token beside the untrained model's (same architecture, freshly initialised weights)."""
    import copy
    import logging

    import torch

    from spanbert_plugin.model.layers import init_bert_weights
    from spanbert_plugin.model.spanbert import SpanBertModel

    logging.disable(logging.INFO)  # loading the checkpoint logs its task set-up; the demo shows the result only
    hub = SpanBertModel.from_pretrained(save_dir, "checkpoint_last.pt").eval()
    untrained = copy.deepcopy(hub.model)
    torch.manual_seed(seed)
    untrained.apply(lambda m: init_bert_weights(m, hub.model.cfg.init_std))
    d, rng = hub.dictionary, np.random.default_rng(seed)
    print("\n== Masked spans of held-out text: the trained model's guesses beside the untrained model's ==")
    for sentence in held_out_sentences(text_file, n, seed):
        encoding = hub.tokenizer.encode(sentence)
        starts = np.flatnonzero(encoding.word_starts)
        if len(starts) < 6:
            continue
        first = int(rng.integers(1, len(starts) - 3))  # a span of 2-3 whole words, not the first word
        words = int(rng.integers(2, 4))
        lo, hi = int(starts[first]), int(starts[min(first + words, len(starts) - 1)])
        ids = torch.tensor([d.bos(), *encoding.ids.tolist(), d.eos()])
        masked = torch.zeros_like(ids, dtype=torch.bool)
        masked[1 + lo:1 + hi] = True
        source = ids.masked_fill(masked, d.mask_index)
        start_char, end_char = encoding.offsets[lo][0], encoding.offsets[hi - 1][1]
        print(f"\n  {sentence[:start_char]}[{'_' * max(3, end_char - start_char)}]{sentence[end_char:]}")
        print(f"  {'target':>10}: {sentence[start_char:end_char]!r}")
        for name, model in (("trained", hub.model), ("untrained", untrained)):
            with torch.no_grad():
                out, _ = model(source[None], masked_tokens=masked[None])
            probs = torch.softmax(out["mlm_logits"].float(), dim=-1)
            best = probs.argmax(-1).tolist()
            guess = hub.tokenizer.decode(best).strip() or " ".join(d[i] for i in best)  # pieces when nothing decodes
            target_p = probs[torch.arange(len(probs)), ids[masked]].mean().item()
            print(f"  {name:>10}: {guess!r} (mean probability of the target tokens {100 * target_p:.2f}%)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="demo_out", help="output folder")
    parser.add_argument("--train", help="your training text (default: the embedded corpus)")
    parser.add_argument("--valid", help="your validation text")
    parser.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece vocabulary size")
    parser.add_argument("--max-update", type=int, default=1200, help="pre-training updates (about 2-3 minutes on 2 cores)")
    parser.add_argument("--fp32", action="store_true",
                        help="train in fp32 even where the CPU computes bfloat16 natively (default: bfloat16 autocast there)")
    args = parser.parse_args(argv)
    if args.max_update < 1:
        parser.error(f"--max-update must be at least 1, got {args.max_update}")
    from spanbert_plugin.core.file_utils import signals_as_interrupt

    claim_output(args.out, [p for p in (args.train, args.valid) if p])
    try:
        # SIGTERM/SIGHUP too end in the finally below, so the manifest lists what this run wrote
        # (a killed run's unlisted checkpoints would make the next run refuse the folder)
        with signals_as_interrupt():
            run_demo(args)
    except KeyboardInterrupt:
        sys.exit(f"demo: interrupted; {args.out} keeps what was written so far (a new run starts over)")
    finally:
        record_output(args.out)


def use_bf16_autocast(args) -> bool:
    """bfloat16 autocast where oneDNN reports native bfloat16 (AVX512-BF16 or AMX), else fp32; one line either way."""
    from spanbert_plugin.core.precision import cpu_supports_bf16

    if args.fp32:
        print("== Precision: fp32 (--fp32)")
        return False
    if cpu_supports_bf16():
        print("== Precision: bfloat16 autocast (this CPU computes bfloat16 natively: AVX512-BF16 or AMX); --fp32 to turn "
              "it off")
        return True
    print("== Precision: fp32 (this CPU has no native bfloat16, AVX512-BF16 or AMX, so autocast would not be faster)")
    return False


def run_demo(args):

    train, valid = args.train, args.valid
    if train is None:
        from spanbert_plugin.pretraining.default_corpus import write_default_corpus

        train, valid = os.path.join(args.out, "corpus.train.txt"), os.path.join(args.out, "corpus.valid.txt")
        counts = write_default_corpus(train, valid)
        print(f"== Embedded corpus: {counts['train']} train / {counts['valid']} valid documents "
              f"(standard-library docstrings, one module per document) -> {train}")

    data = os.path.join(args.out, "data")
    prepare = [os.path.join(BIN, "spanbert-prepare"), "--train", train, "--destdir", data, "--force",
               "--vocab-size", str(args.vocab_size)] + (["--valid", valid] if valid else [])
    print("\n== " + " ".join(prepare))
    subprocess.run(prepare, check=True)
    show_masked_examples(data)

    save_dir = os.path.join(args.out, "checkpoints")
    train_cmd = [os.path.join(BIN, "fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs/pretrain"),
                 "--config-name", "tiny_cpu", f"task.data={os.path.abspath(data)}",
                 f"checkpoint.save_dir={os.path.abspath(save_dir)}", f"common.user_dir={os.path.join(ROOT, 'user_dir')}",
                 f"optimization.max_update={args.max_update}", f"lr_scheduler.total_num_update={args.max_update}",
                 "lr_scheduler.warmup_updates=30",  # the demo's minutes-long schedule, not the recipe's hour
                 # at least 8 loss records however short the run (a run shorter than the interval logged none)
                 "common.log_format=json", f"common.log_interval={max(1, min(50, args.max_update // 8))}",
                 "checkpoint.save_interval_updates=400"]
    train_cmd += [f"task.bf16_autocast={str(use_bf16_autocast(args)).lower()}"]
    log_path = os.path.join(save_dir, "train.log")
    print("\n== Pre-training spanbert_tiny on the CPU (fairseq's full log: " + log_path + "):\n" + " ".join(train_cmd))
    records = []
    os.makedirs(save_dir, exist_ok=True)
    from tqdm import tqdm

    with open(log_path, "w", encoding="utf-8") as log, tqdm(total=args.max_update, unit="update", file=sys.stdout,
                                                             desc="pre-training", dynamic_ncols=True) as bar, \
            subprocess.Popen(train_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            log.write(line)
            match = re.search(r"train_inner\W.*?(\{.*\})", line)
            if match:
                records.append(json.loads(match.group(1)))
                bar.update(int(records[-1]["num_updates"]) - bar.n)
                bar.set_postfix(mlm_loss=records[-1]["mlm_loss"], sbo_loss=records[-1]["sbo_loss"])
    if proc.returncode != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = f.readlines()[-15:]
        sys.exit("".join(tail) + f"demo: training failed with exit status {proc.returncode} (full log: {log_path})")
    if not records:
        sys.exit(f"demo: error: fairseq-hydra-train logged no update (see {log_path})")

    print("\n== Losses (bits per masked token) over training:")
    print(f"{'update':>7} {'mlm_loss':>9} {'sbo_loss':>9} {'mlm_acc':>8} {'sbo_acc':>8}")
    shown = records[:: max(1, len(records) // 8)]
    for r in shown + records[-1:] * (shown[-1] is not records[-1]):
        print(f"{r['num_updates']:>7} {r['mlm_loss']:>9} {r['sbo_loss']:>9} {r['mlm_acc']:>8} {r['sbo_acc']:>8}")
    first, last = records[0], records[-1]
    print(f"\nMLM loss {first['mlm_loss']} -> {last['mlm_loss']}, SBO loss {first['sbo_loss']} -> {last['sbo_loss']}")
    print(f"Checkpoint: {os.path.join(save_dir, 'checkpoint_last.pt')}")
    show_predictions(save_dir, valid or train)
    print("\nNext:\n"
          "  * continue training: rerun the command above with a larger optimization.max_update\n"
          f"  * run the demo again: it starts over in {args.out}\n"
          "  * your own text: python scripts/demo.py --train my.txt [--valid my_valid.txt]\n"
          "  * full-size recipes: configs/pretrain/base.yaml and large.yaml (see README)")


if __name__ == "__main__":
    main()
