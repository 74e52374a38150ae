#!/usr/bin/env python
"""Masking throughput on 512-token blocks: SpanBERT span masking vs fairseq's MaskTokensDataset.

Same blocks (the embedded corpus, sentencepiece 8k), same process, one thread,
15% budget; each side masks every block once per epoch for several epochs
(new (seed, epoch, index) each time, so no cache hits). The sides run in ``--runs``
alternating runs of ``--epochs-per-run`` epochs each (``benchmarks/common/timing.py``: the order flips every run,
after one untimed run); ratios are the medians of the per-run ratios, with their range.

fairseq's masked_lm task builds one training example from *two*
MaskTokensDatasets (``apply_mask``: the masked source and the targets, each
re-drawing the same mask); SpanMaskedDataset yields source, targets and span
boundaries from one draw. The headline compares one training example each;
the single MaskTokensDataset (source only) is printed too.

    .venv/bin/python benchmarks/cpu_speed/masking_throughput.py [--runs 7]
    .venv/bin/python benchmarks/cpu_speed/masking_throughput.py --quick   # smoke run (the test suite): no meaningful numbers
"""
import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers

import torch  # noqa: E402
from timing import alternating_runs, ratio_line, time_line  # noqa: E402



def prepared_data(out, max_docs=None):
    data = os.path.join(out, "data" if max_docs is None else f"data-{max_docs}-docs")
    if not os.path.isfile(os.path.join(data, "dict.txt")):
        from spanbert_plugin.pretraining.default_corpus import write_default_corpus
        from spanbert_plugin.cli.prepare import main as cli_main

        os.makedirs(out, exist_ok=True)
        train, valid = os.path.join(out, "train.txt"), os.path.join(out, "valid.txt")
        write_default_corpus(train, valid, max_docs=max_docs)
        assert cli_main(["--train", train, "--valid", valid, "--destdir", data, "--force"]) == 0
    return data


def epoch_runner(dataset, epochs):
    """fn(run index): mask every block ``epochs`` times, each under a new epoch (new masks, no cache hits)."""
    def run(index):
        for epoch in range(index * epochs + 1, (index + 1) * epochs + 1):
            dataset.set_epoch(epoch)
            for i in range(len(dataset)):
                dataset[i]
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="alternating timed runs of every side")
    parser.add_argument("--epochs-per-run", type=int, default=3, help="passes over the ~590 blocks in one run")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "out"), help="work folder")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run that checks the script works: 40 documents, 3 runs of 1 epoch; the numbers mean nothing")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.epochs_per_run = 3, 1
    torch.set_num_threads(1)

    from fairseq.data import MaskTokensDataset, data_utils

    from spanbert_plugin.pretraining.document_blocks import DocumentBlockDataset
    from spanbert_plugin.pretraining.span_masked_dataset import SpanMaskedDataset
    from spanbert_plugin.pretraining.task import SpanBertPretrainingConfig, SpanBertPretrainingTask

    data = prepared_data(args.out, max_docs=40 if args.quick else None)
    task = SpanBertPretrainingTask.setup_task(SpanBertPretrainingConfig(data=data, tokens_per_sample=512, seed=1))
    d = task.dictionary
    docs = data_utils.load_indexed_dataset(os.path.join(data, "train"), d, "mmap")
    blocks = DocumentBlockDataset(docs, docs.sizes, 510, d.bos(), d.eos())
    full = [i for i in range(len(blocks)) if blocks.sizes[i] == 512]

    class FullBlocks(torch.utils.data.Dataset):
        def __getitem__(self, i):
            return blocks[full[i]]

        def __len__(self):
            return len(full)

    source = FullBlocks()
    spanbert = SpanMaskedDataset(source, task.masker, d.pad(), seed=1)
    kwargs = dict(pad_idx=d.pad(), mask_idx=d.mask_index, seed=1, mask_prob=0.15)
    fairseq_src, fairseq_tgt = MaskTokensDataset.apply_mask(source, d, **kwargs)

    class FairseqExample(torch.utils.data.Dataset):
        """What masked_lm reads per training example: masked source and targets."""

        def set_epoch(self, epoch):
            fairseq_src.set_epoch(epoch)
            fairseq_tgt.set_epoch(epoch)

        def __getitem__(self, i):
            return fairseq_src[i], fairseq_tgt[i]

        def __len__(self):
            return len(source)

    if not full:
        sys.exit("masking_throughput: the corpus has no document of 510 tokens or more")
    print(f"{len(full)} blocks of 512 tokens, {args.runs} alternating runs of {args.epochs_per_run} epoch(s), 1 thread"
          + (" (--quick: not a measurement)" if args.quick else ""))
    sides = {
        "fairseq MaskTokensDataset, source only": MaskTokensDataset(source, d, **kwargs),
        "fairseq masked_lm example (src + tgt)": FairseqExample(),
        "spanbert SpanMaskedDataset example": spanbert,
    }
    per_run = alternating_runs({name: epoch_runner(ds, args.epochs_per_run) for name, ds in sides.items()}, args.runs)
    for name, times in per_run.items():
        print(time_line(f"{name} run", times, unit="s", scale=1.0, places=3))
    for name, times in per_run.items():  # median throughput of the runs
        print(f"{name:40s} {len(full) * args.epochs_per_run / statistics.median(times):8.0f} blocks/s")
    example = per_run["spanbert SpanMaskedDataset example"]
    # a throughput ratio is the inverse time ratio: fairseq's time over ours
    masked_lm, single = per_run["fairseq masked_lm example (src + tgt)"], per_run["fairseq MaskTokensDataset, source only"]
    print(ratio_line("ratio per training example (spanbert / fairseq masked_lm)", masked_lm, example))
    print(ratio_line("ratio against a single MaskTokensDataset", single, example))


if __name__ == "__main__":
    main()
