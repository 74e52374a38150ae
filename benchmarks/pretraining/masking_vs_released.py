"""The plugin's span masking against the released SpanBERT code's loop on real blocks: how long merged spans are.

The released loop (SPEC §1.1), written out one draw at a time in ``released_span_masking``, draws a span length
and an anchor, draws again when the anchor is masked already, and takes whole words from the anchor's word start
until the length or the budget (ceil(15% of the block), which may stop a span mid-word). Spans that overlap or
touch merge; their length in words is what the span boundary objective sees. The plugin's vectorised masker
(``spanbert_plugin/pretraining/span_masking.py``) is compared with it, and with the same loop keeping masked
anchors (the rule the masker followed before), on the full 512-token blocks of LitBank novels prepared with BERT's
uncased WordPiece vocabulary, a few seeds per block.

    python benchmarks/pretraining/masking_vs_released.py --out benchmarks/pretraining/masking_vs_released

writes ``results.json`` in ``--out`` (an earlier one of this script only with ``--force``); ``--work`` (default
/tmp/masking_vs_released) holds the prepared novels, made once and reused.
"""
import argparse
import glob
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
from command_output import relative_to_root  # noqa: E402
from results_file import add_results_options, claim_outputs, write_results_file  # noqa: E402

WORK_MARK = "masking_vs_released.work"
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
NOVELS = os.path.join(SHARED, "litbank", "novels")
VOCAB = os.path.join(SHARED, "bert_uncased_vocab", "vocab.txt")


def released_span_masking(tokens, word_starts, rng, probs, mask_ratio=0.15, redraw_masked_anchors=True):
    """Masked positions of a framed block's inner tokens, the released loop's way (module docstring).

    ``word_starts``: per vocabulary id, whether the symbol starts a word. ``redraw_masked_anchors=False`` keeps a
    span whose anchor is masked already (it then extends from there and merges with the earlier span).
    """
    inner = tokens[1:-1]
    n = len(inner)
    starts = word_starts[inner].copy()
    starts[0] = True
    budget = int(np.ceil(n * mask_ratio))
    masked = np.zeros(n, dtype=bool)
    count = 0
    lengths = np.arange(1, len(probs) + 1)
    while count < budget:
        length = rng.choice(lengths, p=probs)
        anchor = int(rng.integers(n))
        if redraw_masked_anchors and masked[anchor]:
            continue
        position = anchor
        while not starts[position]:
            position -= 1
        words = 0
        while words < length and position < n and count < budget:
            words += 1
            while True:  # the word at position, token by token
                if not masked[position]:
                    masked[position] = True
                    count += 1
                position += 1
                if position == n or starts[position] or count == budget:
                    break
    return masked


def words_per_merged_span(masked, tokens, word_starts):
    """Length in words of each run of masked inner tokens (a run starting inside a word counts that word)."""
    starts = word_starts[tokens[1:-1]].copy()
    starts[0] = True
    edges = np.flatnonzero(np.diff(np.concatenate(([0], masked.astype(int), [0]))))
    return [int(starts[a:b].sum()) + int(not starts[a]) for a, b in zip(edges[0::2], edges[1::2])]


def prepare(work, num_novels):
    """The first ``num_novels`` LitBank novels (by file name) prepared with BERT's uncased vocabulary, once."""
    data = os.path.join(work, "data")
    if os.path.isfile(os.path.join(data, "train.idx")):
        return data
    novels = sorted(glob.glob(os.path.join(NOVELS, "*.txt*")))[:num_novels]
    if len(novels) < num_novels:
        sys.exit(f"{NOVELS}: {len(novels)} novels, {num_novels} asked for")
    corpus = os.path.join(work, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for path in novels:
        target = os.path.join(corpus, os.path.basename(path))
        if not os.path.exists(target):
            os.symlink(path, target)
    command = [os.path.join(os.path.dirname(sys.executable), "spanbert-prepare"), "--train", corpus,
               "--join-wrapped-lines", "--wordpiece-vocab", VOCAB, "--lowercase", "--valid-fraction", "0.2",
               "--destdir", data]
    if subprocess.run(command).returncode != 0:
        sys.exit(f"masking_vs_released.py: {' '.join(command)} failed")
    return data


def build_task(data, seed):
    """The pre-training task as fairseq-train builds it, with the training split loaded."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [data, "--user-dir", os.path.join(ROOT, "user_dir"), "--task", "spanbert_pretraining", "--criterion",
            "span_bert", "--arch", "spanbert_tiny", "--tokens-per-sample", "512", "--seed", str(seed), "--cpu"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    return task


def summary(lengths, blocks):
    lengths = np.asarray(lengths)
    return {"words_per_merged_span": round(float(lengths.mean()), 4),
            "standard_error": round(float(lengths.std() / np.sqrt(len(lengths))), 4),
            "merged_spans_per_block": round(len(lengths) / blocks, 3),
            "share_longer_than_10_words": round(float(np.mean(lengths > 10)), 4)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--novels", type=int, default=6, help="how many LitBank novels, by file name (default 6)")
    parser.add_argument("--seeds", type=int, default=3, help="draws per block (default 3)")
    add_results_options(parser, "/tmp/masking_vs_released")
    args = parser.parse_args(argv)
    results_path = claim_outputs(args, "masking_vs_released.py", ("plugin", "released"), WORK_MARK)
    from tqdm import tqdm

    data = prepare(args.work, args.novels)
    task = build_task(data, seed=1)
    masker, pad = task.masker, task.dictionary.pad()
    blocks = task.dataset("train").dataset.dataset  # SortDataset -> SpanMaskedDataset -> DocumentBlockDataset
    full = [i for i in range(len(blocks)) if blocks.sizes[i] == 512]
    sides = {"plugin": lambda t, rng: (masker(t, rng).target != pad)[1:-1],
             "released": lambda t, rng: released_span_masking(t, masker.word_starts, rng, masker.length_probs),
             "released_keeping_masked_anchors": lambda t, rng: released_span_masking(
                 t, masker.word_starts, rng, masker.length_probs, redraw_masked_anchors=False)}
    lengths = {side: [] for side in sides}
    for seed in tqdm(range(args.seeds), desc="seeds", disable=None):
        for index in full:
            tokens = blocks[index].numpy()
            for side, mask in sides.items():
                lengths[side] += words_per_merged_span(mask(tokens, np.random.default_rng((seed, index))), tokens,
                                                       masker.word_starts)
    draws = len(full) * args.seeds
    results = {"novels": args.novels, "blocks": len(full), "seeds": args.seeds,
               "command": relative_to_root(" ".join(["benchmarks/pretraining/masking_vs_released.py",
                                                     *(argv if argv is not None else sys.argv[1:])])),
               **{side: summary(values, draws) for side, values in lengths.items()}}
    write_results_file(results_path, results)
    for side in sides:
        r = results[side]
        print(f"{side:32s} {r['words_per_merged_span']:.3f} +- {r['standard_error']:.3f} words per merged span, "
              f"{r['merged_spans_per_block']:.2f} merged spans per block, {r['share_longer_than_10_words']:.4f} > 10 words")


if __name__ == "__main__":
    main()
