#!/usr/bin/env python
"""The optimizer's share of one fine-tuning update: fairseq's ``adam`` against ``--optimizer torch_adamw``.

On the parameters of a BERT encoder of a given shape (default all-MiniLM-L6-v2's: 6 layers, hidden 384,
12 heads, FFN 1536, vocabulary 30,522, plus a 2-class head) with random gradients, one update does what
fairseq's trainer does after the backward pass: scale the gradients (``multiply_grads``), clip their norm
at 1.0 (``clip_grad_norm``) and step. Per optimizer:

* **operations per update**: the top-level PyTorch operations the profiler records (each is at least one
  kernel launch on a GPU, where a small model's update is bound by launches, not FLOPs); machine-independent;
* **milliseconds per update** on this machine (``--device``; CPU by default), median of ``--updates``,
  the two optimizers alternating.

    .venv/bin/python benchmarks/cpu_speed/optimizer_step.py [--layers 6 --dim 384 --ffn 1536] [--threads 1] [--device cpu]
"""
import argparse
import statistics
import sys
import time

import torch
from omegaconf import OmegaConf


def encoder_parameters(args):
    """The parameters of a BERT encoder of this shape with a 2-class head (built with transformers)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=args.vocab, hidden_size=args.dim, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=args.ffn, num_labels=2)
    torch.manual_seed(0)
    return list(BertForSequenceClassification(config).to(args.device).parameters())


def build(name, params):
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

    import spanbert_plugin.registry  # noqa: F401
    from spanbert_plugin.core.torch_adamw import TorchAdamW, TorchAdamWConfig

    options = dict(lr=[2e-5], adam_betas="(0.9,0.999)", adam_eps=1e-6, weight_decay=0.01)
    if name == "adam":
        return FairseqAdam(OmegaConf.structured(FairseqAdamConfig(**options, tpu=False)), params)
    return TorchAdamW(OmegaConf.structured(TorchAdamWConfig(**options)), params)


def update(optimizer, params, grads, device):
    for p, g in zip(params, grads):
        p.grad = g.clone()
    return timed_update(optimizer, device)


def timed_update(optimizer, device):
    if device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    optimizer.multiply_grads(1 / 32)
    optimizer.clip_grad_norm(1.0)
    optimizer.step()
    if device != "cpu":
        torch.cuda.synchronize()
    return time.perf_counter() - start


NO_KERNEL = {"aten::detach", "aten::to", "aten::view", "aten::alias", "aten::empty"}  # views, same-device casts


def operations(optimizer, params, grads, device):
    """(top-level operations the profiler records in one update, those of them that compute: not views,
    same-device casts or allocations; nested calls are not counted twice)."""
    from torch.profiler import profile

    for p, g in zip(params, grads):
        p.grad = g.clone()
    with profile() as prof:
        timed_update(optimizer, device)
    def outermost(event):
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                return False
            parent = parent.cpu_parent
        return True

    top = [e.name for e in prof.events() if e.name.startswith("aten::") and outermost(e)]
    return len(top), sum(1 for name in top if name not in NO_KERNEL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--ffn", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--updates", type=int, default=30, help="timed updates per optimizer (after 3 warm-up ones)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = ("adam", "torch_adamw")
    runs = {}
    for name in names:
        params = encoder_parameters(args)
        generator = torch.Generator().manual_seed(1)
        grads = [torch.randn(p.shape, generator=generator).to(args.device) for p in params]
        runs[name] = (build(name, params), params, grads)
    print(f"{len(runs['adam'][1])} parameter tensors, {sum(p.numel() for p in runs['adam'][1]):,} parameters, "
          f"device {args.device}, {args.threads} thread(s)")
    seconds = {name: [] for name in names}
    for _ in range(3):
        for name in names:
            update(*runs[name], args.device)
    ops = {name: operations(*runs[name], args.device) for name in names}
    for _ in range(args.updates):
        for name in names:  # alternating, so both see the same load
            seconds[name].append(update(*runs[name], args.device))
    print("| optimizer | operations per update (computing ones) | ms per update (median) | range |")
    print("| --- | --- | --- | --- |")
    for name in names:
        values = [1000 * s for s in seconds[name]]
        print(f"| `{name}` | {ops[name][0]} ({ops[name][1]}) | {statistics.median(values):.2f} | "
              f"{min(values):.2f}-{max(values):.2f} |")
    ratio = statistics.median(seconds["adam"]) / statistics.median(seconds["torch_adamw"])
    print(f"\ntorch_adamw is {ratio:.2f}x as fast per update, with {ops['adam'][1] / ops['torch_adamw'][1]:.0f}x fewer "
          "computing operations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
