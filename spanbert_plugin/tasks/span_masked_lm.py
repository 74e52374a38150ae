"""The ``span_masked_lm`` task: SpanBERT pre-training data (SPEC §1.1, §1.3).

Single contiguous segments of up to ``tokens_per_sample`` tokens, framed by the
begin/end tokens, never crossing a document; span masking applied on the fly
(a new mask each epoch, reproducible from seed, epoch and index). ``data`` may
list shards separated by colons, visited one per epoch in turn.

fairseq itself registers a T5-style task under this name
(``fairseq.tasks.span_masked_lm``); while this plugin is loaded, the name
refers to SpanBERT's task, as the plugin's configs expect.
"""
import argparse
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from fairseq import tasks as fairseq_tasks
from fairseq.data import SortDataset, data_utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..data.dictionary import SpanBertDictionary
from ..data.document_blocks import DocumentBlockDataset
from ..data.span_masked_dataset import SpanMaskedDataset
from ..data.span_masking import SCHEMES, SpanMasker
from ..tokenization import META_FILE, SentencePieceTokenizer, TokenizerError, WordPieceTokenizer

logger = logging.getLogger(__name__)
TASK_NAME = "span_masked_lm"


_IGNORED = {"help": argparse.SUPPRESS}


@dataclass
class _FairseqT5TaskKeys(FairseqDataclass):
    """Keys of fairseq's own (T5-style) ``span_masked_lm`` config; accepted and ignored.

    ``fairseq-hydra-train`` fills the task config from fairseq's registry before
    it imports ``common.user_dir``, so a YAML naming ``span_masked_lm`` arrives
    with these keys; accepting them keeps hydra working. They do nothing here.
    """

    shuffle: bool = field(default=False, metadata=_IGNORED)
    noise_density: float = field(default=0.15, metadata=_IGNORED)
    mean_noise_span_length: float = field(default=3.0, metadata=_IGNORED)
    sample_break_mode: Optional[str] = field(default=None, metadata=_IGNORED)
    shorten_method: Optional[str] = field(default=None, metadata=_IGNORED)
    shorten_data_split_list: str = field(default="", metadata=_IGNORED)
    dataset_impl: Optional[str] = field(default=None, metadata=_IGNORED)
    max_source_positions: int = field(default=0, metadata=_IGNORED)
    max_target_positions: int = field(default=0, metadata=_IGNORED)
    include_target_tokens: bool = field(default=False, metadata=_IGNORED)


@dataclass
class SpanMaskedLMConfig(_FairseqT5TaskKeys):
    data: str = field(default="", metadata={"help": "spanbert-prepare directory, or several separated by ':' (one per epoch)"})
    tokens_per_sample: int = field(default=512, metadata={"help": "block length including the begin/end tokens"})
    mask_scheme: ChoiceEnum(SCHEMES) = field(default="span", metadata={"help": "span (geometric, SpanBERT), word (whole words) or subword (BERT)"})
    mask_ratio: float = field(default=0.15, metadata={"help": "masking budget: share of each block's maskable tokens"})
    geometric_p: float = field(default=0.2, metadata={"help": "p of the geometric span-length distribution (in words)"})
    max_span_len: int = field(default=10, metadata={"help": "longest span in words (the distribution is renormalised)"})
    mask_prob: float = field(default=0.8, metadata={"help": "share of spans replaced by the mask symbol"})
    random_prob: float = field(default=0.1, metadata={"help": "share of spans replaced by random tokens"})
    leave_prob: float = field(default=0.1, metadata={"help": "share of spans left unchanged"})
    random_token_source: ChoiceEnum(["uniform", "unigram"]) = field(
        default="uniform", metadata={"help": "random replacements: uniform over real tokens, or the corpus unigram distribution"}
    )
    seed: int = II("common.seed")


def word_start_table(data_dir, dictionary):
    """Per dictionary id: does the token start a word (sentencepiece '▁', WordPiece not '##')?"""
    import json

    meta_path = os.path.join(data_dir, META_FILE)
    if not os.path.isfile(meta_path):
        raise TokenizerError(f"{meta_path}: no such file; prepare the data with spanbert-prepare")
    with open(meta_path) as f:
        kind = json.load(f).get("type")
    rule = {"sentencepiece": SentencePieceTokenizer, "wordpiece": WordPieceTokenizer}.get(kind)
    if rule is None:
        raise TokenizerError(f"{meta_path}: unknown tokenizer type {kind!r}")
    return np.array([rule.is_word_start_piece(s) for s in dictionary.symbols], dtype=bool)


def _release_fairseq_task_name(name):
    """Free a task name that fairseq registered itself, so the plugin can own it."""
    if name in fairseq_tasks.TASK_REGISTRY and not fairseq_tasks.TASK_REGISTRY[name].__module__.startswith(__package__.split(".")[0]):
        fairseq_tasks.TASK_REGISTRY.pop(name)
        fairseq_tasks.TASK_DATACLASS_REGISTRY.pop(name, None)


_release_fairseq_task_name(TASK_NAME)


@register_task(TASK_NAME, dataclass=SpanMaskedLMConfig)
class SpanBertMaskedLMTask(FairseqTask):
    """SpanBERT pre-training: span-masked single segments for MLM + SBO."""

    cfg: SpanMaskedLMConfig

    def __init__(self, cfg: SpanMaskedLMConfig, dictionary: SpanBertDictionary, word_starts: np.ndarray):
        super().__init__(cfg)
        self.dictionary = dictionary
        if dictionary.mask_index is None:
            raise ValueError(f"{dictionary.source}: dictionary has no mask symbol ([MASK] or <mask>)")
        if cfg.tokens_per_sample < 3:
            raise ValueError(f"--tokens-per-sample must be at least 3 (begin, token, end), got {cfg.tokens_per_sample}")
        never_mask = dictionary.special_mask()
        never_mask[dictionary.unk()] = False  # [UNK] is text and may be masked, as in BERT
        weights = ~dictionary.special_mask()
        if cfg.random_token_source == "unigram":
            weights = weights * np.asarray(dictionary.count, dtype=float)
        self.masker = SpanMasker(
            word_starts, never_mask, dictionary.mask_index, dictionary.pad(),
            scheme=cfg.mask_scheme, mask_ratio=cfg.mask_ratio, geometric_p=cfg.geometric_p,
            max_span_len=cfg.max_span_len, mask_prob=cfg.mask_prob, random_prob=cfg.random_prob,
            leave_prob=cfg.leave_prob, replacement_weights=weights,
        )

    @classmethod
    def setup_task(cls, cfg: SpanMaskedLMConfig, **kwargs):
        paths = [p for p in cfg.data.split(":") if p]
        if not paths:
            raise ValueError("span_masked_lm needs a data directory (spanbert-prepare --destdir)")
        dict_path = os.path.join(paths[0], "dict.txt")
        if not os.path.isfile(dict_path):
            raise FileNotFoundError(f"{dict_path}: no such file; prepare the data with spanbert-prepare")
        dictionary = SpanBertDictionary.load(dict_path)
        logger.info(f"dictionary: {len(dictionary)} types")
        return cls(cfg, dictionary, word_start_table(paths[0], dictionary))

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        max_positions = getattr(model, "max_positions", lambda: None)()
        if max_positions is not None and self.cfg.tokens_per_sample > max_positions:
            raise ValueError(
                f"--tokens-per-sample {self.cfg.tokens_per_sample} exceeds the model's {max_positions} positions (--max-positions)"
            )
        slots = getattr(getattr(model, "sbo_head", None), "position_slots", None)
        if slots is not None and self.cfg.mask_scheme == "span" and self.cfg.max_span_len > slots:
            raise ValueError(
                f"--max-span-len {self.cfg.max_span_len} words exceeds the model's {slots} SBO position slots "
                f"(--sbo-position-slots); tokens past the last slot would get no SBO loss"
            )
        return model

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = [p for p in self.cfg.data.split(":") if p]
        data_path = paths[(epoch - 1) % len(paths)]
        split_path = os.path.join(data_path, split)
        documents = data_utils.load_indexed_dataset(split_path, self.dictionary, "mmap", combine=combine)
        if documents is None:
            raise FileNotFoundError(f"{split_path}.bin/.idx: no such dataset (split {split!r})")
        blocks = DocumentBlockDataset(
            documents, documents.sizes, self.cfg.tokens_per_sample - 2, self.dictionary.bos(), self.dictionary.eos()
        )
        logger.info(f"{split_path}: {len(documents)} documents, {len(blocks)} blocks, {int(blocks.sizes.sum())} tokens")
        dataset = SpanMaskedDataset(blocks, self.masker, self.dictionary.pad(), seed=self.cfg.seed)
        with data_utils.numpy_seed(self.cfg.seed + epoch):
            shuffle = np.random.permutation(len(dataset))
        self.datasets[split] = SortDataset(dataset, sort_order=[shuffle, blocks.sizes])

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def max_positions(self):
        return self.cfg.tokens_per_sample
