#!/usr/bin/env python
"""Host time of seeding an update in fairseq-train: the plugin's seeding against fairseq's, alternating update by update.

Before every update fairseq's ``Trainer.train_step`` calls ``Trainer._set_seed``, which seeds through
``torch.manual_seed``; for each device type whose runtime has not started, torch formats the Python stack to queue
the seed, so the cost depends on the stack it is called from. This runs ``fairseq-train`` (SST-2 fine-tuning with
the update-cost benchmark's inputs and options: ``update_cost.py``) in this process and calls, before each update,
fairseq's method and the plugin's (``spanbert_plugin/core/update_seeding.py``) in turn from fairseq's own stack,
timing each; both set the same seed (checked on every call).

    .venv/bin/python benchmarks/cpu_speed/update_cost/seeding.py --encoder narrow-minilm --vocab-from $VOCAB \
        --work /tmp/update_cost_work --out benchmarks/cpu_speed/update_cost/results/seeding.json

Writes the JSON file ``--out`` and prints its summary; an existing ``--out`` is replaced only with ``--force``, and
only when it is an earlier result of this script.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
import update_cost  # noqa: E402  (this script's folder)
from results_file import check_results_file, write_results_file  # noqa: E402

RESULT_KEYS = ("updates", "plugin_us", "fairseq_us", "ratio")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    update_cost.add_in_process_arguments(parser)
    parser.add_argument("--warmup", type=int, default=20, help="updates before the timed ones")
    parser.add_argument("--updates", type=int, default=400, help="timed updates, half seeded by each side")
    args = parser.parse_args()
    if not args.out:
        parser.error("--out is required")
    command = " ".join(["benchmarks/cpu_speed/update_cost/seeding.py", *sys.argv[1:]])
    if args.encoder != "minilm" and not args.vocab_from:
        parser.error("--encoder with a shape needs --vocab-from")
    check_results_file(args.out, "seeding.py", args.force, RESULT_KEYS)
    argv = update_cost.in_process_sst2_argv(args.encoder, args.vocab_from, args.work)

    import torch
    from fairseq.trainer import Trainer
    from fairseq_cli import train as fairseq_train

    import spanbert_plugin.registry  # noqa: F401  (installs the plugin's seeding before it is wrapped here)

    torch.set_num_threads(1)
    plugins = Trainer._set_seed
    fairseqs = plugins.__wrapped__
    times = {"plugin": [], "fairseq": []}
    calls = [0]

    def alternating(self):
        calls[0] += 1
        side, method = ("plugin", plugins) if calls[0] % 2 == 0 else ("fairseq", fairseqs)
        start = time.perf_counter()
        method(self)
        elapsed = time.perf_counter() - start
        expected = self.cfg.common.seed + self.get_num_updates()
        if torch.initial_seed() != expected:
            raise RuntimeError(f"{side}'s seeding set {torch.initial_seed()}, not {expected}")
        if calls[0] > args.warmup:
            times[side].append(elapsed * 1e6)

    Trainer._set_seed = alternating
    sys.argv = ["fairseq-train", *argv, "--max-update", str(args.warmup + args.updates)]
    fairseq_train.cli_main()
    pairs = list(zip(times["plugin"], times["fairseq"]))
    ratios = [p / f for p, f in pairs]
    result = {"updates": args.updates, "encoder": args.encoder, "torch": torch.__version__,
              "cuda_initialised": torch.cuda.is_initialized(),
              "plugin_us": statistics.median(times["plugin"]), "fairseq_us": statistics.median(times["fairseq"]),
              "ratio": statistics.median(ratios), "ratio_quartiles": statistics.quantiles(ratios, n=4)[::2],
              "command": command}
    write_results_file(args.out, result)
    print(f"Seeding an update from fairseq-train's stack, median of {len(pairs)} updates each (CUDA started: "
          f"{result['cuda_initialised']}): fairseq's {result['fairseq_us']:.0f} µs, the plugin's "
          f"{result['plugin_us']:.0f} µs, ratio {result['ratio']:.3f} (quartiles {result['ratio_quartiles'][0]:.3f}-"
          f"{result['ratio_quartiles'][1]:.3f})")


if __name__ == "__main__":
    main()
