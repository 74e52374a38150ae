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
from tqdm import tqdm

from ..errors import UsageError
from ..evaluation.relation import relation_counts, relation_scores
from ..file_utils import atomic_directory, check_destination
from .prepare import load_re_meta, load_split_arrays

COMMAND = "spanbert-predict-re"
TASK = "relation_extraction"


def load_re_checkpoint(checkpoint: str, data: Optional[str] = None, cpu: bool = False):
    """(model, task, cfg) of a relation_extraction checkpoint; ``data`` overrides the prepared folder."""
    from fairseq import checkpoint_utils

    from ..models.hub_interface import USER_DIR

    if not os.path.isfile(checkpoint):
        raise UsageError(f"--checkpoint {checkpoint}: no such file")
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint, {"user_dir": USER_DIR})
    trained_on = state["cfg"]["task"].get("data")
    if state["cfg"]["task"].get("_name") != TASK:
        raise UsageError(f"--checkpoint {checkpoint}: not a {TASK} checkpoint (its task is {state['cfg']['task'].get('_name')})")
    if data:
        _check_same_labels(data, trained_on)
    overrides = {"user_dir": USER_DIR, **({"data": os.path.abspath(data)} if data else {})}
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides=overrides, state=state)
    model = models[0].eval()
    if torch.cuda.is_available() and not cpu:
        model = model.cuda()
    return model, task, cfg


def _check_same_labels(data: str, trained_on: Optional[str]) -> None:
    """A folder prepared differently from the training one would give wrong labels: refuse it."""
    meta = load_re_meta(data)
    if not trained_on or not os.path.isfile(os.path.join(trained_on, "re_meta.json")):
        return  # the training folder is gone; the label count is still checked against the head
    trained = load_re_meta(trained_on)
    for key in ("labels", "negative_label", "entity_marker", "markers"):
        if meta[key] != trained[key]:
            raise UsageError(f"--data {data}: its {key} differ from those of {trained_on}, which the checkpoint was trained on")


@torch.no_grad()
def predict_probabilities(model, task, cfg, split: str, batch_size=None, max_tokens=None) -> np.ndarray:
    """N x labels probabilities of every example of ``split``, in input order."""
    from fairseq import utils

    from ..criterions.relation_extraction import relation_logits

    if hasattr(task.cfg, "span_drop_p"):
        task.cfg.span_drop_p = 0.0  # prediction never drops spans, whatever the split is called
    task.load_dataset(split)
    dataset = task.dataset(split)
    head = model.relation_heads[task.cfg.relation_head_name]
    if head.out_proj.out_features != len(task.labels):
        raise UsageError(f"{task.cfg.data}: {len(task.labels)} labels, but the checkpoint's head has {head.out_proj.out_features}")
    iterator = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=max_tokens if max_tokens is not None else cfg.dataset.max_tokens_valid,
        max_sentences=batch_size if batch_size is not None else cfg.dataset.batch_size_valid,
        max_positions=model.max_positions(),
        required_batch_size_multiple=1,
        seed=cfg.common.seed,
    ).next_epoch_itr(shuffle=False)
    probs = np.full((len(dataset), len(task.labels)), np.nan, dtype=np.float32)
    device = next(model.parameters()).device
    for sample in tqdm(iterator, desc=f"predict {split}", unit="batch", disable=None):
        sample = utils.apply_to_sample(lambda t: t.to(device), sample)
        logits = relation_logits(model, sample, task.cfg.relation_head_name)
        probs[sample["id"].cpu().numpy()] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
    if np.isnan(probs).any():
        raise RuntimeError(f"split {split!r}: {int(np.isnan(probs).any(axis=1).sum())} examples were not evaluated")
    return probs


def predict_split(checkpoint, data, split, out, force=False, batch_size=None, max_tokens=None, cpu=False) -> dict:
    """Write ``predictions.jsonl`` (id, label, prob per example, input order) and ``eval.json`` to ``out``."""
    inputs = [checkpoint] + ([data] if data else [])
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
