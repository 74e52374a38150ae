#!/usr/bin/env python
"""Fine-tuning step time (forward + backward + Adam) of a spanbert classifier: plain against AD-DROP,
or the plain step against the plain step of another checkout.

    .venv/bin/python benchmarks/cpu_speed/ad_drop_step_time.py [--runs 7 --steps 4 --threads 2]
        [--layers 4 --dim 256 --heads 4 --ffn 1024 --batch 8 --seq 128] [--ad-drop-layers 0 --attribution gradient]
    .venv/bin/python benchmarks/cpu_speed/ad_drop_step_time.py --compare-root OLD_CHECKOUT [--runs 7 --steps 4]

Default: plain and AD-DROP steps in one process, in ``--runs`` alternating runs of ``--steps``
steps each (the order flips every run); each run gives each side its median step time, and the
script prints the per-step medians and the ratio AD-DROP / plain (median of the per-run ratios,
with their range). ``--compare-root OLD`` times the plain step of this checkout against that of
another one (e.g. the commit before AD-DROP, extracted with ``git archive``): the two cannot share
a process (same package name), so each run starts one child process per checkout, alternating,
each timing ``--steps`` plain steps after two warm-up steps with the same ``--threads``; the ratio
is this / OLD. Peak resident memory is printed per process (on CUDA: peak allocated GPU memory).
"""
import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers

from timing import alternating_runs, ratio_line, thread_note, time_line  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("both", "plain", "ad_drop"), default="both", help="which steps to time")
    parser.add_argument("--root", default=ROOT, help="checkout whose spanbert_plugin is imported")
    for name, default in (("layers", 4), ("dim", 256), ("heads", 4), ("ffn", 1024), ("batch", 8), ("seq", 128),
                          ("steps", 4), ("runs", 7), ("threads", 2)):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    parser.add_argument("--compare-root", help="time the plain step of this checkout against that of another one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child of --compare-root
    parser.add_argument("--ad-drop-layers", default="0", help="--ad-drop-layers of the AD-DROP steps")
    parser.add_argument("--attribution", default="gradient", help="--ad-drop-attribution of the AD-DROP steps")
    parser.add_argument("--p", type=float, default=0.3, help="--ad-drop-p")
    parser.add_argument("--q", type=float, default=0.5, help="--ad-drop-q")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    return parser.parse_args()


def build_model(args, device):
    import torch

    import spanbert_plugin

    if os.path.isdir(os.path.join(os.path.dirname(spanbert_plugin.__file__), "core")):
        from spanbert_plugin.core.dictionary import SpanBertDictionary
        from spanbert_plugin.model.spanbert import SpanBertConfig, SpanBertEncoder, SpanBertModel
    else:  # a --compare-root checkout from before the one-folder-per-feature layout
        from spanbert_plugin.data.dictionary import SpanBertDictionary
        from spanbert_plugin.models.spanbert import SpanBertConfig, SpanBertEncoder, SpanBertModel

    torch.manual_seed(1)
    dictionary = SpanBertDictionary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(8000)])
    cfg = SpanBertConfig(encoder_layers=args.layers, encoder_embed_dim=args.dim, encoder_ffn_embed_dim=args.ffn,
                         encoder_attention_heads=args.heads, max_positions=max(512, args.seq))
    model = SpanBertModel(cfg, SpanBertEncoder(cfg, dictionary))
    model.register_classification_head("cls", num_classes=2)
    return model.to(device).train()


def batches(args, device, count):
    """Batches of random tokens; lengths from seq/2 to seq, so padding is present."""
    import torch

    gen = torch.Generator().manual_seed(2)
    out = []
    for _ in range(count):
        lengths = torch.randint(args.seq // 2, args.seq + 1, (args.batch,), generator=gen)
        tokens = torch.randint(5, 8005, (args.batch, args.seq), generator=gen)
        tokens[torch.arange(args.seq)[None, :] >= lengths[:, None]] = 0
        tokens[:, 0] = 2
        out.append({"net_input": {"src_tokens": tokens.to(device)},
                    "target": torch.randint(0, 2, (args.batch,), generator=gen).to(device)})
    return out


class Criterion:
    """Summed cross-entropy on the [CLS] head; AD-DROP scalar: summed pseudo-label logits."""

    def __call__(self, model, sample):
        import torch.nn.functional as F

        logits, _ = model(**sample["net_input"], classification_head_name="cls")
        loss = F.cross_entropy(logits.float(), sample["target"], reduction="sum")
        return loss, sample["target"].numel(), {}

    def ad_drop_objective(self, model, sample):
        from spanbert_plugin.addrop.attribution import pseudo_label_logit_sum

        return pseudo_label_logit_sum(model(**sample["net_input"], classification_head_name="cls")[0])


class _Backward:
    def backward(self, loss):
        loss.backward()


def compare_roots(args):
    """Alternating child processes of this checkout and of ``--compare-root``: plain step medians and their ratio."""
    roots = {"this checkout": ROOT, "other checkout": os.path.abspath(args.compare_root)}
    sizes = ["--layers", str(args.layers), "--dim", str(args.dim), "--heads", str(args.heads), "--ffn", str(args.ffn),
             "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps), "--threads",
             str(args.threads), "--device", args.device]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    results = {name: [] for name in roots}

    def child(name):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", "plain", "--root", roots[name],
                               "--json", *sizes], capture_output=True, text=True, env=env, check=True)
        results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))

    names = list(roots)
    for run in range(args.runs):  # whole-process times include imports: only the children's step medians count
        for name in (names if run % 2 == 0 else names[::-1]):
            child(name)
    print(f"plain step, encoder {args.layers} x {args.dim}, batch {args.batch} x {args.seq}, {args.steps} timed steps "
          f"per process, {args.runs} alternating runs, {args.threads} threads")
    for name, root in roots.items():
        times = [r["plain_ms"] / 1000 for r in results[name]]
        peak = max(r["peak_rss_mib"] for r in results[name])
        print(time_line(f"{name} ({root})", times) + f"; peak resident memory {peak:.0f} MiB")
    print(ratio_line("plain step, this / other", [r["plain_ms"] for r in results["this checkout"]],
                     [r["plain_ms"] for r in results["other checkout"]]))


def main():
    args = parse_args()
    if args.compare_root:
        return compare_roots(args)
    sys.path.insert(0, os.path.abspath(args.root))  # before the installed checkout
    import torch

    import spanbert_plugin

    device = torch.device(args.device)
    modes = ["plain", "ad_drop"] if args.mode == "both" else [args.mode]
    steps = {}
    if "ad_drop" in modes:
        from fairseq.tasks import FairseqTask

        from spanbert_plugin.addrop.task_mixin import ADDropConfig, ADDropMixin

        cfg = ADDropConfig(ad_drop_p=args.p, ad_drop_q=args.q, ad_drop_layers=args.ad_drop_layers,
                           ad_drop_attribution=args.attribution, ad_drop_every_epoch=True, seed=1)
        # the plugin's tasks (OneDictionaryTask) give the mixin forward_precision: fp32 here, as FairseqTask runs
        task = type("BenchTask", (ADDropMixin, FairseqTask),
                    {"forward_precision": lambda self, model: contextlib.nullcontext()})(cfg)
        steps["ad_drop"] = lambda model, sample, n: task.train_step(sample, model, Criterion(), _Backward(), n)
    steps["plain"] = lambda model, sample, n: _Backward().backward(Criterion()(model, sample)[0])

    torch.set_num_threads(args.threads)
    model = build_model(args, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    data = batches(args, device, 8)
    peaks = {}

    def timed(mode):
        def step(n):
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            steps[mode](model, data[n % len(data)], n)
            optimizer.step()
            optimizer.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
                peaks[mode] = max(peaks.get(mode, 0), torch.cuda.max_memory_allocated())
        return step

    if args.json:  # one run of one side, for --compare-root: two warm-up steps, then the median of --steps
        for n in range(2):
            timed(args.mode)(n)
        times = []
        for n in range(args.steps):
            start = time.perf_counter()
            timed(args.mode)(n + 2)
            times.append(time.perf_counter() - start)
        print(json.dumps({f"{args.mode}_ms": 1000 * statistics.median(times),
                          "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
        return
    per_run = alternating_runs({mode: timed(mode) for mode in modes}, args.runs, steps_per_run=args.steps)
    print(f"spanbert_plugin from {os.path.dirname(os.path.dirname(spanbert_plugin.__file__))}; encoder {args.layers} x "
          f"{args.dim} (heads {args.heads}, FFN {args.ffn}), batch {args.batch} x {args.seq}, {args.runs} alternating "
          f"runs of {args.steps} steps, {device}, {thread_note()}")
    if "ad_drop" in modes:
        print(f"AD-DROP: p {args.p}, q {args.q}, layers {args.ad_drop_layers}, attribution {args.attribution}")
    for mode in modes:
        peak = f", peak GPU memory {peaks[mode] / 2**20:.0f} MiB" if mode in peaks else ""
        print(time_line(f"{mode:8s} step", per_run[mode]) + peak)
    if len(modes) == 2:
        print(ratio_line("AD-DROP / plain", per_run["ad_drop"], per_run["plain"]))
    print(f"peak resident memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
