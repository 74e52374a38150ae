"""A fairseq-style hub interface for spanbert checkpoints (like ``RobertaHubInterface``)."""
import numbers
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..core.checkpoint_loading import CheckpointError
from ..core.user_dir import USER_DIR, register_plugin
from ..core.tokenization import load_tokenizer

MASK_PLACEHOLDER = "<mask>"
# Task-specific hub methods (``answer``, ``coref``) are functions their feature registers here, the way fairseq
# registers tasks by name: the model layer never imports a feature.
HUB_FEATURES = {}


def check_text(method: str, name: str, value) -> None:
    """A hub method's text argument: a string (a list is a batch, which the hub methods take one text at a time)."""
    if not isinstance(value, str):
        hint = "; one text a call" if isinstance(value, (list, tuple)) else ""
        raise TypeError(f"hub.{method}: {name} must be a string, got {type(value).__name__}{hint}")


def check_count(method: str, name: str, value, least: int = 1) -> int:
    """A hub method's count argument as an int: an integer of at least ``least`` (not a float, not a bool; numpy's
    integers are integers, as a count computed with numpy is one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"hub.{method}: {name} must be an integer of at least {least}, got {value!r}")
    return int(value)


def register_hub_feature(name: str):
    """Decorator: ``hub.<name>(...)`` calls the decorated ``function(hub, ...)``."""

    def register(function):
        if HUB_FEATURES.get(name, function) is not function:
            raise ValueError(f"hub feature {name!r} is registered twice")
        HUB_FEATURES[name] = function
        return function

    return register


def _model_name(state):
    """The registered fairseq model name a checkpoint was built with (e.g. 'spanbert', 'roberta')."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    if state.get("cfg") is not None:
        arch = state["cfg"]["model"]["_name"] if state["cfg"].get("model") is not None else None
    else:
        arch = getattr(state.get("args"), "arch", None)
    model_class = ARCH_MODEL_REGISTRY.get(arch, MODEL_REGISTRY.get(arch))
    return next((name for name, cls in MODEL_REGISTRY.items() if cls is model_class), arch)


def _stored_data(state):
    """The first data folder the checkpoint's task was given (``data`` may list shards a:b:c)."""
    if state.get("cfg") is not None:
        data = state["cfg"]["task"].get("data")
    else:
        data = getattr(state.get("args"), "data", None)
    return str(data).split(":")[0] if data else None


def resolve_data_dir(checkpoint, data_name_or_path, state):
    """The folder with dict.txt and the tokenizer files for a checkpoint, as an absolute path.

    A given path is taken relative to the working directory; a relative one falls back to the
    checkpoint's folder when that holds dict.txt. Without one: the checkpoint's folder when it holds
    dict.txt, else the folder recorded at training time (relative to the working directory, then to
    the checkpoint's folder, for checkpoints that stored a relative path).
    """
    checkpoint_dir = os.path.dirname(os.path.abspath(checkpoint))
    if data_name_or_path is None:
        if os.path.isfile(os.path.join(checkpoint_dir, "dict.txt")):
            return checkpoint_dir
        data_name_or_path, origin = _stored_data(state), "the data folder recorded in the checkpoint"
        if data_name_or_path is None:
            raise CheckpointError(checkpoint, "records no data folder; pass data_name_or_path= (--data) with dict.txt")
    else:
        origin = f"data folder {data_name_or_path}"
    candidates = [os.path.abspath(data_name_or_path)]
    if not os.path.isabs(data_name_or_path):
        candidates.append(os.path.abspath(os.path.join(checkpoint_dir, data_name_or_path)))
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "dict.txt")):
            return folder
    raise CheckpointError(
        checkpoint, f"{origin} has no dict.txt (tried {', '.join(candidates)}); "
        "pass data_name_or_path= (--data) with the folder holding dict.txt and the tokenizer files",
    )


def load_hub_model(model_dir, checkpoint_file="checkpoint_best.pt", data_name_or_path=None, **overrides):
    """Load a spanbert checkpoint and its task; the data folder holds dict.txt and the tokenizer files."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import overwrite_args_by_name

    path = checkpoint_file if os.path.isabs(checkpoint_file) else os.path.join(model_dir, checkpoint_file)
    if not os.path.isfile(path):
        raise CheckpointError(path, "no such checkpoint")
    register_plugin()  # the checkpoint's task and model
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    model_name = _model_name(state)
    if model_name != "spanbert":
        raise CheckpointError(path, f"not a spanbert checkpoint: its model is {model_name}")
    data_dir = resolve_data_dir(path, data_name_or_path, state)
    overrides = {"data": data_dir, "user_dir": USER_DIR, **overrides}
    # the state is read once; apply the overrides as fairseq's loader would
    if state.get("args") is not None:
        for key, value in overrides.items():
            setattr(state["args"], key, value)
    if state.get("cfg") is not None:
        overwrite_args_by_name(state["cfg"], overrides)
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], state=state)
    return SpanBertHubInterface(cfg, task, models[0], data_dir)


class SpanBertHubInterface(nn.Module):
    """encode/decode text, extract features, fill masks and run classification heads."""

    def __init__(self, cfg, task, model, data_dir):
        super().__init__()
        self.cfg, self.task, self.model = cfg, task, model
        self.dictionary = task.source_dictionary
        self.tokenizer = load_tokenizer(data_dir)
        self.register_buffer("_float_tensor", torch.tensor([0], dtype=torch.float))
        self.eval()

    @property
    def device(self):
        return self._float_tensor.device

    def encode(self, text: str, *addl_texts: str) -> torch.LongTensor:
        """``[CLS] text [SEP] (addl [SEP])*`` as token ids of the training dictionary."""
        for given in (text, *addl_texts):
            check_text("encode", "every text", given)
        d = self.dictionary
        ids = [d.bos()] + self.tokenizer.encode(text).ids.tolist() + [d.eos()]
        for extra in addl_texts:
            ids += self.tokenizer.encode(extra).ids.tolist() + [d.eos()]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, tokens: torch.LongTensor) -> str:
        """Text of token ids (one sequence), without the begin/end tokens and padding."""
        if tokens.dim() != 1:
            raise ValueError(f"decode takes one sequence of token ids (1-D); got shape {tuple(tokens.shape)}: "
                             "decode a batch row by row")
        d = self.dictionary
        drop = {d.bos(), d.eos(), d.pad()}
        return self.tokenizer.decode([t for t in tokens.tolist() if t not in drop])

    def _batch(self, tokens):
        tokens = tokens.unsqueeze(0) if tokens.dim() == 1 else tokens
        if tokens.size(-1) > self.model.max_positions():
            raise ValueError(f"{tokens.size(-1)} tokens exceed the model's {self.model.max_positions()} positions")
        return tokens.to(self.device)

    def segment_labels(self, tokens: torch.LongTensor) -> torch.LongTensor:
        """BERT's token types of ``encode(a, b)``: 0 up to the first ``[SEP]``, 1 after it (padding 0), as the
        fine-tuning tasks give them and transformers' tokenizers return them for pairs."""
        d = self.dictionary
        separators = tokens.eq(d.eos())
        # a model with one token type (type_vocab_size 1, as some imported BERTs) gives every token that one
        second = min(1, self.model.encoder.embeddings.token_type_embeddings.num_embeddings - 1)
        return ((separators.cumsum(-1) - separators.long()).clamp(max=second) * tokens.ne(d.pad())).long()

    def extract_features(self, tokens: torch.LongTensor, segment_labels=None) -> torch.Tensor:
        """Final hidden states, B x T x H; token types from :meth:`segment_labels` unless given."""
        tokens = self._batch(tokens)
        segment_labels = self.segment_labels(tokens) if segment_labels is None else segment_labels
        features, _ = self.model(tokens, segment_labels=segment_labels, features_only=True)
        return features

    @torch.no_grad()
    def fill_mask(self, masked_input: str, topk: int = 5):
        """Fill the single ``<mask>`` in the text: [(filled text, probability, predicted token)]."""
        check_text("fill_mask", "masked_input", masked_input)
        topk = check_count("fill_mask", "topk", topk)
        if masked_input.count(MASK_PLACEHOLDER) != 1:
            raise ValueError(f"fill_mask needs exactly one {MASK_PLACEHOLDER} in the input")
        before, after = masked_input.split(MASK_PLACEHOLDER)
        d = self.dictionary
        if topk > len(d):
            raise ValueError(f"fill_mask topk={topk}: must be at most the vocabulary size {len(d)}")
        before_ids, after_ids = self.tokenizer.encode(before.rstrip()).ids.tolist(), self.tokenizer.encode(after).ids.tolist()
        if d.mask_index in before_ids or d.mask_index in after_ids:
            raise ValueError(f"fill_mask: the text holds the tokenizer's own mask token ({d[d.mask_index]}) beside "
                             f"{MASK_PLACEHOLDER}; only {MASK_PLACEHOLDER} marks the word to fill")
        ids = [d.bos()] + before_ids + [d.mask_index] + after_ids + [d.eos()]
        tokens = torch.tensor(ids, dtype=torch.long)
        masked = (tokens == d.mask_index).unsqueeze(0).to(self.device)
        out, _ = self.model(self._batch(tokens), masked_tokens=masked)
        probs = F.softmax(out["mlm_logits"][0].float(), dim=-1)
        values, indices = probs.topk(topk)
        results = []
        for p, idx in zip(values.tolist(), indices.tolist()):
            filled = tokens.clone()
            filled[tokens == d.mask_index] = idx
            results.append((self.decode(filled), p, d[idx]))
        return results

    def register_classification_head(self, name: str, num_classes: Optional[int] = None, **kwargs):
        """Add (or replace) a [CLS] classification head, in the hub's mode (eval after loading), device and dtype."""
        self.model.register_classification_head(name, num_classes=num_classes, **kwargs)
        weight = self.model.encoder.embeddings.word_embeddings.weight
        self.model.classification_heads[name].to(device=weight.device, dtype=weight.dtype).train(self.training)

    def predict(self, head: str, tokens: torch.LongTensor, return_logits: bool = False, segment_labels=None):
        """Log-probabilities (or logits) of a classification head on [CLS]; a pair (``encode(a, b)``) gets its token
        types from :meth:`segment_labels` unless they are given. A head with one output (regression) gives its
        value, B x 1, either way (a softmax over one output is always 1)."""
        if head not in self.model.classification_heads:
            registered = ", ".join(self.model.classification_heads) or "none"
            raise ValueError(f"no classification head {head!r} (registered: {registered}); see register_classification_head")
        tokens = self._batch(tokens)
        segment_labels = self.segment_labels(tokens) if segment_labels is None else segment_labels
        logits, _ = self.model(tokens, segment_labels=segment_labels, classification_head_name=head)
        return logits if return_logits or logits.size(-1) == 1 else F.log_softmax(logits, dim=-1)

    def coref(self, text: str, genre=None, join_wrapped_lines: bool = False):
        """Coreference clusters of raw text in the order of their first mentions, each a list of ``{text, start,
        end}`` (character offsets, end exclusive), as ``spanbert-predict-coref --text`` gives them.

        Words are runs of letters/digits or single punctuation marks; a sentence ends after . ! or ? and at each line
        break (with ``join_wrapped_lines``, at blank lines only); the text is cut into segments as
        ``spanbert-prepare-coref`` does with the checkpoint's settings. ``genre``: an OntoNotes genre or ``other``
        (default: one the checkpoint trained, ``other`` where it does not record them).
        """
        return self._feature("coref")(self, text, genre, join_wrapped_lines)

    def classify(self, text: str, pair: Optional[str] = None) -> dict:
        """A sentence-classification checkpoint's prediction: ``{"label", "probabilities"}`` (``{"value"}`` for
        regression), the pair truncated longest-first to the prepared ``--max-seq-length`` as
        ``spanbert-predict-classification`` does."""
        return self._feature("classify")(self, text, pair)

    def answer(self, question: str, context: str, topk: int = 1, **kwargs):
        """Extractive QA: the ``topk`` answers (text, character start/end, score, probability).

        Long contexts are cut into windows as ``spanbert-prepare-qa`` does (the checkpoint's
        window settings when it was fine-tuned with extractive_qa).
        """
        return self._feature("answer")(self, question, context, topk, **kwargs)

    @staticmethod
    def _feature(name):
        if name not in HUB_FEATURES:
            raise ValueError(f"hub.{name} is provided by a feature that is not loaded; import spanbert_plugin.registry")
        return HUB_FEATURES[name]
