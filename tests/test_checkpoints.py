"""Checkpoint reliability: damaged or foreign files, relative data paths of older checkpoints."""
import os
import shutil

import pytest
import torch

from conftest import bin_path, run_cli
from test_hf_interop import call, random_hf_bert, snapshot
from test_pretrain import TINY


@pytest.fixture(scope="module")
def tiny_model(wordpiece_vocab, tmp_path_factory):
    """A tiny spanbert checkpoint (spanbert-import-hf of a random BERT) and its data folder."""
    from spanbert_plugin.hf.interop import import_hf

    root = tmp_path_factory.mktemp("tiny_model")
    random_hf_bert(root / "hf", wordpiece_vocab)
    import_hf(str(root / "hf"), str(root / "imported"))
    return root / "imported"


def _layout(tiny_model, root, stored_data):
    """root/data (dict.txt + tokenizer) and root/ck/checkpoint_last.pt whose task.data is ``stored_data``."""
    shutil.copytree(tiny_model, root / "data", ignore=shutil.ignore_patterns("model.pt"))
    (root / "ck").mkdir()
    state = torch.load(tiny_model / "model.pt", weights_only=True)
    state["cfg"]["task"]["data"] = stored_data  # as older checkpoints stored a relative --data
    torch.save(state, root / "ck" / "checkpoint_last.pt")
    (root / "x" / "y").mkdir(parents=True)
    return root / "ck" / "checkpoint_last.pt"


def test_relative_data_of_old_checkpoints(tiny_model, tmp_path, monkeypatch):
    from spanbert_plugin.core.checkpoint_loading import CheckpointError
    from spanbert_plugin.model.spanbert import SpanBertModel

    checkpoint = _layout(tiny_model, tmp_path, "data")
    monkeypatch.chdir(tmp_path)  # 'data' relative to the working directory
    hub = SpanBertModel.from_pretrained("ck", "checkpoint_last.pt")
    assert hub.cfg.task.data == str(tmp_path / "data")
    assert hub.decode(hub.encode("the value of an attribute")) == "the value of an attribute"
    monkeypatch.chdir(tmp_path / "x" / "y")  # neither here nor beside the checkpoint: both paths named
    with pytest.raises(CheckpointError) as err:
        SpanBertModel.from_pretrained(str(tmp_path / "ck"), "checkpoint_last.pt")
    message = str(err.value)
    assert message.startswith(str(checkpoint)) and "has no dict.txt" in message
    assert str(tmp_path / "x" / "y" / "data") in message and str(tmp_path / "ck" / "data") in message
    # '../data' is wrong from here but right from the checkpoint's folder: the fallback finds it
    state = torch.load(checkpoint, weights_only=True)
    state["cfg"]["task"]["data"] = "../data"
    torch.save(state, checkpoint)
    hub = SpanBertModel.from_pretrained(str(tmp_path / "ck"), "checkpoint_last.pt")
    assert hub.cfg.task.data == str(tmp_path / "data")


def test_given_data_is_relative_to_working_directory(tiny_model, tmp_path, monkeypatch):
    from spanbert_plugin.cli.export_hf import main
    from spanbert_plugin.model.spanbert import SpanBertModel

    _layout(tiny_model, tmp_path, "/nonexistent/data")
    monkeypatch.chdir(tmp_path)
    hub = SpanBertModel.from_pretrained("ck", "checkpoint_last.pt", data_name_or_path="data")
    assert hub.cfg.task.data == str(tmp_path / "data")
    status, out, err = call(main, ["--checkpoint", "ck/checkpoint_last.pt", "--data", "data", "--out", "hf"])
    assert status == 0 and (tmp_path / "hf" / "config.json").exists(), err
    # a folder named relative to the checkpoint is used only when the working directory has no such folder
    shutil.copytree(tmp_path / "data", tmp_path / "ck" / "vocab_dir")
    hub = SpanBertModel.from_pretrained("ck", "checkpoint_last.pt", data_name_or_path="vocab_dir")
    assert hub.cfg.task.data == str(tmp_path / "ck" / "vocab_dir")
    shutil.copytree(tmp_path / "data", tmp_path / "vocab_dir")
    hub = SpanBertModel.from_pretrained("ck", "checkpoint_last.pt", data_name_or_path="vocab_dir")
    assert hub.cfg.task.data == str(tmp_path / "vocab_dir")
    status, _, err = call(main, ["--checkpoint", "ck/checkpoint_last.pt", "--data", "missing", "--out", "hf2"])
    assert status == 1 and "data folder missing has no dict.txt" in err and not (tmp_path / "hf2").exists()


def test_damaged_files_are_named(tmp_path, tiny_model):
    from fairseq import checkpoint_utils

    from spanbert_plugin.core.checkpoint_loading import CheckpointError

    data = (tiny_model / "model.pt").read_bytes()
    cases = {
        "empty.pt": (b"", "empty file (0 bytes)"),
        "truncated.pt": (data[: len(data) * 3 // 4], "truncated or damaged checkpoint"),
        "notes.pt": (b"epoch 3: loss 2.1\n", "a text file, not a PyTorch checkpoint"),
        "random.pt": (bytes(range(256)) * 4, "not a PyTorch checkpoint (unknown file format)"),
    }
    for name, (content, expect) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError) as err:
            checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / name))
        assert err.value.path == str(tmp_path / name) and str(err.value).startswith(f"{tmp_path / name}: {expect}")
    torch.save({"weight": torch.zeros(2)}, tmp_path / "state_dict.pt")
    with pytest.raises(CheckpointError, match="a PyTorch file but not a fairseq checkpoint"):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "state_dict.pt"))
    assert checkpoint_utils.load_checkpoint_to_cpu(str(tiny_model / "model.pt"))["model"]  # sound files load


def test_resume_from_truncated_checkpoint_last(tiny_model, wordpiece_data, tmp_path):
    """fairseq-train names the damaged file and --restore-file in one line, exit 1, and writes nothing."""
    save_dir = tmp_path / "ck"
    save_dir.mkdir()
    data = (tiny_model / "model.pt").read_bytes()
    (save_dir / "checkpoint_last.pt").write_bytes(data[: len(data) // 2])
    (save_dir / "checkpoint_best.pt").write_bytes(data)
    before = snapshot(save_dir)
    proc = run_cli([bin_path("fairseq-train"), wordpiece_data, *TINY, "--max-update", "2", "--save-dir", str(save_dir)],
                   check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {save_dir / 'checkpoint_last.pt'}: truncated or damaged checkpoint"), last
    assert "--restore-file can name an earlier checkpoint" in last and "checkpoint_best.pt" in last
    assert snapshot(save_dir) == before


def test_finetune_from_a_damaged_checkpoint_is_one_line(tiny_model, wordpiece_data, tmp_path):
    """--finetune-from-model names the damaged file in one line, exit 1, and no checkpoint is written."""
    data = (tiny_model / "model.pt").read_bytes()
    damaged = tmp_path / "pretrained.pt"
    damaged.write_bytes(data[: len(data) // 2])
    save_dir = tmp_path / "ck"
    proc = run_cli([bin_path("fairseq-train"), wordpiece_data, *TINY, "--max-update", "2", "--save-dir", str(save_dir),
                    "--finetune-from-model", str(damaged)], check=False)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"error: {damaged}: truncated or damaged checkpoint: its zip archive is incomplete "
                      "(an interrupted save or a partial copy?)"], proc.stderr[-2000:]
    assert not save_dir.exists() or not list(save_dir.glob("*.pt"))


class ForeignState:
    """A class no allowlist names; unpickling it runs ``__setstate__``, which creates a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __setstate__(self, state):
        open(state["marker"], "w").close()


def test_safe_loading_refuses_a_class_outside_the_allowlist(tiny_model, tmp_path):
    """A checkpoint holding an object of a class outside the allowlist is refused without running its code."""
    import pickle

    from fairseq import checkpoint_utils

    marker = tmp_path / "code_ran"
    state = torch.load(tiny_model / "model.pt", weights_only=True)
    state["extra_state"] = {"payload": ForeignState(marker)}
    torch.save(state, tmp_path / "foreign.pt")
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL test_checkpoints.ForeignState"):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "foreign.pt"))
    assert not marker.exists()
    torch.load(tmp_path / "foreign.pt", weights_only=False)  # unsafe loading would have run it
    assert marker.exists()


def test_reading_a_starting_checkpoints_options_keeps_safe_loading(tmp_path):
    from spanbert_plugin.core.checkpoint_loading import stored_checkpoint, stored_model_options

    marker = tmp_path / "code_ran"
    torch.save({"model": {}, "cfg": {"model": {"encoder_layers": 2}}, "extra_state": {"payload": ForeignState(str(marker))}},
               tmp_path / "foreign.pt")
    assert stored_checkpoint(str(tmp_path / "foreign.pt")) == {}
    assert stored_model_options(str(tmp_path / "foreign.pt")) is None
    assert not marker.exists()


def test_diagnosis_tells_a_fairseq_checkpoint_by_its_cfg_or_its_args(tmp_path):
    """A readable file with model weights and either a run config (``cfg``, current fairseq) or legacy ``args`` is a
    fairseq checkpoint: a load that failed on it for another reason keeps its own error (no diagnosis)."""
    import argparse

    from spanbert_plugin.core.checkpoint_loading import diagnose_checkpoint

    weights = {"encoder.weight": torch.zeros(2)}
    files = {"cfg.pt": {"model": weights, "cfg": {"model": {"encoder_layers": 2}}},
             "args.pt": {"model": weights, "args": argparse.Namespace(arch="spanbert_tiny")},
             "weights_only.pt": {"model": weights}}
    for name, state in files.items():
        torch.save(state, tmp_path / name)
    error = KeyError("upgrade_state_dict")
    assert diagnose_checkpoint(str(tmp_path / "cfg.pt"), error) is None
    assert diagnose_checkpoint(str(tmp_path / "args.pt"), error) is None
    assert diagnose_checkpoint(str(tmp_path / "weights_only.pt"), error).startswith(
        "a PyTorch file but not a fairseq checkpoint")


def test_a_tasks_absolute_data_folder_reaches_the_run_config_checkpoints_save(tmp_path, monkeypatch):
    """fairseq hands a task a merged copy of the run's task section (its parent: the run); the absolute data folder
    the task resolves is copied into the run's config, which checkpoints save. Another task's section is left alone."""
    from omegaconf import OmegaConf

    from spanbert_plugin.core.tasks import prepared_data_folder

    (tmp_path / "prep").mkdir()
    (tmp_path / "prep" / "dict.txt").write_text("w 1\n")
    monkeypatch.chdir(tmp_path)

    def merged_copy(run, name):
        copy = OmegaConf.create({"_name": name, "data": "prep"})
        copy._set_parent(run)  # as fairseq's merge_with_parent leaves it
        return copy

    run = OmegaConf.create({"task": {"_name": "sentence_classification", "data": "prep"}, "common": {"seed": 1}})
    copy = merged_copy(run, "sentence_classification")
    assert prepared_data_folder(copy, "t", "spanbert-prepare-classification") == str(tmp_path / "prep")
    assert run.task.data == str(tmp_path / "prep") and run.task._name == "sentence_classification"
    other = OmegaConf.create({"task": {"_name": "extractive_qa", "data": "prep"}})
    prepared_data_folder(merged_copy(other, "sentence_classification"), "t", "spanbert-prepare-classification")
    assert other.task.data == "prep" and other.task._name == "extractive_qa"


def test_a_recorded_relative_data_folder_beside_the_checkpoint_is_not_gone(tmp_path, monkeypatch):
    """A relative ``task.data`` is looked for from the working directory and from the checkpoint's folder, as the
    loaders do: found beside the checkpoint it is not reported gone; found nowhere, it is."""
    import os

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.finetune_io import refuse_a_recorded_data_folder_that_is_gone

    (tmp_path / "data").mkdir()
    (tmp_path / "ck").mkdir()
    (tmp_path / "x" / "y").mkdir(parents=True)
    checkpoint = str(tmp_path / "ck" / "checkpoint_best.pt")
    monkeypatch.chdir(tmp_path / "x" / "y")  # '../data' is no folder from here, but is from the checkpoint's folder
    refuse_a_recorded_data_folder_that_is_gone(checkpoint, "../data")
    refuse_a_recorded_data_folder_that_is_gone(checkpoint, str(tmp_path / "data"))
    with pytest.raises(UsageError, match=r"the data folder it was trained on, \.\./gone, no longer exists"):
        refuse_a_recorded_data_folder_that_is_gone(checkpoint, "../data" + os.pathsep + "../gone")


def test_the_resume_hint_names_the_other_checkpoints_not_the_damaged_one(tmp_path):
    from spanbert_plugin.core.checkpoint_loading import _other_checkpoints

    for name in ("checkpoint_last.pt", "checkpoint2.pt", "checkpoint1.pt", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert _other_checkpoints(str(tmp_path / "checkpoint_last.pt")) == ["checkpoint1.pt", "checkpoint2.pt"]


def _zip_entry_data_offset(path, suffix):
    """Byte offset of the stored (uncompressed) data of the zip entry whose name ends in ``suffix``."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + name_length + extra_length


def test_damaged_zip_archives_and_legacy_files_are_named(tmp_path):
    """A complete zip archive can still be damaged (its central directory, an entry's bytes), and a checkpoint of
    torch's legacy (pre-zip) format can be cut short: each is one line naming the file and what is wrong."""
    from fairseq import checkpoint_utils

    from spanbert_plugin.core.checkpoint_loading import CheckpointError

    state = {"model": {"w": torch.arange(100.0)}, "cfg": {"model": {}}}
    torch.save(state, tmp_path / "sound.pt")
    raw = (tmp_path / "sound.pt").read_bytes()
    directory = raw.find(b"PK\x01\x02")  # the central directory's first entry
    (tmp_path / "directory.pt").write_bytes(raw[:directory] + b"XXXX" + raw[directory + 4:])
    data = bytearray(raw)
    data[_zip_entry_data_offset(tmp_path / "sound.pt", "/data/0") + 5] ^= 0xFF  # a byte of the weights flipped
    (tmp_path / "flipped.pt").write_bytes(bytes(data))
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    legacy = (tmp_path / "legacy.pt").read_bytes()
    assert legacy[:1] == b"\x80"  # a pickle stream
    (tmp_path / "legacy_cut.pt").write_bytes(legacy[: len(legacy) // 2])
    expected = {"directory.pt": "damaged checkpoint (Bad magic number for central directory)",
                "flipped.pt": "damaged checkpoint (its entry sound/data/0 fails the CRC check)",
                "legacy_cut.pt": "truncated or damaged checkpoint (RuntimeError: unexpected EOF"}
    for name, problem in expected.items():
        with pytest.raises(CheckpointError) as err:
            checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / name))
        assert str(err.value).startswith(f"{tmp_path / name}: {problem}"), str(err.value)
        assert "\n" not in str(err.value)


def test_a_folder_given_as_a_checkpoint_keeps_its_own_error(tmp_path):
    """Only files are diagnosed: fairseq's error for a folder is left as it is (it names the folder itself)."""
    from fairseq import checkpoint_utils

    from spanbert_plugin.core.checkpoint_loading import diagnose_checkpoint

    assert diagnose_checkpoint(str(tmp_path), OSError("any")) is None
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path))


@pytest.mark.parametrize("options", [{"checkpoint_suffix": "-shard0"}, {"model_parallel_size": 2}],
                         ids=["checkpoint suffix", "model parallel"])
def test_a_restore_file_fairseq_names_with_a_suffix_is_left_to_fairseq(tmp_path, options):
    """Under --checkpoint-suffix or model parallelism fairseq reads another file than the one named: a missing
    --restore-file is no error of the plugin's then (without them it is)."""
    from spanbert_plugin.core.checkpoint_loading import refuse_a_named_checkpoint_that_is_missing
    from spanbert_plugin.core.errors import UsageError

    checkpoint = {"save_dir": str(tmp_path), "restore_file": str(tmp_path / "missing.pt")}
    with pytest.raises(UsageError, match="missing.pt: no such checkpoint"):
        refuse_a_named_checkpoint_that_is_missing(checkpoint)
    refuse_a_named_checkpoint_that_is_missing({**checkpoint, **options})
    refuse_a_named_checkpoint_that_is_missing(checkpoint, {"ddp_backend": "fully_sharded", "use_sharded_state": True})


def test_a_saved_head_of_another_size_is_left_to_the_models_loading(tmp_path):
    """A classifier checkpoint for 3 labels, fine-tuned on 2: the head's rows are neither reordered nor dropped here
    (the model's loading leaves the whole head out)."""
    from spanbert_plugin.core.checkpoint_loading import match_saved_head_labels

    class Model:
        mapped = []

        def map_saved_head(self, *args):
            self.mapped.append(args)

    torch.save({"model": {"classification_heads.head.out_proj.weight": torch.zeros(3, 4)},
                "task_state": {"labels": ["a", "b", "c"]}}, tmp_path / "three.pt")
    model = Model()
    match_saved_head_labels(model, str(tmp_path / "three.pt"), "classification_heads", "head", ["b", "a"])
    assert model.mapped == []
    match_saved_head_labels(model, str(tmp_path / "three.pt"), "classification_heads", "head", ["c", "b", "a"])
    assert model.mapped == [("classification_heads", "head", [2, 1, 0])]  # the same size: reordered


def test_the_model_options_of_a_legacy_checkpoint_come_from_its_args(tmp_path):
    import argparse

    from spanbert_plugin.core.checkpoint_loading import stored_model_options

    torch.save({"model": {}, "args": argparse.Namespace(arch="spanbert_base", encoder_layers=2)}, tmp_path / "args.pt")
    torch.save({"model": {}}, tmp_path / "neither.pt")
    assert stored_model_options(str(tmp_path / "args.pt")) == {"arch": "spanbert_base", "encoder_layers": 2}
    assert stored_model_options(str(tmp_path / "neither.pt")) is None


LEGACY_PRETRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "legacy_layout", "pretrain")


def test_a_hub_checkpoint_that_is_missing_or_records_no_data_folder_is_one_line(tmp_path):
    from spanbert_plugin.core.checkpoint_loading import CheckpointError
    from spanbert_plugin.model.spanbert import SpanBertModel

    with pytest.raises(CheckpointError) as err:
        SpanBertModel.from_pretrained(str(tmp_path), "checkpoint_best.pt")
    assert str(err.value) == f"{tmp_path / 'checkpoint_best.pt'}: no such checkpoint"
    state = torch.load(os.path.join(LEGACY_PRETRAIN, "checkpoint.pt"), weights_only=True)
    state["cfg"]["task"]["data"] = ""  # and no dict.txt beside it
    torch.save(state, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError) as err:
        SpanBertModel.from_pretrained(str(tmp_path), "checkpoint.pt")
    assert str(err.value) == (f"{tmp_path / 'checkpoint.pt'}: records no data folder; pass data_name_or_path= (--data) "
                              "with dict.txt")


def test_the_hub_refuses_more_tokens_than_the_models_positions():
    from spanbert_plugin.model.spanbert import SpanBertModel

    hub = SpanBertModel.from_pretrained(LEGACY_PRETRAIN, "checkpoint.pt", data_name_or_path=LEGACY_PRETRAIN)
    positions = hub.model.max_positions()
    tokens = hub.encode("the " * positions)
    assert len(tokens) > positions
    with pytest.raises(ValueError, match=f"^{len(tokens)} tokens exceed the model's {positions} positions$"):
        hub.extract_features(tokens)
    assert hub.extract_features(tokens[:positions]).shape[:2] == (1, positions)


def test_a_legacy_format_file_that_is_not_a_fairseq_checkpoint_is_one_line(tmp_path):
    """A file of torch's legacy (pre-zip) format, which torch cannot memory-map, is still looked into: weights without
    a run config are named as not a fairseq checkpoint (fairseq itself fails on it with a KeyError), and a legacy
    checkpoint's model options are read."""
    import argparse

    from fairseq import checkpoint_utils

    from spanbert_plugin.core.checkpoint_loading import CheckpointError, stored_model_options

    torch.save({"model": {"w": torch.zeros(2)}}, tmp_path / "weights.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError) as err:
        checkpoint_utils.load_checkpoint_to_cpu(str(tmp_path / "weights.pt"))
    assert str(err.value) == (f"{tmp_path / 'weights.pt'}: a PyTorch file but not a fairseq checkpoint "
                              "(no 'model' and 'cfg' entries)")
    legacy_args = {"model": {}, "args": argparse.Namespace(arch="spanbert_base", encoder_layers=2)}
    torch.save(legacy_args, tmp_path / "args.pt", _use_new_zipfile_serialization=False)
    assert stored_model_options(str(tmp_path / "args.pt")) == {"arch": "spanbert_base", "encoder_layers": 2}


def test_only_fairseqs_optimizer_and_criterion_mismatch_on_resume_becomes_one_line(tmp_path):
    """The resume's AssertionError that the optimizer or criterion differ is a UsageError naming --save-dir; any
    other assertion is fairseq's own and propagates as it is."""
    from types import SimpleNamespace

    from spanbert_plugin.core.checkpoint_loading import _resume_hint
    from spanbert_plugin.core.errors import UsageError

    def failing(message):
        def load_checkpoint(cfg, trainer, **kwargs):
            raise AssertionError(message)
        return _resume_hint(load_checkpoint)

    cfg = SimpleNamespace(save_dir=str(tmp_path), finetune_from_model=None)
    with pytest.raises(UsageError) as err:
        failing("Optimizer does not match; please reset the optimizer (--reset-optimizer). FP16Optimizer vs Adam")(cfg, None)
    assert str(err.value) == (f"resuming from {tmp_path}: Optimizer does not match; please reset the optimizer "
                              "(--reset-optimizer). FP16Optimizer vs Adam; or train in a new --save-dir")
    with pytest.raises(AssertionError, match="^something else$") as err:
        failing("something else")(cfg, None)
    assert not isinstance(err.value, UsageError)


def test_the_checkpoint_broadcast_passes_other_objects_unchanged_and_the_checks_install_once():
    """fairseq broadcasts other objects than loaded states too; installing the checks again wraps nothing twice."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils
    from omegaconf import OmegaConf

    from spanbert_plugin.core.checkpoint_loading import _plain_cfg_broadcast, install_checkpoint_checks

    sent = []  # the type of what is sent (of its cfg for a state)

    def send(obj, *args, **kwargs):
        sent.append(type(obj["cfg"]) if isinstance(obj, dict) else type(obj))
        return obj

    broadcast = _plain_cfg_broadcast(send)
    assert broadcast([1, 2], 0, None) == [1, 2] and broadcast(None) is None
    state = broadcast({"model": {}, "cfg": OmegaConf.create({"task": {"data": "d"}})})
    assert sent[-1] is dict and OmegaConf.is_config(state["cfg"]) and state["cfg"].task.data == "d"
    install_checkpoint_checks()
    wrapped = (checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.load_checkpoint,
               distributed_utils.broadcast_object)
    install_checkpoint_checks()
    assert (checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.load_checkpoint,
            distributed_utils.broadcast_object) == wrapped
    assert all(getattr(f, "spanbert_checked", False) for f in wrapped)
