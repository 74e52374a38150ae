#!/usr/bin/env python
"""Updates per second with ``--bf16-autocast`` against fp32: whole fairseq updates, alternating runs.

Each workload builds two fairseq ``Trainer``s from the same command line, one
with ``--bf16-autocast``, over the same prepared data and the same initial
weights, and times whole updates (forward, loss, backward, gradient clipping,
Adam) in alternating runs (``benchmarks/common/timing.py``): each run gives each side
the median of ``--steps`` update times, the ratio is the median of the per-run
ratios with its range. Workloads (MiniLM size = all-MiniLM-L6-v2's 6 layers x
384, 12 heads, FFN 1536, BERT uncased vocabulary; random weights, which cost
what pre-trained ones do):

* ``minilm_pretrain``: span masking + SBO, 32 blocks x 128 tokens (continued pre-training);
* ``sst2``: sentence classification, batches of 32 SST-2 sentences;
* ``litbank``: coreference on LitBank fold 0, windows of 3 segments of 384 tokens, head FFNN 150;
* ``tiny_pretrain``: ``spanbert_tiny`` (2 x 128) span + SBO, 16 blocks x 128 tokens.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_speed/bf16_autocast_speed.py --threads 1 \
        --out benchmarks/cpu_speed/bf16_autocast/results_1thread.json

Writes a JSON with every per-run time and prints one line per workload.
An existing ``--out`` is replaced only with ``--force``, and only when it is an earlier result of this script.
"""
import argparse
import glob
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
BIN = os.environ.get("SPANBERT_COMMANDS_DIR") or os.path.dirname(sys.executable)  # the console commands
SHARED = os.path.join(ROOT, "..", "shared", "data")
MINILM = ["--arch", "spanbert_base", "--encoder-layers", "6", "--encoder-embed-dim", "384",
          "--encoder-ffn-embed-dim", "1536", "--encoder-attention-heads", "12", "--max-positions", "512"]
WORKLOADS = ("minilm_pretrain", "sst2", "litbank", "tiny_pretrain")


def prepare(work):
    """Prepared folders (made once in ``work``): a corpus of 10 LitBank novels, SST-2 (first 4,000), fold 0."""
    corpus = os.path.join(work, "corpus")
    if not os.path.isdir(corpus):
        novels = sorted(glob.glob(os.path.join(SHARED, "litbank", "novels", "*")))[:10]
        subprocess.run([os.path.join(BIN, "spanbert-prepare"), "--train", *novels, "--join-wrapped-lines",
                        "--wordpiece-vocab", os.path.join(SHARED, "bert_uncased_vocab", "vocab.txt"), "--lowercase",
                        "--destdir", corpus], check=True)
    sst2 = os.path.join(work, "sst2")
    if not os.path.isdir(sst2):
        rows = open(os.path.join(SHARED, "glue", "SST-2", "train.tsv"), encoding="utf-8").read().splitlines()[:4001]
        train = os.path.join(work, "sst2_train.tsv")
        with open(train, "w", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
        subprocess.run([os.path.join(BIN, "spanbert-prepare-classification"), "--train", train, "--valid",
                        os.path.join(SHARED, "glue", "SST-2", "dev.tsv"), "--tokenizer-from", corpus, "--destdir", sst2,
                        "--text-columns", "sentence", "--label-column", "label"], check=True)
    litbank = os.path.join(work, "litbank")
    if not os.path.isdir(litbank):
        splits = os.path.join(SHARED, "litbank", "splits", "fold0")
        subprocess.run([os.path.join(BIN, "spanbert-prepare-coref"), "--train", os.path.join(splits, "train.txt"),
                        "--tokenizer-from", corpus, "--destdir", litbank, "--max-segment-length", "384"], check=True)
    return {"corpus": corpus, "sst2": sst2, "litbank": litbank}


def command_line(workload, data):
    common = ["--user-dir", os.path.join(ROOT, "user_dir"), "--cpu", "--optimizer", "adam", "--lr", "1e-4",
              "--clip-norm", "1.0", "--num-workers", "0", "--seed", "1", "--disable-validation"]
    if workload == "minilm_pretrain":
        return [data["corpus"], "--task", "spanbert_pretraining", "--criterion", "span_bert", *MINILM,
                "--tokens-per-sample", "128", "--batch-size", "32", *common]
    if workload == "tiny_pretrain":
        return [data["corpus"], "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch",
                "spanbert_tiny", "--tokens-per-sample", "128", "--batch-size", "16", *common]
    if workload == "sst2":
        return [data["sst2"], "--task", "sentence_classification", "--criterion", "sentence_classification",
                *MINILM, "--batch-size", "32", *common]
    return [data["litbank"], "--task", "coreference", "--criterion", "coreference", *MINILM,
            "--coref-ffnn-size", "150", "--max-training-segments", "3", "--batch-size", "1", *common]


def build_trainer(argv):
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", training=True)
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    iterator = task.get_batch_iterator(task.dataset("train"), max_tokens=cfg.dataset.max_tokens,
                                       max_sentences=cfg.dataset.batch_size, seed=1).next_epoch_itr(shuffle=True)
    return trainer, iterator, model


RESULT_KEYS = ("threads", "cpu_bf16", "runs", "steps", "workloads")  # what tells this script's results file


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="updates per side and run (the run's median)")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "bf16_autocast_speed"))
    parser.add_argument("--out", required=True, help="results JSON")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    args = parser.parse_args()
    from command_output import relative_to_root
    from results_file import check_results_file, write_results_file

    check_results_file(args.out, "bf16_autocast_speed.py", args.force, RESULT_KEYS)
    import torch

    torch.set_num_threads(args.threads)
    import spanbert_plugin.registry  # noqa: F401
    from spanbert_plugin.core.precision import cpu_supports_bf16
    from timing import alternating_runs, ratio_line, thread_note, time_line

    os.makedirs(args.work, exist_ok=True)
    data = prepare(args.work)
    results = {"threads": thread_note(), "cpu": platform.processor() or platform.machine(),
               "cpu_bf16": cpu_supports_bf16(), "torch": torch.__version__, "runs": args.runs, "steps": args.steps,
               "workloads": {}}
    for workload in args.workloads.split(","):
        argv = command_line(workload, data)
        sides = {}
        for name, extra in (("fp32", []), ("bf16_autocast", ["--bf16-autocast"])):
            trainer, iterator, model = build_trainer(argv + extra)
            sides[name] = (trainer, iterator)
        # the same starting weights on both sides
        sides["bf16_autocast"][0].model.load_state_dict(sides["fp32"][0].model.state_dict())

        def update(name):
            trainer, iterator = sides[name]
            return lambda step: trainer.train_step([next(iterator)])

        per_run = alternating_runs({name: update(name) for name in sides}, args.runs, args.steps)
        results["workloads"][workload] = {"command": [relative_to_root(a) for a in argv],
                                          "seconds_per_update": per_run}
        print(f"{workload} ({thread_note()}): " + ratio_line("fp32 / bf16-autocast update time", per_run["fp32"],
                                                              per_run["bf16_autocast"]), flush=True)
        for name in sides:
            print("   " + time_line(name, per_run[name], unit="s", scale=1.0, places=3), flush=True)
        write_results_file(args.out, results)  # after every workload: a stopped run keeps those done
    return 0


if __name__ == "__main__":
    sys.exit(main())
