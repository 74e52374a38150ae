#!/usr/bin/env python
"""Fine-tuning step time: spanbert + sentence_classification vs transformers' BertForSequenceClassification.

Same encoder size, vocabulary, batch (sentence pairs with token types and
padding), dropout and Adam; each step is forward + backward + Adam update on
the CPU, the two models alternate step by step (so drift in the shared
machine's speed hits both), warm-up steps are not timed, and the median is
reported with the spread of the per-step ratios.

    .venv/bin/python benchmarks/cpu_speed/classification_step_time.py [--layers 4 --dim 256 --heads 4 --ffn 1024 --batch 32 --seq 128]
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import ratio_line  # noqa: E402


def prepared_pairs(out, seq):
    """A classification folder of sentence pairs from the benchmark corpus (spanbert-prepare's output as tokenizer)."""
    from masking_throughput import prepared_data

    from spanbert_plugin.classification.prepare import PrepareOptions, ReadOptions, prepare_classification

    folder = os.path.join(out, f"cls_pairs_{seq}")
    if not os.path.isfile(os.path.join(folder, "classification.json")):
        tokenizer_folder = prepared_data(out)
        with open(os.path.join(out, "train.txt"), encoding="utf-8") as f:
            lines = [" ".join(line.split()) for line in f if line.strip()]
        pairs = os.path.join(out, "cls_pairs.jsonl")
        with open(pairs, "w", encoding="utf-8") as f:
            for i in range(0, min(len(lines), 4000) - 1, 2):
                f.write(json.dumps({"a": lines[i], "b": lines[i + 1], "label": str(i % 3)}) + "\n")
        options = PrepareOptions(tokenizer_folder, folder, ReadOptions(["a", "b"], "label"), max_seq_length=seq, force=True)
        prepare_classification(pairs, pairs, options)
    return folder


def build_spanbert(data, args):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cli = [data, "--user-dir", os.path.join(ROOT, "user_dir"), "--task", "sentence_classification",
           "--criterion", "sentence_classification", "--arch", "spanbert_base", "--cpu",
           "--encoder-layers", str(args.layers), "--encoder-embed-dim", str(args.dim),
           "--encoder-ffn-embed-dim", str(args.ffn), "--encoder-attention-heads", str(args.heads)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), cli))
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


def build_hf(vocab_size, num_labels, args):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=vocab_size, hidden_size=args.dim, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=args.ffn, max_position_embeddings=512,
                        type_vocab_size=2, num_labels=num_labels, layer_norm_eps=1e-12)
    return BertForSequenceClassification(config)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 4), ("dim", 256), ("heads", 4), ("ffn", 1024), ("batch", 32), ("seq", 128),
                          ("steps", 20), ("warmup", 3), ("threads", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = prepared_pairs(os.path.join(ROOT, "benchmarks", "out"), args.seq)
    task, model, criterion = build_spanbert(data, args)
    hf = build_hf(len(task.source_dictionary), task.num_classes, args)
    assert sum(p.numel() for p in hf.bert.parameters()) - sum(p.numel() for p in hf.bert.pooler.parameters()) == \
        sum(p.numel() for p in model.encoder.parameters()), "encoders differ in size"

    task.load_dataset("train", training=True)
    dataset = task.dataset("train")
    order = np.random.default_rng(0).permutation(len(dataset))
    total = args.steps + args.warmup
    batches = [dataset.collater([dataset[int(i)] for i in order[k * args.batch:(k + 1) * args.batch]]) for k in range(total)]

    def spanbert_step(batch):
        loss, sample_size, _ = criterion(model, batch)
        (loss / sample_size).backward()

    def hf_step(batch):
        net = batch["net_input"]
        out = hf(input_ids=net["src_tokens"], token_type_ids=net["segment_labels"],
                 attention_mask=net["src_tokens"].ne(task.source_dictionary.pad()).long(), labels=batch["target"])
        out.loss.backward()

    runs = {"spanbert + sentence_classification": (model, spanbert_step),
            "transformers BertForSequenceClassification": (hf, hf_step)}
    optims = {name: torch.optim.Adam(m.parameters(), lr=1e-5) for name, (m, _) in runs.items()}
    times = {name: [] for name in runs}
    for step, batch in enumerate(batches):
        # the order flips every step, so neither side always runs first
        for name, (net, run) in (list(runs.items()) if step % 2 == 0 else list(runs.items())[::-1]):
            net.train()
            start = time.perf_counter()
            run(batch)
            optims[name].step()
            optims[name].zero_grad()
            if step >= args.warmup:
                times[name].append(time.perf_counter() - start)
    mean_tokens = statistics.mean(b["net_input"]["src_tokens"].numel() for b in batches)
    print(f"encoder {args.layers} x {args.dim} (heads {args.heads}, FFN {args.ffn}), vocab {len(task.source_dictionary)}, "
          f"batch {args.batch} pairs padded to {mean_tokens / args.batch:.0f} tokens on average (max {args.seq}), "
          f"{torch.get_num_threads()} threads, {args.steps} timed steps")
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, m in medians.items():
        print(f"{name:44s} {m * 1000:8.1f} ms/step (min {min(times[name]) * 1000:.1f}, max {max(times[name]) * 1000:.1f})")
    ours, theirs = times["spanbert + sentence_classification"], times["transformers BertForSequenceClassification"]
    ratios = sorted(a / b for a, b in zip(ours, theirs))
    print(f"ratio spanbert / transformers: median {statistics.median(ratios):.3f}x "
          f"(per-step ratios {ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f} interquartile)")
    print(ratio_line("spanbert / transformers (each step a run)", ours, theirs))


if __name__ == "__main__":
    main()
