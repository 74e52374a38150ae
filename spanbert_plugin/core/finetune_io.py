"""Shared input/output of the fine-tuning commands (QA, relation extraction, classification).

A fine-tuning data folder starts from a tokenizer folder (``--tokenizer-from``:
a ``spanbert-prepare`` or ``spanbert-import-hf`` output), whose ``dict.txt``
and tokenizer files are copied unchanged, so token ids stay the checkpoint's.
The predict commands load a fine-tuned checkpoint (``load_finetuned_checkpoint``)
and run it over a split in validation batches (``predict_split_outputs``).
"""
import os
import shutil
from typing import Callable, Optional, Tuple, Union

from .errors import UsageError
from .file_utils import read_json
from .tokenization import META_FILE, SPM_FILE, WORDPIECE_FILE, SpanTokenizer, TokenizerError, load_tokenizer

TOKENIZER_FILES = ("dict.txt", META_FILE, SPM_FILE, WORDPIECE_FILE)
# {metadata file: (the command that writes it, the task that trains on the folder)} of every fine-tuning data
# folder; each feature registers its own. Such a folder copies the tokenizer files of a pre-training folder too.
FINETUNING_FOLDERS = {}


def register_finetuning_folder(metadata_file: str, command: str, task: str) -> str:
    FINETUNING_FOLDERS[metadata_file] = (command, task)
    return metadata_file


def load_tokenizer_folder(folder: str, flag: str = "--tokenizer-from"):
    """(tokenizer, dictionary) of a tokenizer folder; TokenizerError names what is missing."""
    if not os.path.isdir(folder):
        raise TokenizerError(f"{flag} {folder}: no such folder")
    dict_path = os.path.join(folder, "dict.txt")
    if not os.path.isfile(dict_path):
        raise TokenizerError(f"{flag} {folder}: no dict.txt (expected a spanbert-prepare or spanbert-import-hf output)")
    if not os.path.isfile(os.path.join(folder, META_FILE)):
        raise TokenizerError(f"{flag} {folder}: no {META_FILE} (expected a spanbert-prepare or spanbert-import-hf output)")
    tokenizer = load_tokenizer(folder)
    from .dictionary import SpanBertDictionary  # imports fairseq and torch: only when a folder is read

    try:
        dictionary = SpanBertDictionary.load(dict_path)
    except ValueError as err:
        raise TokenizerError(str(err)) from None
    if dictionary.symbols[: len(tokenizer.vocab)] != list(tokenizer.vocab):
        raise TokenizerError(f"{dict_path}: does not list the tokenizer's vocabulary in id order")
    return tokenizer, dictionary


def warn_if_vocabulary_does_not_fit(tokenizer: SpanTokenizer, inputs) -> None:
    """One warning line per way the tokenizer's vocabulary does not fit the text it has encoded from ``inputs``
    (a case-keeping tokenizer over an uncased vocabulary meeting upper-case text; more than 1% [UNK])."""
    import logging

    for line in tokenizer.fit.warnings(tokenizer, ", ".join(str(path) for path in inputs)):
        logging.getLogger("spanbert_plugin.prepare").warning(line)


def copy_tokenizer_files(src: str, dst: str) -> None:
    """Copy dict.txt and the tokenizer files of ``src`` into ``dst``."""
    for name in TOKENIZER_FILES:
        path = os.path.join(src, name)
        if os.path.isfile(path):
            shutil.copyfile(path, os.path.join(dst, name))


def write_json(path: str, value) -> None:
    """Write a metadata or statistics file of a prepared folder (UTF-8, indented)."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)


def read_prepared_json(folder: str, name: str, command: str) -> dict:
    """``name`` of a folder written by ``command``; UsageError when the folder is not such an output."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file; {folder} is not a {command} folder")
    return read_json(path)


def write_token_items(items, prefix: str, vocab_size: int) -> None:
    """Write sequences of token ids as one fairseq mmap item each (``prefix``.bin/.idx)."""
    import numpy as np
    import torch
    from fairseq.data import indexed_dataset

    dtype = indexed_dataset.best_fitting_int_dtype(vocab_size)
    builder = indexed_dataset.MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for ids in items:
        builder.add_item(torch.from_numpy(np.asarray(ids, dtype=np.int64)))
    builder.finalize(prefix + ".idx")


def load_finetuned_checkpoint(checkpoint: str, task_name: str, data: Optional[str] = None, cpu: bool = False,
                              check_data: Optional[Callable[[str, str], None]] = None):
    """(model, task, cfg) of a checkpoint fine-tuned with ``task_name``; ``data`` replaces its prepared folder.

    ``check_data(data, trained_on)`` may refuse a replacement folder before the model is built.
    """
    import torch
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import overwrite_args_by_name

    from .user_dir import USER_DIR, register_plugin

    if not os.path.isfile(checkpoint):
        raise UsageError(f"--checkpoint {checkpoint}: no such file")
    register_plugin()
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint, {"user_dir": USER_DIR})
    found = state["cfg"].task.get("_name")
    if found != task_name:
        raise UsageError(f"--checkpoint {checkpoint}: not a {task_name} checkpoint (its task is {found})")
    if data:
        if check_data is not None:
            check_data(data, state["cfg"].task.get("data"))
        overwrite_args_by_name(state["cfg"], {"data": os.path.abspath(data)})
    else:
        refuse_a_recorded_data_folder_that_is_gone(checkpoint, state["cfg"].task.get("data"))
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], state=state)
    model = models[0].eval()
    if torch.cuda.is_available() and not cpu:
        model = model.cuda()
    return model, task, cfg


def refuse_a_recorded_data_folder_that_is_gone(checkpoint: str, recorded: Optional[str]) -> None:
    """UsageError when the prepared folder a checkpoint was trained on (its ``task.data``) no longer exists: the task
    would call it "not a prepared folder", though the fix is to name another with --data."""
    for folder in (recorded or "").split(os.pathsep):
        places = [folder] if os.path.isabs(folder) else [folder, os.path.join(os.path.dirname(checkpoint), folder)]
        if folder and not any(os.path.isdir(place) for place in places):
            raise UsageError(f"--checkpoint {checkpoint}: the data folder it was trained on, {folder}, no longer "
                             "exists; pass --data FOLDER (that folder's copy, or another prepared the same way)")


def predict_split_outputs(model, task, cfg, split: str, outputs_of: Callable, shape: Union[Tuple[int, ...], Callable],
                          dtype="float32", fill=float("nan"), batch_size=None, max_tokens=None):
    """``outputs_of(sample)`` (B x ``shape``, the last axis possibly shorter) of every example of ``split``, by index.

    ``shape`` may be a function of the loaded dataset (e.g. its longest item).
    Batches are built as at validation (the checkpoint's validation batch size and
    token limit unless given), training-only SpanDrop is off, and a split with an
    example left out is an error. The last axis is filled with ``fill`` past a batch's width.
    """
    import numpy as np
    import torch
    from fairseq import utils

    from .progress import progress_bar

    task.load_dataset(split, training=False)  # no SpanDrop, whatever the split is called
    dataset = task.dataset(split)
    iterator = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=max_tokens if max_tokens is not None else cfg.dataset.max_tokens_valid,
        max_sentences=batch_size if batch_size is not None else cfg.dataset.batch_size_valid,
        max_positions=model.max_positions(),
        ignore_invalid_inputs=False,
        required_batch_size_multiple=1,
        seed=cfg.common.seed,
    ).next_epoch_itr(shuffle=False)
    shape = shape(dataset) if callable(shape) else shape
    outputs = np.full((len(dataset), *shape), fill, dtype=dtype)
    seen = np.zeros(len(dataset), dtype=bool)
    device = next(model.parameters()).device
    with torch.no_grad():
        for sample in progress_bar(iterator, desc=f"predict {split}", unit="batch"):
            sample = utils.apply_to_sample(lambda t: t.to(device), sample)
            values = outputs_of(sample).float().cpu().numpy()
            ids = sample["id"].cpu().numpy()
            outputs[ids, ..., : values.shape[-1]] = values
            seen[ids] = True
    if not seen.all():
        raise RuntimeError(f"split {split!r}: {int((~seen).sum())} of {len(dataset)} examples were not evaluated")
    return outputs
