"""Pre-training end to end with fairseq-train and fairseq-hydra-train on the CPU."""
import json
import math
import re
import sys

import pytest
import torch

from conftest import bin_path, run_cli, run_gloo_ranks

TINY = ["--user-dir", "user_dir", "--task", "spanbert_pretraining", "--criterion", "span_bert",
        "--arch", "spanbert_tiny", "--tokens-per-sample", "128", "--batch-size", "8",
        "--optimizer", "adam", "--adam-betas", "(0.9,0.999)", "--lr", "1e-3", "--lr-scheduler", "polynomial_decay",
        "--warmup-updates", "5", "--total-num-update", "200", "--clip-norm", "1.0",
        "--cpu", "--num-workers", "0", "--log-format", "json", "--log-interval", "1",
        "--no-epoch-checkpoints", "--seed", "3"]


def train_logs(output):
    """Per-update JSON records fairseq logged under train_inner."""
    records = []
    for line in output.splitlines():
        match = re.search(r"train_inner\W.*?(\{.*\})", line)
        if match:
            records.append(json.loads(match.group(1)))
    return records


def _falls(records, key, window=5):
    values = [float(r[key]) for r in records]
    return sum(values[-window:]) / window < sum(values[:window]) / window - 0.5


def test_fairseq_train_lowers_both_losses(spm_data, tmp_path):
    proc = run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "60",
                    "--save-dir", str(tmp_path / "ck")])
    records = train_logs(proc.stdout + proc.stderr)
    assert len(records) == 60
    assert _falls(records, "mlm_loss") and _falls(records, "sbo_loss")
    assert all(math.isfinite(float(r["loss"])) for r in records)
    assert (tmp_path / "ck" / "checkpoint_last.pt").exists()


def test_fairseq_hydra_train_tiny_recipe(spm_data, tmp_path):
    proc = run_cli([bin_path("fairseq-hydra-train"), "--config-dir", "configs/pretrain", "--config-name", "tiny_cpu",
                    f"task.data={spm_data}", "optimization.max_update=60", "common.log_interval=1",
                    "common.log_format=json", f"checkpoint.save_dir={tmp_path / 'ck'}"])
    records = train_logs(proc.stdout + proc.stderr)
    assert len(records) == 60 and _falls(records, "mlm_loss") and _falls(records, "sbo_loss")
    assert (tmp_path / "ck" / "checkpoint_last.pt").exists()


def test_resume_sees_same_data_and_masks(spm_data, tmp_path):
    """Stop after 12 updates, resume from checkpoint_last.pt (safe loading on) to 24: same losses."""
    full = run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "24", "--save-dir", str(tmp_path / "a")])
    first = run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "12", "--save-dir", str(tmp_path / "b")])
    second = run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "24", "--save-dir", str(tmp_path / "b")])
    assert "Loaded checkpoint" in second.stdout + second.stderr
    uninterrupted = {r["num_updates"]: float(r["loss"]) for r in train_logs(full.stdout + full.stderr)}
    resumed = {r["num_updates"]: float(r["loss"]) for r in train_logs(second.stdout + second.stderr)}
    assert sorted(resumed) == [str(u) for u in range(13, 25)] or sorted(map(int, resumed)) == list(range(13, 25))
    for update, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[update], abs=2e-3), update
    assert len(train_logs(first.stdout + first.stderr)) == 12


def test_two_process_gloo_training(spm_data, tmp_path):
    outputs = run_gloo_ranks(lambda rank: [
        sys.executable, "tests/_train_and_dump.py", str(tmp_path / f"rank{rank}.pt"), spm_data, *TINY,
        "--max-update", "30", "--save-dir", str(tmp_path / "ck")])
    records = train_logs(outputs[0])
    assert len(records) == 30 and _falls(records, "loss")
    assert int(float(records[-1]["bsz"])) == 16  # 8 per rank, summed over 2 ranks
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key


def test_memory_efficient_fp16_with_loss_scaling(spm_data, tmp_path):
    """fp16 weights and activations on the CPU; the dynamic scaler doubles after each clean window.

    (fairseq's overflow branch calls ``.cuda()`` unconditionally, so a CPU run
    cannot exercise the back-off; the GPU path handles it.)
    """
    proc = run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "30", "--save-dir", str(tmp_path / "ck"),
                    "--memory-efficient-fp16", "--fp16-init-scale", "4", "--fp16-scale-window", "5"])
    records = train_logs(proc.stdout + proc.stderr)
    assert len(records) == 30 and all(math.isfinite(float(r["loss"])) for r in records)
    scales = [float(r["loss_scale"]) for r in records]
    assert scales[0] == 4 and scales[-1] >= 4 * 2 ** 4 and scales == sorted(scales)
    assert _falls(records, "mlm_loss")


def _valid_logs(output):
    return [json.loads(m.group(1)) for m in re.finditer(r"\| valid \| (\{.*\})", output)]


def test_tiny_validation_split_masks_every_epoch(corpus_files, wordpiece_vocab, tmp_path):
    """A 1-block validation split of two tokens: its budget rounds to 0 seven times in ten, yet every
    validation masks a token and reports a real loss (it used to log num_masked 0, loss 0, best_loss 0)."""
    from spanbert_plugin.prepare import cli_main

    documents = open(corpus_files[0], encoding="utf-8").read().split("\n\n")[:3]
    (tmp_path / "train.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    (tmp_path / "valid.txt").write_text("Return value\n", encoding="utf-8")
    data = str(tmp_path / "data")
    assert cli_main(["--train", str(tmp_path / "train.txt"), "--valid", str(tmp_path / "valid.txt"), "--destdir", data,
                     "--tokenizer", "wordpiece", "--wordpiece-vocab", wordpiece_vocab]) == 0
    proc = run_cli([bin_path("fairseq-train"), data, *TINY, "--max-epoch", "3", "--save-dir", str(tmp_path / "ck")])
    valid = _valid_logs(proc.stdout + proc.stderr)
    assert [int(v["epoch"]) for v in valid] == [1, 2, 3]
    for record in valid:
        assert int(float(record["valid_num_masked"])) >= 1 and float(record["valid_loss"]) > 0, record


def test_batches_without_masked_tokens_log_no_loss():
    """No masked token: nothing measured, so no loss (a 0 would win best-checkpoint selection)."""
    from fairseq import metrics

    from spanbert_plugin.criterions.span_bert import SpanBertCriterion

    empty = {"sample_size": 0, "num_masked": 0, "loss": 0.0, "mlm_loss": 0.0, "mlm_correct": 0, "ntokens": 12, "nsentences": 1}
    with metrics.aggregate() as agg:
        SpanBertCriterion.reduce_metrics([empty, empty])
    values = agg.get_smoothed_values()
    assert "loss" not in values and "mlm_loss" not in values and "ppl" not in values and values["num_masked"] == 0
    real = dict(empty, sample_size=4, num_masked=4, loss=8.0, mlm_loss=8.0, mlm_correct=1)
    with metrics.aggregate() as agg:
        SpanBertCriterion.reduce_metrics([empty])
        SpanBertCriterion.reduce_metrics([real])
    assert agg.get_smoothed_values()["loss"] == pytest.approx(2 / math.log(2), abs=1e-3)


def test_gloo_helper_kills_the_others_when_a_worker_fails():
    """A worker that dies stops the run at once: its peer (which would wait for it) is killed, not awaited."""
    waiting, dying = "import time; time.sleep(600)", "import sys; sys.exit(3)"
    with pytest.raises(AssertionError) as failure:
        run_gloo_ranks(lambda rank: [sys.executable, "-c", dying if rank == 1 else waiting], timeout=300)
    message = str(failure.value)
    assert "gloo worker 1 of 2 exited with 3" in message
    assert "gloo worker 0 of 2 killed (worker 1 failed)" in message


def test_gloo_helper_kills_every_worker_at_the_time_limit():
    with pytest.raises(AssertionError) as failure:
        run_gloo_ranks(lambda rank: [sys.executable, "-c", "import time; time.sleep(600)"], timeout=1)
    for rank in range(2):
        assert f"gloo worker {rank} of 2 killed (the time limit of 1 s passed)" in str(failure.value)
