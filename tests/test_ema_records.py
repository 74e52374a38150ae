"""fairseq's --store-ema over the plugin's models, whose vocabulary record is integer buffers."""
import os

import pytest
import torch

from conftest import bin_path, run_cli
from test_finetune_span_drop import folders  # noqa: F401 - the prepared synthetic folders (a module fixture)
from test_pretrain import TINY


def test_the_fairseq_code_under_the_shim_is_the_code_it_was_written_against():
    from spanbert_plugin.core import ema_records

    assert ema_records.fairseq_source_sha256() == ema_records.FAIRSEQ_SOURCE_SHA256


@pytest.mark.parametrize("fp32", [False, True])
def test_store_ema_trains_resumes_and_copies_the_records(spm_data, tmp_path, fp32):
    """fairseq's EMA decayed every state entry: the int64 symbol hashes stopped the first update with a dtype
    error. They are copied now, and the weights are averaged as fairseq averages them."""
    train = [bin_path("fairseq-train"), spm_data, *TINY, "--store-ema", "--ema-decay", "0.5",
             *(["--ema-fp32"] if fp32 else []), "--disable-validation", "--save-dir", str(tmp_path / "ck")]
    run_cli([*train, "--max-update", "2"])
    state = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    ema, model = state["extra_state"]["ema"], state["model"]
    for key in ("vocabulary.symbol_hashes", "vocabulary.tokenizer"):
        assert ema[key].dtype == model[key].dtype and torch.equal(ema[key], model[key])
    moved = [k for k in model if model[k].is_floating_point() and not torch.equal(ema[k].to(model[k].dtype), model[k])]
    assert moved  # an average of the updates' weights, not a copy of the last
    resumed = run_cli([*train, "--max-update", "3"])
    assert "loaded checkpoint" in (resumed.stdout + resumed.stderr).lower()


def test_store_ema_starts_from_a_checkpoint_without_one(imported, family_data, tmp_path):
    """--finetune-from-model, and a resume of a run saved without an EMA: fairseq deleted the checkpoint's model,
    then read it to start the EMA (KeyError: 'model'). The EMA starts from that model now."""
    import os

    train = [bin_path("fairseq-train"), family_data["cls"], "--user-dir", "user_dir", "--task", "sentence_classification",
             "--criterion", "sentence_classification", "--arch", "spanbert_base", "--batch-size", "8",
             "--optimizer", "adam", "--lr", "1e-4", "--cpu", "--num-workers", "0", "--no-epoch-checkpoints",
             "--disable-validation"]
    start = os.path.join(imported, "model.pt")
    run_cli([*train, "--finetune-from-model", start, "--store-ema", "--ema-decay", "0.5", "--max-update", "2",
             "--save-dir", str(tmp_path / "finetuned")])
    ema = torch.load(tmp_path / "finetuned" / "checkpoint_last.pt", map_location="cpu", weights_only=True)["extra_state"]["ema"]
    assert ema["vocabulary.symbol_hashes"].dtype == torch.int64
    run_cli([*train, "--finetune-from-model", start, "--max-update", "2", "--save-dir", str(tmp_path / "plain")])
    resumed = run_cli([*train, "--store-ema", "--max-update", "3", "--save-dir", str(tmp_path / "plain")])
    assert "holds no EMA: the EMA starts from its model" in resumed.stdout + resumed.stderr
    state = torch.load(tmp_path / "plain" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 3 and "ema" in state["extra_state"]


def _classification_run(data):
    from test_finetune_checks import RESUME_RUN, RESUME_TASKS

    return [bin_path("fairseq-train"), data, *RESUME_RUN[:RESUME_RUN.index("--span-drop-p")], *RESUME_TASKS["cls"][:-2],
            "--num-workers", "0", "--disable-validation", "--store-ema", "--ema-decay", "0.5"]


@pytest.mark.parametrize("fp32", [False, True])
def test_a_new_training_starts_its_ema_from_the_model_not_the_checkpoints_ema(folders, tmp_path, fp32):  # noqa: F811
    """--finetune-from-model of a checkpoint trained with --store-ema: its EMA (and --ema-fp32's copy of it) went on as
    the new run's, with that run's head (here its classes in another order: the model's head rows are reordered to
    this data's labels, the EMA's were not, so the EMA's class 0 was the other label). The new EMA starts from the
    model as loaded."""
    train = [*_classification_run(folders["cls"]), *(["--ema-fp32"] if fp32 else [])]
    run_cli([*train, "--max-update", "2", "--save-dir", str(tmp_path / "first")])
    state = torch.load(tmp_path / "first" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    labels = state["task_state"]["labels"]
    state["task_state"]["labels"] = labels[::-1]  # the same classes in another order (as an imported head's may be)
    torch.save(state, tmp_path / "reordered.pt")
    run_cli([*train, "--max-update", "1", "--lr", "1e-12", "--save-dir", str(tmp_path / "second"),
             "--finetune-from-model", str(tmp_path / "reordered.pt")])
    new = torch.load(tmp_path / "second" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    head = "classification_heads.sentence_classification_head.out_proj.weight"
    assert torch.allclose(new["model"][head], state["model"][head][[1, 0]], atol=1e-6)  # the rows follow the labels
    assert torch.allclose(new["extra_state"]["ema"][head], new["model"][head], atol=1e-6)
    encoder = "encoder.embeddings.word_embeddings.weight"
    assert torch.allclose(new["extra_state"]["ema"][encoder], state["model"][encoder], atol=1e-6)


def test_an_ema_fp32_run_resumes_with_its_data_folder_moved(folders, tmp_path):  # noqa: F811
    """--ema-fp32 saves its fp32 copy of the EMA with the records, the vocabulary's tokenizer record (the data folder's
    path) included: resumed from a folder at another path, the copy of a record of another length stopped the load
    ("The size of tensor a (54) must match the size of tensor b (41)")."""
    import shutil

    moved = str(tmp_path / "the_classification_folder_moved_elsewhere")
    shutil.copytree(folders["cls"], moved)
    save_dir = str(tmp_path / "ck")
    run_cli([*_classification_run(folders["cls"]), "--ema-fp32", "--max-update", "1", "--save-dir", save_dir])
    run_cli([*_classification_run(moved), "--ema-fp32", "--max-update", "2", "--save-dir", save_dir])
    state = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 2
    record = "vocabulary.tokenizer"
    assert torch.equal(state["extra_state"]["ema"][record], state["model"][record])
    assert moved in bytes(state["model"][record].tolist()).decode()
