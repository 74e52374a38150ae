#!/usr/bin/env python
"""Fine-tuning step time (forward + backward + Adam) of a spanbert classifier: plain against AD-DROP.

    .venv/bin/python benchmarks/ad_drop_step_time.py [--mode both|plain|ad_drop] [--root CHECKOUT]
        [--layers 4 --dim 256 --heads 4 --ffn 1024 --batch 16 --seq 128 --steps 20]
        [--ad-drop-layers 0 --attribution gradient]

``--mode both`` alternates plain and AD-DROP steps in one process and prints
the median of each and their ratio. ``--mode plain --root OTHER`` times the
plain step with the spanbert_plugin of another checkout (e.g. the commit before
AD-DROP, extracted with ``git archive``), so two processes compare the
encoder before and after the change. Each process prints its peak resident
memory (on CUDA: the peak allocated GPU memory of each mode).
"""
import argparse
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("both", "plain", "ad_drop"), default="both", help="which steps to time")
    parser.add_argument("--root", default=ROOT, help="checkout whose spanbert_plugin is imported")
    for name, default in (("layers", 4), ("dim", 256), ("heads", 4), ("ffn", 1024), ("batch", 16), ("seq", 128),
                          ("steps", 20)):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    parser.add_argument("--ad-drop-layers", default="0", help="--ad-drop-layers of the AD-DROP steps")
    parser.add_argument("--attribution", default="gradient", help="--ad-drop-attribution of the AD-DROP steps")
    parser.add_argument("--p", type=float, default=0.3, help="--ad-drop-p")
    parser.add_argument("--q", type=float, default=0.5, help="--ad-drop-q")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    return parser.parse_args()


def build_model(args, device):
    import torch
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
        from spanbert_plugin.modules.ad_drop import pseudo_label_logit_sum

        return pseudo_label_logit_sum(model(**sample["net_input"], classification_head_name="cls")[0])


class _Backward:
    def backward(self, loss):
        loss.backward()


def main():
    args = parse_args()
    sys.path.insert(0, os.path.abspath(args.root))  # before the installed checkout
    import torch

    import spanbert_plugin

    device = torch.device(args.device)
    modes = ["plain", "ad_drop"] if args.mode == "both" else [args.mode]
    steps = {}
    if "ad_drop" in modes:
        from fairseq.tasks import FairseqTask

        from spanbert_plugin.tasks.ad_drop import ADDropConfig, ADDropMixin

        cfg = ADDropConfig(ad_drop_p=args.p, ad_drop_q=args.q, ad_drop_layers=args.ad_drop_layers,
                           ad_drop_attribution=args.attribution, ad_drop_every_epoch=True, seed=1)
        task = type("BenchTask", (ADDropMixin, FairseqTask), {})(cfg)
        steps["ad_drop"] = lambda model, sample, n: task.train_step(sample, model, Criterion(), _Backward(), n)
    steps["plain"] = lambda model, sample, n: _Backward().backward(Criterion()(model, sample)[0])

    model = build_model(args, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    data = batches(args, device, args.steps + 2)
    times = {mode: [] for mode in modes}
    peaks = {}
    for n, sample in enumerate(data):
        for mode in modes:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            steps[mode](model, sample, n)
            optimizer.step()
            optimizer.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
                peaks[mode] = max(peaks.get(mode, 0), torch.cuda.max_memory_allocated())
            if n >= 2:  # warm-up steps not timed
                times[mode].append(time.perf_counter() - start)
    print(f"spanbert_plugin from {os.path.dirname(os.path.dirname(spanbert_plugin.__file__))}; encoder {args.layers} x "
          f"{args.dim} (heads {args.heads}, FFN {args.ffn}), batch {args.batch} x {args.seq}, {args.steps} timed steps, "
          f"{device}, {torch.get_num_threads()} threads")
    if "ad_drop" in modes:
        print(f"AD-DROP: p {args.p}, q {args.q}, layers {args.ad_drop_layers}, attribution {args.attribution}")
    median = {mode: statistics.median(t) for mode, t in times.items()}
    for mode in modes:
        peak = f", peak GPU memory {peaks[mode] / 2**20:.0f} MiB" if mode in peaks else ""
        print(f"{mode:8s} {median[mode] * 1000:8.1f} ms/step{peak}")
    if len(modes) == 2:
        print(f"ratio AD-DROP / plain: {median['ad_drop'] / median['plain']:.3f}x")
    print(f"peak resident memory of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
