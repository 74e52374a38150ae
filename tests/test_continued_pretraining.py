"""Continued pre-training of an imported encoder: heads trained alone first, and the continue_from_hf recipe."""
import os

import torch

from conftest import ROOT, bin_path, run_cli, run_gloo_ranks
from test_finetune_recipes import SHAPE

HEADS = ("lm_head.", "sbo_head.")


def _corpus(imported, corpus_files, tmp_path):
    from spanbert_plugin.cli.prepare import main as prepare

    data = str(tmp_path / "corpus")
    assert prepare(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", data, "--wordpiece-vocab",
                    os.path.join(imported, "vocab.txt"), "--lowercase"]) == 0
    return data


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _changed(before, after, heads):
    """Names of the weights (heads' or the encoder's) that training changed (buffers such as the vocabulary
    record, which names the data's tokenizer file, left out)."""
    return {k for k in after if k.startswith(HEADS) == heads and k in before and after[k].is_floating_point()
            and not torch.equal(before[k], after[k])}


def _freeze_two_updates(data, imported, save_dir, updates):
    return [bin_path("fairseq-train"), data, "--user-dir", "user_dir", "--task", "spanbert_pretraining",
            "--criterion", "span_bert", "--arch", "spanbert_base", "--finetune-from-model",
            os.path.join(imported, "model.pt"), "--tokens-per-sample", "64", "--optimizer", "adam", "--lr", "1e-3",
            "--weight-decay", "0.01", "--batch-size", "4", "--max-update", str(updates), "--cpu",
            "--num-workers", "0", "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--disable-validation",
            "--freeze-encoder-updates", "2"]


def _check_heads_alone_then_everything(start, train):
    frozen = train(2)
    assert _changed(start, frozen, heads=True)  # the heads trained
    assert not _changed(start, frozen, heads=False)  # the encoder (and the tied decoder) did not move, decay included
    unfrozen = train(3)  # resumed: update 3 trains everything
    assert _changed(frozen, unfrozen, heads=False) and _changed(frozen, unfrozen, heads=True)


def test_freeze_encoder_updates_trains_the_heads_alone_then_everything(imported, corpus_files, tmp_path):
    data = _corpus(imported, corpus_files, tmp_path)

    def train(updates):
        proc = run_cli(_freeze_two_updates(data, imported, tmp_path / "two", updates))
        # the known-harmless warnings are silenced once the plugin loads (the DataLoader's pinned-memory note)
        assert "pin_memory" not in proc.stderr, proc.stderr
        return _weights(os.path.join(tmp_path / "two", "checkpoint_last.pt"))

    _check_heads_alone_then_everything(_weights(os.path.join(imported, "model.pt")), train)


def test_freeze_encoder_updates_under_fp16_with_per_parameter_master_weights(imported, corpus_files, tmp_path):
    # --fp16 with --fp16-no-flatten-grads (fairseq's flat copy needs CUDA; this one runs on a CPU): the frozen
    # encoder's fp16 weights stay as loaded, the heads train
    data = _corpus(imported, corpus_files, tmp_path)
    start = {k: v.half() if v.is_floating_point() else v for k, v in _weights(os.path.join(imported, "model.pt")).items()}

    def train(updates):
        run_cli([*_freeze_two_updates(data, imported, tmp_path / "two", updates), "--fp16", "--fp16-no-flatten-grads"])
        return _weights(os.path.join(tmp_path / "two", "checkpoint_last.pt"))

    _check_heads_alone_then_everything(start, train)


def test_freeze_encoder_updates_in_two_gloo_workers(imported, corpus_files, tmp_path):
    # legacy_ddp all-reduces the gradients of the parameters that require one; the workers agree on the update
    # number, so they freeze and unfreeze the encoder together (otherwise their buffers would differ in size)
    data = _corpus(imported, corpus_files, tmp_path)

    def train(updates):
        run_gloo_ranks(lambda rank: _freeze_two_updates(data, imported, tmp_path / "two", updates))
        return _weights(os.path.join(tmp_path / "two", "checkpoint_last.pt"))

    _check_heads_alone_then_everything(_weights(os.path.join(imported, "model.pt")), train)


def test_negative_freeze_encoder_updates_is_one_line(imported, corpus_files, tmp_path):
    data = _corpus(imported, corpus_files, tmp_path)
    proc = run_cli([bin_path("fairseq-train"), data, "--user-dir", "user_dir", "--task", "spanbert_pretraining",
                    "--criterion", "span_bert", "--arch", "spanbert_tiny", "--cpu", "--max-update", "1", "--batch-size", "4",
                    "--save-dir", str(tmp_path / "ck"), "--freeze-encoder-updates", "-1"], check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith("--freeze-encoder-updates must be at least 0, got -1")


def test_continue_from_hf_recipe_runs_from_an_imported_encoder(imported, corpus_files, tmp_path):
    data = _corpus(imported, corpus_files, tmp_path)
    proc = run_cli([bin_path("fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs", "pretrain"),
                    "--config-name", "continue_from_hf", f"task.data={data}",
                    f"checkpoint.finetune_from_model={os.path.join(imported, 'model.pt')}",
                    f"checkpoint.save_dir={tmp_path / 'ck'}", "common.cpu=true", "optimization.max_update=2",
                    "lr_scheduler.warmup_updates=1", "lr_scheduler.total_num_update=2", "task.tokens_per_sample=64",
                    "dataset.batch_size=4", "task.freeze_encoder_updates=1", "task.bf16_autocast=true"])
    assert "model shape from" in proc.stdout + proc.stderr
    saved = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert saved["optimizer_history"][-1]["num_updates"] == 2
    assert {k: saved["cfg"]["model"][k] for k in SHAPE} == SHAPE


def test_freeze_encoder_updates_under_pytorch_ddp_needs_find_unused_parameters(tmp_path):
    # fairseq builds PyTorch's DDP only on GPUs; the check is on the wrapped module, so a CPU DDP of one gloo
    # worker stands in. Without find_unused_parameters the second update would fail with a reduction error.
    import pytest
    import torch.distributed as dist
    from fairseq.distributed import ModuleProxyWrapper

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.pretraining.task import refuse_pytorch_ddp_without_unused_parameters

    refuse_pytorch_ddp_without_unused_parameters(torch.nn.Linear(2, 2))  # one process: nothing to refuse
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        for find_unused in (False, True):
            wrapped = ModuleProxyWrapper(torch.nn.parallel.DistributedDataParallel(
                torch.nn.Linear(2, 2), find_unused_parameters=find_unused))
            if find_unused:
                refuse_pytorch_ddp_without_unused_parameters(wrapped)
            else:
                with pytest.raises(UsageError, match="--find-unused-parameters"):
                    refuse_pytorch_ddp_without_unused_parameters(wrapped)
    finally:
        dist.destroy_process_group()


def test_freeze_encoder_updates_refuses_fairseqs_flat_fp16_master_weights(monkeypatch):
    # fairseq's --fp16/--bf16 optimizer packs the gradients of the parameters that require one into its flat fp32
    # copy from the start: a frozen first parameter shifts the second one's gradient onto it
    import argparse

    import pytest
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.pretraining.task import refuse_flat_fp16_master_weights

    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # the flat copy on the CPU (device index None)
    encoder, head = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    optimizer = object.__new__(FP16Optimizer)  # only the state the gradient copy reads
    optimizer.fp16_params, optimizer._needs_sync = [encoder, head], True
    optimizer.fp32_params = FP16Optimizer.build_fp32_params(argparse.Namespace(), [encoder, head], flatten=True)
    encoder.requires_grad_(False)
    head.grad = torch.ones(3)
    optimizer._sync_fp16_grads_to_fp32()
    assert optimizer.fp32_params[None].grad[:3].tolist() == [1, 1, 1]  # the head's gradient, on the encoder's weights
    with pytest.raises(UsageError, match="--fp16-no-flatten-grads"):
        refuse_flat_fp16_master_weights(optimizer)
    optimizer.fp32_params = FP16Optimizer.build_fp32_params(argparse.Namespace(), [encoder, head], flatten=False)
    refuse_flat_fp16_master_weights(optimizer)  # one fp32 copy per parameter: the frozen one is skipped, not packed
