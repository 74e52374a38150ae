"""SpanDrop and Beta-SpanDrop on fine-tuning data: extractive QA, relation extraction, classification.

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
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, FairseqDataset
from fairseq.dataclass import ChoiceEnum

from ..errors import UsageError
from ..tokenization import TokenizerError, load_tokenizer
from .span_drop import SpanDropSampling, check_span_drop_args, sample_keep_mask
from .span_masked_dataset import ItemRandom

FINETUNE_UNITS = ("token", "chunk", "word", "sentence")
SENTENCE_FINAL_SYMBOLS = (".", "!", "?")

# A sentence ends at . ! or ? (closing quotes/brackets may follow), then white space and a capital, digit or opening quote.
_SENTENCE_BREAK = re.compile(r"""[.!?]+["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")
_ABBREVIATIONS = frozenset(
    "Mr Mrs Ms Dr Prof Sr Jr St Mt Ft vs etc No Nos Gen Col Lt Sgt Capt Rev Gov Sen Rep Inc Ltd Co Corp Jan Feb Mar "
    "Apr Aug Sept Sep Oct Nov Dec approx ca cf al".split()
)


@dataclass
class FinetuneSpanDropConfig(SpanDropSampling):
    """``--span-drop-*`` options of the fine-tuning tasks (applied to training splits only)."""

    span_drop_unit: ChoiceEnum(FINETUNE_UNITS) = field(
        default="token", metadata={"help": "span unit: token, chunk (--span-drop-chunk-size tokens), word (whole words) "
                                           "or sentence"}
    )


@dataclass
class QASpanDropConfig(FinetuneSpanDropConfig):
    """QA adds the paper's SQuAD protection rule."""

    span_drop_protect_question_overlap: bool = field(
        default=False, metadata={"help": "never drop a unit that contains a word bigram of the question (case-folded)"}
    )


# ----------------------------------------------------------------------------- segmentation


def sentence_starts(text: str) -> np.ndarray:
    """Character offsets where the sentences of ``text`` begin (0 first); abbreviations and initials do not end one."""
    starts = [0]
    for match in _SENTENCE_BREAK.finditer(text):
        word = text[text.rfind(" ", 0, match.start()) + 1: match.start()]
        if text[match.start()] == "." and (word in _ABBREVIATIONS or (len(word) == 1 and word.isupper()) or "." in word):
            continue  # "Dr. Smith", "J. Smith", "U.S. Army"
        starts.append(match.end())
    return np.asarray(starts, dtype=np.int64)


def token_sentence_ids(contexts, token_context: np.ndarray, char_start: np.ndarray) -> np.ndarray:
    """Sentence index, within its context, of every token given its context index and character start.

    Sentence starts of all contexts are laid on one increasing axis (context c
    shifted by the lengths of the contexts before it), so one searchsorted
    serves every token.
    """
    starts = [sentence_starts(text) for text in contexts]
    counts = np.array([len(s) for s in starts], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum([len(text) + 1 for text in contexts], dtype=np.int64)[:-1]])
    axis = np.concatenate([s + b for s, b in zip(starts, base)]) if starts else np.zeros(0, np.int64)
    token_context = np.asarray(token_context, dtype=np.int64)
    sentence = np.searchsorted(axis, np.asarray(char_start, np.int64) + base[token_context], side="right") - 1
    return (sentence - (np.cumsum(counts) - counts)[token_context]).astype(np.int64)


def passage_sentence_ids(qa) -> np.ndarray:
    """[N] sentence index of every passage token of a QASplit: stored at prepare time, else found from the contexts."""
    if getattr(qa, "sentence_ids", None) is not None:
        return qa.sentence_ids
    window_context = np.array([q["context_index"] for q in qa.questions], dtype=np.int64)[qa.question_index]
    return token_sentence_ids(qa.contexts, np.repeat(window_context, qa.passage_lengths()), qa.char_start)


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


_HASH = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier: word keys as polynomials in it, modulo 2^64


def word_keys(ids: np.ndarray, word_starts: np.ndarray):
    """(64-bit key per word, word index per token): a word's key hashes its token ids in order."""
    starts = np.asarray(word_starts, dtype=bool).copy()
    if len(starts):
        starts[0] = True  # a window may open inside a word
    word_of = np.cumsum(starts) - 1
    begin = np.flatnonzero(starts)
    offset = np.arange(len(ids)) - begin[word_of]
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(len(ids) + 1, _HASH, dtype=np.uint64))
        terms = (np.asarray(ids).astype(np.uint64) + np.uint64(1)) * powers[offset]
        keys = np.add.reduceat(terms, begin) if len(begin) else np.zeros(0, np.uint64)
    return keys, word_of


def bigram_overlap(question: np.ndarray, question_word_starts, passage: np.ndarray, passage_word_starts) -> np.ndarray:
    """Per passage token: does its word belong to a word bigram that also occurs in the question?"""
    q_keys, _ = word_keys(question, question_word_starts)
    p_keys, word_of = word_keys(passage, passage_word_starts)
    with np.errstate(over="ignore"):
        q_bigrams = q_keys[:-1] * _HASH + q_keys[1:]
        p_bigrams = p_keys[:-1] * _HASH + p_keys[1:]
    hit = np.isin(p_bigrams, q_bigrams)
    in_bigram = np.zeros(len(p_keys), dtype=bool)
    in_bigram[:-1] |= hit
    in_bigram[1:] |= hit
    return in_bigram[word_of]


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
        self.sentence_final = np.zeros(size, dtype=bool)
        for i, symbol in enumerate(dictionary.symbols):
            self.sentence_final[i] = symbol.lstrip("\u2581") in SENTENCE_FINAL_SYMBOLS
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


def tokenizer_word_starts(folder: str) -> np.ndarray:
    """Word-start flag of every vocabulary entry of the tokenizer saved in a prepared data ``folder``."""
    try:
        return load_tokenizer(folder).word_start_table()
    except (TokenizerError, OSError) as err:
        raise UsageError(f"--span-drop-unit word needs the tokenizer files of {folder}: {err}") from None


def span_dropper(cfg, dictionary, folder: str, seed: int) -> Optional[SpanDropper]:
    """The SpanDropper of a task's ``--span-drop-*`` options, or None when ``--span-drop-p`` is 0."""
    check_span_drop_args(cfg.span_drop_p, cfg.span_drop_gamma)
    if cfg.span_drop_p == 0:
        return None
    needs_words = str(cfg.span_drop_unit) == "word" or getattr(cfg, "span_drop_protect_question_overlap", False)
    table = tokenizer_word_starts(folder) if needs_words else np.ones(len(dictionary), dtype=bool)
    return SpanDropper(cfg, dictionary, table, seed)


# ----------------------------------------------------------------------------- the task datasets


class SpanDropWrapper(BaseWrapperDataset):
    """Base of the per-task wrappers: items drawn once per (epoch, index); subclasses implement ``drop``."""

    def __init__(self, dataset, dropper: SpanDropper):
        super().__init__(dataset)
        self.dropper, self.epoch = dropper, 1

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index):
        return self._dropped(self.epoch, index)

    @lru_cache(maxsize=16)
    def _dropped(self, epoch, index):
        return self.drop(self.dataset[index], index, self.dropper.rng(epoch, index))

    def drop(self, item, index, rng):
        raise NotImplementedError


class QASpanDropDataset(SpanDropWrapper):
    """SpanDrop on the passage of ``ExtractiveQADataset`` windows; the question and the gold answer's units stay.

    Start/end labels and token types follow the kept tokens; a window labelled
    [CLS] (no answer inside) stays so.
    """

    def __init__(self, dataset, dropper: SpanDropper, protect_question_overlap: bool = False):
        super().__init__(dataset, dropper)
        qa = dataset.qa
        self.passage_offset, self.token_offsets = qa.passage_offset, qa.token_offsets
        self.sentence_ids = passage_sentence_ids(qa) if dropper.unit == "sentence" else None
        self.lowercase = dropper.lowercase_table() if protect_question_overlap else None

    def drop(self, item, index, rng):
        tokens = item["source"].numpy()
        lo = int(self.passage_offset[index])
        first, last = int(self.token_offsets[index]), int(self.token_offsets[index + 1])
        hi = lo + last - first
        droppable = np.zeros(len(tokens), dtype=bool)
        droppable[lo:hi] = True
        protected = np.zeros(len(tokens), dtype=bool)
        start, end = item["start"], item["end"]
        if start > 0:
            protected[start: end + 1] = True
        if self.lowercase is not None:
            question, passage = tokens[1: lo - 1], tokens[lo:hi]
            word_start = self.dropper.word_start
            protected[lo:hi] |= bigram_overlap(self.lowercase[question], word_start[question],
                                               self.lowercase[passage], word_start[passage])
        sentence_ids = None
        if self.sentence_ids is not None:
            sentence_ids = np.full(len(tokens), -1, dtype=np.int64)
            sentence_ids[lo:hi] = self.sentence_ids[first:last]
        out = self.dropper.apply(item["source"], self.dropper.token_keep(tokens, droppable, protected, rng, sentence_ids))
        return dict(item, source=out.source, segment=item["segment"][torch.from_numpy(out.taken)],
                    start=int(out.new_position[start]), end=int(out.new_position[end]))


class ClassificationSpanDropDataset(SpanDropWrapper):
    """SpanDrop on ``ClassificationDataset`` items: every token but [CLS]/[SEP] may go; segment A's length follows."""

    def drop(self, item, index, rng):
        tokens = item["source"].numpy()
        keep = self.dropper.token_keep(tokens, ~self.dropper.special[tokens], np.zeros(len(tokens), bool), rng)
        out = self.dropper.apply(item["source"], keep)
        # the token closing segment A is [SEP], always kept
        return dict(item, source=out.source, segment_a=int(out.new_position[item["segment_a"] - 1]) + 1)


class RelationSpanDrop(SpanDropWrapper):
    """Token items of a relation split with SpanDrop; ``entity_positions`` gives the matching marker positions.

    The subject and object regions (start marker to the end of the mention and
    its closing marker, as ``marker_region_end`` finds them) are protected.
    """

    def __init__(self, tokens, entity_positions, dropper: SpanDropper, region_end):
        super().__init__(tokens, dropper)
        self.positions = np.asarray(entity_positions, dtype=np.int64)
        self.region_end = region_end

    def __getitem__(self, index):
        return super().__getitem__(index)[0]

    def drop(self, item, index, rng):
        tokens = item.numpy()
        protected = np.zeros(len(tokens), dtype=bool)
        for role, start in enumerate(self.positions[index]):
            protected[start: self.region_end(tokens, int(start), role) + 1] = True
        keep = self.dropper.token_keep(tokens, ~self.dropper.special[tokens], protected, rng)
        out = self.dropper.apply(item.long(), keep)
        return out.source, out.new_position[self.positions[index]].tolist()

    @property
    def entity_positions(self) -> "EntityPositions":
        """The companion dataset of remapped (subject, object) marker positions."""
        return EntityPositions(self)


class EntityPositions(FairseqDataset):
    """(subject, object) start-marker positions of ``RelationSpanDrop`` items, batched as B x 2."""

    def __init__(self, tokens: RelationSpanDrop):
        self.tokens = tokens

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        return self.tokens._dropped(self.tokens.epoch, index)[1]

    def collater(self, samples):
        return torch.tensor(samples, dtype=torch.long)


def marker_region_end(meta: dict, tokenizer):
    """``f(tokens, start, role) -> last position`` of the entity region opened by the marker at ``start``.

    ``ner``: the marker replaces the mention; ``typed_marker``: up to the first
    end marker after it; ``typed_marker_punct``: up to the closing ``@``/``#``
    word (the first occurrence of the opening word's tokens after it).
    """
    mode = meta["entity_marker"]
    if mode == "ner":
        return lambda tokens, start, role: start
    if mode == "typed_marker":
        end_ids = np.array([i for symbol, i in meta["markers"].items() if symbol.startswith("[/")], dtype=np.int64)

        def typed_end(tokens, start, role):
            after = np.flatnonzero(np.isin(tokens[start + 1:], end_ids))
            return start + 1 + int(after[0]) if len(after) else len(tokens) - 1
        return typed_end
    from ..relation_extraction.markers import PUNCT_MARKERS, ROLES

    openers = [np.asarray(tokenizer.encode(PUNCT_MARKERS[role][0]).ids, dtype=np.int64) for role in ROLES]

    def punct_end(tokens, start, role):
        opener = openers[role]
        if len(tokens) - start < 2 * len(opener):
            return len(tokens) - 1
        windows = np.lib.stride_tricks.sliding_window_view(tokens[start + len(opener):], len(opener))
        after = np.flatnonzero((windows == opener).all(axis=1))
        return start + len(opener) + int(after[0]) + len(opener) - 1 if len(after) else len(tokens) - 1
    return punct_end


def relation_span_drop(dropper: SpanDropper, meta: dict, folder: str):
    """``RelationDataset.load``'s transform: (tokens, entity positions) -> their SpanDrop views."""
    tokenizer = load_tokenizer(folder) if meta["entity_marker"] == "typed_marker_punct" else None
    region_end = marker_region_end(meta, tokenizer)

    def transform(tokens, entity_positions):
        dropped = RelationSpanDrop(tokens, entity_positions, dropper, region_end)
        return dropped, dropped.entity_positions
    return transform
