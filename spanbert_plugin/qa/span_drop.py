"""SpanDrop on extractive-QA windows: the passage's sentences, the question-overlap protection rule and the
dataset wrapper (the question and the gold answer's units always stay)."""
import re
from dataclasses import dataclass, field

import numpy as np
import torch

from ..spandrop.finetune import FinetuneSpanDropConfig, SpanDropper, SpanDropWrapper

# A sentence ends at . ! or ? (closing quotes/brackets may follow), then white space and a capital, digit or opening quote.
_SENTENCE_BREAK = re.compile(r"""[.!?]+["'\u201d\u2019)\]]*\s+(?=["'\u201c\u2018(\[]?[A-Z0-9])""")


_ABBREVIATIONS = frozenset(
    "Mr Mrs Ms Dr Prof Sr Jr St Mt Ft vs etc No Nos Gen Col Lt Sgt Capt Rev Gov Sen Rep Inc Ltd Co Corp Jan Feb Mar "
    "Apr Aug Sept Sep Oct Nov Dec approx ca cf al".split()
)


@dataclass
class QASpanDropConfig(FinetuneSpanDropConfig):
    """QA adds the paper's SQuAD protection rule."""

    span_drop_protect_question_overlap: bool = field(
        default=False, metadata={"help": "never drop a unit that contains a word bigram of the question (case-folded)"}
    )


def sentence_starts(text: str) -> np.ndarray:
    """Character offsets where the sentences of ``text`` begin (0 first); abbreviations and initials do not end one."""
    starts = [0]
    for match in _SENTENCE_BREAK.finditer(text):
        word = text[text.rfind(" ", 0, match.start()) + 1: match.start()]
        if text[match.start()] == "." and (word in _ABBREVIATIONS or (len(word) == 1 and word.isupper()) or "." in word):
            continue  # "Dr. Smith", "J. Smith", "U.S. Army"
        starts.append(match.end())
    return np.asarray(starts, dtype=np.int64)


_TOKENS_A_CHUNK = 1 << 22


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
    first_sentence = np.cumsum(counts) - counts
    sentence = np.empty(len(char_start), dtype=np.int32)
    for lo in range(0, len(sentence), _TOKENS_A_CHUNK):  # a split's windows hold tens of millions of tokens
        context = np.asarray(token_context[lo:lo + _TOKENS_A_CHUNK], dtype=np.int64)
        found = np.searchsorted(axis, np.asarray(char_start[lo:lo + _TOKENS_A_CHUNK], np.int64) + base[context],
                                side="right") - 1
        sentence[lo:lo + _TOKENS_A_CHUNK] = found - first_sentence[context]
    return sentence


def passage_sentence_ids(qa) -> np.ndarray:
    """[N] sentence index of every passage token of a QASplit: stored at prepare time, else found from the contexts."""
    if getattr(qa, "sentence_ids", None) is not None:
        return qa.sentence_ids
    window_context = np.array([q["context_index"] for q in qa.questions], dtype=np.int64)[qa.question_index]
    return token_sentence_ids(qa.contexts, np.repeat(window_context, qa.passage_lengths()), qa.char_start)


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
