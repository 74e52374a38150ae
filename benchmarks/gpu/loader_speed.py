#!/usr/bin/env python
"""Batches per second of a fairseq-train data pipeline alone (masking included, no model): is it the bottleneck?

Takes fairseq-train's arguments; builds the task, loads the train split and iterates its
epoch iterator exactly as fairseq-train does (same ``--num-workers``, ``--batch-size``,
``--seed``), timing ``--batches`` batches after ``--warmup`` untimed ones. Compare the rate
with the updates per second of training: a pipeline much faster than the GPU is not the
bottleneck.

    python benchmarks/gpu/loader_speed.py --batches 300 -- .gpu/novels8 --user-dir user_dir \\
        --task spanbert_pretraining --criterion span_bert --arch spanbert_base --batch-size 8 --num-workers 2
"""
import argparse
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=300, help="timed batches")
    parser.add_argument("--warmup", type=int, default=20, help="untimed first batches (workers starting)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="fairseq-train arguments, after --")
    args = parser.parse_args()
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args

    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), train_args))
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    task.load_dataset(cfg.dataset.train_subset, epoch=1, training=True)
    itr = task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.train_subset), max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size, seed=cfg.common.seed, num_workers=cfg.dataset.num_workers, epoch=1,
    ).next_epoch_itr(shuffle=True)
    tokens, start = 0, None
    for n, batch in enumerate(itr):
        if n == args.warmup:
            start = time.perf_counter()
        elif n > args.warmup:
            tokens += int(batch["net_input"]["src_tokens"].numel())
        if n == args.warmup + args.batches:
            break
    if start is None or n < args.warmup + args.batches:
        raise SystemExit(f"the epoch has {n + 1} batches: fewer than --warmup {args.warmup} + --batches {args.batches}")
    elapsed = time.perf_counter() - start
    print(f"{cfg.task._name}: {args.batches / elapsed:.1f} batches/s, {tokens / elapsed:,.0f} tokens/s "
          f"({cfg.dataset.num_workers} workers, batch {cfg.dataset.batch_size}, {args.batches} batches in {elapsed:.1f} s)")


if __name__ == "__main__":
    main()
