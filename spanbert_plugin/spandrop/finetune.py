"""SpanDrop and Beta-SpanDrop on fine-tuning data: units, per-item draws and the wrapper each task feature adapts.

A training input is cut into units: single tokens (``token``), runs of
``--span-drop-chunk-size`` tokens (``chunk``), whole words from the tokenizer's
word starts (``word``), or sentences (``sentence``: for QA the passage's
sentences, found in the original text when the data is prepared; for the
other tasks runs of tokens closed by a sentence-final ``.``, ``!`` or ``?``).
A unit never spans a token that cannot be dropped (special tokens, the QA
question), and a unit that holds a protected token (a QA gold answer, a
relation's mentions with their markers, a word bigram of the question with
``--span-drop-protect-question-overlap``) is always kept whole. The other
units are dropped (``drop``) or replaced by the mask symbol (``mask``, the
SpanMask baseline) as ``sample_keep_mask`` draws them, and every label and
per-token field is remapped. Only training splits are wrapped; each epoch
draws new units, reproducibly from (seed, epoch, index). Everything per item is
numpy over the item's tokens.
"""
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

import numpy as np
import torch
from fairseq.dataclass import ChoiceEnum

from ..core.errors import UsageError
from ..core.tokenization import TokenizerError, load_tokenizer
from .sampler import SpanDropSampling, check_span_drop_args, sample_keep_mask
from ..core.datasets import EpochKeyedWrapper, ItemRandom

FINETUNE_UNITS = ("token", "chunk", "word", "sentence")
SENTENCE_FINAL_SYMBOLS = (".", "!", "?")


def ends_a_sentence(symbol: str) -> bool:
    """Does a token end a sentence (the last character . ! or ?)? WordPiece keeps punctuation apart, sentencepiece
    merges it into pieces such as ').' or '...' (a piece that is only the mark counted alone missed those)."""
    piece = symbol.lstrip("\u2581")
    return bool(piece) and piece[-1] in SENTENCE_FINAL_SYMBOLS and not (piece.startswith("<") or piece.startswith("["))


@dataclass
class FinetuneSpanDropConfig(SpanDropSampling):
    """``--span-drop-*`` options of the fine-tuning tasks (applied to training splits only)."""

    span_drop_unit: ChoiceEnum(FINETUNE_UNITS) = field(
        default="token", metadata={"help": "span unit: token, chunk (--span-drop-chunk-size tokens), word (whole words) "
                                           "or sentence"}
    )


# ----------------------------------------------------------------------------- segmentation


def unit_ids(droppable: np.ndarray, unit: str, chunk_size: int = 1, word_starts: Optional[np.ndarray] = None,
             sentence_ids: Optional[np.ndarray] = None) -> np.ndarray:
    """Unit index per token (-1: not droppable), units numbered from 0 left to right.

    A unit starts at every droppable token after a non-droppable one, and also
    at every token (``token``), every ``chunk_size``-th token of a droppable run
    (``chunk``), every word start (``word``) or every change of ``sentence_ids``
    (``sentence``).
    """
    positions = np.flatnonzero(droppable)
    begins = np.ones(len(positions), dtype=bool)
    begins[1:] = positions[1:] != positions[:-1] + 1
    if unit == "chunk":
        run_begin = np.flatnonzero(begins)
        offset_in_run = np.arange(len(positions)) - run_begin[np.cumsum(begins) - 1]
        begins |= offset_in_run % chunk_size == 0
    elif unit == "word":
        begins |= np.asarray(word_starts, dtype=bool)[positions]
    elif unit == "sentence":
        sentence = np.asarray(sentence_ids)[positions]
        begins[1:] |= sentence[1:] != sentence[:-1]
    elif unit == "token":
        begins[:] = True
    else:
        raise UsageError(f"--span-drop-unit must be one of {', '.join(FINETUNE_UNITS)}, got {unit!r}")
    ids = np.full(len(droppable), -1, dtype=np.int64)
    ids[positions] = np.cumsum(begins) - 1
    return ids


# ----------------------------------------------------------------------------- drawing and applying


@dataclass
class Dropped:
    """One item after SpanDrop: new token ids, the old positions kept (in order) and old -> new positions."""

    source: torch.Tensor
    taken: np.ndarray
    new_position: np.ndarray


class SpanDropper:
    """Cuts token sequences into units, draws the units to keep and applies the drop; shared by the task datasets."""

    def __init__(self, cfg, dictionary, word_start_table: np.ndarray, seed: int = 1):
        check_span_drop_args(cfg.span_drop_p, cfg.span_drop_gamma)
        self.p, self.gamma = cfg.span_drop_p, cfg.span_drop_gamma
        self.unit, self.mode, self.chunk_size = str(cfg.span_drop_unit), str(cfg.span_drop_mode), cfg.span_drop_chunk_size
        if self.unit not in FINETUNE_UNITS:
            raise UsageError(f"--span-drop-unit must be one of {', '.join(FINETUNE_UNITS)}, got {self.unit!r}")
        if self.mode not in ("drop", "mask"):
            raise UsageError(f"--span-drop-mode must be drop or mask, got {self.mode!r}")
        if self.unit == "chunk" and self.chunk_size < 1:
            raise UsageError(f"--span-drop-chunk-size must be >= 1, got {self.chunk_size}")
        self.mask_index = getattr(dictionary, "mask_index", None)
        if self.mode == "mask" and self.mask_index is None:
            raise UsageError("--span-drop-mode mask: the dictionary has no mask symbol")
        self.dictionary, self.seed = dictionary, seed
        size = len(dictionary)
        # symbols past the tokenizer's vocabulary (appended entity markers) are words of their own
        self.word_start = np.ones(size, dtype=bool)
        table = np.asarray(word_start_table, dtype=bool)[:size]
        self.word_start[: len(table)] = table
        self.sentence_final = np.array([ends_a_sentence(symbol) for symbol in dictionary.symbols], dtype=bool)
        self.special = np.zeros(size, dtype=bool)
        for i in (dictionary.bos(), dictionary.eos(), dictionary.pad()):
            self.special[i] = True
        self.item_random = ItemRandom()

    def rng(self, epoch: int, index: int) -> np.random.Generator:
        """The generator of one item in one epoch."""
        return self.item_random(self.seed, epoch, index)

    def lowercase_table(self) -> np.ndarray:
        """Token id -> id of its lower-cased symbol (itself when there is none), for case-folded word matching."""
        index = self.dictionary.indices
        return np.array([index.get(s.lower(), i) for i, s in enumerate(self.dictionary.symbols)], dtype=np.int64)

    def token_keep(self, tokens: np.ndarray, droppable: np.ndarray, protected: np.ndarray, rng,
                   sentence_ids: Optional[np.ndarray] = None) -> np.ndarray:
        """Bool per token: kept. Units holding a ``protected`` token are kept whole; non-droppable tokens always."""
        if self.unit == "sentence" and sentence_ids is None:
            final = self.sentence_final[tokens]
            sentence_ids = np.cumsum(final) - final  # a final token closes its own sentence
        word_starts = self.word_start[tokens] if self.unit == "word" else None
        units = unit_ids(droppable, self.unit, self.chunk_size, word_starts, sentence_ids)
        protected_units = units[protected & (units >= 0)]
        keep = sample_keep_mask(int(units.max()) + 1 if len(units) else 0, self.p, self.gamma, rng, protected_units)
        return (units < 0) | keep[np.maximum(units, 0)]

    def apply(self, source: torch.Tensor, keep: np.ndarray) -> Dropped:
        """Remove (``drop``) or mask (``mask``) the tokens not kept."""
        if self.mode == "mask":
            masked = source.clone()
            masked[torch.from_numpy(~keep)] = self.mask_index
            everything = np.arange(len(keep))
            return Dropped(masked, everything, everything)
        taken = np.flatnonzero(keep)
        return Dropped(source[torch.from_numpy(taken)], taken, np.cumsum(keep) - 1)


def tokenizer_word_starts(folder: str, needed_by: str) -> np.ndarray:
    """Word-start flag of every vocabulary entry of the tokenizer saved in a prepared data ``folder`` (the option
    ``needed_by`` is named when it cannot be read)."""
    try:
        return load_tokenizer(folder).word_start_table()
    except (TokenizerError, OSError) as err:
        raise UsageError(f"{needed_by} needs the tokenizer files of {folder}: {err}") from None


def span_dropper(cfg, dictionary, folder: str, seed: int) -> Optional[SpanDropper]:
    """The SpanDropper of a task's ``--span-drop-*`` options, or None when ``--span-drop-p`` is 0."""
    check_span_drop_args(cfg.span_drop_p, cfg.span_drop_gamma)
    if cfg.span_drop_p == 0:
        return None
    needed_by = ("--span-drop-unit word" if str(cfg.span_drop_unit) == "word" else
                 "--span-drop-protect-question-overlap" if getattr(cfg, "span_drop_protect_question_overlap", False)
                 else None)  # both read whole words
    table = tokenizer_word_starts(folder, needed_by) if needed_by else np.ones(len(dictionary), dtype=bool)
    return SpanDropper(cfg, dictionary, table, seed)


# ----------------------------------------------------------------------------- the task datasets


class SpanDropWrapper(EpochKeyedWrapper):
    """Base of the per-task wrappers: items drawn once per (epoch, index); subclasses implement ``drop``."""

    def __init__(self, dataset, dropper: SpanDropper):
        super().__init__(dataset)
        self.dropper = dropper

    def __getitem__(self, index):
        return self._dropped(self.epoch, index)

    @lru_cache(maxsize=16)
    def _dropped(self, epoch, index):
        return self.drop(self.dataset[index], index, self.dropper.rng(epoch, index))

    def drop(self, item, index, rng):
        raise NotImplementedError
