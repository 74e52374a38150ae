"""Classify every example of a prepared split with a fine-tuned checkpoint; write predictions and metrics.

Batches are built as at validation (the checkpoint's validation batch size
unless overridden), and the metrics come from the same confusion-matrix and
correlation functions as the criterion's, so ``eval.json`` equals what
fairseq-train logged for the same checkpoint and split.
"""
import json
import os
from typing import Optional

import numpy as np
import torch

from ..core.errors import UsageError
from .metrics import classification_metrics, confusion_matrix, regression_metrics
from ..core.file_utils import atomic_directory, check_destination, checkpoint_inputs, read_json
from ..core.finetune_io import load_finetuned_checkpoint, predict_split_outputs

COMMAND = "spanbert-predict-classification"
TASK_NAME = "sentence_classification"


def load_classifier(checkpoint: str, data: Optional[str] = None, cpu: bool = False):
    """(model, task, cfg) of a sentence_classification checkpoint; ``data`` overrides the prepared folder."""
    model, task, cfg = load_finetuned_checkpoint(checkpoint, TASK_NAME, data, cpu, check_data=_check_same_labels)
    trained = task.state.labels  # the data's, replaced on loading by the checkpoint's when it saved them
    if trained != task.labels:
        raise UsageError(f"--data {cfg.task.data}: labels {task.labels} differ from the checkpoint's {trained}")
    return model, task, cfg


def _check_same_labels(data: str, trained_on: Optional[str]) -> None:
    """Refuse other labels before the model is built (building it would first resize the head, with a warning),
    when the training folder is still there; otherwise the labels saved in the checkpoint are compared after."""
    from .prepare import META_FILE, read_meta

    if not trained_on or not os.path.isfile(os.path.join(trained_on, META_FILE)):
        return
    labels, trained = read_meta(data)["labels"], read_meta(trained_on)["labels"]
    if labels != trained:
        raise UsageError(f"--data {os.path.abspath(data)}: labels {labels} differ from the checkpoint's {trained}")


def split_outputs(model, task, cfg, split: str, batch_size=None, max_tokens=None) -> np.ndarray:
    """Class probabilities (N x K) or regression values (N x 1) of every example, in input order."""
    from .criterion import classification_logits

    def outputs_of(sample):
        logits = classification_logits(model, sample, task.cfg.classification_head_name).float()
        return logits if task.regression else torch.softmax(logits, dim=-1)

    return predict_split_outputs(model, task, cfg, split, outputs_of, (task.num_classes,), dtype="float64",
                                 batch_size=batch_size, max_tokens=max_tokens)


def split_metrics(task, outputs: np.ndarray, gold: np.ndarray) -> dict:
    """The validation metrics of the whole split (percent), or only the count when it has no labels."""
    labelled = (gold >= 0).all() if not task.regression else np.isfinite(gold).all()
    result = {"examples": int(len(gold)), "labelled": bool(labelled)}
    if not labelled:
        return result
    if task.regression:
        return {**result, **regression_metrics(outputs[:, 0], gold)}
    confusion = confusion_matrix(gold, outputs.argmax(axis=1), task.num_classes)
    return {**result, **classification_metrics(confusion), "labels": task.labels, "confusion": confusion.tolist()}


def prediction_records(task, outputs: np.ndarray, gold: np.ndarray, ids):
    """One JSON-ready dict per example, in input order."""
    for i in range(len(outputs)):
        record = {"index": i}
        if ids is not None:
            record["id"] = ids[i]
        if task.regression:
            record["value"] = float(outputs[i, 0])
            if np.isfinite(gold[i]):
                record["gold"] = float(gold[i])
        else:
            record["label"] = task.labels[int(outputs[i].argmax())]
            if gold[i] >= 0:
                record["gold"] = task.labels[int(gold[i])]
            record["probabilities"] = {label: round(float(p), 6) for label, p in zip(task.labels, outputs[i])}
        yield record


def predict_split(checkpoint: str, data: Optional[str], split: str, out: str, force: bool = False,
                  batch_size=None, max_tokens=None, cpu: bool = False) -> dict:
    """Write ``predictions.jsonl``, ``predictions.tsv`` (index, prediction: a GLUE submission's rows) and
    ``eval.json`` for ``split`` into ``out``; return the metrics."""
    inputs = checkpoint_inputs(checkpoint, data)  # the data folder the checkpoint names counts too
    check_destination(out, COMMAND, inputs, force, "--out")
    model, task, cfg = load_classifier(checkpoint, data, cpu)
    outputs = split_outputs(model, task, cfg, split, batch_size, max_tokens)
    dataset = task.dataset(split)
    folder = cfg.task.data.split(os.pathsep)[0]
    ids_path = os.path.join(folder, f"{split}.ids.json")
    ids = read_json(ids_path) if os.path.isfile(ids_path) else None
    scores = {"split": split, **split_metrics(task, outputs, dataset.labels)}
    records = list(prediction_records(task, outputs, dataset.labels, ids))
    with atomic_directory(out, COMMAND, inputs + [folder], force, "--out") as work:
        with open(os.path.join(work, "predictions.jsonl"), "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
        # the GLUE server's layout: input order (a GLUE test file's own index) and the label name or the value
        with open(os.path.join(work, "predictions.tsv"), "w", encoding="utf-8") as f:
            f.write("index\tprediction\n")
            for record in records:
                prediction = f"{record['value']:.6f}" if task.regression else record["label"]
                f.write(f"{record['index']}\t{prediction}\n")
        with open(os.path.join(work, "eval.json"), "w", encoding="utf-8") as f:
            json.dump(scores, f, indent=2, ensure_ascii=False)
    return scores
