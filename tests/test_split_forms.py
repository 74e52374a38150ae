"""Which form of a split a fine-tuning task reads. fairseq's training load gets the training form (shuffled, SpanDrop,
QA windows not grouped by question, coreference's training window) whatever the split is called; every other load
inside a run (fairseq-train's validation, the training split too with --valid-subset train; fairseq-validate;
prediction) gets the evaluation form, whatever the split is called."""
import glob
import inspect
import os
import re
import shutil

import pytest
from omegaconf import OmegaConf

from conftest import bin_path, run_cli
from test_finetune_span_drop import SMALL, folders  # noqa: F401 - the fixture
from spanbert_plugin.classification.task import SentenceClassificationConfig, SentenceClassificationTask
from spanbert_plugin.qa.dataset import ExtractiveQADataset
from spanbert_plugin.qa.task import ExtractiveQAConfig, ExtractiveQATask
from spanbert_plugin.relation.task import RelationExtractionConfig, RelationExtractionTask

TASKS = {"qa": (ExtractiveQATask, ExtractiveQAConfig), "re": (RelationExtractionTask, RelationExtractionConfig),
         "cls": (SentenceClassificationTask, SentenceClassificationConfig)}
TRAINING_LOAD = {"epoch": 1, "combine": True, "data_selector": None, "tpu": False}  # what fairseq's Trainer passes


def test_fairseq_marks_its_training_load_and_iterator_alone():
    """The plugin tells fairseq's training load and iterator from the others by keywords only they pass: this fails
    when fairseq's code under it changes."""
    import fairseq_cli.hydra_validate
    import fairseq_cli.train
    import fairseq_cli.validate
    from fairseq.trainer import Trainer

    train = inspect.getsource(Trainer.get_train_iterator)
    assert "data_selector=data_selector" in train and "update_epoch_batch_itr=" in train
    valid = inspect.getsource(Trainer.get_valid_iterator)
    assert "data_selector" not in valid and "update_epoch_batch_itr" not in valid
    for module in (fairseq_cli.train, fairseq_cli.validate, fairseq_cli.hydra_validate):
        loads = re.findall(r"load_dataset\(([^)]*)\)", inspect.getsource(module))
        assert loads and not any("data_selector" in arguments for arguments in loads)


def with_copies(folder, destination, names):
    """A copy of a prepared folder whose training split is also there under each of ``names``."""
    shutil.copytree(folder, destination)
    for path in glob.glob(os.path.join(destination, "train.*")):
        for name in names:
            shutil.copyfile(path, os.path.join(destination, name + os.path.basename(path)[len("train"):]))
    return str(destination)


def task_in_a_run(kind, data, **options):
    """A task built from a run's config, as fairseq-train builds it (validating on the training split too)."""
    task_cls, cfg_cls = TASKS[kind]
    run = OmegaConf.create({"dataset": {"train_subset": "train", "valid_subset": "valid,train"}})
    run.task = OmegaConf.structured(cfg_cls(data=data, seed=7, **options))
    return task_cls.setup_task(run.task)


def tokens_read(task, dataset, **iterator_options):
    """The non-padding tokens of every batch of an iterator over ``dataset``, as fairseq builds one."""
    iterator = task.get_batch_iterator(dataset=dataset, max_sentences=8, max_positions=512, seed=1, epoch=1,
                                       **iterator_options).next_epoch_itr(shuffle=False)
    total = 0
    for sample in iterator:
        source = sample["net_input"]["src_tokens"]
        total += int(source.ne(task.dictionary.pad()).sum())
    return total


@pytest.mark.parametrize("kind, name", [("qa", "qa"), ("re", "typed_marker"), ("cls", "cls")])
def test_only_fairseqs_training_load_reads_the_training_form(folders, tmp_path, kind, name):  # noqa: F811
    data = with_copies(folders[name], tmp_path / "data", ["train_copy"])
    task = task_in_a_run(kind, data, span_drop_p=0.5)
    plain = task_in_a_run(kind, data, span_drop_p=0.0)
    for split in ("train", "train_copy"):
        plain.load_dataset(split, epoch=1, combine=False)
    whole = tokens_read(plain, plain.dataset("train"))

    task.load_dataset("train", epoch=1, combine=False)  # fairseq-train's validation load (--valid-subset train)
    evaluation = task.dataset("train")
    task.load_dataset("train", **TRAINING_LOAD)  # then its Trainer's
    training = task.dataset("train")
    assert training is not evaluation
    # the training iterator (fairseq's passes update_epoch_batch_itr) drops spans; validation's reads every token
    assert tokens_read(task, training, update_epoch_batch_itr=False) < 0.9 * whole
    assert tokens_read(task, task.dataset("train")) == whole
    # a split whose name starts with "train" is evaluated as it is
    task.load_dataset("train_copy", epoch=1, combine=False)
    assert tokens_read(task, task.dataset("train_copy")) == tokens_read(plain, plain.dataset("train_copy")) == whole
    if kind == "qa":  # evaluation batches hold whole questions; training shuffles windows
        assert isinstance(evaluation, ExtractiveQADataset) and evaluation.group_questions
        assert not training.dataset.group_questions
    # the training form, whatever the training subset is called (--train-subset train_copy)
    task.load_dataset("train_copy", **TRAINING_LOAD)
    assert tokens_read(task, task.dataset("train_copy"), update_epoch_batch_itr=False) < 0.9 * whole


def test_a_task_built_outside_a_run_reads_train_as_training(folders):  # noqa: F811
    task_cls, cfg_cls = TASKS["re"]
    task = task_cls.setup_task(cfg_cls(data=folders["typed_marker"], seed=7, span_drop_p=0.5))
    plain = task_cls.setup_task(cfg_cls(data=folders["typed_marker"], seed=7, span_drop_p=0.0))
    task.load_dataset("train")
    plain.load_dataset("train")
    assert tokens_read(task, task.dataset("train")) < 0.9 * tokens_read(plain, plain.dataset("train"))


def validations(output):
    """{subset: (loss, tokens per batch)} from fairseq's simple log lines ("valid on 'train' subset | loss 1.234 | ...
    | wpb 421.4 | ..."): an untrained model's loss barely depends on the tokens, their number does."""
    return {subset: (float(loss), float(wpb)) for subset, loss, wpb in
            re.findall(r"valid on '([^']+)' subset \| loss ([0-9.]+) \|.* wpb ([0-9.]+) \|", output)}


def test_validation_on_the_training_split_reads_it_without_span_drop(folders, tmp_path):  # noqa: F811
    """fairseq-train --valid-subset valid,train and fairseq-validate --valid-subset train score the training split as
    they score an exact copy of it under another name, with SpanDrop at p = 0.9 in training."""
    data = with_copies(folders["typed_marker"], tmp_path / "data", ["heldcopy", "train_copy"])
    save = tmp_path / "checkpoints"
    options = [arg for arg in SMALL if arg != "--no-save"]
    options[options.index("json")] = "simple"
    proc = run_cli([bin_path("fairseq-train"), data, *options, "--task", "relation_extraction", "--criterion",
                    "relation_extraction", "--max-positions", "128", "--lr", "1e-3", "--batch-size", "16",
                    "--max-update", "4", "--span-drop-p", "0.9", "--valid-subset", "valid,train,heldcopy,train_copy",
                    "--save-dir", save, "--no-epoch-checkpoints"])
    trained = validations(proc.stdout + proc.stderr)
    assert set(trained) == {"valid", "train", "heldcopy", "train_copy"}, (proc.stdout + proc.stderr)[-3000:]
    assert trained["train"] == trained["heldcopy"] == trained["train_copy"]
    proc = run_cli([bin_path("fairseq-validate"), data, "--user-dir", "user_dir", "--path", save / "checkpoint_last.pt",
                    "--task", "relation_extraction", "--valid-subset", "train,heldcopy,train_copy", "--cpu",
                    "--batch-size", "16", "--log-format", "simple"])
    validated = validations(proc.stdout + proc.stderr)
    assert validated["train"] == validated["heldcopy"] == validated["train_copy"]
    assert validated["heldcopy"][0] == trained["heldcopy"][0]  # fairseq-validate's wpb is the whole split's
