"""``hub.classify(text, pair)``: a classification checkpoint's prediction for raw text, as
``spanbert-predict-classification`` makes it (the pair truncated longest-first to the folder's ``--max-seq-length``)."""
from typing import Optional

import numpy as np
import torch

from ..model.hub_interface import check_text, register_hub_feature
from .prepare import truncated_lengths
from .task import SentenceClassificationTask


@register_hub_feature("classify")
def hub_classify(hub, text: str, pair: Optional[str] = None) -> dict:
    """``{"label", "probabilities"}`` (``{"value"}`` for regression) of one sentence or pair."""
    task = hub.task
    if not isinstance(task, SentenceClassificationTask):
        raise ValueError("hub.classify: this checkpoint was not fine-tuned with --task sentence_classification (use "
                         "hub.predict with a head of your own)")
    check_text("classify", "text", text)
    if pair is not None:
        check_text("classify", "pair", pair)
    texts = [text] if pair is None else [text, pair]
    ids = [hub.tokenizer.encode(t).ids.tolist() for t in texts]
    budget = int(task.meta["max_seq_length"]) - (2 if pair is None else 3)
    keep = truncated_lengths(np.array([len(ids[0])]), None if pair is None else np.array([len(ids[1])]), budget)
    d = hub.dictionary
    tokens = [d.bos()] + ids[0][: int(keep[0][0])] + [d.eos()]
    if pair is not None:
        tokens += ids[1][: int(keep[1][0])] + [d.eos()]
    with torch.no_grad():
        out = hub.predict(task.cfg.classification_head_name, torch.tensor(tokens))[0].float().cpu()
    if task.regression:
        return {"value": float(out[0])}
    probabilities = out.exp()
    return {"label": task.labels[int(probabilities.argmax())],
            "probabilities": {label: float(p) for label, p in zip(task.labels, probabilities)}}
