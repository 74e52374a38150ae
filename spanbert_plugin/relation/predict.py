"""Predict the relation of every example of a prepared split with a fine-tuned checkpoint.

Batches are built as at validation (the checkpoint's validation batch size
unless overridden; every example evaluated), so the scores written here equal
the ones fairseq-train logged for the same checkpoint and split.
"""
import json
import os
from typing import Optional

import numpy as np
import torch

from ..core.errors import UsageError
from .metrics import relation_counts, relation_scores
from ..core.file_utils import atomic_directory, check_destination, checkpoint_inputs
from ..core.finetune_io import load_finetuned_checkpoint, predict_split_outputs
from .prepare import load_re_meta, load_split_arrays
from .task import TRAINED_ON

COMMAND = "spanbert-predict-re"
TASK = "relation_extraction"


def load_re_checkpoint(checkpoint: str, data: Optional[str] = None, cpu: bool = False):
    """(model, task, cfg) of a relation_extraction checkpoint; ``data`` overrides the prepared folder."""
    model, task, cfg = load_finetuned_checkpoint(checkpoint, TASK, data, cpu, check_data=_check_same_labels)
    for key in TRAINED_ON:  # the data's, replaced on loading by the checkpoint's where it saved them
        trained = getattr(task.state, key, None)
        if trained is not None and trained != task.meta[key]:
            raise UsageError(f"--data {cfg.task.data}: its {key} differ from those the checkpoint was trained with")
    return model, task, cfg


def _check_same_labels(data: str, trained_on: Optional[str]) -> None:
    """A folder prepared differently from the training one would give wrong labels: refuse it."""
    meta = load_re_meta(data)
    if not trained_on or not os.path.isfile(os.path.join(trained_on, "re_meta.json")):
        return  # the training folder is gone; the label count is still checked against the head
    trained = load_re_meta(trained_on)
    for key in TRAINED_ON:
        if meta[key] != trained[key]:
            raise UsageError(f"--data {data}: its {key} differ from those of {trained_on}, which the checkpoint was trained on")


def predict_probabilities(model, task, cfg, split: str, batch_size=None, max_tokens=None) -> np.ndarray:
    """N x labels probabilities of every example of ``split``, in input order."""
    from .criterion import relation_logits

    head = model.relation_heads[task.cfg.relation_head_name]
    if head.out_proj.out_features != len(task.labels):
        raise UsageError(f"{task.cfg.data}: {len(task.labels)} labels, but the checkpoint's head has {head.out_proj.out_features}")

    def outputs_of(sample):
        return torch.softmax(relation_logits(model, sample, task.cfg.relation_head_name).float(), dim=-1)

    return predict_split_outputs(model, task, cfg, split, outputs_of, (len(task.labels),),
                                 batch_size=batch_size, max_tokens=max_tokens)


def predict_split(checkpoint, data, split, out, force=False, batch_size=None, max_tokens=None, cpu=False) -> dict:
    """Write ``predictions.jsonl`` (id, label, prob per example, input order) and ``eval.json`` to ``out``."""
    inputs = checkpoint_inputs(checkpoint, data)  # the data folder the checkpoint names counts too
    check_destination(out, COMMAND, inputs, force, "--out")
    model, task, cfg = load_re_checkpoint(checkpoint, data, cpu)
    gold, _, examples = load_split_arrays(task.cfg.data, split)
    probs = predict_probabilities(model, task, cfg, split, batch_size, max_tokens)
    predicted = probs.argmax(axis=1)
    counts = relation_counts(predicted, gold, task.negative_index)
    scores = {**relation_scores(counts), "counts": {key[len("re_"):]: value for key, value in counts.items()},
              "negative_label": task.labels[task.negative_index], "split": split}
    with atomic_directory(out, COMMAND, inputs, force, "--out") as work:
        with open(os.path.join(work, "predictions.jsonl"), "w", encoding="utf-8") as f:
            for example, label, prob in zip(examples, predicted, probs[np.arange(len(predicted)), predicted]):
                f.write(json.dumps({"id": example["id"], "label": task.labels[label], "prob": float(prob)},
                                   ensure_ascii=False) + "\n")
        with open(os.path.join(work, "eval.json"), "w", encoding="utf-8") as f:
            json.dump(scores, f, indent=2)
    return scores
