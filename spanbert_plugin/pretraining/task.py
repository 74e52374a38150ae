"""The ``spanbert_pretraining`` task: SpanBERT pre-training data (SPEC §1.1, §1.3).

Single contiguous segments of up to ``tokens_per_sample`` tokens, framed by the
begin/end tokens, never crossing a document; span masking applied on the fly
(a new mask each epoch, reproducible from seed, epoch and index). ``data`` may
list shards separated by colons, visited one per epoch in turn; every shard
must come from the same tokenizer and dictionary.

The task was first registered as ``span_masked_lm``, the name of fairseq's own
T5-style task. ``fairseq-hydra-train`` validates the ``task`` section against
fairseq's registry *before* it imports ``common.user_dir``, so under that name
hydra saw fairseq's T5 schema and refused the masking options; the old name is
now a deprecated alias (``span_masked_lm.py``).
"""
import logging
import os
from dataclasses import dataclass, field
from typing import List

import numpy as np
from fairseq.data import SortDataset, data_utils
from fairseq.data.indexed_dataset import MMapIndexedDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..core.datasets import check_token_item_files, load_token_items
from ..core.dictionary import SpanBertDictionary
from .document_blocks import DocumentBlockDataset
from .span_masked_dataset import SpanMaskedDataset
from .annotate import span_file
from .span_masking import SCHEMES, SpanMasker
from ..core.errors import UsageError
from ..core.finetune_io import FINETUNING_FOLDERS
from ..core.user_dir import register_plugin
from ..core.precision import SharedTrainingConfig
from ..core.tokenization import META_FILE, SentencePieceTokenizer, WordPieceTokenizer, read_tokenizer_meta
from ..core.run_config import run_section
from ..core.tasks import OneDictionaryTask, record_in_run_config, register_options_check

logger = logging.getLogger(__name__)
TASK_NAME = "spanbert_pretraining"
_WORD_START_RULES = {"sentencepiece": SentencePieceTokenizer, "wordpiece": WordPieceTokenizer}
_ANNOTATION_OF_SCHEME = {"named_entity": "entities", "noun_phrase": "noun_phrases"}


@dataclass
class SpanBertPretrainingConfig(SharedTrainingConfig):
    data: str = field(default="", metadata={"help": "spanbert-prepare folder, or several separated by ':' (one per epoch)"})
    tokens_per_sample: int = field(default=512, metadata={"help": "block length including the begin/end tokens"})
    mask_scheme: ChoiceEnum(SCHEMES) = field(
        default="span", metadata={"help": "span (geometric, SpanBERT), word (whole words), subword (BERT), named_entity or "
                                          "noun_phrase (annotated spans or whole words, half each; spanbert-prepare --annotate)"}
    )
    mask_ratio: float = field(default=0.15, metadata={"help": "masking budget: share of each block's maskable tokens"})
    geometric_p: float = field(default=0.2, metadata={"help": "p of the geometric span-length distribution (in words)"})
    max_span_len: int = field(default=10, metadata={"help": "longest span in words (the distribution is renormalised)"})
    mask_prob: float = field(default=0.8, metadata={"help": "share of spans replaced by the mask symbol"})
    random_prob: float = field(default=0.1, metadata={"help": "share of spans replaced by random tokens"})
    leave_prob: float = field(default=0.1, metadata={"help": "share of spans left unchanged"})
    random_token_source: ChoiceEnum(["uniform", "unigram"]) = field(
        default="uniform",
        metadata={"help": "random replacements: uniform over the non-control symbols (fairseq's masked_lm), "
                          "or the corpus unigram distribution"}
    )
    freeze_encoder_updates: int = field(
        default=0, metadata={"help": "train only the MLM and SBO heads for the first N updates (the encoder, its "
                             "embeddings and so the tied MLM decoder stay as they are), so that freshly initialised "
                             "heads of an imported encoder do not send their first, noisy gradients into it"})
    seed: int = II("common.seed")


def data_folders(data: str) -> List[str]:
    """The absolute shard folders of a ``data`` value (``a:b:c``), relative ones resolved against the working directory."""
    paths = [os.path.abspath(p) for p in data.split(":") if p]
    if not paths:
        raise UsageError(f"{TASK_NAME} needs a data folder (spanbert-prepare --destdir): give DATA or task.data=DATA")
    return paths


@register_options_check
def span_length_options_of_other_schemes(options):
    if "mask_scheme" in options and str(options["mask_scheme"]) != "span":
        return [(("geometric_p", "max_span_len"), f"since --mask-scheme {options['mask_scheme']} draws no span lengths")]
    return []


def load_prepared_folder(folder: str):
    """The dictionary and tokenizer description of a ``spanbert-prepare`` folder; UsageError for anything else."""
    if not os.path.isdir(folder):
        raise UsageError(f"{folder}: no such data folder")
    register_plugin()  # every feature registers its folder's metadata file (idempotent; --user-dir has done it)
    for marker, (command, task) in FINETUNING_FOLDERS.items():
        # a fine-tuning folder copies the tokenizer files too, and its train.bin reads as documents: pre-training
        # would train on [CLS] question [SEP] windows, sentence pairs or marked relations without a word
        if os.path.isfile(os.path.join(folder, marker)):
            raise UsageError(f"{folder}: a {command} folder (it holds {marker}), not a spanbert-prepare one; train it "
                             f"with --task {task}, or pre-train on a spanbert-prepare folder of raw text")
    meta_path = os.path.join(folder, META_FILE)
    if not os.path.isfile(meta_path):
        raise UsageError(
            f"{folder}: not a spanbert-prepare folder (no {META_FILE}); fairseq-preprocess output lacks the tokenizer's "
            "ids and word boundaries: run spanbert-prepare on the raw text"
        )
    meta = read_tokenizer_meta(meta_path)
    try:
        dictionary = SpanBertDictionary.load(os.path.join(folder, "dict.txt"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{folder}: unreadable spanbert-prepare folder: {e}") from None
    if meta.get("type") not in _WORD_START_RULES:
        raise UsageError(f"{meta_path}: unknown tokenizer type {meta.get('type')!r}; expected sentencepiece or wordpiece")
    if dictionary.mask_index is None:
        raise UsageError(f"{folder}/dict.txt: no mask symbol ([MASK] or <mask>)")
    return dictionary, meta


def word_start_table(meta: dict, dictionary: SpanBertDictionary) -> np.ndarray:
    """Per dictionary id: does the token start a word (sentencepiece '▁', WordPiece not '##')?"""
    rule = _WORD_START_RULES[meta["type"]]
    return np.array([rule.is_word_start_piece(s) for s in dictionary.symbols], dtype=bool)


def check_same_vocabulary(first: str, first_dict, first_meta, other: str, other_dict, other_meta) -> None:
    """Shards must share the tokenizer and every id; else ids of one would be read with another's dictionary."""
    if first_meta != other_meta:
        raise UsageError(
            f"data shards {first} and {other} were prepared with different tokenizers ({first_meta} vs {other_meta}); "
            "prepare every shard with the same tokenizer and vocabulary"
        )
    if first_dict.symbols != other_dict.symbols:
        n = min(len(first_dict), len(other_dict))
        differ = next((i for i in range(n) if first_dict.symbols[i] != other_dict.symbols[i]), n)
        shown = lambda d: repr(d.symbols[differ]) if differ < len(d) else "none"  # noqa: E731
        raise UsageError(
            f"data shards {first} and {other} have different dictionaries ({len(first_dict)} vs {len(other_dict)} "
            f"symbols; id {differ} is {shown(first_dict)} vs {shown(other_dict)}); prepare every shard with the same "
            "tokenizer and vocabulary"
        )


def has_maskable_token(documents, never_mask: np.ndarray, chunk: int = 1 << 20) -> bool:
    """Does any token of the split lie outside ``never_mask``? Reads chunks of the memory map until one does."""
    if isinstance(documents, MMapIndexedDataset):
        tokens = np.frombuffer(documents._bin_buffer, dtype=documents._index.dtype)
        return any((~never_mask[tokens[i : i + chunk]]).any() for i in range(0, len(tokens), chunk))
    return any((~never_mask[np.asarray(documents[i])]).any() for i in range(len(documents)))


def _criterion_option(model_cfg, key, default):
    """An option of the run's criterion (``--sbo-weight``), read from the run config above the model's; ``default``
    where there is none (a model built outside fairseq-train)."""
    criterion = run_section(model_cfg, "criterion")
    value = criterion.get(key) if criterion is not None else None
    return default if value is None else value


def _missing_annotations(path, kind, scheme):
    return UsageError(f"{path}.bin: no {kind.replace('_', '-')} annotations; --mask-scheme {scheme} needs a folder "
                      "prepared with spanbert-prepare --annotate spacy")


def _parameters(module) -> int:
    return sum(p.numel() for p in module.parameters())


def refuse_pytorch_ddp_without_unused_parameters(model):
    """PyTorch's DDP waits for a gradient of every parameter it was built with: a frozen encoder would stop the
    second update with a reduction error, unless DDP looks for unused parameters (legacy_ddp reduces only those
    that require a gradient)."""
    import torch

    ddp = getattr(model, "module", None)  # fairseq's ModuleProxyWrapper holds the DDP module
    if isinstance(ddp, torch.nn.parallel.DistributedDataParallel) and not ddp.find_unused_parameters:
        raise UsageError("--freeze-encoder-updates in several processes with --ddp-backend pytorch_ddp needs "
                         "--find-unused-parameters (or use --ddp-backend legacy_ddp)")


def refuse_flat_fp16_master_weights(optimizer):
    """fairseq's --fp16/--bf16 optimizer keeps one flat fp32 copy of all the weights, and fills its gradient with
    those of the parameters that require one, packed from the start: with the encoder frozen, the heads' gradients
    would land on the encoder's first weights (and the heads would not train). Per-parameter copies do not pack."""
    if getattr(optimizer, "has_flat_params", False):
        raise UsageError("--freeze-encoder-updates with --fp16 or --bf16 needs --fp16-no-flatten-grads (or use "
                         "--memory-efficient-fp16)")


@register_task(TASK_NAME, dataclass=SpanBertPretrainingConfig)
class SpanBertPretrainingTask(OneDictionaryTask, FairseqTask):
    """SpanBERT pre-training: span-masked single segments for MLM + SBO."""

    trains_pretraining_heads = True
    criteria = ("span_bert",)

    cfg: SpanBertPretrainingConfig

    def __init__(self, cfg: SpanBertPretrainingConfig, dictionary: SpanBertDictionary, word_starts: np.ndarray):
        super().__init__(cfg)
        self.dictionary = dictionary
        if dictionary.mask_index is None:
            raise UsageError(f"{dictionary.source}: dictionary has no mask symbol ([MASK] or <mask>)")
        if cfg.freeze_encoder_updates < 0:
            raise UsageError(f"--freeze-encoder-updates must be at least 0, got {cfg.freeze_encoder_updates}")
        if cfg.tokens_per_sample < 3:
            raise UsageError(f"--tokens-per-sample must be at least 3 (begin, token, end), got {cfg.tokens_per_sample}")
        self.sbo_position_slots = None  # the model's, once build_model has run (see load_dataset)
        self._head_parameters = None  # (model id, MLM head parameters, SBO head parameters) for training_flops
        self.never_mask = dictionary.special_mask()
        self.never_mask[dictionary.unk()] = False  # [UNK] is text and may be masked, as in BERT
        weights = ~dictionary.special_mask()
        if cfg.random_token_source == "unigram":
            weights = weights * np.maximum(np.asarray(dictionary.count, dtype=float), 0)  # a negative count: none
        if not weights.sum() > 0:
            raise UsageError(f"{dictionary.source}: no text symbol has a count above 0; --random-token-source unigram "
                             "draws random replacements by these counts (uniform does not need them)"
                             if cfg.random_token_source == "unigram" else
                             f"{dictionary.source}: no text symbol, only control symbols")
        self.masker = SpanMasker(
            word_starts, self.never_mask, dictionary.mask_index, dictionary.pad(),
            scheme=str(cfg.mask_scheme), mask_ratio=cfg.mask_ratio, geometric_p=cfg.geometric_p,
            max_span_len=cfg.max_span_len, mask_prob=cfg.mask_prob, random_prob=cfg.random_prob,
            leave_prob=cfg.leave_prob, replacement_weights=weights,
        )
        logger.info(
            f"span masking: scheme {cfg.mask_scheme}, ratio {cfg.mask_ratio}, geometric p {cfg.geometric_p}, "
            f"max span {cfg.max_span_len} words, mask/random/unchanged {cfg.mask_prob}/{cfg.random_prob}/{cfg.leave_prob}, "
            f"random tokens {cfg.random_token_source}"
        )

    @classmethod
    def setup_task(cls, cfg: SpanBertPretrainingConfig, **kwargs):
        folders = data_folders(cfg.data)
        cfg.data = ":".join(folders)  # checkpoints then load from any working directory
        record_in_run_config(cfg)
        dictionary, meta = load_prepared_folder(folders[0])
        for other in folders[1:]:
            check_same_vocabulary(folders[0], dictionary, meta, other, *load_prepared_folder(other))
        logger.info(f"dictionary: {len(dictionary)} types")
        return cls(cfg, dictionary, word_start_table(meta, dictionary))

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        max_positions = getattr(model, "max_positions", lambda: None)()
        if max_positions is not None and self.cfg.tokens_per_sample > max_positions:
            raise UsageError(
                f"--tokens-per-sample {self.cfg.tokens_per_sample} exceeds the model's {max_positions} positions (--max-positions)"
            )
        slots = getattr(getattr(model, "sbo_head", None), "position_slots", None)
        self.sbo_position_slots = slots  # the batches of datasets loaded from now on say which tokens get SBO
        sbo_weight = _criterion_option(cfg, "sbo_weight", 1.0)
        if slots is not None and sbo_weight > 0:
            if slots < 1:
                raise UsageError("--sbo-position-slots 0 gives no token an SBO loss; train without the SBO with "
                                 "--sbo-weight 0")
            if self.cfg.mask_scheme == "span" and self.cfg.max_span_len > slots:
                raise UsageError(
                    f"--max-span-len {self.cfg.max_span_len} words exceeds the model's {slots} SBO position slots "
                    f"(--sbo-position-slots); tokens past the last slot would get no SBO loss"
                )
        if sbo_weight == 0 and not from_checkpoint and hasattr(model, "leave_sbo_head_out_of_training"):
            model.leave_sbo_head_out_of_training()
        if not from_checkpoint:  # training: every shard's annotations now, not when its epoch comes
            self._check_annotations()
        return model

    def _check_annotations(self):
        """With named_entity/noun_phrase masking, every split of every shard must hold the scheme's annotations."""
        kind = _ANNOTATION_OF_SCHEME.get(str(self.cfg.mask_scheme))
        for folder in data_folders(self.cfg.data) if kind is not None else ():
            for split in sorted(n[:-4] for n in os.listdir(folder) if n.endswith(".bin") and "." not in n[:-4]):
                if not MMapIndexedDataset.exists(span_file(os.path.join(folder, split), kind)):
                    raise _missing_annotations(span_file(os.path.join(folder, split), kind), kind,
                                               self.cfg.mask_scheme)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """With --freeze-encoder-updates N, updates 0..N-1 leave the encoder without gradients (so without updates)."""
        if self.cfg.freeze_encoder_updates > 0:
            frozen = update_num < self.cfg.freeze_encoder_updates
            encoder = model.encoder  # in several processes fairseq's ModuleProxyWrapper passes this to the model
            if next(encoder.parameters()).requires_grad == frozen:
                if frozen:
                    refuse_pytorch_ddp_without_unused_parameters(model)
                    refuse_flat_fp16_master_weights(optimizer)
                for p in encoder.parameters():
                    p.requires_grad_(not frozen)
                    p.grad = None
                logger.info(f"update {update_num}: encoder {'frozen' if frozen else 'trained'} (--freeze-encoder-updates "
                            f"{self.cfg.freeze_encoder_updates})")
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    def training_flops(self, model, sample, logging_output):
        """The encoder's, plus 6 x the MLM head's parameters (transform and tied decoder) per masked token and
        the SBO head's per SBO token."""
        if self._head_parameters is None or self._head_parameters[0] != id(model):  # counted once per model
            self._head_parameters = (id(model), _parameters(model.lm_head), _parameters(model.sbo_head))
        _, mlm_head, sbo_head = self._head_parameters
        head_flops = 6.0 * (mlm_head * logging_output.get("num_masked", 0) + sbo_head * logging_output.get("num_sbo", 0))
        return super().training_flops(model, sample, logging_output) + head_flops

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        folders = data_folders(self.cfg.data)
        split_path = os.path.join(folders[(epoch - 1) % len(folders)], split)
        documents = load_token_items(split_path, self.dictionary, split, combine=combine)
        if documents is None:
            raise UsageError(f"{split_path}.bin/.idx: no such split {split!r}")
        if not has_maskable_token(documents, self.never_mask):
            # every block would mask nothing: a validation loss of 0 and a best checkpoint chosen on nothing
            raise UsageError(f"{split_path}: no token that can be masked (only control symbols); split {split!r} measures nothing")
        blocks = DocumentBlockDataset(
            documents, documents.sizes, self.cfg.tokens_per_sample - 2, self.dictionary.bos(), self.dictionary.eos()
        )
        logger.info(f"{split_path}: {len(documents)} documents, {len(blocks)} blocks, {int(blocks.sizes.sum())} tokens")
        unit_spans = self._unit_spans(split_path, blocks, len(documents))
        dataset = SpanMaskedDataset(blocks, self.masker, self.dictionary.pad(), seed=self.cfg.seed, unit_spans=unit_spans,
                                    sbo_position_slots=self.sbo_position_slots)
        # one folder is loaded once, in epoch 1, by an uninterrupted run: a run resumed later gets that order too
        order_epoch = epoch if len(folders) > 1 else 1
        with data_utils.numpy_seed(self.cfg.seed + order_epoch):
            shuffle = np.random.permutation(len(dataset))
        # a split trained and validated on gets one object each: validation sets its dataset's epoch to 1, which
        # would mask the training batches fetched after it as epoch 1's
        self.keep_dataset(split, SortDataset(dataset, sort_order=[shuffle, blocks.sizes]),
                          self.loads_training_form(split, kwargs))

    def _unit_spans(self, split_path, blocks, num_documents):
        """index -> the block's annotated spans, for --mask-scheme named_entity/noun_phrase; None for the others."""
        kind = _ANNOTATION_OF_SCHEME.get(str(self.cfg.mask_scheme))
        if kind is None:
            return None
        path = span_file(split_path, kind)
        if not MMapIndexedDataset.exists(path):
            raise _missing_annotations(path, kind, self.cfg.mask_scheme)
        check_token_item_files(path)
        spans = MMapIndexedDataset(path)
        if len(spans) != num_documents:
            raise UsageError(f"{path}.bin: {len(spans)} annotated documents for {num_documents} documents; prepare the folder again")
        return lambda index: blocks.block_spans(index, spans)

    def max_positions(self):
        return self.cfg.tokens_per_sample
