"""HuggingFace ``transformers`` interop: ``spanbert-export-hf`` and ``spanbert-import-hf``.

Parameter names of the spanbert encoder mirror ``BertModel``, so the mapping is
a prefix change: ``encoder.embeddings.*`` <-> ``bert.embeddings.*``,
``encoder.encoder.layer.N.*`` <-> ``bert.encoder.layer.N.*``, and the MLM head
``lm_head.{dense,LayerNorm,bias}`` <-> ``cls.predictions.{transform.dense,
transform.LayerNorm,bias}`` (its decoder is tied to the word embeddings on
both sides). The SBO head has no place in ``transformers``; export writes it to
``sbo_head.safetensors`` + ``sbo_config.json`` beside the model, and import
reads it back when present.
"""
import json
import os

import torch

from .errors import UsageError
from .file_utils import atomic_directory, check_destination

SBO_WEIGHTS, SBO_CONFIG = "sbo_head.safetensors", "sbo_config.json"
TOLERANCE = 1e-4
SAMPLE_TEXT = (
    "SpanBERT masks contiguous random spans rather than random tokens, and trains the span "
    "boundary representations to predict the entire content of the masked span."
)


class InteropError(UsageError):
    """Bad input for export/import: the message names the file and the problem."""


def to_hf_state_dict(state):
    """spanbert state dict -> BertForMaskedLM names (SBO and classification heads left out)."""
    out = {}
    for key, value in state.items():
        if key.startswith("encoder.embeddings.") or key.startswith("encoder.encoder."):
            out["bert." + key[len("encoder."):]] = value
        elif key.startswith("lm_head."):
            name = key[len("lm_head."):]
            if name == "bias":
                out["cls.predictions.bias"] = value
            elif name != "weight":  # tied decoder weight
                out["cls.predictions.transform." + name] = value
    return out


def from_hf_state_dict(hf_state):
    """BERT (HF) names -> spanbert names; unknown keys (pooler, NSP) are returned separately."""
    ours, ignored = {}, []
    for key, value in hf_state.items():
        name = key[len("bert."):] if key.startswith("bert.") else key
        if name.startswith("embeddings.") or name.startswith("encoder.layer."):
            ours["encoder." + name] = value
        elif name.startswith("cls.predictions.transform."):
            ours["lm_head." + name[len("cls.predictions.transform."):]] = value
        elif name in ("cls.predictions.bias", "cls.predictions.decoder.bias"):
            ours["lm_head.bias"] = value
        elif name == "embeddings.position_ids" or name.endswith("position_ids"):
            continue
        else:
            ignored.append(key)
    ours.pop("encoder.embeddings.position_ids", None)
    return ours, ignored


def bert_config_of(model_cfg, dictionary):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(dictionary),
        hidden_size=model_cfg.encoder_embed_dim,
        num_hidden_layers=model_cfg.encoder_layers,
        num_attention_heads=model_cfg.encoder_attention_heads,
        intermediate_size=model_cfg.encoder_ffn_embed_dim,
        hidden_act="gelu",
        hidden_dropout_prob=model_cfg.dropout,
        attention_probs_dropout_prob=model_cfg.attention_dropout,
        max_position_embeddings=model_cfg.max_positions,
        type_vocab_size=model_cfg.type_vocab_size,
        initializer_range=model_cfg.init_std,
        layer_norm_eps=model_cfg.layer_norm_eps,
        pad_token_id=dictionary.pad(),
        architectures=["BertForMaskedLM"],
    )


def unigram_tokenizer_from_spm(model_file):
    """A ``tokenizers`` Unigram tokenizer equivalent to a sentencepiece unigram model (same ids)."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    proto = sentencepiece_model_pb2.ModelProto()
    with open(model_file, "rb") as f:
        proto.ParseFromString(f.read())
    if proto.trainer_spec.model_type != 1:  # 1 = UNIGRAM
        raise InteropError(f"{model_file}: only sentencepiece unigram models can be exported")
    tok = Tokenizer(Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=proto.trainer_spec.unk_id,
                            byte_fallback=proto.trainer_spec.byte_fallback))
    spec = proto.normalizer_spec
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        # sentencepiece drops leading and trailing spaces and collapses runs (after its charsmap,
        # which turns tabs, newlines and other spaces into ' '); a kept trailing space would become a final '▁'
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("^ | $"), "")]
    tok.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spec.add_dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    return tok


def save_hf_tokenizer(tokenizer, dictionary, out_dir, max_length):
    """Tokenizer files ``AutoTokenizer`` loads, with ids equal to the fairseq dictionary's."""
    from transformers import BertTokenizerFast, PreTrainedTokenizerFast

    if tokenizer.kind == "wordpiece":
        hf = BertTokenizerFast(vocab={piece: i for i, piece in enumerate(tokenizer.vocab)},
                               do_lower_case=tokenizer.lowercase, strip_accents=tokenizer.lowercase,
                               tokenize_chinese_chars=True)
        tokenizer.save(out_dir)  # vocab.txt too: BERT directories carry it (and import reads it)
        os.remove(os.path.join(out_dir, "spanbert_tokenizer.json"))
    else:
        inner = unigram_tokenizer_from_spm(tokenizer.model_file)
        inner.add_special_tokens([dictionary.mask_word])  # appended: the dictionary's last id
        bos, eos = dictionary.bos_word, dictionary.eos_word
        from tokenizers import processors

        inner.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B {eos}",
            special_tokens=[(bos, dictionary.bos()), (eos, dictionary.eos())],
        )
        hf = PreTrainedTokenizerFast(
            tokenizer_object=inner, bos_token=bos, eos_token=eos, cls_token=bos, sep_token=eos,
            unk_token=dictionary.unk_word, pad_token=dictionary.pad_word, mask_token=dictionary.mask_word,
        )
    hf.model_max_length = max_length  # the model's positions: longer inputs would fail in transformers
    hf.save_pretrained(out_dir)
    return hf


@torch.no_grad()
def compare_outputs(hub, hf_model, text=SAMPLE_TEXT):
    """Max abs differences of final hidden states and MLM logits for the same text."""
    tokens = hub.encode(text)[: hub.model.max_positions()].unsqueeze(0)
    ours = hub.model
    ours.eval()
    hf_model.eval()
    features, _ = ours(tokens, features_only=True)
    ours_logits = ours.lm_head(features)
    hf_out = hf_model(input_ids=tokens, attention_mask=torch.ones_like(tokens), output_hidden_states=True)
    return {
        "hidden": (features - hf_out.hidden_states[-1]).abs().max().item(),
        "mlm_logits": (ours_logits - hf_out.logits).abs().max().item(),
    }


def export_hf(checkpoint, out_dir, data=None, force=False):
    """Write a transformers directory for a spanbert checkpoint, then check it against fairseq."""
    from safetensors.torch import save_file
    from transformers import BertForMaskedLM

    from .models.hub_interface import load_hub_model

    inputs = [checkpoint] + ([data] if data else [])
    check_destination(out_dir, "spanbert-export-hf", inputs, force, "--out")
    if not os.path.isfile(checkpoint):
        raise InteropError(f"{checkpoint}: no such checkpoint")
    # a relative --data is relative to the working directory (load_hub_model falls back to the checkpoint's folder)
    hub = load_hub_model(os.path.dirname(os.path.abspath(checkpoint)), os.path.abspath(checkpoint), data)
    model, d = hub.model.float(), hub.dictionary
    config = bert_config_of(model.cfg, d)
    hf_model = BertForMaskedLM(config)
    missing, unexpected = hf_model.load_state_dict(to_hf_state_dict(model.state_dict()), strict=False)
    missing = [k for k in missing if k not in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
               and not k.endswith("position_ids")]
    if missing or unexpected:
        raise InteropError(f"{checkpoint}: weights do not map onto BertForMaskedLM (missing {missing}, unexpected {unexpected})")
    with atomic_directory(out_dir, "spanbert-export-hf", inputs, force, "--out") as work:
        hf_model.save_pretrained(work, safe_serialization=True)
        save_hf_tokenizer(hub.tokenizer, d, work, model.max_positions())
        sbo = {k: v.contiguous() for k, v in model.sbo_head.state_dict().items() if k != "weight"}
        save_file(sbo, os.path.join(work, SBO_WEIGHTS))
        with open(os.path.join(work, SBO_CONFIG), "w") as f:
            json.dump({"position_slots": model.sbo_head.position_slots,
                       "position_dim": model.sbo_head.position_embeddings.embedding_dim,
                       "layer_norm_eps": model.cfg.layer_norm_eps,
                       "decoder": "tied to bert.embeddings.word_embeddings.weight",
                       "inputs": "[left boundary state; right boundary state; position embedding of offset-1]"}, f, indent=2)
        # self-check: reload from disk with transformers and compare with fairseq again
        reloaded = BertForMaskedLM.from_pretrained(work)
        diffs = compare_outputs(hub, reloaded)
        if max(diffs.values()) > TOLERANCE:
            raise InteropError(f"export check failed: transformers and fairseq differ by {diffs} (tolerance {TOLERANCE})")
    return diffs


REQUIRED_CONFIG_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size", "max_position_embeddings")


def _read_json(path):
    """A JSON object from a file; malformed JSON is an InteropError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise InteropError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise InteropError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _read_weights(path):
    """Tensors of a safetensors or torch file; a damaged or truncated file is an InteropError."""
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            weights = load_file(path)
        else:
            weights = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any reader failure means a damaged file
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise InteropError(f"{path}: damaged or truncated weights file ({reason})") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise InteropError(f"{path}: expected a dictionary of tensors (a state dict)")
    return weights


def _read_hf_dir(hf_dir):
    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        raise InteropError(f"{config_path}: no such file (not a HuggingFace model directory?)")
    config = _read_json(config_path)
    if config.get("model_type") != "bert":
        raise InteropError(f"{config_path}: model_type {config.get('model_type')!r} is not a BERT model (expected 'bert')")
    for key in ("pre_layer_norm", "pre_layernorm", "normalize_before", "pre_norm"):
        if config.get(key):
            raise InteropError(f"{config_path}: {key}=true (pre-LayerNorm) is not BERT's post-LayerNorm encoder")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise InteropError(f"{config_path}: position_embedding_type {config['position_embedding_type']!r}; only absolute positions map onto spanbert")
    if config.get("hidden_act", "gelu") not in ("gelu", "gelu_python"):
        raise InteropError(f"{config_path}: hidden_act {config.get('hidden_act')!r}; spanbert uses exact (erf) gelu")
    for key in REQUIRED_CONFIG_KEYS:
        if not isinstance(config.get(key), int) or isinstance(config.get(key), bool) or config[key] <= 0:
            raise InteropError(f"{config_path}: {key} must be a positive integer, found {config.get(key)!r}")
    safetensors_path = os.path.join(hf_dir, "model.safetensors")
    bin_path = os.path.join(hf_dir, "pytorch_model.bin")
    if os.path.isfile(safetensors_path):
        weights = _read_weights(safetensors_path)
    elif os.path.isfile(bin_path):
        weights = _read_weights(bin_path)
    else:
        raise InteropError(f"{hf_dir}: no model.safetensors or pytorch_model.bin")
    vocab_path = os.path.join(hf_dir, "vocab.txt")
    if not os.path.isfile(vocab_path):
        raise InteropError(f"{vocab_path}: no such file (a WordPiece vocab.txt is required)")
    return config, weights, vocab_path


def import_hf(hf_dir, out_dir, force=False):
    """Turn a HuggingFace BERT directory into a spanbert checkpoint + data folder; return a report."""
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from .data.dictionary import SpanBertDictionary
    from .tokenization import WordPieceTokenizer, TokenizerError

    check_destination(out_dir, "spanbert-import-hf", [hf_dir], force, "--out")
    config, weights, vocab_path = _read_hf_dir(hf_dir)
    try:
        lowercase = False
        tok_cfg = os.path.join(hf_dir, "tokenizer_config.json")
        if os.path.isfile(tok_cfg):
            lowercase = bool(_read_json(tok_cfg).get("do_lower_case", False))
        tokenizer = WordPieceTokenizer(vocab_path, lowercase=lowercase)
    except TokenizerError as err:
        raise InteropError(str(err)) from None
    if len(tokenizer.vocab) != config["vocab_size"]:
        raise InteropError(f"{vocab_path}: {len(tokenizer.vocab)} tokens, but config.json says vocab_size {config['vocab_size']}")
    ours, ignored = from_hf_state_dict(weights)
    embed = ours.get("encoder.embeddings.word_embeddings.weight")
    if embed is None:
        raise InteropError(f"{hf_dir}: no embeddings.word_embeddings.weight in the weights")
    if embed.shape[0] != len(tokenizer.vocab):
        raise InteropError(f"{hf_dir}: word embeddings have {embed.shape[0]} rows but vocab.txt has {len(tokenizer.vocab)} tokens")

    with atomic_directory(out_dir, "spanbert-import-hf", [hf_dir], force, "--out") as work:
        tokenizer.save(work)
        SpanBertDictionary.from_tokenizer(tokenizer).save(os.path.join(work, "dict.txt"))
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
               "--tokens-per-sample", str(min(512, config["max_position_embeddings"]))]
        sbo_config_path = os.path.join(hf_dir, SBO_CONFIG)
        sbo_config = _read_json(sbo_config_path) if os.path.isfile(sbo_config_path) else None
        if sbo_config:
            cli += ["--sbo-position-slots", str(sbo_config["position_slots"]), "--sbo-position-dim", str(sbo_config["position_dim"])]
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), cli))
        task = tasks.setup_task(cfg.task)
        model = task.build_model(cfg.model)
        if sbo_config:
            from safetensors.torch import load_file

            ours.update({"sbo_head." + k: v for k, v in load_file(os.path.join(hf_dir, SBO_WEIGHTS)).items()})
        expected = model.state_dict()
        for key, value in ours.items():
            if key not in expected:
                raise InteropError(f"{hf_dir}: weight {key} has no counterpart in spanbert")
            if tuple(value.shape) != tuple(expected[key].shape):
                raise InteropError(f"{hf_dir}: weight {key} has shape {tuple(value.shape)}, config implies {tuple(expected[key].shape)}")
        fresh = sorted(k for k in expected if k not in ours and k not in ("lm_head.weight", "sbo_head.weight"))
        model.load_state_dict({**expected, **{k: v.float() for k, v in ours.items()}})
        cfg.task.data = os.path.abspath(out_dir)
        checkpoint_utils.torch_persistent_save(
            {"args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(),
             "criterion": None, "task_state": {},
             # a fresh start: no optimizer state, update 0, epoch 1
             "optimizer_history": [{"criterion_name": "SpanBertCriterion", "optimizer_name": "none",
                                    "lr_scheduler_state": {"best": None}, "num_updates": 0}],
             "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}}},
            os.path.join(work, "model.pt"),
        )
    return {"freshly_initialised": fresh, "ignored_hf_weights": ignored}
