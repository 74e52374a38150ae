#!/usr/bin/env python
"""QA fine-tuning step time: spanbert + extractive_qa vs transformers' BertForQuestionAnswering.

Both models have the same size and the same weights (ours copied into the
transformers model through the export's name mapping; the first batch's loss is
checked to agree in eval mode), the same dropout, and get the same batches:
real SQuAD 1.1 dev windows ``[CLS] question [SEP] passage [SEP]`` prepared by
``spanbert-prepare-qa``'s library with token types and start/end labels,
``--batch`` windows of exactly ``--seq`` tokens each (no padding). One step is
forward + loss ((CE(start) + CE(end)) / 2 per window, ours through the
``extractive_qa`` criterion, theirs ``BertForQuestionAnswering``'s own loss) +
backward + Adam update (``torch.optim.Adam`` on both sides), on the CPU. The
sides alternate step by step, so drift in the shared machine's speed hits both;
warm-up steps are not timed. Reported: median ms per step and the median and
interquartile range of the per-step ratios ours / theirs.

A third row times ours with fairseq's own Adam (what ``fairseq-train`` runs on a
CPU) for reference; the ratio goal is about the models, both under torch's Adam.

    .venv/bin/python benchmarks/cpu_speed/qa_step_time.py [--layers 4 --dim 256 --heads 4 --ffn 1024 --batch 8 --seq 384]
    .venv/bin/python benchmarks/cpu_speed/qa_step_time.py --layers 2 --dim 128 --heads 2 --ffn 512   # spanbert_tiny's size

On a GPU (``--device cuda``), ``--amp`` runs both sides under ``torch.autocast`` (fp16) with a
``GradScaler`` each, and every step ends with ``torch.cuda.synchronize()`` so it is timed whole:

    python benchmarks/cpu_speed/qa_step_time.py --device cuda --amp --layers 12 --dim 768 --heads 12 --ffn 3072 --steps 50
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))  # the shared helpers
SQUAD_DEV = os.environ.get("SQUAD_DEV", os.path.join(ROOT, "..", "shared", "data", "squad", "dev-v1.1.json"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import ratio_line  # noqa: E402

OURS, THEIRS, OURS_FAIRSEQ_ADAM = ("spanbert + extractive_qa", "transformers BertForQuestionAnswering",
                                   "spanbert + extractive_qa, fairseq Adam")


def prepared_squad(out, seq, tokenizer_from):
    """SQuAD 1.1 dev windows of up to ``seq`` tokens (train split: with labels), cached under ``out``."""
    from spanbert_plugin.qa.prepare import QAConfig, prepare_qa

    folder = os.path.join(out, f"qa_squad_dev_{seq}")
    if not os.path.isfile(os.path.join(folder, "qa_config.json")):
        prepare_qa({"train": SQUAD_DEV}, tokenizer_from, folder, QAConfig(seq, 128, 64), force=True)
    return folder


def build_spanbert(data, args):
    """(task, model with QA head, extractive_qa criterion, fairseq Adam config) from fairseq-train's arguments."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cli = [data, "--user-dir", os.path.join(ROOT, "user_dir"), "--task", "extractive_qa", "--criterion", "extractive_qa",
           "--arch", "spanbert_base", "--cpu", "--encoder-layers", str(args.layers), "--encoder-embed-dim", str(args.dim),
           "--encoder-ffn-embed-dim", str(args.ffn), "--encoder-attention-heads", str(args.heads),
           "--max-positions", str(args.max_positions), "--optimizer", "adam", "--lr", str(args.lr)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), cli))
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion), cfg


def hf_copy(model, cfg, dictionary):
    """``BertForQuestionAnswering`` of the same size holding our weights (the export's name mapping)."""
    from transformers import BertForQuestionAnswering

    from spanbert_plugin.hf.interop import bert_config_of, to_hf_state_dict

    config = bert_config_of(cfg.model, dictionary, architectures=("BertForQuestionAnswering",))
    hf = BertForQuestionAnswering(config)
    hf_state = {k: v for k, v in to_hf_state_dict(model.state_dict()).items() if not k.startswith("cls.")}
    missing, unexpected = hf.load_state_dict(hf_state, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return hf


def full_length_batches(dataset, seq, batch, count, seed=0):
    """``count`` collated batches of ``batch`` windows of exactly ``seq`` tokens (passages longer than a window)."""
    full = np.flatnonzero(np.asarray(dataset.sizes) == seq)
    need = batch * count
    if len(full) < batch:
        raise SystemExit(f"only {len(full)} windows of {seq} tokens; use a smaller --seq")
    order = np.random.default_rng(seed).permutation(full)
    order = np.resize(order, need)  # cycle when there are fewer than needed
    return [dataset.collater([dataset[int(i)] for i in order[k * batch:(k + 1) * batch]]) for k in range(count)]


def hf_inputs(batch, pad):
    net = batch["net_input"]
    return dict(input_ids=net["src_tokens"], token_type_ids=net["segment_labels"],
                attention_mask=net["src_tokens"].ne(pad).long())


def check_same_loss(model, criterion, hf, batch, pad):
    """Eval-mode losses of the two models on one batch: they must agree (same weights, same computation)."""
    model.eval()
    hf.eval()
    windows_only = {k: v for k, v in batch.items() if k != "qa_split"}  # a loss, not validation's answer scoring
    with torch.no_grad():
        loss, n, _ = criterion(model, windows_only)
        theirs = hf(**hf_inputs(batch, pad), start_positions=batch["start_positions"],
                    end_positions=batch["end_positions"]).loss
    ours = float(loss) / n
    assert abs(ours - float(theirs)) < 1e-4, (ours, float(theirs))
    return ours, float(theirs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default, help_text in (
        ("layers", 4, "encoder layers"), ("dim", 256, "hidden size"), ("heads", 4, "attention heads"),
        ("ffn", 1024, "feed-forward size"), ("batch", 8, "windows per step"), ("seq", 384, "tokens per window"),
        ("max-positions", 512, "position embeddings of both models"), ("steps", 20, "timed steps"),
        ("warmup", 3, "untimed first steps"), ("threads", 2, "torch threads"),
    ):
        parser.add_argument(f"--{name}", type=int, default=default, help=help_text)
    parser.add_argument("--lr", type=float, default=3e-5, help="Adam learning rate")
    parser.add_argument("--tokenizer-from", help="tokenizer folder (default: the benchmark corpus' sentencepiece, "
                        "vocabulary 8,001, prepared under benchmarks/out)")
    parser.add_argument("--no-fairseq-adam", action="store_true", help="skip the reference row with fairseq's Adam")
    parser.add_argument("--device", default="cpu", help="torch device of both models (cpu, cuda)")
    parser.add_argument("--amp", action="store_true", help="fp16 autocast + GradScaler on both sides (CUDA)")
    args = parser.parse_args()
    if not os.path.isfile(SQUAD_DEV):
        raise SystemExit(f"{SQUAD_DEV}: no such file (the shared SQuAD 1.1 dev set)")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out = os.path.join(ROOT, "benchmarks", "out")
    if args.tokenizer_from is None:
        from masking_throughput import prepared_data

        args.tokenizer_from = prepared_data(out)
    data = prepared_squad(out, args.seq, args.tokenizer_from)
    task, model, criterion, cfg = build_spanbert(data, args)
    pad = task.source_dictionary.pad()
    hf = hf_copy(model, cfg, task.source_dictionary)
    task.load_dataset("train", training=True)
    batches = full_length_batches(task.dataset("train"), args.seq, args.batch, args.steps + args.warmup)
    device = torch.device(args.device)
    model.to(device)
    hf.to(device)
    if device.type == "cuda":
        from fairseq.utils import move_to_cuda

        batches = [move_to_cuda(b, device) for b in batches]
    ours_loss, theirs_loss = check_same_loss(model, criterion, hf, batches[0], pad)
    scalers = {}

    def backward(name, loss):
        # under --amp each side has its own GradScaler (what a user's loop or fairseq's --amp does)
        if args.amp:
            scalers.setdefault(name, torch.amp.GradScaler(device.type)).scale(loss).backward()
        else:
            loss.backward()

    def autocast():
        return torch.autocast(device.type, dtype=torch.float16, enabled=args.amp)

    def spanbert_step(batch):
        with autocast():
            loss, sample_size, _ = criterion(model, batch)
        backward(OURS, loss / sample_size)

    def hf_step(batch):
        with autocast():
            loss = hf(**hf_inputs(batch, pad), start_positions=batch["start_positions"],
                      end_positions=batch["end_positions"]).loss
        backward(THEIRS, loss)

    runs = {OURS: (model, spanbert_step, torch.optim.Adam(model.parameters(), lr=args.lr)),
            THEIRS: (hf, hf_step, torch.optim.Adam(hf.parameters(), lr=args.lr))}
    if not args.no_fairseq_adam:
        import copy

        from fairseq import optim

        twin = copy.deepcopy(model)
        twin_criterion = task.build_criterion(cfg.criterion)

        def twin_step(batch):
            with autocast():
                loss, sample_size, _ = twin_criterion(twin, batch)
            backward(OURS_FAIRSEQ_ADAM, loss / sample_size)

        runs[OURS_FAIRSEQ_ADAM] = (twin, twin_step, optim.build_optimizer(cfg.optimizer, list(twin.parameters())))
    times = {name: [] for name in runs}
    for step, batch in enumerate(batches):
        # the order flips every step, so neither side always runs first
        for name, (net, run, optimizer) in (list(runs.items()) if step % 2 == 0 else list(runs.items())[::-1]):
            net.train()
            start = time.perf_counter()
            run(batch)
            if name in scalers:
                scalers[name].step(optimizer)
                scalers[name].update()
            else:
                optimizer.step()
            optimizer.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= args.warmup:
                times[name].append(time.perf_counter() - start)
    print(f"encoder {args.layers} x {args.dim} (heads {args.heads}, FFN {args.ffn}), vocab {len(task.source_dictionary)}, "
          f"batch {args.batch} x {args.seq} tokens (SQuAD dev windows), "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else f'{torch.get_num_threads()} threads'}"
          f"{', fp16 autocast' if args.amp else ''}, "
          f"{args.steps} timed steps; eval-mode loss on batch 0: ours {ours_loss:.6f}, transformers {theirs_loss:.6f}")
    for name, t in times.items():
        print(f"{name:40s} {statistics.median(t) * 1000:8.1f} ms/step (min {min(t) * 1000:.1f}, max {max(t) * 1000:.1f})")
    for name in [n for n in runs if n != THEIRS]:
        ratios = sorted(a / b for a, b in zip(times[name], times[THEIRS]))
        print(f"ratio {name} / transformers: median {statistics.median(ratios):.3f}x "
              f"(per-step ratios {ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f} interquartile; "
              f"ratio of median step times {statistics.median(times[name]) / statistics.median(times[THEIRS]):.3f}x)")
        print(ratio_line(f"{name} / transformers (each step a run)", times[name], times[THEIRS]))


if __name__ == "__main__":
    main()
