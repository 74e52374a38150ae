"""``--bf16-autocast``: every plugin task trains under bfloat16 autocast with fp32 weights; resume is exact; refusals."""
import json
import math
import os

import pytest
import torch

from conftest import ROOT, bin_path, run_cli, run_gloo_ranks

# task, criterion and data family of each fine-tuning task (test_finetune_recipes' prepared folders)
FINETUNING = {"cls": ("sentence_classification", "sentence_classification"),
              "qa": ("extractive_qa", "extractive_qa"),
              "re": ("relation_extraction", "relation_extraction"),
              "coref": ("coreference", "coreference")}


def _finetune(data, checkpoint, save_dir, task, criterion, *extra):
    return [bin_path("fairseq-train"), data, "--user-dir", "user_dir", "--task", task, "--criterion", criterion,
            "--arch", "spanbert_base", "--finetune-from-model", checkpoint, "--optimizer", "adam", "--lr", "1e-4",
            "--batch-size", "8", "--cpu", "--num-workers", "0", "--save-dir", str(save_dir), "--no-epoch-checkpoints",
            "--log-format", "json", "--log-interval", "1", "--bf16-autocast", *extra]


def _losses(output):
    """Training and validation losses of a --log-format json run."""
    records = [json.loads(line[line.index("{"):]) for line in output.splitlines()
               if ("train_inner" in line or "| valid |" in line) and "{" in line]
    return [float(r["loss"] if "loss" in r else r["valid_loss"]) for r in records]


def _assert_fp32_checkpoint(path, updates):
    saved = torch.load(path, map_location="cpu", weights_only=True)
    assert saved["optimizer_history"][-1]["num_updates"] == updates
    assert saved["cfg"]["task"]["bf16_autocast"] is True
    dtypes = {t.dtype for t in saved["model"].values() if t.is_floating_point()}
    assert dtypes == {torch.float32}
    return saved


@pytest.mark.parametrize("family", list(FINETUNING))
def test_finetuning_tasks_train_under_bf16_autocast(family, imported, family_data, tmp_path):
    task, criterion = FINETUNING[family]
    extra = ["--coref-ffnn-size", "32"] if family == "coref" else []
    proc = run_cli(_finetune(family_data[family], os.path.join(imported, "model.pt"), tmp_path / "ck", task, criterion,
                             "--max-update", "2", *extra))
    losses = _losses(proc.stdout + proc.stderr)
    assert len(losses) >= 2 and all(math.isfinite(x) for x in losses), losses
    _assert_fp32_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", 2)


def test_pretraining_and_find_animals_train_under_bf16_autocast(imported, corpus_files, tmp_path):
    from spanbert_plugin.cli.prepare import main as prepare

    data = str(tmp_path / "corpus")
    assert prepare(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", data, "--wordpiece-vocab",
                    os.path.join(imported, "vocab.txt"), "--lowercase"]) == 0
    proc = run_cli(_finetune(data, os.path.join(imported, "model.pt"), tmp_path / "pre", "spanbert_pretraining",
                             "span_bert", "--tokens-per-sample", "64", "--max-update", "2"))
    assert all(math.isfinite(x) for x in _losses(proc.stdout + proc.stderr))
    _assert_fp32_checkpoint(tmp_path / "pre" / "checkpoint_last.pt", 2)
    proc = run_cli([bin_path("fairseq-train"), "--user-dir", "user_dir", "--task", "find_animals", "--criterion",
                    "sentence_prediction", "--arch", "spanbert_tiny", "--encoder-layers", "1", "--seq-len", "8",
                    "--animals", "cat", "--train-size", "64", "--test-size", "16", "--batch-size", "16", "--optimizer",
                    "adam", "--lr", "1e-3", "--max-update", "2", "--cpu", "--num-workers", "0", "--log-format", "json",
                    "--log-interval", "1", "--save-dir", str(tmp_path / "fa"), "--no-epoch-checkpoints",
                    "--span-drop-p", "0.2", "--bf16-autocast"])
    assert all(math.isfinite(x) for x in _losses(proc.stdout + proc.stderr))
    _assert_fp32_checkpoint(tmp_path / "fa" / "checkpoint_last.pt", 2)


def test_ad_drop_trains_under_bf16_autocast(imported, family_data, tmp_path):
    proc = run_cli(_finetune(family_data["cls"], os.path.join(imported, "model.pt"), tmp_path / "ck",
                             "sentence_classification", "sentence_classification", "--max-update", "2",
                             "--ad-drop-p", "0.3", "--ad-drop-q", "0.3"))
    assert all(math.isfinite(x) for x in _losses(proc.stdout + proc.stderr))
    _assert_fp32_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", 2)


def test_resume_is_exact(imported, family_data, tmp_path):
    """4 updates in one run equal 2 updates, a stop, and 2 more resumed from checkpoint_last.pt, to the bit."""
    def train(save_dir, updates):
        run_cli(_finetune(family_data["cls"], os.path.join(imported, "model.pt"), save_dir, "sentence_classification",
                          "sentence_classification", "--max-update", str(updates), "--disable-validation"))

    train(tmp_path / "whole", 4)
    train(tmp_path / "parts", 2)
    train(tmp_path / "parts", 4)
    whole = _assert_fp32_checkpoint(tmp_path / "whole" / "checkpoint_last.pt", 4)["model"]
    parts = _assert_fp32_checkpoint(tmp_path / "parts" / "checkpoint_last.pt", 4)["model"]
    assert whole.keys() == parts.keys()
    assert all(torch.equal(whole[k], parts[k]) for k in whole)
    start = torch.load(os.path.join(imported, "model.pt"), map_location="cpu", weights_only=True)["model"]
    assert not torch.equal(whole["encoder.embeddings.word_embeddings.weight"],
                           start["encoder.embeddings.word_embeddings.weight"])  # it did train


def test_two_gloo_workers_train_under_bf16_autocast(imported, family_data, tmp_path):
    """A CPU multi-process run from an imported checkpoint (rank 0 loads it and broadcasts it to rank 1): both
    workers train under autocast and the checkpoint rank 0 writes is fp32."""
    outputs = run_gloo_ranks(lambda rank: _finetune(
        family_data["cls"], os.path.join(imported, "model.pt"), tmp_path / "ck", "sentence_classification",
        "sentence_classification", "--max-update", "2", "--batch-size", "4"))
    losses = _losses(outputs[0])  # rank 0 logs the losses reduced over both workers
    assert len(losses) >= 2 and all(math.isfinite(x) for x in losses), outputs[0][-2000:]
    assert "as rank 1" in outputs[1]
    _assert_fp32_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", 2)


@pytest.mark.parametrize("flag", ["--fp16", "--memory-efficient-fp16", "--bf16", "--amp"])
def test_half_precision_modes_are_refused_beside_it(flag, imported, family_data, tmp_path):
    proc = run_cli(_finetune(family_data["cls"], os.path.join(imported, "model.pt"), tmp_path / "ck",
                             "sentence_classification", "sentence_classification", "--max-update", "1", flag),
                   check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"--bf16-autocast cannot be combined with {flag}: it keeps fp32 weights and needs no loss scaler; use one of "
        "them"), proc.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def test_hydra_recipe_takes_it(imported, family_data, tmp_path):
    proc = run_cli([bin_path("fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs", "finetune"),
                    "--config-name", "glue_sst2", f"task.data={family_data['cls']}",
                    f"checkpoint.finetune_from_model={os.path.join(imported, 'model.pt')}",
                    f"checkpoint.save_dir={tmp_path / 'ck'}", "common.cpu=true", "optimization.max_update=2",
                    "dataset.num_workers=0", "dataset.batch_size=8", "lr_scheduler.warmup_updates=1",
                    "lr_scheduler.total_num_update=2", "task.bf16_autocast=true"])
    assert proc.returncode == 0
    _assert_fp32_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", 2)


def test_forward_runs_in_bfloat16_and_backward_reaches_fp32_weights():
    """The context the tasks use: matrix products in bfloat16, gradients on the fp32 parameters."""
    from types import SimpleNamespace

    from spanbert_plugin.core.precision import forward_precision

    layer = torch.nn.Linear(8, 4)
    with forward_precision(SimpleNamespace(bf16_autocast=True), layer):
        out = layer(torch.randn(3, 8))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    with forward_precision(SimpleNamespace(bf16_autocast=False), layer):
        assert layer(torch.randn(3, 8)).dtype == torch.float32


@pytest.mark.parametrize("native", [True, False])
def test_cpu_without_native_bfloat16_is_warned_about(native, monkeypatch, caplog):
    """On a CPU that emulates bfloat16 (AVX2 only) autocast trains several times slower: one warning, no refusal."""
    from omegaconf import OmegaConf

    from spanbert_plugin.core import precision

    monkeypatch.setattr(precision, "cpu_supports_bf16", lambda: native)
    run = OmegaConf.create({"common": {"cpu": True, "fp16": False}, "task": {"bf16_autocast": True}})
    with caplog.at_level("WARNING", logger=precision.__name__):
        precision.check_bf16_autocast(run.task)
    warned = [r.getMessage() for r in caplog.records if "without native bfloat16" in r.getMessage()]
    assert len(warned) == (0 if native else 1)


def test_the_training_forward_stays_in_bfloat16_where_the_model_and_amp_share_a_device(monkeypatch):
    """On a GPU the task's bf16 autocast and fairseq's AMP autocast are both CUDA contexts: an AMP context entered
    with enabled=False inside the bf16 one switched it off, and --bf16-autocast trained in fp32 there. Every
    autocast is made a CPU one here, so the two share a device as on a GPU."""
    from types import SimpleNamespace

    from spanbert_plugin.core.precision import forward_precision
    from spanbert_plugin.core.tasks import OneDictionaryTask

    real = torch.autocast
    monkeypatch.setattr(torch, "autocast", lambda device_type, **options: real("cpu", **options))

    class Model(torch.nn.Linear):
        def set_num_updates(self, num_updates):
            pass

    seen = []

    def criterion(model, sample):
        out = model(sample)
        seen.append(out.dtype)
        return out.float().sum(), 1, {}

    task = SimpleNamespace(forward_precision=lambda model: forward_precision(SimpleNamespace(bf16_autocast=True), model),
                           flops_log=SimpleNamespace(prepared_for=lambda model: True, layer_parameters=None))
    optimizer = SimpleNamespace(backward=lambda loss: loss.backward())
    OneDictionaryTask.train_step(task, torch.randn(3, 8), Model(8, 4), criterion, optimizer, update_num=1)
    assert seen == [torch.bfloat16]


def _run_task_cfg(**common):
    """A task config inside a run config, as fairseq hands the task its section."""
    from omegaconf import OmegaConf

    return OmegaConf.create({"common": {"cpu": True, **common}, "optimizer": {"_name": "adam"},
                             "task": {"_name": "sentence_classification", "bf16_autocast": False, "tf32": False}}).task


@pytest.mark.parametrize("flag", ["fp16", "memory_efficient_fp16", "bf16", "memory_efficient_bf16", "amp"])
def test_any_one_half_precision_mode_makes_the_run_half_precision(flag):
    from spanbert_plugin.core.precision import run_precision

    assert run_precision(_run_task_cfg(**{flag: True})) == "half"
    assert run_precision(_run_task_cfg()) == "fp32"


def test_fp16_on_a_cpu_is_refused_only_with_the_flat_copy():
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.precision import refuse_half_precision_a_cpu_cannot_run

    refuse_half_precision_a_cpu_cannot_run(_run_task_cfg(fp16=True, fp16_no_flatten_grads=True))
    refuse_half_precision_a_cpu_cannot_run(_run_task_cfg(fp16=True, memory_efficient_fp16=True))
    with pytest.raises(UsageError, match="^--fp16 on a CPU needs --fp16-no-flatten-grads"):
        refuse_half_precision_a_cpu_cannot_run(_run_task_cfg(fp16=True))


@pytest.mark.parametrize("capability, turned_on", [((8, 0), True), ((9, 0), True), ((7, 5), False)])
def test_tf32_is_turned_on_from_compute_capability_8_0(capability, turned_on, monkeypatch):
    from types import SimpleNamespace

    from spanbert_plugin.core.precision import enable_tf32

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "a GPU")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        enable_tf32(SimpleNamespace(tf32=True))
        assert torch.backends.cuda.matmul.allow_tf32 == turned_on and torch.backends.cudnn.allow_tf32 == turned_on
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_only_fairseqs_amp_optimizer_gets_a_cuda_autocast_around_the_forward():
    import contextlib
    import warnings
    from types import SimpleNamespace

    from fairseq.optim.amp_optimizer import AMPOptimizer

    from spanbert_plugin.core.precision import amp_autocast

    assert isinstance(amp_autocast(SimpleNamespace()), contextlib.nullcontext)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA autocast on a host without CUDA: disabled, with a warning
        context = amp_autocast(AMPOptimizer.__new__(AMPOptimizer))
    assert isinstance(context, torch.autocast) and context.device == "cuda"
