"""HuggingFace ``transformers`` interop: ``spanbert-export-hf`` and ``spanbert-import-hf``.

Parameter names of the spanbert encoder mirror ``BertModel``, so the mapping is
a prefix change: ``encoder.embeddings.*`` <-> ``bert.embeddings.*``,
``encoder.encoder.layer.N.*`` <-> ``bert.encoder.layer.N.*``, and the MLM head
``lm_head.{dense,LayerNorm,bias}`` <-> ``cls.predictions.{transform.dense,
transform.LayerNorm,bias}`` (its decoder is tied to the word embeddings on
both sides). Task heads map onto transformers' own: the extractive-QA head
``qa_outputs`` keeps its name (``BertForQuestionAnswering``), and a
classification head ``classification_heads.NAME.{dense,out_proj}`` is BERT's
pooler + classifier, ``bert.pooler.dense`` + ``classifier``
(``BertForSequenceClassification``: dense -> tanh -> dropout -> linear on the
first token, as ours). Heads ``transformers`` has no class for (SBO, relation extraction,
coreference) are written beside the model in their own files; ``hf/heads.py`` holds
the table of every head's mapping, ``hf/tokenizer_files.py`` the tokenizer's files both ways.
"""
import logging
import os
import tempfile

import torch

from ..core.tasks import task_state_of
from ..core.user_dir import register_plugin
from ..qa.hf_settings import QA_SETTINGS, TASK_STATE_KEY as QA_STATE_KEY, read_qa_settings, write_qa_settings
from ..core.file_utils import atomic_directory, check_destination, checkpoint_inputs
from .files import InteropError, read_json, read_weights
from .heads import CLASSIFICATION_NAMES, NATIVE_NAMES, POOLER_NAMES, SIDE_HEADS
from .tokenizer_files import read_hf_tokenizer, save_hf_tokenizer

TOLERANCE = 1e-4
SAMPLE_TEXT = (
    "SpanBERT masks contiguous random spans rather than random tokens, and trains the span "
    "boundary representations to predict the entire content of the masked span."
)


IMPORTED_HEAD = "sentence_classification_head"  # the name fairseq's sentence_prediction (and ours) use
QA_HEAD = "qa"  # --head value selecting the extractive-QA head


def _renamed(key, pairs):
    """``key`` with the first matching prefix of ``pairs`` replaced, or None (a prefix without a final dot matches whole)."""
    for old, new in pairs:
        if key == old or (old.endswith(".") and key.startswith(old)):
            return new + key[len(old):]
    return None


def to_hf_state_dict(state, classification_head=None):
    """spanbert state dict -> transformers BERT names: encoder, MLM head, QA head, one classification head (else the
    pooler an import kept)."""
    pairs = list(NATIVE_NAMES)
    if classification_head is not None:
        pairs += [(f"classification_heads.{classification_head}.{ours}", theirs) for ours, theirs in CLASSIFICATION_NAMES]
    else:
        pairs += list(POOLER_NAMES)
    renamed = ((_renamed(key, pairs), value) for key, value in state.items())
    return {key: value for key, value in renamed if key is not None}


def is_sequence_classifier(hf_state, architectures=()):
    """Is the weights' ``classifier`` BertForSequenceClassification's (on the pooler), not a per-token one?"""
    if "classifier.weight" not in hf_state or any("TokenClassification" in name for name in architectures):
        return False
    return "bert.pooler.dense.weight" in hf_state or any("SequenceClassification" in name for name in architectures)


def from_hf_state_dict(hf_state, architectures=()):
    """BERT (HF) names -> spanbert names; unknown keys (the NSP head, a token classifier) are returned separately."""
    pairs = [(theirs, ours) for ours, theirs in NATIVE_NAMES] + [("cls.predictions.decoder.bias", "lm_head.bias")]
    if is_sequence_classifier(hf_state, architectures):  # BERT's pooler belongs to the classification head then
        pairs += [(theirs, f"classification_heads.{IMPORTED_HEAD}.{ours}") for ours, theirs in CLASSIFICATION_NAMES]
    else:  # kept beside the encoder for the export
        pairs += [(theirs, ours) for ours, theirs in POOLER_NAMES]
    ours, ignored = {}, []
    for key, value in hf_state.items():
        if key.endswith("position_ids"):
            continue
        # a bare BertModel's weights have no "bert." prefix
        name = "bert." + key if key.startswith(("embeddings.", "encoder.", "pooler.")) else key
        renamed = _renamed(name, pairs)
        if renamed is None:
            ignored.append(key)
        else:
            ours[renamed] = value
    return ours, ignored


def label_names(task, num_labels):
    """The task's class names in id order when it has them (a ``labels`` list or a fairseq label dictionary), else None."""
    try:
        labels = getattr(task, "labels", None)
        if labels is None and getattr(task, "state", None) is not None:  # as tasks save them in checkpoints
            labels = task.state.state_dict.get("labels")
        if labels is None and getattr(task, "label_dictionary", None) is not None:
            labels = task.label_dictionary.symbols[task.label_dictionary.nspecial:]
    except Exception:  # noqa: BLE001 - names are optional: a task that cannot say gets transformers' LABEL_i
        return None
    if isinstance(labels, (list, tuple)) and len(labels) == num_labels and all(isinstance(x, str) for x in labels):
        return list(labels)
    return None


def choose_heads(model, head=None):
    """(export the QA head?, classification head name or None); InteropError when the choice is ambiguous."""
    names = list(model.classification_heads)
    has_qa = model.qa_outputs is not None
    available = ([QA_HEAD] if has_qa else []) + names
    if head is not None:
        if head not in available:
            # coreference and relation heads are exported beside the encoder whatever --head says
            beside = (["coreference"] if getattr(model, "coref_head", None) is not None else []) + \
                [f"relation ({name})" for name in getattr(model, "relation_heads", {})]
            also = f"; its {' and '.join(beside)} head is exported on its own, without --head" if beside else ""
            raise InteropError(f"--head {head}: the checkpoint has no such head (--head chooses among its QA and "
                               f"classification heads: {', '.join(available) or 'it has none'}{also})")
        return head == QA_HEAD, None if head == QA_HEAD else head
    if len(names) > 1:
        raise InteropError(f"the checkpoint has {len(names)} classification heads ({', '.join(names)}); "
                           f"choose one with --head (or --head {QA_HEAD})")
    chosen = names[0] if names else None
    if has_qa and chosen is not None and model.classification_heads[chosen].out_proj.out_features != 2:
        # transformers sizes both qa_outputs and classifier by one num_labels
        raise InteropError(f"the QA head and the {model.classification_heads[chosen].out_proj.out_features}-class head "
                           f"{chosen} cannot share one transformers config (num_labels); choose one with --head")
    return has_qa, chosen


def bert_config_of(model_cfg, dictionary, architectures=("BertForMaskedLM",), num_labels=2, labels=None,
                   regression=False):
    """The transformers ``BertConfig`` of a spanbert model (and of the task head written with it)."""
    from transformers import BertConfig

    if labels:  # transformers derives num_labels from id2label
        extra = {"id2label": dict(enumerate(labels)), "label2id": {x: i for i, x in enumerate(labels)}}
    else:
        extra = {"num_labels": num_labels}
    if regression:
        extra["problem_type"] = "regression"
    return BertConfig(
        vocab_size=len(dictionary),
        hidden_size=model_cfg.encoder_embed_dim,
        num_hidden_layers=model_cfg.encoder_layers,
        num_attention_heads=model_cfg.encoder_attention_heads,
        intermediate_size=model_cfg.encoder_ffn_embed_dim,
        hidden_act="gelu",
        hidden_dropout_prob=model_cfg.dropout,
        attention_probs_dropout_prob=model_cfg.attention_dropout,
        classifier_dropout=model_cfg.pooler_dropout,
        max_position_embeddings=model_cfg.max_positions,
        type_vocab_size=model_cfg.type_vocab_size,
        initializer_range=model_cfg.init_std,
        layer_norm_eps=model_cfg.layer_norm_eps,
        pad_token_id=dictionary.pad(),
        architectures=list(architectures),
        **extra,
    )



def _max_diff(ours, theirs):
    return (ours - theirs).abs().max().item()


@torch.no_grad()
def compare_outputs(hub, directory, qa=False, classification_head=None, text=SAMPLE_TEXT):
    """Reload ``directory`` with transformers; max abs differences from fairseq of every exported output."""
    from transformers.utils import logging as hf_logging

    tokens = hub.encode(text)[: hub.model.max_positions()].unsqueeze(0)
    inputs = {"input_ids": tokens, "attention_mask": torch.ones_like(tokens)}
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # each class ignores the other heads' weights: expected, not worth a warning
    hf_logging.disable_progress_bar()  # a bar per reload would bury the command's one-line report
    try:
        return _compare(hub, directory, tokens, inputs, qa, classification_head)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _compare(hub, directory, tokens, inputs, qa, classification_head):
    from transformers import BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification, BertModel

    ours = hub.model
    ours.eval()
    features, _ = ours(tokens, features_only=True)
    mlm = _load_checked(BertForMaskedLM, directory)
    hf_out = mlm(**inputs, output_hidden_states=True)
    diffs = {"hidden": _max_diff(features, hf_out.hidden_states[-1]),
             "mlm_logits": _max_diff(ours.lm_head(features), hf_out.logits)}
    for side in SIDE_HEADS:
        if side.present(ours):
            diffs.update(side.compare(hub, directory, features, hf_out.hidden_states[-1]))
    if ours.pooler is not None and classification_head is None:  # the imported pooler was written back
        diffs["pooler_output"] = _max_diff(ours.pooler(features), _load_checked(BertModel, directory)(**inputs).pooler_output)
    if qa:
        (start, end), _ = ours(tokens, qa=True)
        hf_qa = _load_checked(BertForQuestionAnswering, directory)(**inputs)
        diffs["qa_start_logits"] = _max_diff(start, hf_qa.start_logits)
        diffs["qa_end_logits"] = _max_diff(end, hf_qa.end_logits)
    if classification_head is not None:
        logits, _ = ours(tokens, classification_head_name=classification_head)
        diffs["class_logits"] = _max_diff(logits, _load_checked(BertForSequenceClassification, directory)(**inputs).logits)
    return diffs


def _load_checked(model_class, directory):
    """``model_class.from_pretrained(directory)``; every weight must come from the directory."""
    model, info = model_class.from_pretrained(directory, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if not k.endswith("position_ids") and k != "cls.predictions.decoder.weight"]
    if missing:
        raise InteropError(f"export check failed: {model_class.__name__} found no weights for {', '.join(missing[:5])}")
    return model.eval()


def export_hf(checkpoint, out_dir, data=None, force=False, head=None):
    """Write a transformers directory for a spanbert checkpoint (and its task heads), then check it against fairseq."""
    from safetensors.torch import save_file

    from ..model.hub_interface import load_hub_model

    inputs = checkpoint_inputs(checkpoint, data)  # the data folder the checkpoint was trained on counts too
    check_destination(out_dir, "spanbert-export-hf", inputs, force, "--out")
    if not os.path.isfile(checkpoint):
        raise InteropError(f"{checkpoint}: no such checkpoint")
    # a relative --data is relative to the working directory (load_hub_model falls back to the checkpoint's folder)
    hub = load_hub_model(os.path.dirname(checkpoint), os.path.basename(checkpoint), data)  # errors name it as given
    model, d = hub.model.float(), hub.dictionary
    qa, classification_head = choose_heads(model, head)
    architectures, num_labels, labels, regression = ["BertForMaskedLM"], 2, None, False
    if qa:
        architectures.append("BertForQuestionAnswering")
    if classification_head is not None:
        module = model.classification_heads[classification_head]
        if module.dense.out_features != model.cfg.encoder_embed_dim:
            raise InteropError(f"{checkpoint}: classification head {classification_head} has inner size "
                               f"{module.dense.out_features}; transformers' pooler needs the hidden size {model.cfg.encoder_embed_dim}")
        architectures.append("BertForSequenceClassification")
        num_labels = module.out_proj.out_features
        labels = label_names(hub.task, num_labels)
        stored = task_state_of(hub.task)  # an imported head's task state
        regression = bool(getattr(hub.task, "regression", False) or stored.get("regression")) and num_labels == 1
    config = bert_config_of(model.cfg, d, architectures, num_labels, labels, regression)
    weights = {k: v.detach().float().contiguous() for k, v in to_hf_state_dict(model.state_dict(), classification_head).items()
               if qa or not k.startswith("qa_outputs.")}
    with atomic_directory(out_dir, "spanbert-export-hf", inputs, force, "--out") as work:
        config.save_pretrained(work)
        save_file(weights, os.path.join(work, "model.safetensors"), metadata={"format": "pt"})
        save_hf_tokenizer(hub.tokenizer, d, work, model.max_positions(), model.cfg.type_vocab_size)
        for side in SIDE_HEADS:
            if side.present(model):
                side.write(hub, work)
        if qa:  # how the model answers: windows, SQuAD 2.0 rules, the answer options
            write_qa_settings(hub, work)
        # self-check: reload from disk with transformers and compare with fairseq again
        diffs = compare_outputs(hub, work, qa, classification_head)
        if max(diffs.values()) > TOLERANCE:
            raise InteropError(f"export check failed: transformers and fairseq differ by {diffs} (tolerance {TOLERANCE})")
    return diffs


REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size", "max_position_embeddings")


def _read_hf_dir(hf_dir):
    if os.path.isfile(hf_dir):
        raise InteropError(f"--hf {hf_dir}: a file; give the HuggingFace model folder that holds config.json")
    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        raise InteropError(f"{config_path}: no such file (not a HuggingFace model directory?)")
    config = read_json(config_path)
    if config.get("model_type") != "bert":
        raise InteropError(f"{config_path}: model_type {config.get('model_type')!r} is not a BERT model (expected 'bert')")
    for key in ("pre_layer_norm", "pre_layernorm", "normalize_before", "pre_norm"):
        if config.get(key):
            raise InteropError(f"{config_path}: {key}=true (pre-LayerNorm) is not BERT's post-LayerNorm encoder")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise InteropError(f"{config_path}: position_embedding_type {config['position_embedding_type']!r}; "
                           "only absolute positions map onto spanbert")
    if config.get("hidden_act", "gelu") not in ("gelu", "gelu_python"):
        raise InteropError(f"{config_path}: hidden_act {config.get('hidden_act')!r}; spanbert uses exact (erf) gelu")
    for key in REQUIRED_CONFIG_KEYS:
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool) or config[key] <= 0:
            raise InteropError(f"{config_path}: {key} must be a positive integer, found {config.get(key)!r}")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise InteropError(f"{config_path}: hidden_size {config['hidden_size']} is not a multiple of num_attention_heads "
                           f"{config['num_attention_heads']}")
    safetensors_path = os.path.join(hf_dir, "model.safetensors")
    bin_path = os.path.join(hf_dir, "pytorch_model.bin")
    if os.path.isfile(safetensors_path):
        weights = read_weights(safetensors_path)
    elif os.path.isfile(bin_path):
        weights = read_weights(bin_path)
    else:
        raise InteropError(f"{hf_dir}: no model.safetensors or pytorch_model.bin")
    vocab_path = os.path.join(hf_dir, "vocab.txt")
    if not os.path.isfile(vocab_path):  # modern folders may carry only the fast tokenizer's file
        vocab_path = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.isfile(vocab_path):
        raise InteropError(f"{hf_dir}: no vocab.txt or tokenizer.json (a WordPiece or sentencepiece tokenizer is required)")
    return config, weights, vocab_path



# files of a sentence-transformers model folder beside the BERT encoder (its pooling/normalising modules)
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def _import_notes(hf_dir, tokenizer, ours, ignored, untied_decoder=False):
    """One line each on what the import read or dropped that a user would otherwise miss, and warnings."""
    notes, warnings = [], []
    if tokenizer.kind == "sentencepiece":
        notes.append(f"tokenizer: a sentencepiece unigram model of {len(tokenizer.vocab)} pieces rebuilt from tokenizer.json "
                     f"({'lower-cased' if tokenizer.lowercase else 'cased'}); written as spm.model")
    elif tokenizer.vocab_file.endswith("tokenizer.json"):
        rules = f"{'lower-cased' if tokenizer.lowercase else 'cased'}, accents {'stripped' if tokenizer.strip_accents else 'kept'}"
        rules += "" if tokenizer.tokenize_chinese_chars else ", CJK characters not split"
        notes.append(f"tokenizer: {len(tokenizer.vocab)} WordPiece tokens read from tokenizer.json ({rules}); "
                     "written as vocab.txt")
    special = getattr(tokenizer, "extra_special_tokens", None)
    if special:  # a relation folder's markers are dozens: the first few name them
        shown = ", ".join(special[:6]) + (f" and {len(special) - 6} more" if len(special) > 6 else "")
        notes.append(f"tokenizer: {len(special)} special tokens kept whole (transformers' additional_special_tokens): "
                     f"{shown}")
    extras = sorted(n + ("/" if os.path.isdir(os.path.join(hf_dir, n)) else "") for n in os.listdir(hf_dir)
                    if n in SENTENCE_TRANSFORMERS_FILES or (n[:1].isdigit() and "_" in n
                                                            and os.path.isdir(os.path.join(hf_dir, n))))
    if extras:
        notes.append(f"sentence-transformers files ignored (the encoder alone is imported): {', '.join(extras)}")
    token_classifier = sorted(k for k in ignored if k.startswith("classifier."))
    if token_classifier:
        notes.append(f"token classifier ignored ({', '.join(token_classifier)}): spanbert has no token-classification "
                     "head; the encoder is imported")
    if "pooler.weight" in ours:
        notes.append("pooler (bert.pooler.dense) kept for the export, which writes it back unless a classification "
                     "head's own dense layer takes its place; spanbert does not use it (a new classification head "
                     "starts its dense layer fresh)")
    if untied_decoder:
        warnings.append(f"{hf_dir}: the MLM decoder (cls.predictions.decoder.weight) is not tied to the word embeddings "
                        "(tie_word_embeddings false), and spanbert's is: the MLM head starts from fresh weights "
                        "(continued pre-training begins with an untrained head; fine-tuning does not use it)")
    elif "lm_head.dense.weight" not in ours:
        warnings.append(f"{hf_dir} has no MLM head (cls.predictions.*): the MLM head starts from fresh weights "
                        "(continued pre-training begins with an untrained head; fine-tuning does not use it)")
    return notes, warnings


def import_hf(hf_dir, out_dir, force=False, seed=1):
    """Turn a HuggingFace BERT directory into a spanbert checkpoint + data folder; return a report.

    The weights the folder lacks (the SBO, an MLM head's missing layers, task heads) start from ``seed``'s draws, so
    an import is repeated bit for bit; the caller's random state is left as it was."""
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from ..core.dictionary import tokenizer_description

    check_destination(out_dir, "spanbert-import-hf", [hf_dir], force, "--out")
    register_plugin()  # the tasks and options the checkpoint is built with
    config, weights, vocab_path = _read_hf_dir(hf_dir)
    scratch = tempfile.TemporaryDirectory(prefix="spanbert-import-")  # a sentencepiece model rebuilt from tokenizer.json
    tokenizer, dictionary, case_note = read_hf_tokenizer(hf_dir, vocab_path, scratch.name)
    dictionary_size = len(dictionary)
    if dictionary_size != config["vocab_size"]:
        raise InteropError(f"{vocab_path}: {dictionary_size} tokens, but config.json says vocab_size {config['vocab_size']}")
    architectures = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    ours, ignored = from_hf_state_dict(weights, [str(name) for name in architectures])
    embed = ours.get("encoder.embeddings.word_embeddings.weight")
    if embed is None:
        raise InteropError(f"{hf_dir}: no embeddings.word_embeddings.weight in the weights")
    if embed.shape[0] != dictionary_size:
        raise InteropError(f"{hf_dir}: word embeddings have {embed.shape[0]} rows but {os.path.basename(vocab_path)} has "
                           f"{dictionary_size} tokens")
    decoder = weights.get("cls.predictions.decoder.weight")
    untied_decoder = decoder is not None and not (decoder.shape == embed.shape and bool((decoder == embed).all()))
    if untied_decoder:  # spanbert's MLM decoder is the word embeddings: an MLM head of its own cannot come along
        ours = {key: value for key, value in ours.items() if not key.startswith("lm_head.")}

    with atomic_directory(out_dir, "spanbert-import-hf", [hf_dir], force, "--out") as work:
        tokenizer.save(work)
        dictionary.save(os.path.join(work, "dict.txt"))
        side_configs = {side: side.load_config(hf_dir) for side in SIDE_HEADS}
        side_configs = {side: c for side, c in side_configs.items() if c is not None}
        cli = _training_command_line(work, config, side_configs, hf_dir)
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), cli))
        task = tasks.setup_task(cfg.task)
        # built as a checkpoint is loaded: of the shape given above, never of a run's checkpoint_last.pt that the
        # working folder's checkpoints/ (fairseq's default --save-dir) happens to hold
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = task.build_model(cfg.model, from_checkpoint=True)
            heads, task_state = _register_task_heads(model, ours, config, hf_dir)
        if "pooler.weight" in ours:
            model.keep_pooler()
        for side, side_config in side_configs.items():
            side_weights, line = side.restore(model, hf_dir, side_config, config["hidden_size"])
            ours.update(side_weights)
            heads += [line] if line else []
            for key, value in (side.task_state(side_config) if side.task_state else {}).items():
                task_state.setdefault(key, value)  # a native classification head's record comes first
        expected = model.state_dict()
        for key, value in ours.items():
            if key not in expected:
                raise InteropError(f"{hf_dir}: weight {key} has no counterpart in spanbert")
            if tuple(value.shape) != tuple(expected[key].shape):
                raise InteropError(f"{hf_dir}: weight {key} has shape {tuple(value.shape)}, config implies {tuple(expected[key].shape)}")
        fresh = sorted(k for k in expected if k not in ours and k not in ("lm_head.weight", "sbo_head.weight")
                       and not k.startswith("vocabulary."))  # the vocabulary record is vocab.txt's, not a weight
        missing = [k for k in fresh if k.startswith("encoder.")]  # only heads may start fresh
        if missing:
            raise InteropError(f"{hf_dir}: {len(missing)} encoder weights that config.json implies are not in the "
                               f"checkpoint, the first {missing[0]} (config.json: {config['num_hidden_layers']} layers, "
                               f"hidden size {config['hidden_size']}); fix config.json or the weights")
        model.load_state_dict({**expected, **{k: v.float() for k, v in ours.items()}})
        cfg.task.data = os.path.abspath(out_dir)
        # the model was built from the temporary folder; record the tokenizer where it will be
        model.vocabulary.set_tokenizer(tokenizer_description(tokenizer.kind, cfg.task.data))
        checkpoint_utils.torch_persistent_save(
            {"args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(),
             "criterion": None, "task_state": task_state,
             # a fresh start: no optimizer state, update 0, epoch 1
             "optimizer_history": [{"criterion_name": "SpanBertCriterion", "optimizer_name": "none",
                                    "lr_scheduler_state": {"best": None}, "num_updates": 0}],
             "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}}},
            os.path.join(work, "model.pt"),
        )
    notes, warnings = _import_notes(hf_dir, tokenizer, ours, ignored, untied_decoder)
    warnings += [case_note] if case_note else []
    classifier = f"classification_heads.{IMPORTED_HEAD}.out_proj.weight" in ours
    if config.get("problem_type") == "multi_label_classification" and classifier:
        warnings.append(f"{hf_dir}: problem_type multi_label_classification, but spanbert's classification heads are "
                        "single-label (softmax cross-entropy, one class per example): the classifier's weights are "
                        "imported as they are, and fine-tuning, prediction and the export treat it as single-label")
    for warning in warnings:
        logging.getLogger(__name__).warning(warning)
    return {"freshly_initialised": fresh, "ignored_hf_weights": ignored, "task_heads": heads, "notes": notes}


def _training_command_line(work, config, side_configs, hf_dir):
    """The fairseq-train arguments that build the imported model over the data folder ``work``: the encoder's shape
    and dropout from ``config.json``, the side heads' options, and a task of a side head's (preparing ``work`` for
    it) in place of pre-training's."""
    cli = [work, "--task", "spanbert_pretraining", "--criterion", "span_bert", "--arch", "spanbert_base", "--cpu",
           "--encoder-layers", str(config["num_hidden_layers"]), "--encoder-embed-dim", str(config["hidden_size"]),
           "--encoder-ffn-embed-dim", str(config["intermediate_size"]),
           "--encoder-attention-heads", str(config["num_attention_heads"]),
           "--max-positions", str(config["max_position_embeddings"]),
           "--type-vocab-size", str(config.get("type_vocab_size", 2)),
           "--layer-norm-eps", str(config.get("layer_norm_eps", 1e-12)),
           "--dropout", str(config.get("hidden_dropout_prob", 0.1)),
           "--attention-dropout", str(config.get("attention_probs_dropout_prob", 0.1)),
           "--init-std", str(config.get("initializer_range", 0.02)),
           "--pooler-dropout", str(config.get("hidden_dropout_prob", 0.1) if config.get("classifier_dropout") is None
                                   else config["classifier_dropout"]),
           "--tokens-per-sample", str(min(512, config["max_position_embeddings"]))]
    for side, side_config in side_configs.items():
        cli += side.model_arguments(side_config, hf_dir)
    for side, side_config in side_configs.items():
        if side.task_arguments is not None:  # e.g. a coreference checkpoint: its task replaces pre-training's
            at = cli.index("--tokens-per-sample")
            cli = [a for a in cli[:at] + cli[at + 2:] if a not in ("--task", "spanbert_pretraining", "--criterion",
                                                                  "span_bert")]
            cli += side.task_arguments(side_config, hf_dir, work)
    return cli


def _register_task_heads(model, ours, config, hf_dir):
    """Create the QA / classification heads the HF weights hold: (descriptions for the report, task state).

    The task state keeps what the weights cannot say (class names, a regression head), where fine-tuning tasks
    keep them, so an export gives them back.
    """
    heads, task_state = [], {}
    qa = ours.get("qa_outputs.weight")
    if qa is not None:
        if qa.dim() != 2 or qa.shape[0] != 2:
            raise InteropError(f"{hf_dir}: qa_outputs has {qa.shape[0]} outputs; extractive QA needs 2 (start, end)")
        model.register_qa_head()
        settings_path = os.path.join(hf_dir, QA_SETTINGS)
        recorded = read_qa_settings(settings_path) if os.path.isfile(settings_path) else None
        if recorded is not None and recorded["max_seq_length"] > config["max_position_embeddings"]:
            raise InteropError(f"{settings_path}: max_seq_length {recorded['max_seq_length']} exceeds the model's "
                               f"{config['max_position_embeddings']} positions (config.json max_position_embeddings)")
        if recorded is not None:
            task_state[QA_STATE_KEY] = recorded
        rules = "" if recorded is None else (f"; {'SQuAD 2.0' if recorded['with_negative'] else 'SQuAD 1.1'} rules "
                                             f"and windows of {recorded['max_seq_length']} from {QA_SETTINGS}")
        heads.append(f"qa_outputs (extractive QA: start and end logits{rules})")
    elif os.path.isfile(os.path.join(hf_dir, QA_SETTINGS)):
        raise InteropError(f"{os.path.join(hf_dir, QA_SETTINGS)}: the folder has no qa_outputs weights for these "
                           "settings (spanbert-export-hf writes both); copy the weights, or remove this file")
    out_proj = ours.get(f"classification_heads.{IMPORTED_HEAD}.out_proj.weight")
    if out_proj is not None:
        if f"classification_heads.{IMPORTED_HEAD}.dense.weight" not in ours:
            raise InteropError(f"{hf_dir}: a classifier without bert.pooler.dense weights; BertForSequenceClassification has both")
        num_classes, inner = out_proj.shape
        model.register_classification_head(IMPORTED_HEAD, num_classes=num_classes, inner_dim=inner)
        id2label = config.get("id2label") if isinstance(config.get("id2label"), dict) else {}
        names = [str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(num_classes)]
        if names != [f"LABEL_{i}" for i in range(num_classes)]:  # transformers' defaults are no names
            task_state["labels"] = names
        if config.get("problem_type") == "regression":
            task_state["regression"] = True
        kind = "regression" if task_state.get("regression") else f"{num_classes} classes: {', '.join(names)}"
        heads.append(f"classification head {IMPORTED_HEAD} (from bert.pooler + classifier; {kind})")
    return heads, task_state
