#!/usr/bin/env python
"""The ``span_bert`` criterion's chunked vocabulary cross-entropy against ``F.cross_entropy`` on fp32 logits.

One step is what the criterion does for one loss: the loss, the argmax count it
logs, and the backward pass to the logits, for the masked tokens of a MiniLM
continued-pre-training batch (32 x 128 tokens, about 600 masked) against the BERT
uncased vocabulary (30,522). Logits in bf16 (as bf16 autocast gives them) and in
fp32, sides in alternating runs (``benchmarks/common/timing.py``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_speed/vocab_cross_entropy_speed.py --threads 1 \\
        --out benchmarks/cpu_speed/bf16_autocast/vocab_cross_entropy_1thread.json

An existing ``--out`` is replaced only with ``--force``, and only when it is an earlier result of this script.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers


RESULT_KEYS = ("threads", "rows", "vocab", "runs", "steps", "dtypes")  # what tells this script's results file


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=601, help="masked tokens")
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True, help="results JSON")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    args = parser.parse_args()
    from results_file import check_results_file, write_results_file

    check_results_file(args.out, "vocab_cross_entropy_speed.py", args.force, RESULT_KEYS)
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    from spanbert_plugin.pretraining.vocab_cross_entropy import vocab_cross_entropy
    from timing import alternating_runs, ratio_line, thread_note, time_line

    generator = torch.Generator().manual_seed(0)
    targets = torch.randint(0, args.vocab, (args.rows,), generator=generator)
    results = {"threads": thread_note(), "torch": torch.__version__, "rows": args.rows, "vocab": args.vocab,
               "runs": args.runs, "steps": args.steps, "dtypes": {}}
    for dtype in (torch.bfloat16, torch.float32):
        logits = (torch.randn(args.rows, args.vocab, generator=generator) * 3).to(dtype).requires_grad_()

        def reference(step):
            full = logits.float()
            loss = F.cross_entropy(full, targets, reduction="sum")
            (full.argmax(-1) == targets).sum().item()
            loss.backward()

        def chunked(step):
            loss, correct = vocab_cross_entropy(logits, targets)
            correct.item()
            loss.backward()

        per_run = alternating_runs({"F.cross_entropy": reference, "chunked": chunked}, args.runs, args.steps)
        name = str(dtype).replace("torch.", "")
        results["dtypes"][name] = per_run
        print(f"{name} logits ({thread_note()}): " + ratio_line("F.cross_entropy / chunked time",
                                                                 per_run["F.cross_entropy"], per_run["chunked"]))
        print("\n".join("   " + time_line(side, times) for side, times in per_run.items()))
    write_results_file(args.out, results)


if __name__ == "__main__":
    main()
