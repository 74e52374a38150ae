"""fairseq-train with the plugin's tasks given options or data that cannot work: one line naming the flag or
file, exit status 1, no checkpoint written."""
import os
import re

import pytest

from conftest import bin_path, run_cli

TINY = ["--arch", "spanbert_tiny", "--lr", "1e-4", "--cpu", "--num-workers", "0",
        "--batch-size", "4", "--max-update", "1", "--seed", "1", "--log-format", "simple"]


def train(data, task, save_dir, *extra, criterion=None):
    """fairseq-train of ``task`` on ``data`` (criterion: the task's own unless given; "" leaves --criterion out)."""
    criterion = {"spanbert_pretraining": "span_bert"}.get(task, task) if criterion is None else criterion
    return run_cli([bin_path("fairseq-train"), data, "--user-dir", "user_dir", "--task", task,
                    *(["--criterion", criterion] if criterion else []), *TINY, "--save-dir", str(save_dir),
                    *([] if "--optimizer" in extra else ["--optimizer", "adam"]), *extra],
                   check=False)


def assert_one_line_error(proc, save_dir, message):
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[-1] == f"error: {message}", proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not os.path.exists(os.path.join(save_dir, "checkpoint_last.pt"))


@pytest.mark.parametrize("task, folder, criterion, own", [
    ("sentence_classification", "cls", "", "sentence_classification"),  # --criterion left out: fairseq's cross_entropy
    ("sentence_classification", "cls", "extractive_qa", "sentence_classification"),
    ("extractive_qa", "qa", "sentence_classification", "extractive_qa"),
    ("relation_extraction", "re", "cross_entropy", "relation_extraction"),
])
def test_a_criterion_of_another_task_is_one_line(family_data, tmp_path, task, folder, criterion, own):
    """It failed mid-step with a TypeError or ConfigAttributeError traceback."""
    proc = train(family_data[folder], task, tmp_path / "ck", criterion=criterion)
    assert_one_line_error(proc, tmp_path / "ck", f"--criterion {criterion or 'cross_entropy'} does not work with "
                                                 f"--task {task}; use --criterion {own}")


def test_pretraining_refuses_masked_lm_criterion(spm_data, tmp_path):
    proc = train(spm_data, "spanbert_pretraining", tmp_path / "ck", "--tokens-per-sample", "128", criterion="masked_lm")
    assert_one_line_error(proc, tmp_path / "ck", "--criterion masked_lm does not work with --task "
                                                 "spanbert_pretraining; use --criterion span_bert")


@pytest.mark.parametrize("folder, command, marker, task", [
    ("cls", "spanbert-prepare-classification", "classification.json", "sentence_classification"),
    ("qa", "spanbert-prepare-qa", "qa_config.json", "extractive_qa"),
])
def test_pretraining_refuses_a_finetuning_folder(family_data, tmp_path, folder, command, marker, task):
    """A fine-tuning folder holds the tokenizer files and a train.bin too: it pre-trained on its examples, silently."""
    data = family_data[folder]
    proc = train(data, "spanbert_pretraining", tmp_path / "ck", "--tokens-per-sample", "64")
    assert_one_line_error(proc, tmp_path / "ck", f"{data}: a {command} folder (it holds {marker}), not a "
                                                 f"spanbert-prepare one; train it with --task {task}, or pre-train on a "
                                                 "spanbert-prepare folder of raw text")


@pytest.mark.parametrize("extra, message", [
    (["--adam-betas", "(0.9,1.5)"], "--adam-betas (0.9,1.5): expected two numbers in [0, 1), e.g. '(0.9,0.999)'"),
    (["--adam-betas", "(0.9,"], "--adam-betas (0.9,: expected two numbers in [0, 1), e.g. '(0.9,0.999)'"),
    (["--adam-betas", "(0.9,0.98,0.999)"], "--adam-betas (0.9,0.98,0.999): expected two numbers in [0, 1), e.g. "
                                           "'(0.9,0.999)'"),
    (["--adam-eps=-1e-6"], "--adam-eps -1e-06: expected a number of at least 0"),
    (["--weight-decay", "-0.1"], "--weight-decay -0.1: expected a number of at least 0"),
])
def test_torch_adamw_options_out_of_range_are_one_line(family_data, tmp_path, extra, message):
    """torch's AdamW raised a ValueError traceback (and a malformed --adam-betas a SyntaxError one)."""
    proc = train(family_data["cls"], "sentence_classification", tmp_path / "ck", "--optimizer", "torch_adamw", *extra)
    assert_one_line_error(proc, tmp_path / "ck", message)


def test_a_negative_peak_tflops_is_one_line(family_data, tmp_path):
    """It trained and logged a negative mfu."""
    proc = train(family_data["cls"], "sentence_classification", tmp_path / "ck", "--peak-tflops=-5")
    assert_one_line_error(proc, tmp_path / "ck", "--peak-tflops -5.0: expected the device's peak TFLOP/s, a number "
                                                 "above 0 (0: the table of known GPUs)")


def test_an_unknown_compile_backend_is_one_line(family_data, tmp_path):
    """torch's InvalidBackend ended the run in a traceback."""
    proc = train(family_data["cls"], "sentence_classification", tmp_path / "ck", "--compile", "--compile-backend",
                 "inductr")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --compile-backend inductr: not a torch.compile backend; expected one of "), last
    assert "inductor" in last and not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def _copy_with(folder, tmp_path, name, text):
    import shutil

    copy = tmp_path / os.path.basename(folder)
    shutil.copytree(folder, copy)
    (copy / name).write_text(text, encoding="utf-8")
    return str(copy)


@pytest.mark.parametrize("folder, task", [("cls", "sentence_classification"), ("qa", "extractive_qa"),
                                          ("re", "relation_extraction"), ("coref", "coreference")])
@pytest.mark.parametrize("text, problem", [
    ("", "empty, no symbol; copy it again or prepare the folder again"),
    ("[PAD] 0\ngarbage\n", "unreadable ({path}:2: expected '<symbol> <count>', got 'garbage'); copy it again or "
                           "prepare the folder again"),
])
def test_a_damaged_dict_txt_of_a_finetuning_folder_is_one_line(family_data, tmp_path, folder, task, text, problem):
    """A bad line was a ValueError traceback; an empty dict.txt a TypeError in the first batch (no padding symbol)."""
    data = _copy_with(family_data[folder], tmp_path, "dict.txt", text)
    path = os.path.join(data, "dict.txt")
    proc = train(data, task, tmp_path / "ck")
    assert_one_line_error(proc, tmp_path / "ck", f"{path}: " + problem.format(path=path))


def test_a_labels_file_of_another_length_is_one_line(family_data, tmp_path):
    """A labels array shorter than the split was a ValueError traceback."""
    import shutil

    import numpy as np

    data = tmp_path / "cls"
    shutil.copytree(family_data["cls"], data)
    labels = np.load(data / "train.labels.npy")
    np.save(data / "train.labels.npy", labels[:5])
    proc = train(str(data), "sentence_classification", tmp_path / "ck")
    assert_one_line_error(proc, tmp_path / "ck", f"{data}/train.labels.npy: damaged or truncated (5 entries for the "
                                                 f"{len(labels)} examples of train.idx); copy it again or prepare the "
                                                 "folder again")


def test_resuming_a_save_dir_of_other_labels_is_one_line(family_data, tmp_path):
    """The run in --save-dir went on (its epoch, updates, optimizer state and best score) with a fresh head for the
    other data's labels, after one warning, and overwrote that run's checkpoints."""
    import json
    import shutil

    save_dir = tmp_path / "ck"
    assert train(family_data["cls"], "sentence_classification", save_dir).returncode == 0
    other = tmp_path / "other"
    shutil.copytree(family_data["cls"], other)
    meta = json.loads((other / "classification.json").read_text(encoding="utf-8"))
    saved_labels = meta["labels"]
    meta["labels"] = [f"other_{label}" for label in saved_labels]
    (other / "classification.json").write_text(json.dumps(meta), encoding="utf-8")
    before = {p.name: p.stat().st_mtime_ns for p in save_dir.iterdir()}
    proc = train(str(other), "sentence_classification", save_dir, "--max-update", "2")
    last = save_dir / "checkpoint_last.pt"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {last}: the run in this --save-dir trained a classification head for {saved_labels}, this data's "
        f"labels are {meta['labels']}: it is another data set's run; train in a new --save-dir (with "
        f"--finetune-from-model {last} to start from its weights)")
    assert {p.name: p.stat().st_mtime_ns for p in save_dir.iterdir()} == before
    # the same run named by --restore-file, or resumed with its optimizer alone reset, goes on as well: refused too
    for options in (["--restore-file", str(last)], ["--reset-optimizer"]):
        proc = train(str(other), "sentence_classification", save_dir, "--max-update", "2", *options)
        assert proc.returncode == 1 and "it is another data set's run" in proc.stderr.strip().splitlines()[-1]
    assert {p.name: p.stat().st_mtime_ns for p in save_dir.iterdir()} == before
    # the same labels resume as before
    assert train(family_data["cls"], "sentence_classification", save_dir, "--max-update", "2").returncode == 0


@pytest.mark.parametrize("folder, task, flag", [("cls", "sentence_classification", "--classification-head-name"),
                                                ("re", "relation_extraction", "--relation-head-name")])
@pytest.mark.parametrize("name", ["", "my.head"])
def test_a_head_name_torch_refuses_is_one_line(family_data, tmp_path, folder, task, flag, name):
    """torch's ModuleDict refused it with a KeyError traceback."""
    proc = train(family_data[folder], task, tmp_path / "ck", f"{flag}={name}")
    assert_one_line_error(proc, tmp_path / "ck", f"{flag} {name!r}: expected a head name, not empty and without '.'")


def test_a_find_animals_head_name_torch_refuses_is_one_line():
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import spanbert_plugin.registry  # noqa: F401  (registers the plugin's tasks)
    from spanbert_plugin.core.errors import UsageError

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "--task", "find_animals", "--criterion", "sentence_prediction", "--arch", "spanbert_tiny", "--cpu",
        "--train-size", "64", "--test-size", "8", "--classification-head-name", "my.head"])
    cfg = convert_namespace_to_omegaconf(args)
    with pytest.raises(UsageError, match=r"--classification-head-name 'my.head': expected a head name"):
        tasks.setup_task(cfg.task).build_model(cfg.model)


@pytest.mark.parametrize("argv, warning", [
    (["--task", "sentence_classification", "--criterion", "sentence_classification", "--ad-drop-q", "0.3",
      "--span-drop-gamma", "1", "--span-drop-unit", "word"],
     ["--span-drop-gamma 1.0, --span-drop-unit word: no effect, since SpanDrop is off (--span-drop-p 0)",
      "--ad-drop-q 0.3: no effect, since AD-DROP is off (--ad-drop-p 0)"]),
    (["--task", "extractive_qa", "--criterion", "extractive_qa", "--span-drop-p", "0.1", "--span-drop-chunk-size", "4"],
     ["--span-drop-chunk-size 4: no effect, since --span-drop-unit is token, not chunk"]),
    (["--task", "extractive_qa", "--criterion", "extractive_qa", "--span-drop-p", "0.1", "--span-drop-chunk-size", "4",
      "--span-drop-unit", "chunk"], []),
    (["--task", "spanbert_pretraining", "--criterion", "span_bert", "--mask-scheme", "subword", "--geometric-p", "0.5"],
     ["--geometric-p 0.5: no effect, since --mask-scheme subword draws no span lengths"]),
    (["--task", "coreference", "--criterion", "coreference", "--span-drop-gamma", "1"],
     ["--span-drop-gamma 1.0: no effect, since SpanDrop is off (--span-drop-p 0)"]),
    (["--task", "spanbert_pretraining", "--criterion", "span_bert"], []),
    (["--task", "sentence_classification", "--criterion", "sentence_classification", "--compile-backend", "aot_eager"],
     ["--compile-backend aot_eager: no effect, since --compile is off"]),
    (["--task", "sentence_classification", "--criterion", "sentence_classification", "--compile-backend", "aot_eager",
      "--compile"], []),
])
def test_options_that_do_nothing_as_set_are_warned_about(argv, warning, caplog):
    """A secondary option of a feature left off (or of another span unit or masking scheme) was ignored in silence,
    which reads as applied."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import spanbert_plugin.registry  # noqa: F401  (registers the plugin's tasks and their checks)
    from spanbert_plugin.core.tasks import warn_options_without_effect

    args = options.parse_args_and_arch(options.get_training_parser(), ["data", *argv, "--arch", "spanbert_tiny", "--cpu"])
    with caplog.at_level("WARNING"):
        warn_options_without_effect(convert_namespace_to_omegaconf(args).task)
    assert sorted(r.getMessage() for r in caplog.records if r.name == "spanbert_plugin.core.tasks") == sorted(warning)


def test_fairseq_train_warns_about_options_that_do_nothing_once(family_data, tmp_path):
    proc = train(family_data["cls"], "sentence_classification", tmp_path / "ck", "--ad-drop-q", "0.3", "--max-epoch", "2",
                 "--max-update", "1000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("--ad-drop-q 0.3: no effect, since AD-DROP is off (--ad-drop-p 0)") == 1


def test_a_head_name_the_starting_checkpoint_lacks_is_warned_about(tmp_path, caplog):
    """--classification-head-name foo from a classifier whose head has the default name started foo fresh in
    silence (the checkpoint's head carried along untrained-on)."""
    import torch

    from spanbert_plugin.core.checkpoint_loading import match_saved_head_labels

    path = str(tmp_path / "classifier.pt")
    torch.save({"model": {"classification_heads.sentence_classification_head.out_proj.weight": torch.zeros(2, 4)},
                "task_state": {"labels": ["negative", "positive"]}}, path)
    with caplog.at_level("WARNING"):
        match_saved_head_labels(None, path, "classification_heads", "foo", ["negative", "positive"])
    assert caplog.messages == [f"{path}: its classification head is named sentence_classification_head, not foo: foo "
                               "starts from fresh weights (--classification-head-name sentence_classification_head "
                               "continues the checkpoint's)"]
    caplog.clear()
    with caplog.at_level("WARNING"):  # the checkpoint's own head name: nothing to say
        match_saved_head_labels(None, path, "classification_heads", "sentence_classification_head",
                                ["negative", "positive"])
    # another data set's head under another name (an MNLI classifier fine-tuned on RTE as "rte"): it could not go
    # on under its own name either, so nothing is suggested
    with caplog.at_level("WARNING"):
        match_saved_head_labels(None, path, "classification_heads", "rte", ["entailment", "not_entailment"])
        match_saved_head_labels(None, path, "classification_heads", "three", ["a", "b", "c"])
    assert caplog.messages == []


@pytest.mark.parametrize("folder, task, data_file", [
    ("cls", "sentence_classification", "valid.bin"), ("qa", "extractive_qa", "valid.bin"),
    ("re", "relation_extraction", "valid.bin"), ("coref", "coreference", "valid.npz")])  # fairseq loads valid first
def test_a_dict_txt_shorter_than_the_data_ids_is_one_line(family_data, tmp_path, folder, task, data_file):
    """A dict.txt of another folder (shorter than the ids the data holds) was an IndexError traceback from the
    embedding lookup mid-step (on a GPU, a device-side assert)."""
    with open(os.path.join(family_data[folder], "dict.txt"), encoding="utf-8") as f:
        lines = f.readlines()
    # the first third and the control symbols ([CLS], [SEP], ... wherever the vocabulary has them)
    shorter = [line for n, line in enumerate(lines) if n < len(lines) // 3 or line.startswith("[")]
    kept = len(shorter)
    data = _copy_with(family_data[folder], tmp_path, "dict.txt", "".join(shorter))
    proc = train(data, task, tmp_path / "ck")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {os.path.join(data, data_file)}: token id ") and (
        f"beyond the {kept} symbols of {os.path.join(data, 'dict.txt')}: that dict.txt is not the one the folder was "
        "prepared with") in last, last
    assert not (tmp_path / "ck").exists() or not os.listdir(tmp_path / "ck")


@pytest.mark.parametrize("flag, message", [
    ("--restore-file", "--restore-file {path}: no such checkpoint (fairseq would start from fresh weights)"),
    ("--finetune-from-model", "--finetune-from-model {path}: no such checkpoint"),
    ("--continue-once", "--continue-once {path}: no such checkpoint (fairseq would start from fresh weights)"),
])
def test_a_named_checkpoint_that_is_missing_is_one_line(family_data, tmp_path, flag, message):
    """fairseq trained a missing --restore-file or --continue-once (a typo) from fresh weights after one log line,
    and stopped on a missing --finetune-from-model with a traceback."""
    path = str(tmp_path / "typo" / "checkpoint_best.pt")
    proc = train(family_data["cls"], "sentence_classification", tmp_path / "ck", flag, path)
    assert_one_line_error(proc, tmp_path / "ck", message.format(path=path))


def test_a_restore_file_naming_the_save_dirs_own_last_checkpoint_starts_fresh_on_a_first_launch(family_data, tmp_path):
    """Launch scripts pass --restore-file SAVE/checkpoint_last.pt on every launch: the first one starts fresh."""
    save_dir = tmp_path / "ck"
    proc = train(family_data["cls"], "sentence_classification", save_dir, "--restore-file",
                 str(save_dir / "checkpoint_last.pt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (save_dir / "checkpoint_last.pt").is_file()


def test_a_restore_file_with_reset_optimizer_starts_a_new_training(tmp_path):
    from spanbert_plugin.core.checkpoint_loading import starts_anew_from

    other = str(tmp_path / "other_run" / "checkpoint_last.pt")
    cfg = {"save_dir": str(tmp_path / "ck"), "restore_file": other, "finetune_from_model": None,
           "reset_optimizer": True, "reset_dataloader": False}
    assert starts_anew_from(cfg, other)
    assert not starts_anew_from({**cfg, "reset_optimizer": False}, other)  # a resume of that run's state
    finetune = str(tmp_path / "pretrained.pt")
    assert starts_anew_from({"save_dir": str(tmp_path / "ck"), "finetune_from_model": finetune}, finetune)


def test_the_largest_token_id_a_dictionary_holds_is_one_less_than_its_size(tmp_path):
    from spanbert_plugin.core.datasets import refuse_token_ids_beyond
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.errors import UsageError

    dictionary = SpanBertDictionary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
    path = str(tmp_path / "valid.bin")
    refuse_token_ids_beyond(path, 5, dictionary)  # the last symbol's id
    with pytest.raises(UsageError, match=r"valid.bin: token id 6, beyond the 6 symbols of .*dict.txt"):
        refuse_token_ids_beyond(path, 6, dictionary)


def test_the_save_dirs_own_last_checkpoint_is_a_resume_even_with_reset_optimizer(tmp_path):
    """Only both resets start afresh in the run's own --save-dir: with --reset-optimizer alone fairseq goes on with
    its epoch, updates and best score there, so the run is no new training."""
    from spanbert_plugin.core.checkpoint_loading import starts_anew_from

    last = str(tmp_path / "ck" / "checkpoint_last.pt")
    cfg = {"save_dir": str(tmp_path / "ck"), "restore_file": None, "finetune_from_model": None,
           "reset_optimizer": True, "reset_dataloader": False}
    assert not starts_anew_from(cfg, last)
    assert starts_anew_from({**cfg, "reset_dataloader": True}, last)


def test_a_missing_finetune_model_is_refused_only_where_fairseq_would_load_it(tmp_path):
    """fairseq loads --finetune-from-model only on a first launch (no checkpoint_last.pt in --save-dir) without
    --continue-once: a pretrained file removed after the first launch, or one --continue-once stands in for, is no
    error; on a first launch it is."""
    from spanbert_plugin.core.checkpoint_loading import refuse_a_named_checkpoint_that_is_missing
    from spanbert_plugin.core.errors import UsageError

    missing = str(tmp_path / "removed_pretrained.pt")
    cfg = {"save_dir": str(tmp_path / "ck"), "restore_file": "checkpoint_last.pt", "finetune_from_model": missing}
    with pytest.raises(UsageError, match=f"--finetune-from-model {missing}: no such checkpoint"):
        refuse_a_named_checkpoint_that_is_missing(cfg)
    (tmp_path / "other_run.pt").write_bytes(b"x")
    refuse_a_named_checkpoint_that_is_missing({**cfg, "continue_once": str(tmp_path / "other_run.pt")})
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "checkpoint_last.pt").write_bytes(b"x")  # a relaunch: fairseq resumes checkpoint_last.pt
    refuse_a_named_checkpoint_that_is_missing(cfg)


def test_a_first_launch_starts_from_continue_once_before_the_pretrained_model(tmp_path):
    """fairseq's first launch loads --continue-once (another run's checkpoint, its optimizer state included) in the
    place of --finetune-from-model, and checkpoint_last.pt once the run has one: the plugin takes the shape, labels
    and heads from the file fairseq loads, and a continued run is no new training."""
    from spanbert_plugin.core.checkpoint_loading import (refuse_a_named_checkpoint_that_is_missing, starting_checkpoint,
                                                         starts_anew_from)

    pretrained, other = tmp_path / "pretrained.pt", tmp_path / "other_run_last.pt"
    pretrained.write_bytes(b"x")
    other.write_bytes(b"x")
    cfg = {"save_dir": str(tmp_path / "ck"), "restore_file": "checkpoint_last.pt", "finetune_from_model": str(pretrained),
           "continue_once": str(other)}
    assert starting_checkpoint(cfg) == str(other) and not starts_anew_from(cfg, str(other))
    assert starting_checkpoint({**cfg, "finetune_from_model": None}) == str(other)
    assert starting_checkpoint({**cfg, "continue_once": None}) == str(pretrained)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "checkpoint_last.pt").write_bytes(b"x")  # a relaunch resumes the run's own checkpoint
    assert starting_checkpoint(cfg) == str(tmp_path / "ck" / "checkpoint_last.pt")
    refuse_a_named_checkpoint_that_is_missing({**cfg, "continue_once": str(tmp_path / "removed.pt")})


def _fine_tuning_task_config(data, task):
    import spanbert_plugin.registry  # noqa: F401  (the plugin's tasks, as --user-dir registers them)
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [data, "--task", task, "--arch", "spanbert_tiny",
                                                                        "--cpu"])
    return convert_namespace_to_omegaconf(args).task


@pytest.mark.parametrize("task, command, first_file", [
    ("sentence_classification", "spanbert-prepare-classification", "dict.txt"),
    ("extractive_qa", "spanbert-prepare-qa", "qa_config.json"),
    ("relation_extraction", "spanbert-prepare-re", "dict.txt"),
    ("coreference", "spanbert-prepare-coref", "dict.txt"),
])
def test_a_fine_tuning_task_on_a_folder_its_command_did_not_write_is_one_line(tmp_path, task, command, first_file):
    from fairseq import tasks

    from spanbert_plugin.core.errors import UsageError

    with pytest.raises(UsageError) as raised:
        tasks.setup_task(_fine_tuning_task_config(str(tmp_path), task))
    assert str(raised.value) == f"{tmp_path / first_file}: no such file; {tmp_path} is not a {command} folder"
    cfg = _fine_tuning_task_config(str(tmp_path), task)
    cfg.data = ""  # fairseq-hydra-train without task.data
    with pytest.raises(UsageError) as raised:
        tasks.setup_task(cfg)
    assert str(raised.value) == f"{task} needs a data folder ({command} --destdir)"


def test_compile_with_a_model_that_has_no_compiled_path_is_one_line():
    """--compile with another architecture (fairseq's roberta, say): the plugin compiles only spanbert's layers."""
    import torch

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.tasks import compile_for_training

    with pytest.raises(UsageError) as raised:
        compile_for_training(torch.nn.Linear(2, 2), None, None)
    assert str(raised.value) == "--compile: Linear has no compiled training path; use a spanbert architecture"


def test_a_validation_example_longer_than_max_tokens_valid_is_refused_before_training(family_data, tmp_path):
    """fairseq-train batched the validation split only at its first validation: the run trained an epoch, then
    failed naming --max-tokens (the option --max-tokens-valid defaults to), not the one that was too small."""
    proc = train(family_data["cls"], "sentence_classification", tmp_path / "ck", "--max-tokens", "64",
                 "--max-tokens-valid", "10")
    last = proc.stderr.splitlines()[-1] if proc.stderr else ""
    longest = re.fullmatch(r"error: --max-tokens-valid 10: an example of the 'valid' split is longer \((\d+) tokens\), "
                           r"and a batch holds whole examples; give --max-tokens-valid at least that \(it defaults to "
                           r"--max-tokens\)", last)
    assert longest and 10 < int(longest[1]) <= 64, proc.stderr[-3000:]
    assert_one_line_error(proc, tmp_path / "ck", last[len("error: "):])
    assert "begin training epoch" not in proc.stderr  # refused before the first update
