"""The cost of an update: host syncs of the plugin and of fairseq's trainer, the selections of masked tokens made on
the host, the device-dependent chunking of the vocabulary cross-entropy, logged model FLOP/s, --tf32."""
import argparse
import json
import logging
import math
import os
import sys
import traceback
import types

import pytest
import torch
from fairseq import metrics, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

import spanbert_plugin.registry  # noqa: F401
from conftest import ROOT, bin_path, run_cli
from spanbert_plugin.core import logging_reads, model_flops, update_seeding
from spanbert_plugin.pretraining import vocab_cross_entropy as vce

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "cpu_speed", "update_cost"))
import update_cost  # noqa: E402

# torch imports a module at a process's first record_function; when a profile with_stack records that import, the
# module's name in it is now and then undecodable (torch 2.13: UnicodeDecodeError in profile.events(), about one run
# in five when this file's profiled tests ran first). The benchmark's own updates open ranges before profiling.
with torch.autograd.profiler.record_function("before any profile"):
    pass

PRETRAIN = ["--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch", "spanbert_tiny",
            "--tokens-per-sample", "128", "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3",
            "--clip-norm", "1.0", "--cpu", "--num-workers", "0", "--seed", "3"]
# Plugin code that syncs only on a CPU, by design: the CPU dropout seeds numpy's generator from torch's (off the
# CPU torch's own dropout runs), and the attention skips its mask when a CPU batch has no padding (off the CPU
# the mask is always applied, since asking would wait for the device).
CPU_ONLY = ("spanbert_plugin/model/dropout.py", "spanbert_plugin/model/layers.py")


def build(data, *extra):
    args = options.parse_args_and_arch(options.get_training_parser(), [data, *PRETRAIN, *extra])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return cfg, task, model, criterion


# Tensor calls that read a value back to the host: on a GPU each waits until the device has caught up.
HOST_READS = {"cpu", "numpy", "tolist", "item", "__bool__", "__float__", "__int__", "__index__", "nonzero"}


class HostReads(torch.overrides.TorchFunctionMode):
    """Records the host reads that plugin code makes, with the plugin frame that made each: device-independent,
    so a CPU run finds the ``.cpu()`` or ``.tolist()`` that a CPU profile cannot tell from a no-op."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        boolean_index = name == "__getitem__" and len(args) > 1 and any(
            torch.is_tensor(i) and i.dtype == torch.bool for i in (args[1] if isinstance(args[1], tuple) else (args[1],)))
        if name in HOST_READS or boolean_index:
            frames = [f for f in traceback.extract_stack()[:-1] if "spanbert_plugin" in f.filename]
            if frames and not any(path in frames[-1].filename for path in CPU_ONLY):
                where = frames[-1].filename[frames[-1].filename.index("spanbert_plugin"):]
                self.reads.append(f"{name} at {where}:{frames[-1].lineno}")
        return func(*args, **(kwargs or {}))


def syncs_by_source(profile, updates=1):
    counts = update_cost.count_profile(profile.events(), updates)["syncs_by_source"]
    return {where: n for where, n in counts.items() if not any(path in where for path in CPU_ONLY)}


def test_a_pretraining_update_syncs_only_in_fairseqs_finiteness_check(spm_data):
    """Through fairseq's own Trainer: the plugin's model, criterion and logging read nothing from the device, and
    fairseq's per-update reads of the logged values are gone; what remains is fairseq's check that the gradient
    norm is finite (Trainer.train_step), whose FloatingPointError the plugin keeps."""
    torch.manual_seed(0)
    cfg, task, model, criterion = build(spm_data, "--dropout", "0", "--attention-dropout", "0")
    trainer = Trainer(cfg, task, model, criterion)
    task.load_dataset("train")
    iterator = trainer.get_train_iterator(epoch=1, load_dataset=False).next_epoch_itr(shuffle=False)
    samples = [next(iterator) for _ in range(3)]
    trainer.train_step([samples[0]])  # the first update builds the optimizer
    with torch.profiler.profile(with_stack=True) as profile:
        for sample in samples[1:]:
            with torch.autograd.profiler.record_function(update_cost.UPDATE_RANGE):
                logged = trainer.train_step([sample])
    syncs = syncs_by_source(profile, updates=2)
    assert syncs == {"_local_scalar_dense (fairseq: fairseq/trainer.py(796): train_step)": 1.0}, syncs
    assert "_reduce_and_log_stats" not in json.dumps(syncs)
    assert {"loss", "mlm_loss", "sbo_loss", "tflops", "sample_size"} <= set(logged)  # reduced when read


FINETUNING = {"cls": ("sentence_classification", "sentence_classification"),
              "qa": ("extractive_qa", "extractive_qa"),
              "re": ("relation_extraction", "relation_extraction")}


@pytest.mark.parametrize("family", ["pretrain", *FINETUNING])
def test_a_training_update_reads_nothing_back_from_the_device_in_plugin_code(family, spm_data, family_data,
                                                                            imported):
    """Pre-training and the fine-tuning tasks of the SST-2 and SQuAD recipes (and relation extraction), two updates
    through fairseq's Trainer: no host read from the plugin's model, criteria, tasks or logging (a coreference
    update does read: its non-crossing top-span selection runs on the host)."""
    torch.manual_seed(0)
    if family == "pretrain":
        cfg, task, model, criterion = build(spm_data, "--dropout", "0", "--attention-dropout", "0")
    else:
        task_name, criterion_name = FINETUNING[family]
        args = options.parse_args_and_arch(options.get_training_parser(), [
            family_data[family], "--task", task_name, "--criterion", criterion_name, "--arch", "spanbert_base",
            "--finetune-from-model", os.path.join(imported, "model.pt"), "--optimizer", "torch_adamw", "--lr", "1e-4",
            "--clip-norm", "1.0", "--batch-size", "8", "--cpu", "--num-workers", "0", "--seed", "1"])
        cfg = convert_namespace_to_omegaconf(args)
        task = tasks.setup_task(cfg.task)
        model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    task.load_dataset("train", training=True)
    iterator = trainer.get_train_iterator(epoch=1, load_dataset=False).next_epoch_itr(shuffle=False)
    samples = [next(iterator) for _ in range(3)]
    trainer.train_step([samples[0]])
    with HostReads() as spy:
        for sample in samples[1:]:
            trainer.train_step([sample])
    assert spy.reads == [], spy.reads


def test_fairseqs_logging_method_is_the_one_the_plugin_replaces():
    """Fails when fairseq's Trainer._reduce_and_log_stats changes: the plugin's replacement must then be reviewed."""
    assert logging_reads.fairseq_source_sha256() == logging_reads.FAIRSEQ_SOURCE_SHA256
    assert hasattr(Trainer._reduce_and_log_stats, "__wrapped__")


def test_the_replacement_logs_what_fairseqs_method_logs(spm_data):
    torch.manual_seed(0)
    cfg, task, model, criterion = build(spm_data)
    trainer = Trainer(cfg, task, model, criterion)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    _, _, logging_output = criterion(model, dataset.collater([dataset[i] for i in range(4)]))
    grad_norm = torch.tensor(3.0)
    values = []
    for method in (Trainer._reduce_and_log_stats.__wrapped__, Trainer._reduce_and_log_stats):
        with metrics.aggregate(new_root=True):
            values.append(dict(method(trainer, [dict(logging_output)], 12.0, grad_norm)))
    fairseqs, plugins = values
    assert set(fairseqs) == set(plugins)
    assert all(fairseqs[k] == pytest.approx(plugins[k]) for k in fairseqs if k != "ups")


def test_fairseqs_seeding_is_the_one_the_plugin_replaces():
    """Fails when fairseq's Trainer._set_seed or set_torch_seed, or torch.manual_seed, changes: the plugin's
    seeding must then be reviewed."""
    assert update_seeding.source_sha256_now() == update_seeding.SOURCE_SHA256
    assert hasattr(Trainer._set_seed, "__wrapped__")


def test_an_updates_seed_sets_what_torch_manual_seed_sets_without_formatting_a_stack(monkeypatch):
    stacks = []
    monkeypatch.setattr(traceback, "format_stack", lambda *args, **kwargs: stacks.append(1) or [])
    states = []
    for seed_all in (update_seeding.seed_started_generators, torch.manual_seed):
        torch.rand(3)  # another state before
        seed_all(1234)
        states.append((torch.get_rng_state(), torch.initial_seed(), torch.rand(8)))
        if seed_all is update_seeding.seed_started_generators:
            assert stacks == []
    assert stacks  # torch queued the seed for the device types not started here (XPU and MTIA at least)
    (state, initial, draws), (expected_state, expected_initial, expected_draws) = states
    assert torch.equal(state, expected_state) and initial == expected_initial and torch.equal(draws, expected_draws)


def test_a_started_device_type_gets_the_updates_seed(monkeypatch):
    seeded = []
    monkeypatch.setattr(torch.xpu, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.xpu, "manual_seed_all", seeded.append)
    update_seeding.seed_started_generators(11)
    assert seeded == [11]


def test_updates_through_fairseqs_trainer_draw_what_they_drew_with_fairseqs_seeding(spm_data, monkeypatch):
    """Three pre-training updates with dropout (the masks drawn from the update's seed): the same parameters,
    bit for bit, with the plugin's seeding and with fairseq's; fairseq's own tasks keep fairseq's."""
    parameters = []
    for set_seed in (Trainer._set_seed, Trainer._set_seed.__wrapped__):
        monkeypatch.setattr(Trainer, "_set_seed", set_seed)
        torch.manual_seed(0)
        cfg, task, model, criterion = build(spm_data)
        trainer = Trainer(cfg, task, model, criterion)
        task.load_dataset("train")
        iterator = trainer.get_train_iterator(epoch=1, load_dataset=False).next_epoch_itr(shuffle=False)
        for _ in range(3):
            torch.rand(5)  # what ran between updates does not matter: each update seeds
            trainer.train_step([next(iterator)])
        parameters.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(ours, fairseqs) for ours, fairseqs in zip(*parameters))
    monkeypatch.undo()
    seeds = []
    monkeypatch.setattr("fairseq.utils.set_torch_seed", seeds.append)
    fairseq_trainer = types.SimpleNamespace(task=object(), cfg=types.SimpleNamespace(
        common=types.SimpleNamespace(seed=3)), get_num_updates=lambda: 4)
    Trainer._set_seed(fairseq_trainer)
    assert seeds == [7]


def test_the_collaters_host_selections_equal_the_device_selections(spm_data):
    torch.manual_seed(0)
    _, task, model, criterion = build(spm_data, "--max-span-len", "3", "--mask-scheme", "word")
    model.eval()
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(len(dataset))])
    assert "sbo_index" in sample  # built after the model: the dataset knows the slots
    masked = sample["target"].ne(task.dictionary.pad())
    offsets = sample["span_offset"][masked]
    assert torch.equal(sample["masked_index"], masked.reshape(-1).nonzero().squeeze(1))
    assert torch.equal(sample["sbo_index"], (offsets <= model.sbo_head.position_slots).nonzero().squeeze(1))
    net = dict(sample["net_input"], span_left=sample["span_left"], span_right=sample["span_right"],
               span_offset=sample["span_offset"])
    with torch.no_grad():
        host, _ = model(**net, masked_index=sample["masked_index"], sbo_index=sample["sbo_index"])
        device, _ = model(**net, masked_tokens=masked)
    assert torch.equal(host["mlm_logits"], device["mlm_logits"]) and torch.equal(host["sbo_logits"], device["sbo_logits"])
    without = {k: v for k, v in sample.items() if k not in ("masked_index", "sbo_index")}
    with torch.no_grad():
        assert criterion(model, sample)[0].item() == pytest.approx(criterion(model, without)[0].item(), rel=1e-6)


def test_the_vocabulary_cross_entropy_chunks_for_caches_only_on_a_cpu():
    starts, rows = vce._row_chunks(torch.empty(2450, 30522))
    assert rows == 17 and len(starts) == 145  # CPU: 2 MiB of fp32 a chunk
    starts, rows = vce._row_chunks(torch.empty(2450, 30522, device="meta"))
    assert len(starts) == 1  # elsewhere the whole batch of a 32 x 512 pre-training update in one chunk


def test_without_the_cpu_paths_a_cpu_runs_what_a_gpu_runs(monkeypatch):
    """update_cost.py --gpu-path counts a GPU's operators on a CPU: torch's dropout, one vocabulary chunk."""
    from spanbert_plugin.core import cpu_paths
    from spanbert_plugin.model.dropout import dropout

    monkeypatch.setattr(cpu_paths, "CPU_PATHS", False)
    starts, _ = vce._row_chunks(torch.empty(2450, 30522))
    assert len(starts) == 1
    x = torch.ones(64, 64)
    torch.manual_seed(0)
    ours = dropout(x, 0.1)
    torch.manual_seed(0)
    assert torch.equal(ours, torch.nn.functional.dropout(x, 0.1))


def test_model_flops_of_an_update_against_a_hand_count(spm_data):
    """spanbert_tiny: 2 layers, hidden 128, FFN 512, 2 heads. Two blocks of 3 and 5 real tokens, padded to 6."""
    _, task, model, _ = build(spm_data)
    pad = task.dictionary.pad()
    tokens = torch.full((2, 6), pad)
    tokens[0, :3] = 7
    tokens[1, :5] = 9
    sample = {"net_input": {"src_tokens": tokens}, "ntokens": 8}
    layers, hidden, ffn = 2, 128, 512
    per_layer = 4 * (hidden * hidden + hidden) + (hidden * ffn + ffn) + (ffn * hidden + hidden) + 2 * 2 * hidden
    assert model_flops.transformer_layer_parameters(model) == layers * per_layer
    expected = (3 + 5) * (6 * layers * per_layer + 12 * layers * hidden * 6)
    assert model_flops.encoder_training_flops(model, sample, layers * per_layer) == expected
    vocab = len(task.dictionary)
    mlm_head = (hidden * hidden + hidden + 2 * hidden) + (vocab * hidden + vocab)  # transform, LN, tied decoder
    logged = {"num_masked": 4, "num_sbo": 3}
    sbo_head = sum(p.numel() for p in model.sbo_head.parameters())
    task.flops_log.prepare(model, "fp32", 1)
    assert sum(p.numel() for p in model.lm_head.parameters()) == mlm_head
    assert task.training_flops(model, sample, logged) == expected + 6 * (4 * mlm_head + 3 * sbo_head)


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA L40", "L40"),
    ("Tesla V100-SXM2-16GB", "V100"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"), ("NVIDIA H800", "H800"), ("NVIDIA H800 PCIe", "H800 PCIe"),
    ("NVIDIA A800-SXM4-80GB", "A800"), ("NVIDIA RTX A1000 Laptop GPU", None),
    ("NVIDIA GeForce RTX 4090", None)])
def test_the_peak_table_matches_device_names_as_whole_words(name, expected):
    """A substring match took an L40S for an L4 and an RTX A1000 for an A100: a wrong mfu, without a word."""
    table = dict(model_flops.PEAK_TFLOPS)
    assert model_flops.peaks_of_device_name(name) is (table[expected] if expected else None)


def test_training_logs_tflops_and_with_a_peak_mfu(spm_data, tmp_path):
    proc = run_cli([bin_path("fairseq-train"), spm_data, "--user-dir", "user_dir", *PRETRAIN, "--max-update", "3",
                    "--log-format", "json", "--log-interval", "1", "--no-save", "--disable-validation",
                    "--peak-tflops", "0.5", "--save-dir", str(tmp_path / "ck")])
    records = [json.loads(line[line.index("{"):]) for line in (proc.stdout + proc.stderr).splitlines()
               if "train_inner" in line and "{" in line]
    assert len(records) == 3
    for record in records[1:]:  # like wps, the first update's rate reads 0 (its meter starts with it)
        assert float(record["tflops"]) > 0
        assert float(record["mfu"]) == pytest.approx(100 * float(record["tflops"]) / 0.5, abs=0.05)


def test_tf32_on_a_cpu_says_it_has_no_effect(spm_data, caplog):
    before = torch.backends.cuda.matmul.allow_tf32
    with caplog.at_level(logging.INFO):
        build(spm_data, "--tf32")
    assert "--tf32 has no effect on this CPU" in caplog.text
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_the_profile_counts_operators_syncs_and_their_sources():
    """The benchmark's counting on a known program: 4 operators that do work (the view and the no-op conjugate
    resolutions of the CPU's matmul excluded), one .item() here."""
    x = torch.randn(4, 4)

    def program():
        y = (x @ x).relu()
        return y.view(-1).sum().item()

    with torch.profiler.profile(with_stack=True) as profile:
        with torch.autograd.profiler.record_function(update_cost.UPDATE_RANGE):
            program()
    counts = update_cost.count_profile(profile.events(), 1)
    assert counts["leaf_ops"] == 4  # mm, relu (its clamp_min), sum (its fill_ here), _local_scalar_dense
    assert counts["host_syncs"] == 1
    (where,) = counts["syncs_by_source"]
    assert where.startswith("_local_scalar_dense (other: test_update_cost.py(") and "program" in where


def test_compiled_updates_count_their_graphs_and_refuse_to_compile_while_profiled():
    """With --compile: graphs compiled in the timed updates are counted (each inflates its update's time), and an
    update that needs a new graph inside the profiled ones stops with torch's error instead of profiling the compiler
    (on SST-2 that grew past 8 GB on this CPU; the benchmark turns the error into one line)."""
    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    recorder = update_cost.UpdateRecorder(warmup=1, timed=2, profiled=1, device="cpu")
    recorder.compiled = True
    for size in (2, 3, 3):  # warm-up on one shape; the timed updates meet a second
        recorder.flops.append(0.0)
        with recorder.update():
            double(torch.ones(size))
    recorder.flops.append(0.0)
    with pytest.raises(RuntimeError, match="fail_on_recompile"):
        with recorder.update():
            double(torch.ones(4))
    recorder.profiler.__exit__(None, None, None)
    assert recorder.graphs_compiled_timed == 1
    torch._dynamo.reset()


class _Event:
    """What count_profile reads of one of the profiler's events."""

    def __init__(self, name, start, end, parent=None):
        self.name, self.cpu_parent, self.cpu_children, self.stack = name, parent, [], []
        self.time_range = types.SimpleNamespace(start=start, end=end)
        self.cpu_time_total = end - start
        if parent is not None:
            parent.cpu_children.append(self)


def test_a_cuda_sync_counts_once_and_the_benchmarks_own_wait_not_at_all():
    """As a GPU's profile nests them: .item() (its cudaStreamSynchronize inside), a .cpu() copy (a copy_ whose
    cudaMemcpyAsync waits), and the benchmark's wait for the device at the end of the update: two syncs, and the
    wait's 40 us are not time outside operators."""
    update = _Event(update_cost.UPDATE_RANGE, 0, 100)
    item = _Event("aten::_local_scalar_dense", 10, 20, update)
    _Event("cudaStreamSynchronize", 12, 18, item)
    copy = _Event("aten::copy_", 30, 40, update)
    _Event("cudaStreamSynchronize", 32, 38, copy)
    wait = _Event(update_cost.WAIT_RANGE, 60, 100, update)
    _Event("cudaDeviceSynchronize", 61, 99, wait)
    events = [update, *update.cpu_children, *item.cpu_children, *copy.cpu_children, *wait.cpu_children]
    counts = update_cost.count_profile(events, 1)
    assert counts["host_syncs"] == 2
    assert counts["leaf_ops"] == 2  # _local_scalar_dense and copy_
    assert counts["outside_ops_ms"] == pytest.approx((100 - 40 - 10 - 10) / 1e3)


@pytest.mark.parametrize("flags, expected", [
    (["--fp16"], "--fp16 on a CPU needs --fp16-no-flatten-grads (hydra: common.fp16_no_flatten_grads=true; fairseq "
                 "keeps its flat fp32 copy of the weights on CUDA), or use --bf16-autocast or --memory-efficient-fp16, "
                 "or train in fp32 (hydra: common.fp16=false)"),
    (["--amp"], "--amp needs a CUDA GPU (on a CPU it would train in plain fp32): on a CPU use --bf16-autocast"),
])
def test_half_precision_a_cpu_cannot_run_is_one_line(spm_data, tmp_path, flags, expected):
    proc = run_cli([bin_path("fairseq-train"), spm_data, "--user-dir", "user_dir", *PRETRAIN, "--max-update", "1",
                    "--save-dir", str(tmp_path / "ck"), *flags], check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith(expected), proc.stderr[-2000:]
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def test_fairseqs_meters_are_those_the_deferred_meters_mirror():
    """Fails when fairseq's meters or its log_scalar functions change: the plugin's meters must then be reviewed."""
    from spanbert_plugin.core import metrics as plugin_metrics

    assert plugin_metrics.fairseq_meters_source_sha256() == plugin_metrics.FAIRSEQ_METERS_SHA256


def test_deferred_meters_report_what_fairseqs_meters_report():
    """Random tensor values and weights, reads in between, a reset, a checkpoint round trip through fairseq's
    MetersDict (which looks meter classes up by name) and a meter adopted from fairseq's kind."""
    from fairseq.logging.meters import AverageMeter, MetersDict, SumMeter

    from spanbert_plugin.core.metrics import FOLD_EVERY, DeferredAverageMeter, DeferredSumMeter

    generator = torch.Generator().manual_seed(0)
    reference, deferred = MetersDict(), MetersDict()
    for meters, average, summed in ((reference, AverageMeter, SumMeter), (deferred, DeferredAverageMeter, DeferredSumMeter)):
        meters.add_meter("loss", average(round=3), 1)
        meters.add_meter("_counts", summed(), 2)
    for step in range(3 * FOLD_EVERY + 5):
        value, counts = torch.rand((), generator=generator, dtype=torch.float64), torch.randint(9, (2, 2), generator=generator)
        weight = int(torch.randint(0, 40, (1,), generator=generator))  # 0 included: such a value only becomes val
        for meters in (reference, deferred):
            meters["loss"].update(value, weight)
            meters["_counts"].update(counts)
        if step % 17 == 0:
            assert float(deferred["loss"].avg) == pytest.approx(float(reference["loss"].avg), rel=1e-12)
        if step == FOLD_EVERY + 3:
            reference.reset()
            deferred.reset()
    assert deferred.get_smoothed_values() == reference.get_smoothed_values()
    assert torch.equal(deferred["_counts"].sum, reference["_counts"].sum)
    assert deferred["loss"].count == reference["loss"].count and deferred["loss"].val is reference["loss"].val
    reloaded = MetersDict()
    reloaded.load_state_dict(deferred.state_dict())
    assert type(reloaded["loss"]) is DeferredAverageMeter and type(reloaded["_counts"]) is DeferredSumMeter
    assert float(reloaded["loss"].avg) == pytest.approx(float(reference["loss"].avg), rel=1e-12)
    adopted = DeferredAverageMeter.adopt(reference["loss"])
    adopted.update(torch.tensor(0.5, dtype=torch.float64), 3)
    assert float(adopted.sum) == pytest.approx(float(reloaded["loss"].sum) + 1.5, rel=1e-12)


def test_the_plugins_logging_adds_no_operator_per_update_for_its_meters():
    """Between reads, a tensor logged through the plugin's log_scalar, log_mean, log_scalar_sum or
    log_percent_above costs no operator in any aggregator (fairseq's meters: a multiplication and an addition in
    each; a mean or a percentage made before logging: one more)."""
    from spanbert_plugin.core.metrics import BITS, FOLD_EVERY, log_mean, log_percent_above, log_scalar, log_scalar_sum

    values = [torch.tensor(float(i)) for i in range(FOLD_EVERY - 1)]
    with metrics.aggregate(new_root=True), metrics.aggregate("outer") as outer, metrics.aggregate("inner") as inner:
        with torch.profiler.profile() as profile:
            for value in values:
                log_scalar("loss", value, 4)
                log_mean("nll_loss", value, 4, BITS)
                log_scalar_sum("_counts", value)
                log_percent_above("clip", value, 10.0)
        assert not [e.name for e in profile.events() if e.name.startswith("aten::")]
        for aggregator in (outer, inner):
            assert aggregator.get_smoothed_value("loss") == pytest.approx(sum(range(FOLD_EVERY - 1)) / (FOLD_EVERY - 1))
            assert aggregator.get_smoothed_value("nll_loss") == pytest.approx(
                sum(range(FOLD_EVERY - 1)) / (FOLD_EVERY - 1) / 4 / math.log(2))
            assert float(aggregator["_counts"].sum) == sum(range(FOLD_EVERY - 1))
            assert aggregator.get_smoothed_value("clip") == pytest.approx(100 * (FOLD_EVERY - 12) / (FOLD_EVERY - 1))


def test_a_mean_logged_as_a_sum_and_a_count_is_fairseqs_mean():
    """log_mean(key, sum, count, scale) against fairseq's log_scalar(key, sum * scale / count, count): random sums
    and counts (0 included: such a value only becomes the meter's last value), reads in between, more values than
    one fold, a checkpoint round trip of the meters, and a number (not a tensor) logged as fairseq logs it."""
    from fairseq.logging.meters import MetersDict

    from spanbert_plugin.core.metrics import BITS, FOLD_EVERY, PERCENT, DeferredAverageMeter, log_mean

    generator = torch.Generator().manual_seed(2)
    names = ("test_log_mean_reference", "test_log_mean_deferred")

    def log(value_sum, count, scale, key):
        with metrics.aggregate(names[0], new_root=True):
            metrics.log_scalar(key, value_sum * (scale / max(count, 1)), count, round=3)
        with metrics.aggregate(names[1], new_root=True):
            log_mean(key, value_sum, count, scale, round=3)

    try:
        reference, deferred = (metrics._aggregators.setdefault(name, MetersDict()) for name in names)
        for step in range(2 * FOLD_EVERY + 9):
            value_sum = torch.rand((), generator=generator, dtype=torch.float64) * 50
            count = int(torch.randint(0, 40, (1,), generator=generator))
            log(value_sum, count, BITS, "loss")
            log(value_sum, count, PERCENT, "acc")
            if step % 13 == 0:
                assert float(deferred["loss"].avg) == pytest.approx(float(reference["loss"].avg), rel=1e-12)
        assert type(deferred["loss"]) is DeferredAverageMeter
        assert deferred.get_smoothed_values() == reference.get_smoothed_values()
        for key in ("loss", "acc"):
            state, expected = deferred[key].state_dict(), reference[key].state_dict()
            assert state["count"] == expected["count"]
            for name in ("val", "sum"):
                assert float(state[name]) == pytest.approx(float(expected[name]), rel=1e-12)
        reloaded = MetersDict()
        reloaded.load_state_dict(deferred.state_dict())
        assert float(reloaded["acc"].avg) == pytest.approx(float(reference["acc"].avg), rel=1e-12)
        log(6.0, 3, 1.0, "loss")  # a number: logged as fairseq logs it
        assert float(deferred["loss"].avg) == pytest.approx(float(reference["loss"].avg), rel=1e-12)
        assert deferred["loss"].val == reference["loss"].val == 2.0
    finally:
        for name in names:
            metrics._aggregators.pop(name, None)


def test_the_clip_percentage_is_fairseqs_counted_when_read():
    from fairseq.logging.meters import AverageMeter

    from spanbert_plugin.core.metrics import FOLD_EVERY, log_percent_above

    norms = torch.rand(FOLD_EVERY + 7, generator=torch.Generator().manual_seed(1)) * 2
    reference = AverageMeter(round=1)
    with metrics.aggregate(new_root=True) as aggregator:
        for norm in norms:
            log_percent_above("clip", norm, 1.0, round=1)
            reference.update(torch.where(norm > 1.0, 100.0, 0.0))
        assert aggregator.get_smoothed_value("clip") == reference.smoothed_value
        assert float(aggregator["clip"].avg) == pytest.approx(float((norms > 1.0).double().mean()) * 100)
        assert float(aggregator["clip"].state_dict()["val"]) == float(reference.val)
    # fairseq's meter of values of 100 and 0 (a checkpoint written before the plugin logged clip so) goes on in percent
    with metrics.aggregate(new_root=True) as aggregator:
        aggregator.add_meter("clip", AverageMeter(round=1), 500)
        aggregator["clip"].update(torch.tensor(100.0))
        log_percent_above("clip", torch.tensor(2.0), 1.0, round=1)
        assert float(aggregator["clip"].avg) == 100.0  # not (100 + 1) / 2
        assert float(aggregator["clip"].val) == 100.0


KEPT_MEMORY_PROBE = """
import ctypes, json, sys, torch
from spanbert_plugin.core import cpu_paths

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
tuned = [cpu_paths.keep_freed_memory(torch.zeros(1)), cpu_paths.keep_freed_memory(torch.zeros(1))]
gradient = torch.zeros(30522 * 384)  # the size of MiniLM's word-embedding gradient
mapped = libc.mallinfo2().hblkhd
del gradient
print(json.dumps({"tuned": tuned, "mapped_mb": mapped >> 20, "kept_free_mb": libc.mallinfo2().fordblks >> 20}))
"""


@pytest.mark.parametrize("user_setting", [None, "MALLOC_ARENA_MAX"])
def test_training_on_a_cpu_keeps_freed_memory_for_the_next_update(user_setting):
    """glibc maps a tensor above 32 MB afresh and unmaps it when freed (every update pays page faults for it);
    once the plugin has told malloc so, it comes from the heap and stays there free. A user's MALLOC_* setting
    leaves malloc alone. Counted with mallinfo2, not timed."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if user_setting:
        env[user_setting] = "4"
    out = subprocess.run([sys.executable, "-c", KEPT_MEMORY_PROBE], env=env, capture_output=True, text=True, check=True)
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    if user_setting:
        assert probe["tuned"] == [False, False] and probe["mapped_mb"] >= 44 and probe["kept_free_mb"] < 44
    else:
        assert probe["tuned"] == [True, False] and probe["mapped_mb"] < 44 and probe["kept_free_mb"] >= 44


def _child_record(spec):
    proc = run_cli([sys.executable, os.path.join(ROOT, "benchmarks", "cpu_speed", "update_cost", "update_cost.py"),
                    "--child", json.dumps(spec)])
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("UPDATE_COST ")]
    return json.loads(line[len("UPDATE_COST "):])


def test_transformers_trainer_runs_the_loops_updates_in_the_same_phases(spm_data, tmp_path):
    """The benchmark's transformers.Trainer side (--hf-trainer) trains on the batches the loop trains on, in
    fairseq's order, and its profile splits into the phases of the other sides (Trainer's own methods wrapped)."""
    args = argparse.Namespace(batch_size=4, tokens=32, device="cpu", precision="fp32", tf32=False, gpu_path=False,
                              encoder="minilm-shape", work=str(tmp_path))
    spec = {"workload": "pretrain", "repeat": 0, "device": "cpu", "precision": "fp32", "threads": 1, "warmup": 1,
            "timed": 1, "profiled": 1, "hf_dir": None, "shape": update_cost.SHAPES["minilm-shape"], "tf32": False,
            "gpu_path": False, "work": str(tmp_path),
            "argv": update_cost.fairseq_argv("pretrain", spm_data, None, args, "torch_adamw")}
    loop = _child_record({**spec, "side": "transformers"})
    trainer = _child_record({**spec, "side": "hf_trainer"})
    assert trainer["shapes"] == loop["shapes"] and len(trainer["shapes"]) == 3
    assert {"forward", "backward", "clip-grads", "optimizer"} <= set(trainer["ops_by_phase"])
    # the same model on the same batch: the loop's forward operators, and Trainer's own ``loss *= loss_scale``
    # (average_tokens_across_devices, on by default; the scale is 1 in one process)
    assert trainer["ops_by_phase"]["forward"] - loop["ops_by_phase"]["forward"] == 1
    assert trainer["wall_ms"] > 0 and trainer["tflops"] > 0


def test_the_table_lists_each_loops_host_time_by_phase(tmp_path, monkeypatch):
    """Bookkeeping is the profiled update's time outside its phases and the benchmark's wait for the device; each
    phase's time is the median over the loop's processes."""
    def record(side, repeat, forward, update_ms):
        return {"workload": "sst2", "label": side, "side": side, "repeat": repeat, "wall_ms": 10.0, "data_ms": 0.5,
                "leaf_ops": 400.0, "host_syncs": 1.0, "outside_ops_ms": 1.0, "tflops": 0.01, "syncs_by_source": {},
                "ops_by_phase": {"forward": 200.0}, "profiled_ms_by_phase": {"forward": forward, "backward": 4.0},
                "profiled_update_ms": update_ms, "profiled_wait_ms": 0.25, "top_ops_by_phase": {}}

    records = [record("fairseq", 0, 3.0, 9.25), record("fairseq", 1, 5.0, 11.0), record("fairseq", 2, 4.0, 11.0),
               record("transformers", 0, 3.0, 7.5)]
    summary = update_cost.summarise(records)
    meta = {"repeats": 3, "device": "cpu", "threads": 1, "precision": "fp32", "batch_size": 32, "tokens": 128}
    update_cost.write_table(summary, meta, tmp_path / "table.md")
    table = (tmp_path / "table.md").read_text()
    # bookkeeping per process: 9.25 - 7 - 0.25, 11 - 9 - 0.25, 11 - 8 - 0.25; their median 2.00 (the wait left out)
    assert "- sst2, fairseq: forward 4.00, backward 4.00, bookkeeping 2.00, between updates 0.50" in table
    assert "- sst2, transformers: forward 3.00, backward 4.00, bookkeeping 0.25, between updates 0.50" in table
    # --summarise-again rewrites an earlier result's summary and table from its records, in its own folder only
    out = tmp_path / "earlier"
    update_cost.write_outputs(str(out), {**meta, "peak_tflops": None}, records)
    (out / "table.md").write_text("an older table\n")
    monkeypatch.setattr(sys, "argv", ["update_cost.py", "--summarise-again", "--out", str(out)])
    update_cost.main()
    assert "bookkeeping 2.00" in (out / "table.md").read_text()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit, match="did not write"):
        update_cost.main()
    assert (out / "notes.txt").read_text() == "mine\n"


def test_paired_ratios_are_per_repeat_with_a_geometric_mean_and_its_interval(tmp_path, monkeypatch):
    """Each loop over the transformers loop (and a --compile side over its eager side) in the same repeat: the
    median and range of those ratios, their geometric mean and the 95% t-interval of the mean log ratio; the
    --paired-ratios mode writes them from an earlier results.json, in a folder of this script's files only."""
    from scipy import stats

    def record(label, side, repeat, wall_ms):
        return {"workload": "sst2", "label": label, "side": side, "repeat": repeat, "wall_ms": wall_ms}

    eager, compiled = "fairseq-train --optimizer torch_adamw", "fairseq-train --optimizer torch_adamw --compile"
    walls = {eager: [8.0, 9.0, 12.0], compiled: [10.0, 9.0, 18.0], "transformers loop": [10.0, 10.0, 10.0]}
    records = [record(label, "transformers" if label == "transformers loop" else "fairseq", repeat, wall)
               for label, values in walls.items() for repeat, wall in enumerate(values)]
    rows = {(r["label"], r["reference"]): r for r in update_cost.paired_ratios(records)}
    assert set(rows) == {(eager, "transformers loop"), (compiled, "transformers loop"), (compiled, eager)}
    row = rows[(compiled, eager)]
    assert row["ratios"] == [1.25, 1.0, 1.5] and row["median"] == 1.25 and (row["min"], row["max"]) == (1.0, 1.5)
    logs = [math.log(r) for r in row["ratios"]]
    low, high = stats.t.interval(0.95, 2, loc=sum(logs) / 3, scale=stats.sem(logs))
    assert row["geometric_mean"] == pytest.approx(1.5 ** (1 / 3) * 1.25 ** (1 / 3))
    assert row["ci95"] == pytest.approx([math.exp(low), math.exp(high)])
    out = tmp_path / "run"
    out.mkdir()
    meta = {"repeats": 3, "device": "cpu", "threads": 1, "precision": "fp32", "command": "update_cost.py ..."}
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": [], "records": records}))
    monkeypatch.setattr(sys, "argv", ["update_cost.py", "--paired-ratios", "--out", str(out)])
    update_cost.main()
    written = json.loads((out / "paired_ratios.json").read_text())
    assert len(written["ratios"]) == 3 and written["run"] == "update_cost.py ..."
    assert f"| sst2 | {compiled} | {eager} | 3 | 1.25x (1.00-1.50) |" in (out / "paired_ratios.md").read_text()
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit, match="did not write"):
        update_cost.main()


def _stub_trainer(clip_norm):
    """What reduce_and_log_stats_without_reads reads of fairseq's trainer: --clip-norm, the task's reduce_metrics."""
    def reduce_metrics(logging_outputs, criterion):
        metrics.log_scalar("loss", sum(log["loss"] for log in logging_outputs) / len(logging_outputs), round=3)

    return types.SimpleNamespace(cfg=types.SimpleNamespace(optimization=types.SimpleNamespace(clip_norm=clip_norm)),
                                 task=types.SimpleNamespace(reduce_metrics=reduce_metrics), get_criterion=lambda: None)


def test_the_run_logs_the_updates_loss_gnorm_and_the_share_of_updates_above_the_clip_norm():
    """fairseq's _reduce_and_log_stats: the run's aggregators get the update's metrics, gnorm (the mean over
    updates) and clip, the percentage of updates whose norm was above --clip-norm (a norm equal to it is not
    clipped); with --clip-norm 0 no clip at all. Numbers and tensors alike."""
    with metrics.aggregate(new_root=True) as run:
        for loss, norm in ((2.0, 1.0), (4.0, 3.0), (3.0, torch.tensor(1.0)), (3.0, torch.tensor(2.5))):
            values = logging_reads.reduce_and_log_stats_without_reads(_stub_trainer(1.0), [{"loss": loss}], 8, norm)
        assert values["sample_size"] == 8 and values["loss"] == 3.0  # the update's own values
        assert run.get_smoothed_value("loss") == 3.0
        assert run.get_smoothed_value("gnorm") == pytest.approx((1.0 + 3.0 + 1.0 + 2.5) / 4)
        assert run.get_smoothed_value("clip") == 50.0
    with metrics.aggregate(new_root=True) as run:
        logging_reads.reduce_and_log_stats_without_reads(_stub_trainer(0.0), [{"loss": 1.0}], 1, torch.tensor(5.0))
        assert "clip" not in run and run.get_smoothed_value("gnorm") == 5.0


def test_a_norm_equal_to_the_threshold_is_not_counted_above_it():
    from spanbert_plugin.core.metrics import log_percent_above

    with metrics.aggregate(new_root=True) as aggregator:
        for norm in (2.0, 1.0, 0.5, 1.0):
            log_percent_above("clip", torch.tensor(norm), 1.0, round=1)
        assert float(aggregator["clip"].val) == 0.0  # the last update's flag: 1.0 is not above 1.0
        assert aggregator.get_smoothed_value("clip") == 25.0


def test_mfu_is_the_share_of_the_peak_given_of_every_worker():
    flops_log = model_flops.FlopsLog(peak_tflops_option=2.0)
    flops_log.prepare(torch.nn.Linear(2, 2), "fp32", 4)
    assert flops_log.peak == 2.0 and flops_log.world_size == 4  # the option, on a device the table lacks too
    assert flops_log.mfu({"tflops": types.SimpleNamespace(avg=torch.tensor(1.6))}) == 20.0  # 100 x 1.6 / (2 x 4)
    assert flops_log.mfu({}) is None


def test_a_mean_of_no_units_logs_its_sum_times_the_scale_as_its_value():
    """fairseq's criteria log sum * scale / max(count, 1): an update without units (no SBO target in a batch) has
    that last value, read without a division by zero (a checkpoint reads it), and adds nothing to the mean."""
    from spanbert_plugin.core.metrics import log_mean

    with metrics.aggregate(new_root=True) as aggregator:
        log_mean("loss", torch.tensor(3.0), 2, 2.0)
        log_mean("loss", torch.tensor(0.5), 0, 2.0)
        assert float(aggregator["loss"].val) == 1.0 and float(aggregator["loss"].avg) == 3.0
        log_mean("number", 0.5, 0, 2.0)
        assert aggregator["number"].val == 1.0


def test_deferred_meters_take_numbers_nothing_and_tensor_weights_as_fairseqs_meters_do():
    """A key logged as a tensor in one update and as a number (or None, or with a tensor weight) in another: the
    deferred meters add them up as fairseq's meters do."""
    from fairseq.logging.meters import AverageMeter, SumMeter

    from spanbert_plugin.core.metrics import DeferredAverageMeter, DeferredSumMeter

    logged = [(torch.tensor(2.0), 3), (4.0, 1), (None, 5), (torch.tensor(1.0), torch.tensor(2))]
    reference, deferred = AverageMeter(round=3), DeferredAverageMeter(round=3)
    for value, weight in logged:
        reference.update(value, weight)
        deferred.update(value, weight)
    deferred.update_mean(None, 4)  # no mean logged: nothing counted
    assert float(deferred.avg) == float(reference.avg) == (2.0 * 3 + 4.0 * 1 + 1.0 * 2) / 6
    assert int(deferred.count) == int(reference.count) == 6
    sums, reference_sums = DeferredSumMeter(), SumMeter()
    for value in (torch.tensor(2.0), 3.0, None, torch.tensor(1.0)):
        sums.update(value)
        reference_sums.update(value)
    assert float(sums.sum) == float(reference_sums.sum) == 6.0


def test_fairseqs_own_tasks_keep_fairseqs_logging_method():
    """A task outside the plugin (here: a stand-in) gets fairseq's _reduce_and_log_stats, which returns the values
    read; a plugin task gets values read on demand, a mapping of the same items."""
    from spanbert_plugin.core.tasks import OneDictionaryTask

    trainer = _stub_trainer(0.0)
    trainer.tpu, trainer._warn_once = False, set()
    with metrics.aggregate(new_root=True):
        values = Trainer._reduce_and_log_stats(trainer, [{"loss": 3.0}], 8)
    assert not isinstance(values, logging_reads.UpdateValuesOnDemand) and values == {"loss": 3.0, "sample_size": 8}
    plugin_task = OneDictionaryTask.__new__(OneDictionaryTask)  # its type is all the routing asks about
    plugin_task.reduce_metrics = trainer.task.reduce_metrics
    trainer.task = plugin_task
    with metrics.aggregate(new_root=True):
        deferred = Trainer._reduce_and_log_stats(trainer, [{"loss": 3.0}], 8)
    assert isinstance(deferred, logging_reads.UpdateValuesOnDemand)
    assert len(deferred) == 2 and dict(deferred) == values


def test_a_dummy_batch_trains_nothing_and_logs_no_flops(spm_data):
    """fairseq hands a worker that has run out of batches a dummy one with ignore_grad: its loss counts for nothing
    (every gradient 0) and it adds no model FLOPs."""
    cfg, task, model, criterion = build(spm_data)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(4)])
    optimizer = types.SimpleNamespace(backward=lambda loss: loss.backward())
    for ignore_grad in (False, True):
        model.zero_grad(set_to_none=True)
        loss, _, logging_output = task.train_step(sample, model, criterion, optimizer, 0, ignore_grad=ignore_grad)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads
        assert all(not g.any() for g in grads) == ignore_grad and (float(loss.detach()) == 0.0) == ignore_grad
        assert ("model_flops" in logging_output) != ignore_grad
