#!/usr/bin/env python
"""Host time of the module walks fairseq makes before every update: the plugin's model against torch's and fairseq's.

fairseq's ``Trainer.train_step`` and the task's ``train_step`` call ``model.train()`` (twice in all) and
``model.set_num_updates(n)`` before each update. Neither launches a kernel: they are Python over every module, which
on a GPU, where a small model's update is bound by the host, adds to the update's time. ``SpanBertModel`` sets the
training flag in one pass over its modules and calls ``set_num_updates`` only on modules with their own; here
both are timed against ``nn.Module.train`` and fairseq's ``BaseFairseqModel.set_num_updates`` on the same model,
alternating, with the fine-tuning heads of SST-2 (one classification head) in place. (fairseq's seeding before
each update: ``seeding.py``, from fairseq-train's own stack.)

    .venv/bin/python benchmarks/cpu_speed/update_cost/module_walks.py --out benchmarks/cpu_speed/update_cost/results/module_walks.json

Writes the JSON file ``--out`` and prints its table; an existing ``--out`` is replaced only with ``--force``, and only
when it is an earlier result of this script.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
from results_file import check_results_file, write_results_file  # noqa: E402
from update_cost import SHAPES as UPDATE_COST_SHAPES  # noqa: E402  (this script's folder)

SHAPES = {name: UPDATE_COST_SHAPES[name] for name in ("minilm-shape", "base-shape")}  # layers, hidden, heads, FFN
RESULT_KEYS = ("rounds", "calls", "rows")
# torch, fairseq and the plugin are imported only once --out is accepted: a refused --out costs no imports


def walks():
    """Per update: (what, the plugin's call, the call it replaces, calls per update)."""
    from fairseq.models import BaseFairseqModel
    from torch import nn

    return (
        ("model.train()", lambda m: m.train(), lambda m: nn.Module.train(m), 2),
        ("model.set_num_updates(n)", lambda m: m.set_num_updates(7), lambda m: BaseFairseqModel.set_num_updates(m, 7), 1),
    )


def model_of(shape):
    from fairseq.data import Dictionary

    from spanbert_plugin.model.spanbert import SpanBertConfig, SpanBertEncoder, SpanBertModel

    layers, hidden, heads, ffn = SHAPES[shape]
    dictionary = Dictionary()
    for i in range(30522 - len(dictionary)):  # BERT's vocabulary size (the walks do not depend on it)
        dictionary.add_symbol(f"w{i}")
    cfg = SpanBertConfig(encoder_layers=layers, encoder_embed_dim=hidden, encoder_attention_heads=heads,
                         encoder_ffn_embed_dim=ffn)
    model = SpanBertModel(cfg, SpanBertEncoder(cfg, dictionary))
    model.register_classification_head("sentence_classification_head", num_classes=2)
    return model


def microseconds(call, model, calls):
    start = time.perf_counter()
    for _ in range(calls):
        call(model)
    return (time.perf_counter() - start) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="alternating rounds; each times --calls calls")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", required=True, help="results JSON")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    args = parser.parse_args()
    check_results_file(args.out, "module_walks.py", args.force, RESULT_KEYS)
    import torch

    torch.set_num_threads(1)
    rows = []
    for shape in SHAPES:
        model = model_of(shape)
        for what, ours, theirs, per_update in walks():
            times = {"plugin": [], "fairseq": []}
            for round_ in range(args.rounds):
                order = (("plugin", ours), ("fairseq", theirs))
                for side, call in order if round_ % 2 == 0 else order[::-1]:
                    times[side].append(microseconds(call, model, args.calls))
            ratios = [p / f for p, f in zip(times["plugin"], times["fairseq"])]
            rows.append({"shape": shape, "modules": len(list(model.modules())), "walk": what, "per_update": per_update,
                         "plugin_us": statistics.median(times["plugin"]), "fairseq_us": statistics.median(times["fairseq"]),
                         "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]})
    write_results_file(args.out, {"rounds": args.rounds, "calls": args.calls, "torch": torch.__version__, "rows": rows})
    lines = [f"Median over {args.rounds} alternating rounds of {args.calls} calls, one thread; the model with an SST-2 "
             "classification head.", "",
             "| shape | modules | walk | calls per update | fairseq / torch µs | plugin µs | ratio (range) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['modules']} | `{r['walk']}` | {r['per_update']} | {r['fairseq_us']:.0f} | "
                     f"{r['plugin_us']:.0f} | {r['ratio']:.2f}x ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}) |")
    for shape in SHAPES:
        saved = sum((r["fairseq_us"] - r["plugin_us"]) * r["per_update"] for r in rows if r["shape"] == shape)
        lines.append(f"\nHost time saved per update, {shape}: {saved / 1e3:.2f} ms")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
