"""The ``spanbert`` model: a BERT encoder with MLM and span-boundary (SBO) heads.

Both heads live in the model (so DDP and checkpoints cover them), share the
input embedding matrix as their decoder weight, and run only on masked
positions: no B x T x V logits are ever formed.
"""
import logging
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from fairseq.dataclass import FairseqDataclass
from fairseq.models import (BaseFairseqModel, FairseqEncoder, FairseqEncoderModel, register_model,
                            register_model_architecture)
from torch import nn

from ..core.dictionary import describe_tokenizer, symbol_hashes
from ..core.errors import UsageError
from .layers import (BertEmbeddings, BertStack, ClassificationHead, MaskedLMHead, SpanBoundaryHead, init_bert_weights,
                     padding_mask_of)
from .relation_head import RelationHead

logger = logging.getLogger(__name__)


@dataclass
class SpanBertConfig(FairseqDataclass):
    encoder_layers: int = field(default=12, metadata={"help": "number of encoder layers"})
    encoder_embed_dim: int = field(default=768, metadata={"help": "hidden size"})
    encoder_ffn_embed_dim: int = field(default=3072, metadata={"help": "feed-forward inner size"})
    encoder_attention_heads: int = field(default=12, metadata={"help": "attention heads per layer"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings and every block output"})
    attention_dropout: float = field(default=0.1, metadata={"help": "dropout on attention weights"})
    pooler_dropout: float = field(default=0.1, metadata={"help": "dropout in classification heads"})
    max_positions: int = field(default=512, metadata={"help": "learned absolute positions (from 0)"})
    type_vocab_size: int = field(default=2, metadata={"help": "token-type (segment) embeddings"})
    layer_norm_eps: float = field(default=1e-12, metadata={"help": "LayerNorm epsilon (BERT: 1e-12)"})
    init_std: float = field(default=0.02, metadata={"help": "std of the N(0, std) initialisation"})
    sbo_position_slots: int = field(
        default=15, metadata={"help": "SBO relative-position slots; span tokens past the last get MLM only"}
    )
    sbo_position_dim: int = field(default=200, metadata={"help": "SBO relative-position embedding size"})


class SpanBertEncoder(FairseqEncoder):
    """Embeddings + post-LN stack, HuggingFace ``BertModel`` names (``embeddings``, ``encoder``)."""

    def __init__(self, cfg: SpanBertConfig, dictionary):
        super().__init__(dictionary)
        self.padding_idx = dictionary.pad()
        self.max_positions_ = cfg.max_positions
        self.embeddings = BertEmbeddings(
            len(dictionary), cfg.encoder_embed_dim, cfg.max_positions, cfg.type_vocab_size,
            dictionary.pad(), cfg.layer_norm_eps, cfg.dropout,
        )
        self.encoder = BertStack(
            cfg.encoder_layers, hidden=cfg.encoder_embed_dim, heads=cfg.encoder_attention_heads,
            ffn=cfg.encoder_ffn_embed_dim, eps=cfg.layer_norm_eps, dropout=cfg.dropout,
            attention_dropout=cfg.attention_dropout,
        )
        self.length_multiple = 1  # set by SpanBertModel.compile_layers

    def forward(self, src_tokens, segment_labels=None, attention_probs_out=None, attention_drop_masks=None,
                has_padding=None, **unused):
        """Final hidden states; the two AD-DROP arguments are described in ``BertStack.forward``.

        ``has_padding``: whether ``src_tokens`` holds padding, where the host knows it (the collaters say so). False
        runs attention unmasked, as ``transformers`` does after asking the device, which waits for it; on a GPU
        that also lets attention take its fastest kernel, which takes no mask. None: the mask is made from the
        tokens.
        """
        length = src_tokens.size(1)
        if length > self.max_positions_:
            raise ValueError(f"input of {length} tokens exceeds the model's {self.max_positions_} positions")
        if self.length_multiple > 1 and not attention_probs_out and not attention_drop_masks:
            src_tokens, segment_labels = self._pad_to_length_multiple(src_tokens, segment_labels)
            if src_tokens.size(1) != length:
                has_padding = True
        padding_mask = padding_mask_of(src_tokens, self.padding_idx, has_padding)
        x = self.encoder(self.embeddings(src_tokens, segment_labels), padding_mask,
                         attention_probs_out, attention_drop_masks)
        return x[:, :length] if x.size(1) != length else x

    def _pad_to_length_multiple(self, src_tokens, segment_labels):
        """Padding (masked out of attention, cut off again after the stack) up to a multiple of ``length_multiple``
        positions, at most the model's: a compiled stack then sees a handful of lengths."""
        length = src_tokens.size(1)
        padded = min(-(-length // self.length_multiple) * self.length_multiple, self.max_positions_)
        if padded == length:
            return src_tokens, segment_labels
        src_tokens = F.pad(src_tokens, (0, padded - length), value=self.padding_idx)
        if segment_labels is not None:
            segment_labels = F.pad(segment_labels, (0, padded - length))
        return src_tokens, segment_labels

    def max_positions(self):
        return self.max_positions_


class VocabularyRecord(nn.Module):
    """The vocabulary the embeddings belong to, saved with the weights: one hash per symbol and the tokenizer's name.

    Buffers, so every checkpoint (fairseq-train's, the hub's, an import's) carries
    them; integer dtypes, so fp16/bf16 conversion leaves them alone. Loading a
    checkpoint into a model built over another dictionary compares the two
    (``SpanBertModel._check_vocabulary``).
    """

    def __init__(self, dictionary):
        super().__init__()
        self.register_buffer("symbol_hashes", torch.from_numpy(symbol_hashes(dictionary.symbols)))
        self.register_buffer("tokenizer", torch.empty(0, dtype=torch.uint8))
        self.set_tokenizer(describe_tokenizer(dictionary))

    def set_tokenizer(self, description: str) -> None:
        """Record the tokenizer as 'KIND (FILE)', e.g. when the folder read at build time is moved into place later."""
        self.tokenizer = torch.tensor(list(description.encode("utf-8")), dtype=torch.uint8)

    @staticmethod
    def tokenizer_of(state_dict, prefix):
        return bytes(state_dict[prefix + "tokenizer"].tolist()).decode("utf-8", "replace")


class PoolerRecord(nn.Module):
    """An imported BERT's pooler (``bert.pooler.dense``: dense + tanh on the first token), kept so that the export
    writes it back; spanbert never runs it (a classification head has a dense layer of its own).

    Buffers, not parameters: no training updates it and DDP waits for no gradient of it; checkpoints carry it.
    """

    def __init__(self, dim, device=None, dtype=None):
        super().__init__()
        self.register_buffer("weight", torch.zeros(dim, dim, device=device, dtype=dtype))
        self.register_buffer("bias", torch.zeros(dim, device=device, dtype=dtype))

    def forward(self, features):
        """BERT's pooled output of B x T x H features: tanh(dense(first token))."""
        return torch.tanh(F.linear(features[:, 0], self.weight, self.bias))


@register_model("spanbert", dataclass=SpanBertConfig)
class SpanBertModel(FairseqEncoderModel):
    """SpanBERT: encoder, tied MLM head and SBO head; optional classification, QA, relation and coreference heads."""

    def __init__(self, cfg: SpanBertConfig, encoder: SpanBertEncoder):
        super().__init__(encoder)
        self.cfg = cfg
        embed = encoder.embeddings.word_embeddings.weight
        eps = cfg.layer_norm_eps
        self.lm_head = MaskedLMHead(cfg.encoder_embed_dim, embed, eps)
        self.sbo_head = SpanBoundaryHead(cfg.encoder_embed_dim, embed, cfg.sbo_position_slots, cfg.sbo_position_dim, eps)
        self.classification_heads = nn.ModuleDict()
        # {"classification_heads.NAME" or "relation_heads.NAME": the saved output rows in this model's class order,
        # or None for fresh ones}: applied at the next checkpoint load
        self._saved_head_rows = {}
        self.qa_outputs = None  # extractive QA head (start, end), created by register_qa_head
        self.relation_heads = nn.ModuleDict()  # relation extraction, created by register_relation_head
        self.coref_head = None  # coreference (spanbert_plugin.coref.head.CorefHead), set by register_coref_head
        self.pooler = None  # an imported BERT's pooler, for the export only (PoolerRecord), set by keep_pooler
        # a training run starting from another checkpoint sets it: saved task heads the run has not registered are left
        # out at the load (_leave_out_heads_this_run_does_not_train)
        self.only_heads_of_this_run = False
        self.apply(lambda m: init_bert_weights(m, cfg.init_std))
        self.vocabulary = VocabularyRecord(encoder.dictionary)

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="checkpoint_best.pt", data_name_or_path=None, **kwargs):
        """Hub interface (encode, decode, extract_features, fill_mask, heads), like RobertaModel's."""
        from .hub_interface import load_hub_model

        return load_hub_model(model_name_or_path, checkpoint_file, data_name_or_path, **kwargs)

    @classmethod
    def build_model(cls, cfg, task):
        return cls(cfg, SpanBertEncoder(cfg, task.source_dictionary))

    def leave_pretraining_heads_out_of_training(self):
        """For fine-tuning, which never runs the MLM and SBO heads: their own parameters (not the decoder weight
        they share with the word embeddings) stop requiring gradients. PyTorch's DDP then does not wait for
        gradients that never come (without this, every multi-process fine-tuning run with fairseq's default
        ``--ddp-backend pytorch_ddp`` stopped at its first update), and fairseq's optimizer leaves them out: they
        received no gradient and so no update before either. Checkpoints keep them."""
        self._leave_out_of_training(self.lm_head, self.sbo_head)

    def leave_sbo_head_out_of_training(self):
        """Pre-training with --sbo-weight 0 never runs the SBO head: as for fine-tuning's heads, its own parameters
        stop requiring gradients (else PyTorch's DDP stops at the second update, waiting for their gradients)."""
        self._leave_out_of_training(self.sbo_head)

    def _leave_out_of_training(self, *heads):
        encoder = {id(p) for p in self.encoder.parameters()}  # the decoder weight the heads share stays trained
        for head in heads:
            for parameter in head.parameters():
                if id(parameter) not in encoder:
                    parameter.requires_grad_(False)

    def compile_layers(self, length_multiple: int = 1, **compile_options):
        """``torch.compile`` each transformer layer's forward (and with it its backward), in place: parameter
        names, state dicts and checkpoints stay as they are, and DDP wraps the model as before. The heads, the
        embeddings and the losses stay eager (their shapes change with every batch's masked tokens). The layers
        share one compiled graph per input shape; sequences are padded to a multiple of ``length_multiple``
        (``--required-seq-len-multiple``) so that few shapes occur. ``compile_options`` go to ``torch.compile``."""
        for layer in self.encoder.encoder.layer:
            layer.compile(**compile_options)
        self.encoder.length_multiple = max(1, int(length_multiple))

    def forward(
        self,
        src_tokens,
        src_lengths=None,
        segment_labels=None,
        masked_tokens: Optional[torch.Tensor] = None,
        span_left: Optional[torch.Tensor] = None,
        span_right: Optional[torch.Tensor] = None,
        span_offset: Optional[torch.Tensor] = None,
        masked_index: Optional[torch.Tensor] = None,
        sbo_index: Optional[torch.Tensor] = None,
        features_only: bool = False,
        classification_head_name: Optional[str] = None,
        qa: bool = False,
        relation_head_name: Optional[str] = None,
        entity_positions: Optional[torch.Tensor] = None,
        coref: Optional[dict] = None,
        attention_probs_out: Optional[dict] = None,
        attention_drop_masks: Optional[dict] = None,
        has_padding: Optional[bool] = None,
        **unused,
    ):
        """Features (B x T x H), class logits, QA (start, end) logits, relation logits, the coreference head's outputs
        (one document), or MLM/SBO logits on masked positions.

        ``attention_probs_out`` / ``attention_drop_masks`` (AD-DROP) are described in ``BertStack.forward``,
        ``has_padding`` in ``SpanBertEncoder.forward``.
        """
        x = self.encoder(src_tokens, segment_labels=segment_labels, attention_probs_out=attention_probs_out,
                         attention_drop_masks=attention_drop_masks, has_padding=has_padding)
        if coref is not None:  # one document's segments: the head sees its real tokens, flattened in order
            return self.coref_head(x[src_tokens.ne(self.encoder.padding_idx)], **coref), {}
        if qa:
            start, end = self.qa_outputs(x).unbind(dim=-1)
            return (start, end), {}
        if relation_head_name is not None:  # entity_positions: B x 2 subject/object start markers
            return self.relation_heads[relation_head_name](x, entity_positions), {}
        if classification_head_name is not None:  # before features_only: fairseq's sentence_prediction passes both
            return self.classification_heads[classification_head_name](x), {}
        if features_only:
            return x, {}
        return self.pretraining_heads(x, masked_tokens, span_left, span_right, span_offset, masked_index, sbo_index), {}

    def pretraining_heads(self, features, masked_tokens=None, span_left=None, span_right=None, span_offset=None,
                          masked_index=None, sbo_index=None):
        """MLM logits for masked positions, and SBO logits when span boundaries are given.

        ``masked_index`` (the masked positions, flat in row-major order) and ``sbo_index`` (which of those have an
        SBO position slot) may come from the data loader, computed on the host: selecting with them never waits
        for the device, where a boolean mask (``masked_tokens``) needs a ``nonzero`` that does. ``out["sbo_index"]``
        says which MLM rows the SBO rows belong to.
        """
        length, dim = features.shape[1], features.shape[2]
        flat = features.reshape(-1, dim)
        if masked_index is None:
            if masked_tokens is None:
                masked_tokens = features.new_ones(features.shape[:2], dtype=torch.bool)
            masked_index = masked_tokens.reshape(-1).nonzero().squeeze(1)
        out = {"mlm_logits": self.lm_head(flat.index_select(0, masked_index))}
        if span_left is not None:
            offsets = span_offset.reshape(-1).index_select(0, masked_index)
            if sbo_index is None:
                # span tokens past the last position slot get MLM but no SBO (released setting)
                sbo_index = (offsets <= self.sbo_head.position_slots).nonzero().squeeze(1)
            positions = masked_index.index_select(0, sbo_index)
            row_start = positions - positions % length
            left = row_start + span_left.reshape(-1).index_select(0, positions)
            right = row_start + span_right.reshape(-1).index_select(0, positions)
            out["sbo_logits"] = self.sbo_head(flat.index_select(0, left), flat.index_select(0, right),
                                              offsets.index_select(0, sbo_index))
            out["sbo_index"] = sbo_index
        return out

    def register_classification_head(self, name, num_classes, inner_dim=None):
        """Add (or replace) a [CLS] classification head."""
        dim = self.cfg.encoder_embed_dim
        self.classification_heads[name] = ClassificationHead(dim, inner_dim or dim, num_classes, self.cfg.pooler_dropout)
        self.classification_heads[name].apply(lambda m: init_bert_weights(m, self.cfg.init_std))

    def register_qa_head(self):
        """Add the extractive-QA head: one linear layer to start and end logits (HF ``qa_outputs``)."""
        if self.qa_outputs is None:
            self.qa_outputs = nn.Linear(self.cfg.encoder_embed_dim, 2)
            init_bert_weights(self.qa_outputs, self.cfg.init_std)

    def keep_pooler(self):
        """Add the record of an imported BERT's pooler (``PoolerRecord``; the weights come with the checkpoint)."""
        if self.pooler is None:
            embed = self.encoder.embeddings.word_embeddings.weight  # a checkpoint may add it after the model moved
            self.pooler = PoolerRecord(self.cfg.encoder_embed_dim, embed.device, embed.dtype)

    def register_relation_head(self, name, num_classes, pooling="cls"):
        """Add (or replace) a relation head: ``cls`` or ``entity_start`` pooling (``RelationHead``)."""
        head = RelationHead(self.cfg.encoder_embed_dim, num_classes, pooling, self.cfg.pooler_dropout)
        head.apply(lambda m: init_bert_weights(m, self.cfg.init_std))
        self.relation_heads[name] = head

    def _check_vocabulary(self, state_dict, prefix, old, new):
        """UsageError unless the data's dictionary is the checkpoint's, possibly with symbols appended.

        Checkpoints written before the vocabulary record existed are checked by size only.
        """
        record = prefix + "vocabulary."
        ours = f"{describe_tokenizer(self.encoder.dictionary)}; {new} symbols"
        if record + "symbol_hashes" not in state_dict:
            if old > new:
                raise UsageError(
                    f"the checkpoint's vocabulary has {old} symbols but the data's dict.txt has {new} ({ours}): prepare "
                    "the data with --tokenizer-from the checkpoint's data folder (the same dict.txt and tokenizer)"
                )
            return
        theirs = f"{VocabularyRecord.tokenizer_of(state_dict, record)}; {old} symbols"
        saved = state_dict[record + "symbol_hashes"]
        if old > new:
            problem = f"the checkpoint's vocabulary has {old} symbols but the data's dict.txt has {new}"
        else:
            differs = (saved != self.vocabulary.symbol_hashes[:old].to(saved)).nonzero()
            if not len(differs):
                return
            first = int(differs[0])
            problem = (f"the data's dict.txt does not start with the checkpoint's vocabulary (symbol {first} is "
                       f"{self.encoder.dictionary.symbols[first]!r} in the data, another in the checkpoint; or the "
                       "checkpoint's record of it was altered: fairseq's average_checkpoints.py averages its integer "
                       "buffers)")
        raise UsageError(
            f"{problem}: the checkpoint was trained with {theirs}, the data was prepared with {ours}; prepare the "
            "data with --tokenizer-from the checkpoint's data folder (the same dict.txt and tokenizer)"
        )

    def register_coref_head(self, head: nn.Module):
        """Set the coreference head (built by the coreference task from its options); fresh BERT-style weights."""
        head.apply(lambda m: init_bert_weights(m, self.cfg.init_std))
        self.coref_head = head

    def _grow_vocabulary(self, state_dict, prefix):
        """Give a checkpoint rows for symbols appended to the dictionary since (e.g. entity markers).

        Old rows stay; new embedding rows keep this model's fresh N(0, init_std)
        values and the MLM/SBO biases fresh zeros, as BERT initialises them.
        The data's vocabulary must extend the checkpoint's (``_check_vocabulary``).
        """
        own = self.state_dict()
        embed = "encoder.embeddings.word_embeddings.weight"
        if prefix + embed in state_dict:
            old, new = state_dict[prefix + embed].size(0), own[embed].size(0)
            self._check_vocabulary(state_dict, prefix, old, new)
        for key in ("vocabulary.symbol_hashes", "vocabulary.tokenizer"):  # the record follows the grown vocabulary
            state_dict[prefix + key] = own[key]
        if prefix + embed not in state_dict or old == new:
            return
        for key in (embed, "lm_head.weight", "sbo_head.weight", "lm_head.bias", "sbo_head.bias"):
            saved = state_dict.get(prefix + key)
            if saved is not None and saved.size(0) == old:
                state_dict[prefix + key] = torch.cat([saved, own[key][old:].to(saved)])
        logger.info(f"checkpoint vocabulary grown from {old} to {new} symbols: {new - old} new embedding rows "
                    f"drawn from N(0, {self.cfg.init_std}), MLM/SBO biases 0")

    def upgrade_state_dict_named(self, state_dict, name):
        """Create task heads found in a checkpoint; keep new heads' fresh weights; grow the vocabulary."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name else ""
        self._grow_vocabulary(state_dict, prefix)
        if self.only_heads_of_this_run:
            self._leave_out_heads_this_run_does_not_train(state_dict, prefix)
        for key in [k for k in state_dict if k.startswith(prefix + "relation_heads.") and k.endswith(".dense.weight")]:
            head = key[len(prefix + "relation_heads.") : -len(".dense.weight")]
            if head not in self.relation_heads:
                out_proj = state_dict[f"{prefix}relation_heads.{head}.out_proj.weight"]
                self.register_relation_head(head, out_proj.size(0), RelationHead.pooling_of(state_dict[key]))
            else:
                self._drop_reshaped_head(state_dict, f"{prefix}relation_heads.{head}.", "relation_heads", head)
                self._reorder_saved_head(state_dict, f"{prefix}relation_heads.{head}.", "relation_heads", head)
        for head, module in self.relation_heads.items():
            for sub, value in module.state_dict().items():
                state_dict.setdefault(f"{prefix}relation_heads.{head}.{sub}", value)
        coref_keys = [k for k in state_dict if k.startswith(prefix + "coref_head.")]
        if self.coref_head is not None:
            for sub, value in self.coref_head.state_dict().items():
                if sub == "coarse_scores_once" and coref_keys:
                    continue  # a saved head without it was trained before: the head's loading records that
                state_dict.setdefault(f"{prefix}coref_head.{sub}", value)
        elif coref_keys:  # a coreference checkpoint fine-tuned for another task: its head is not used
            for key in coref_keys:
                del state_dict[key]
        if prefix + "pooler.weight" in state_dict:
            self.keep_pooler()
        if prefix + "qa_outputs.weight" in state_dict:
            self.register_qa_head()
        if self.qa_outputs is not None:
            for sub, value in self.qa_outputs.state_dict().items():
                state_dict.setdefault(f"{prefix}qa_outputs.{sub}", value)
        for key in list(state_dict.keys()):
            if key.startswith(prefix + "classification_heads.") and key.endswith(".out_proj.weight"):
                head = key[len(prefix + "classification_heads.") : -len(".out_proj.weight")]
                if head not in self.classification_heads:
                    num_classes, inner = state_dict[key].shape
                    self.register_classification_head(head, num_classes, inner)
                else:
                    self._drop_reshaped_head(state_dict, f"{prefix}classification_heads.{head}.",
                                             "classification_heads", head)
                    self._reorder_saved_head(state_dict, f"{prefix}classification_heads.{head}.",
                                             "classification_heads", head)
        for head, module in self.classification_heads.items():
            for sub, value in module.state_dict().items():
                state_dict.setdefault(f"{prefix}classification_heads.{head}.{sub}", value)

    def _leave_out_heads_this_run_does_not_train(self, state_dict, prefix):
        """Delete the saved QA, classification and relation heads this model has not registered, with one warning.

        Kept, such a head (a QA head in a classification fine-tuning) would never train while the encoder under it
        changes, and be saved and exported (``BertForQuestionAnswering``) beside the run's own head as if it still
        worked. fairseq's RoBERTa leaves them out likewise."""
        def unregistered_head(key):
            parts = key[len(prefix):].split(".")
            if parts[0] == "qa_outputs" and self.qa_outputs is None:
                return "qa_outputs"
            if parts[0] in ("classification_heads", "relation_heads") and parts[1] not in getattr(self, parts[0]):
                return f"{parts[0]}.{parts[1]}"
            return None

        stale = {key: head for key in state_dict if key.startswith(prefix) and (head := unregistered_head(key))}
        if not stale:
            return
        for key in stale:
            del state_dict[key]
        logger.warning(f"the starting checkpoint's {', '.join(sorted(set(stale.values())))} left out: this run does not "
                       "train it (the encoder changes under it), so it would be saved and exported stale")

    def map_saved_head(self, group, head, rows):
        """At the next checkpoint load, take the saved head's (``group``: ``classification_heads`` or
        ``relation_heads``) output rows ``rows`` (one saved class index per class of this model), or with ``rows``
        None leave its output layer out (fresh weights): the saved head was trained for other classes or in another
        order (the task compares the labels)."""
        self._saved_head_rows[f"{group}.{head}"] = rows

    def _reorder_saved_head(self, state_dict, head_prefix, group, head):
        if f"{group}.{head}" not in self._saved_head_rows:
            return
        rows = self._saved_head_rows.pop(f"{group}.{head}")
        for key in (head_prefix + "out_proj.weight", head_prefix + "out_proj.bias"):
            if key in state_dict:  # not left out already for another shape
                if rows is None:
                    del state_dict[key]
                else:
                    state_dict[key] = state_dict[key][rows]

    def _drop_reshaped_head(self, state_dict, head_prefix, group, head):
        """Forget a saved classification or relation head whose shape differs from this model's (a new number of
        classes, another pooling). As RoBERTa does: the head registered by the task keeps its fresh weights.
        """
        own = getattr(self, group)[head].state_dict()
        saved = {k[len(head_prefix):]: v for k, v in state_dict.items() if k.startswith(head_prefix)}
        if all(sub in own and own[sub].shape == value.shape for sub, value in saved.items()):
            return
        for sub in saved:
            del state_dict[head_prefix + sub]
        logger.warning(
            f"{group.replace('_heads', '')} head {head!r}: the checkpoint's has another shape (outputs "
            f"{saved['out_proj.weight'].size(0)}, this model's {own['out_proj.weight'].size(0)}; input width "
            f"{saved['dense.weight'].size(1)}, this model's {own['dense.weight'].size(1)}); the checkpoint's head is "
            "left out and the new one starts from fresh weights"
        )

    def max_positions(self):
        return self.cfg.max_positions

    # fairseq's trainer and task call these two before every update; on a GPU a small model's update is bound by
    # the host, and fairseq's ways of walking the modules cost more host time than the walk needs

    def train(self, mode: bool = True):
        """``nn.Module.train``, set in one pass over the modules instead of one recursive call per module (0.25 ms
        against 0.09 ms for all-MiniLM-L6-v2's 110 modules, twice per update: benchmarks/cpu_speed/update_cost/
        module_walks.py). A module with a ``train`` of its own gets torch's recursive walk, which calls it."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        modules = list(self.modules())
        if any(type(module).train is not nn.Module.train for module in modules[1:]):
            return super().train(mode)
        for module in modules:
            object.__setattr__(module, "training", mode)  # what nn.Module.__setattr__ ends in for a bool
        return self

    def set_num_updates(self, num_updates):
        """fairseq's ``BaseFairseqModel.set_num_updates``: every module with a ``set_num_updates`` of its own gets the
        number, once. fairseq's asks each module for the method (a raised AttributeError for each without one) and
        its encoder class walks the encoder's modules again (0.4 ms against 0.1 ms per update for all-MiniLM-L6-v2);
        fairseq's model and encoder classes only pass the number on, so the one walk skips them."""
        for module in self.modules():
            method = getattr(type(module), "set_num_updates", None)
            if method is not None and method not in NUMBER_PASSERS:
                module.set_num_updates(num_updates)


# set_num_updates of fairseq's model and encoder base classes (and of this model): each passes the number on to
# the modules under it and does nothing else
NUMBER_PASSERS = (BaseFairseqModel.set_num_updates, FairseqEncoder.set_num_updates, SpanBertModel.set_num_updates)
# core.source_hash.source_sha256 of fairseq's two (fairseq-fixed 0.12.3.1; a test fails on another)
FAIRSEQ_NUMBER_PASSERS_SHA256 = "bd212fabc4aadc2b9d822ccaaccd0d29430944de5d423955efb3c6ee2abe686e"


def _sizes(args, layers, dim, ffn, heads):
    args.encoder_layers = getattr(args, "encoder_layers", layers)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", dim)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", ffn)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", heads)
    for key, value in SpanBertConfig().__dict__.items():
        if not hasattr(args, key):
            setattr(args, key, value)


@register_model_architecture("spanbert", "spanbert_tiny")
def spanbert_tiny(args):
    """2 layers, hidden 128, 2 heads, FFN 512: tests and the CPU demo."""
    _sizes(args, 2, 128, 512, 2)


@register_model_architecture("spanbert", "spanbert_base")
def spanbert_base(args):
    """BERT-base: 12 layers, hidden 768, 12 heads, FFN 3072."""
    _sizes(args, 12, 768, 3072, 12)


@register_model_architecture("spanbert", "spanbert_large")
def spanbert_large(args):
    """BERT-large: 24 layers, hidden 1024, 16 heads, FFN 4096."""
    _sizes(args, 24, 1024, 4096, 16)
