"""The heads a HuggingFace export carries: one table entry per head.

``NATIVE_NAMES`` maps parameter-name prefixes onto transformers' own classes (the encoder, the MLM head and the
extractive-QA head; a classification head is BERT's pooler + classifier). ``SIDE_HEADS`` are the heads
transformers has no class for; each is written beside the model in its own safetensors + JSON config and read
back by ``spanbert-import-hf``. Adding a head is adding an entry here, not a branch in export or import.
"""
import json
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..core.tasks import task_state_of
from .files import InteropError, read_json, read_weights

# (spanbert prefix, transformers prefix): the encoder, the MLM head (its decoder weight is tied on both sides)
# and the extractive-QA head. Classification heads map separately: their name is part of the prefix.
NATIVE_NAMES = (
    ("encoder.embeddings.", "bert.embeddings."),
    ("encoder.encoder.", "bert.encoder."),
    ("lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_head.LayerNorm.", "cls.predictions.transform.LayerNorm."),
    ("lm_head.bias", "cls.predictions.bias"),
    ("qa_outputs.", "qa_outputs."),
)
CLASSIFICATION_NAMES = (("dense.", "bert.pooler.dense."), ("out_proj.", "classifier."))
# an imported BERT's pooler without classifier (the model's PoolerRecord); a classification head's dense takes its place
POOLER_NAMES = (("pooler.", "bert.pooler.dense."),)


@dataclass(frozen=True)
class SideHead:
    """A head with no transformers class: its files, how to write, check and read them."""

    name: str
    weights_file: str
    config_file: str
    present: Callable  # (model) -> bool
    write: Callable  # (hub, directory) -> None
    compare: Callable  # (hub, directory, features, hf_hidden) -> {output: max abs difference}
    model_arguments: Callable  # (config, directory) -> extra fairseq arguments shaping the model, or None
    restore: Callable  # (model, directory, config, hidden) -> (weights by spanbert name, report line)
    # (config, directory, work) -> fairseq task arguments replacing pre-training's, after preparing ``work``
    task_arguments: Optional[Callable] = None
    validate: Optional[Callable] = None  # (directory) -> config, checked; default: the JSON object as it is
    task_state: Optional[Callable] = None  # (config) -> what the imported checkpoint's task state records

    def load_config(self, directory: str) -> Optional[dict]:
        """The head's config in an export folder, or None when the folder has no such head (neither file);
        InteropError when only one of its two files is there (the head would be dropped without a word)."""
        has_config = os.path.isfile(os.path.join(directory, self.config_file))
        has_weights = os.path.isfile(os.path.join(directory, self.weights_file))
        if has_config != has_weights:
            found, missing = ((self.config_file, self.weights_file) if has_config else
                              (self.weights_file, self.config_file))
            raise InteropError(f"{os.path.join(directory, found)}: the {self.name} needs {missing} beside it too "
                               "(spanbert-export-hf writes both); copy it, or remove this file to import without the head")
        if not has_config:
            return None
        return self.validate(directory) if self.validate else read_json(os.path.join(directory, self.config_file))


# ------------------------------------------------------------------------------------------------------ SBO


def _write_sbo(hub, directory):
    from safetensors.torch import save_file

    model = hub.model
    save_file({k: v.contiguous() for k, v in model.sbo_head.state_dict().items() if k != "weight"},
              os.path.join(directory, SBO.weights_file))
    with open(os.path.join(directory, SBO.config_file), "w") as f:
        json.dump({"position_slots": model.sbo_head.position_slots,
                   "position_dim": model.sbo_head.position_embeddings.embedding_dim,
                   "layer_norm_eps": model.cfg.layer_norm_eps,
                   "decoder": "tied to bert.embeddings.word_embeddings.weight",
                   "inputs": "[left boundary state; right boundary state; position embedding of offset-1]"}, f, indent=2)


def _sbo_arguments(config, directory):
    path = os.path.join(directory, SBO.config_file)
    for key in ("position_slots", "position_dim"):
        if not isinstance(config.get(key), int) or config[key] <= 0:
            raise InteropError(f"{path}: {key} must be a positive integer, found {config.get(key)!r}")
    return ["--sbo-position-slots", str(config["position_slots"]), "--sbo-position-dim", str(config["position_dim"])]


def _compare_sbo(hub, directory, features, hidden):
    """The SBO head rebuilt from the exported files, its decoder the exported word embeddings, on transformers'
    hidden states, against fairseq's SBO logits: the sample's first and last tokens as boundaries, every offset slot."""
    from safetensors.torch import load_file

    from ..model.layers import SpanBoundaryHead

    ours = hub.model.sbo_head.eval()
    config = read_json(os.path.join(directory, SBO.config_file))
    embeddings = load_file(os.path.join(directory, "model.safetensors"))
    decoder = next(v for k, v in embeddings.items() if k.endswith("embeddings.word_embeddings.weight"))
    head = SpanBoundaryHead(hidden.size(-1), decoder.float(), config["position_slots"], config["position_dim"],
                            hub.model.cfg.layer_norm_eps).eval()
    head.load_state_dict(read_weights(os.path.join(directory, SBO.weights_file)))  # the decoder is set above
    slots = torch.arange(1, ours.position_slots + 1)
    left = torch.zeros_like(slots)  # the first token as the left boundary, the last as the right
    right = torch.full_like(slots, features.size(1) - 1)
    theirs = head(hidden[0, left], hidden[0, right], slots)
    return {"sbo_logits": (ours(features[0, left], features[0, right], slots) - theirs).abs().max().item()}


def _restore_sbo(model, directory, config, hidden):
    weights = read_weights(os.path.join(directory, SBO.weights_file))
    return {"sbo_head." + k: v for k, v in weights.items()}, None


SBO = SideHead(
    name="span boundary (SBO) head", weights_file="sbo_head.safetensors", config_file="sbo_config.json",
    present=lambda model: True, write=_write_sbo, compare=_compare_sbo,
    model_arguments=_sbo_arguments, restore=_restore_sbo,
)

# ------------------------------------------------------------------------------------------------- relation


RELATION_INPUTS = ("entity_marker", "markers", "negative_label", "max_seq_length")


def _write_relation(hub, directory):
    from safetensors.torch import save_file

    # a fine-tuning task holds the labels and inputs; a checkpoint an import made, the record _relation_task_state kept
    stored = task_state_of(hub.task)
    model, labels = hub.model, getattr(hub.task, "labels", None) or stored.get("labels")
    weights = {f"{name}.{k}": v.detach().float().contiguous()
               for name, head in model.relation_heads.items() for k, v in head.state_dict().items()}
    save_file(weights, os.path.join(directory, RELATION.weights_file))
    heads = {name: {"pooling": head.pooling, "num_classes": head.out_proj.out_features,
                    **({"labels": labels} if labels and len(labels) == head.out_proj.out_features else {})}
             for name, head in model.relation_heads.items()}
    meta = getattr(hub.task, "meta", None) or stored.get("relation_inputs") or {}
    # what inputs the heads were trained on: the marker mode, each marker's token id, the negative label, the length
    inputs = {key: meta[key] for key in RELATION_INPUTS if key in meta}
    with open(os.path.join(directory, RELATION.config_file), "w") as f:
        json.dump({"heads": heads, **inputs, "layer": "dense -> tanh -> dropout -> out_proj",
                   "inputs": "cls: the first token's final hidden state; entity_start: [subject start marker; "
                             "object start marker] final hidden states"}, f, indent=2)


def read_relation_heads(directory, hidden):
    """The relation heads an export wrote, as ``RelationHead`` modules by name; InteropError on a bad file."""
    from ..model.relation_head import RE_POOLINGS, RelationHead

    config_path = os.path.join(directory, RELATION.config_file)
    weights_path = os.path.join(directory, RELATION.weights_file)
    heads = read_json(config_path).get("heads")
    if not isinstance(heads, dict) or not heads:
        raise InteropError(f"{config_path}: expected a non-empty 'heads' object")
    weights = read_weights(weights_path)
    modules = {}
    for name, spec in heads.items():
        if not isinstance(spec, dict) or spec.get("pooling") not in RE_POOLINGS or not isinstance(spec.get("num_classes"), int):
            raise InteropError(f"{config_path}: head {name!r} needs a pooling ({', '.join(RE_POOLINGS)}) and num_classes")
        head = RelationHead(hidden, spec["num_classes"], spec["pooling"], dropout=0.0)
        state = {k[len(name) + 1:]: v for k, v in weights.items() if k.startswith(name + ".")}
        expected = head.state_dict()
        if set(state) != set(expected) or any(state[k].shape != expected[k].shape for k in expected):
            raise InteropError(f"{weights_path}: head {name!r} does not match {config_path} "
                               f"({spec['pooling']} pooling, {spec['num_classes']} classes, hidden {hidden})")
        head.load_state_dict(state)
        modules[name] = head
    return modules


def _compare_relation(hub, directory, features, hidden):
    """Relation heads rebuilt from the exported files, on transformers' hidden states, against fairseq's logits."""
    model = hub.model
    entity_positions = torch.tensor([[1, min(2, features.size(1) - 1)]])  # any two positions test the gather
    diffs = {}
    for name, head in read_relation_heads(directory, model.cfg.encoder_embed_dim).items():
        ours = model.relation_heads[name].eval()(features, entity_positions)
        diffs[f"relation_logits:{name}"] = (ours - head.eval()(hidden, entity_positions)).abs().max().item()
    return diffs


def _restore_relation(model, directory, config, hidden):
    weights, lines = {}, []
    for name, head in read_relation_heads(directory, hidden).items():
        model.register_relation_head(name, head.out_proj.out_features, head.pooling)
        weights.update({f"relation_heads.{name}.{k}": v for k, v in head.state_dict().items()})
        lines.append(f"relation head {name} ({head.pooling} pooling, {head.out_proj.out_features} classes; "
                     f"from {RELATION.weights_file})")
    return weights, "; ".join(lines)


def _relation_task_state(config):
    """The labels an export recorded (fine-tuning from the import then maps the head's rows by name), and the inputs
    the heads were trained on (an export of the import writes them again)."""
    labels = [spec.get("labels") for spec in config.get("heads", {}).values() if isinstance(spec, dict)]
    state = next(({"labels": names} for names in labels if isinstance(names, list)), {})
    inputs = {key: config[key] for key in RELATION_INPUTS if key in config}
    return {**state, "relation_inputs": inputs} if inputs else state


RELATION = SideHead(
    name="relation-extraction heads", weights_file="relation_heads.safetensors", config_file="relation_config.json",
    present=lambda model: len(model.relation_heads) > 0, write=_write_relation, compare=_compare_relation,
    model_arguments=lambda config, directory: [], restore=_restore_relation, task_state=_relation_task_state,
)

# --------------------------------------------------------------------------------------------- coreference


def _coref_task_arguments(config, directory, work):
    from ..coref.hf_head import coref_task_arguments, write_coref_meta

    write_coref_meta(config, work)  # the checkpoint's folder is also its coreference data folder
    return coref_task_arguments(config)


def _restore_coref(model, directory, config, hidden):
    from ..coref.hf_head import COREF_WEIGHTS, read_coref_weights

    return read_coref_weights(directory), f"coreference head (from {COREF_WEIGHTS})"


def _write_coref(hub, directory):
    from ..coref.hf_head import write_coref_head

    write_coref_head(hub.model, hub.task, directory)


def _compare_coref(hub, directory, features, hidden):
    from ..coref.hf_head import compare_coref_head

    return compare_coref_head(hub, directory)


def _coref_task_state(config):
    from ..coref.hf_head import coref_task_state

    return coref_task_state(config)


def _coref_config(directory):
    from ..coref.hf_head import read_coref_config

    return read_coref_config(directory)


COREF = SideHead(
    name="coreference head", weights_file="coref_head.safetensors", config_file="coref_config.json",
    present=lambda model: getattr(model, "coref_head", None) is not None, write=_write_coref, compare=_compare_coref,
    model_arguments=lambda config, directory: [], restore=_restore_coref, task_arguments=_coref_task_arguments,
    validate=_coref_config, task_state=_coref_task_state,
)

SIDE_HEADS = (SBO, RELATION, COREF)
