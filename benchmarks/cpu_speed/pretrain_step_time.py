#!/usr/bin/env python
"""Training-step time: spanbert (MLM + SBO, span_bert criterion) vs fairseq's roberta (masked_lm).

Same encoder size, batch, sequence length and masked tokens, one process, CPU,
``--threads`` threads for every side; each step is forward + backward + Adam
update. The sides run in ``--runs`` alternating runs of ``--steps`` steps each
(the order reverses every run, after one untimed run); each run gives each side
its median step time, and the ratios to roberta are the medians of the per-run
ratios, with their range.

    .venv/bin/python benchmarks/cpu_speed/pretrain_step_time.py [--runs 7 --steps 3 --threads 2]
        [--layers 4 --dim 256 --heads 4 --ffn 1024 --batch 8 --seq 512]
"""
import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers

import torch  # noqa: E402
from timing import alternating_runs, ratio_line, thread_note, time_line  # noqa: E402


def build(task_name, arch, data, args, criterion):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cli = [data, "--task", task_name, "--arch", arch, "--criterion", criterion, "--cpu",
           "--tokens-per-sample", str(args.seq), "--encoder-layers", str(args.layers),
           "--encoder-embed-dim", str(args.dim), "--encoder-ffn-embed-dim", str(args.ffn),
           "--encoder-attention-heads", str(args.heads), "--max-positions", str(args.seq)]
    if task_name == "span_masked_lm":
        cli += ["--user-dir", os.path.join(ROOT, "user_dir")]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), cli))
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 4), ("dim", 256), ("heads", 4), ("ffn", 1024), ("batch", 8), ("seq", 512),
                          ("steps", 3), ("runs", 7), ("threads", 2)):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from masking_throughput import prepared_data

    data = prepared_data(os.path.join(ROOT, "benchmarks", "out"))
    span_task, span_model, span_crit = build("span_masked_lm", "spanbert_base", data, args, "span_bert")
    mlm_only_crit = type(span_crit)(span_task, sbo_weight=0.0)
    d = span_task.dictionary
    # fairseq's own dictionary for roberta: same ids (sentencepiece layout: <s> <pad> </s> <unk> first)
    fairseq_data = tempfile.mkdtemp()
    with open(os.path.join(fairseq_data, "dict.txt"), "w", encoding="utf-8") as f:
        for sym, cnt in zip(d.symbols[4:], d.count[4:]):
            if sym != d.mask_word:
                f.write(f"{sym} {max(cnt, 1)}\n")
    rob_task, rob_model, rob_crit = build("masked_lm", "roberta_base", fairseq_data, args, "masked_lm")
    assert len(rob_task.source_dictionary) == len(d), (len(rob_task.source_dictionary), len(d))

    span_task.load_dataset("train")
    ds = span_task.dataset("train")
    full = [i for i in range(len(ds)) if ds.size(i) == args.seq]
    batches = [ds.collater([ds[i] for i in full[k * args.batch:(k + 1) * args.batch]])
               for k in range(min(args.steps * 2, len(full) // args.batch))]
    assert batches, f"no {args.batch} blocks of {args.seq} tokens in the benchmark corpus"

    def roberta_sample(b):
        # same tokens, same masked positions; roberta has no SBO
        return {"net_input": {"src_tokens": b["net_input"]["src_tokens"], "src_lengths": b["net_input"]["src_lengths"]},
                "target": b["target"], "ntokens": b["ntokens"], "nsentences": b["nsentences"]}

    runs = {"fairseq roberta + masked_lm": (rob_model, rob_crit, roberta_sample),
            "spanbert + span_bert (MLM+SBO)": (span_model, span_crit, lambda b: b),
            "spanbert, --sbo-weight 0 (MLM only)": (span_model, mlm_only_crit, lambda b: b)}
    optims = {name: torch.optim.Adam(m.parameters(), lr=1e-4) for name, (m, _, _) in runs.items()}  # one per run

    def step_of(name):
        model, crit, to_sample = runs[name]

        def step(n):
            model.train()
            loss, sample_size, _ = crit(model, to_sample(batches[n % len(batches)]))
            (loss / sample_size).backward()
            optims[name].step()
            optims[name].zero_grad()
        return step

    per_run = alternating_runs({name: step_of(name) for name in runs}, args.runs, steps_per_run=args.steps)
    print(f"encoder {args.layers} x {args.dim} (heads {args.heads}, FFN {args.ffn}), vocab {len(d)}, "
          f"batch {args.batch} x {args.seq} tokens, {thread_note()}, {args.runs} alternating runs of {args.steps} steps")
    for name, times in per_run.items():
        print(time_line(f"{name:36s} step", times))
    base = per_run["fairseq roberta + masked_lm"]
    print(ratio_line("spanbert MLM+SBO / roberta", per_run["spanbert + span_bert (MLM+SBO)"], base))
    print(ratio_line("spanbert MLM only / roberta", per_run["spanbert, --sbo-weight 0 (MLM only)"], base))


if __name__ == "__main__":
    main()
