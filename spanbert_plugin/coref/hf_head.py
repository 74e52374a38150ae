"""The coreference head beside a HuggingFace export: ``coref_head.safetensors`` + ``coref_config.json``.

``transformers`` has no coreference class, so ``spanbert-export-hf`` writes the
encoder as usual and the head's weights (its own parameter names) in their own
file; the config holds the task options that shape the head and the data
settings (segment length, span width, genres). ``spanbert-import-hf`` reads
both back and writes a ``coreference`` checkpoint whose folder is also a
coreference data folder (``coref_meta.json``), so ``hub.coref`` works on it and
fine-tuning can continue with ``--task coreference``.
"""
import json
import os
from typing import Optional

import numpy as np
import torch

from ..core.errors import UsageError
from ..core.finetune_io import write_json
from .conll import GENRES
from .head import CorefHead, keep_coarse_scores_of_a_head_saved_before
from .predict import words_sample
from .prepare import META_FILE
from .task import TRAINED_GENRES

COREF_WEIGHTS, COREF_CONFIG = "coref_head.safetensors", "coref_config.json"
HEAD_OPTIONS = ("max_span_width", "top_span_ratio", "max_top_antecedents", "coref_depth", "coref_ffnn_size",
                "coref_feature_size", "coref_dropout")
SAMPLE_DOCUMENT = ("Ada Lovelace wrote the first program . She worked with Charles Babbage on his engine . "
                   "Babbage called her the Enchantress of Numbers . Ada died in 1852 .")


# how documents longer than the exact head's reach are predicted: the checkpoint's settings go along
LONG_DOCUMENT_OPTIONS = ("exact_prediction_max_words", "max_antecedent_distance", "entity_cache_size")


def write_coref_head(model, task, directory: str) -> None:
    from safetensors.torch import save_file

    weights = {k: v.detach().float().contiguous() for k, v in model.coref_head.state_dict().items()}
    save_file(weights, os.path.join(directory, COREF_WEIGHTS))
    write_json(os.path.join(directory, COREF_CONFIG), {
        "hidden_size": model.cfg.encoder_embed_dim,
        "task_options": {name: getattr(task.cfg, name) for name in HEAD_OPTIONS},
        "data": {key: task.meta[key] for key in ("max_segment_length", "max_span_width", "genres")},
        # the segment distances the head was trained on (capped at this less one; 0: no cap)
        "training": {"max_training_segments": int(task.cfg.max_training_segments),
                     "trained_genres": task.state.state_dict.get(TRAINED_GENRES)},
        # how the checkpoint predicts: an import predicts the same clusters
        "prediction": {"no_singletons": bool(task.cfg.no_singletons),
                       "singleton_threshold": float(task.cfg.singleton_threshold),
                       "coref_prediction": str(task.cfg.coref_prediction),
                       **{name: int(getattr(task.cfg, name)) for name in LONG_DOCUMENT_OPTIONS}},
        "inputs": "final hidden states of [CLS] segment [SEP] windows (one document's segments, padding removed)",
    })


def read_coref_config(directory: str) -> Optional[dict]:
    """The export's coreference config, or None when the folder has no coreference head."""
    path = os.path.join(directory, COREF_CONFIG)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except ValueError as err:
        raise UsageError(f"{path}: not valid JSON ({err})") from None
    options = config.get("task_options") if isinstance(config, dict) else None
    if not isinstance(options, dict) or set(options) != set(HEAD_OPTIONS) or not isinstance(config.get("data"), dict):
        raise UsageError(f"{path}: expected task_options ({', '.join(HEAD_OPTIONS)}) and data")
    return config


def coref_task_arguments(config: dict) -> list:
    """fairseq-train arguments of a coreference task shaped like the exported head."""
    args = ["--task", "coreference", "--criterion", "coreference"]
    for name, value in config["task_options"].items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    prediction = config.get("prediction") or {}
    for name in ("singleton_threshold", "coref_prediction", *LONG_DOCUMENT_OPTIONS):  # absent from older exports
        if prediction.get(name) is not None:
            args += [f"--{name.replace('_', '-')}", str(prediction[name])]
    return args + ["--max-training-segments", str(training_segments(config))]


def training_segments(config: dict) -> int:
    """The exported head's training window in segments (0 for exports that do not say: no cap, as they scored)."""
    return int((config.get("training") or {}).get("max_training_segments", 0))


def coref_task_state(config: dict) -> dict:
    """What the import's task state records: the genres the exported head was trained on, when the export says."""
    genres = (config.get("training") or {}).get("trained_genres")
    return {TRAINED_GENRES: list(genres)} if isinstance(genres, list) else {}


def write_coref_meta(config: dict, directory: str) -> None:
    """Make an import folder a coreference data folder (segment length, span width, genres)."""
    # One-mention clusters are predicted where the training data held them: the import's "training data" holds
    # them when the exported checkpoint predicted them (exports before "prediction" was written all did).
    predicted = not (config.get("prediction") or {}).get("no_singletons", False)
    write_json(os.path.join(directory, META_FILE), {**config["data"], "splits": [], "tokenizer": "imported",
                                                    "singletons": {"train": int(predicted)}})


def read_coref_weights(directory: str) -> dict:
    from safetensors.torch import load_file

    path = os.path.join(directory, COREF_WEIGHTS)
    try:
        weights = {"coref_head." + k: v for k, v in load_file(path).items()}
    except Exception as err:  # noqa: BLE001 - safetensors' SafetensorError derives from none of the usual ones
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise UsageError(f"{path}: cannot read the coreference head, a damaged or truncated file ({reason})") from None
    keep_coarse_scores_of_a_head_saved_before(weights, "coref_head.")  # an export written before records nothing
    return weights


def compare_coref_head(hub, directory: str) -> dict:
    """Antecedent scores of a sample document: fairseq's model against the exported encoder + head files."""
    from transformers import BertModel

    model, task = hub.model.eval(), hub.task
    config = read_coref_config(directory)
    o = config["task_options"]
    head = CorefHead(config["hidden_size"], o["coref_ffnn_size"], o["max_span_width"], o["coref_feature_size"],
                     len(GENRES), o["coref_depth"], o["coref_dropout"], o["top_span_ratio"], o["max_top_antecedents"],
                     max_training_segments=training_segments(config))
    head.load_state_dict({k[len("coref_head."):]: v for k, v in read_coref_weights(directory).items()})
    words = SAMPLE_DOCUMENT.split()
    sentence_ids = np.concatenate([[0], np.cumsum([w == "." for w in words[:-1]])])
    sample = words_sample(hub.tokenizer, task.dictionary, config["data"], words, sentence_ids)
    src = sample["net_input"]["src_tokens"].to(hub.device)
    coref = {k: v.to(hub.device) if torch.is_tensor(v) else v for k, v in sample["coref"].items()}
    with torch.no_grad():
        ours, _ = model(src, coref=coref)
        bert = BertModel.from_pretrained(directory, add_pooling_layer=False, output_loading_info=True)[0]
        hidden = bert.eval()(
            input_ids=src.cpu(), attention_mask=src.cpu().ne(task.dictionary.pad()).long()).last_hidden_state
        theirs = head.eval()(hidden[src.cpu().ne(task.dictionary.pad())], **{k: v.cpu() if torch.is_tensor(v) else v
                                                                           for k, v in coref.items()})
    if not torch.equal(ours["antecedents"].cpu(), theirs["antecedents"]):
        return {"coref_scores": float("inf")}
    a, b = ours["scores"].float().cpu(), theirs["scores"].float()
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)):
        return {"coref_scores": float("inf")}
    return {"coref_scores": float((a[finite] - b[finite]).abs().max()) if finite.any() else 0.0}
