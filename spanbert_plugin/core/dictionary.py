"""A fairseq Dictionary whose ids are exactly the tokenizer's vocabulary ids.

fairseq's Dictionary always puts <s> <pad> </s> <unk> first; BERT's vocabulary
has [PAD]=0, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103. To keep token ids
identical to the tokenizer's (and to HuggingFace checkpoints), ``dict.txt``
here lists *every* symbol in id order, and control symbols are found by name.
"""
import hashlib
import json
import os

import numpy as np
from fairseq.data import Dictionary

from .tokenization import META_FILE, SPECIAL_SYMBOLS, SPM_FILE, WORDPIECE_FILE, SentencePieceTokenizer, SpanTokenizer


class SpanBertDictionary(Dictionary):
    """Dictionary in the tokenizer's id order, with BERT or fairseq control symbols."""

    def __init__(self, symbols=(), counts=None, source="<memory>"):
        self.symbols, self.count, self.indices = [], [], {}
        counts = [1] * len(symbols) if counts is None else counts
        for symbol, count in zip(symbols, counts):
            if symbol in self.indices:
                raise ValueError(f"{source}: duplicate symbol {symbol!r}")
            self.indices[symbol] = len(self.symbols)
            self.symbols.append(symbol)
            self.count.append(int(count))
        self.source = source
        self._assign_specials()

    def _assign_specials(self):
        found = {}
        for role, names in SPECIAL_SYMBOLS.items():
            found[role] = next((n for n in names if n in self.indices), None)
        if self.symbols:
            missing = [SPECIAL_SYMBOLS[r][0] for r in ("bos", "pad", "eos", "unk") if found[r] is None]
            if missing:
                raise ValueError(f"{self.source}: missing control symbols {' '.join(missing)}")
        self.bos_word, self.pad_word = found["bos"], found["pad"]
        self.eos_word, self.unk_word = found["eos"], found["unk"]
        self.mask_word = found["mask"]
        self.bos_index = self.indices.get(self.bos_word)
        self.pad_index = self.indices.get(self.pad_word)
        self.eos_index = self.indices.get(self.eos_word)
        self.unk_index = self.indices.get(self.unk_word)
        self.mask_index = self.indices.get(self.mask_word) if self.mask_word else None
        # Control symbols are not necessarily the first ids; code that needs
        # them uses ``special_mask()`` rather than fairseq's ``nspecial``.
        self.nspecial = 0

    def special_mask(self) -> np.ndarray:
        """Boolean array over ids: True for control symbols (bos, pad, eos, unk, mask)."""
        mask = np.zeros(len(self.symbols), dtype=bool)
        for idx in (self.bos_index, self.pad_index, self.eos_index, self.unk_index, self.mask_index):
            if idx is not None:
                mask[idx] = True
        return mask

    @classmethod
    def from_tokenizer(cls, tokenizer: SpanTokenizer, counts=None):
        """Dictionary over the tokenizer's vocabulary (plus <mask> for sentencepiece)."""
        symbols = list(tokenizer.vocab)
        if tokenizer.special_symbols()["mask"] is None:
            symbols.append(SPECIAL_SYMBOLS["mask"][1])
        if counts is None:
            counts = np.zeros(len(symbols), dtype=np.int64)
        counts = np.concatenate([counts, np.zeros(len(symbols) - len(counts), np.int64)])
        return cls(symbols, counts.tolist())

    @classmethod
    def load(cls, f):
        """Read ``dict.txt``: one ``symbol count`` line per id, in id order."""
        if isinstance(f, str):
            with open(f, encoding="utf-8") as fd:
                return cls._read(fd, f)
        return cls._read(f, getattr(f, "name", "<stream>"))

    @classmethod
    def _read(cls, fd, source):
        symbols, counts = [], []
        for line_no, line in enumerate(fd, 1):
            line = line.rstrip("\n")
            symbol, sep, count = line.rpartition(" ")
            if not sep or not count.lstrip("-").isdigit():
                raise ValueError(f"{source}:{line_no}: expected '<symbol> <count>', got {line!r}")
            symbols.append(symbol)
            counts.append(int(count))
        return cls(symbols, counts, source=source)

    def save(self, f):
        """Write every symbol with its count, in id order."""
        if isinstance(f, str):
            with open(f, "w", encoding="utf-8") as fd:
                return self.save(fd)
        for symbol, count in zip(self.symbols, self.count):
            print(f"{symbol} {count}", file=f)


def symbol_hashes(symbols) -> np.ndarray:
    """One signed 64-bit BLAKE2b hash per symbol, in id order: a compact record of a vocabulary.

    A checkpoint keeps these so that a data dictionary can be checked symbol by
    symbol (is it the checkpoint's vocabulary, or that vocabulary with symbols
    appended?) without storing the symbols themselves.
    """
    digests = b"".join(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest() for s in symbols)
    return np.frombuffer(digests, dtype="<i8").copy()


def describe_tokenizer(dictionary) -> str:
    """'KIND (FILE)' of the tokenizer a dictionary was prepared with, for messages that compare two vocabularies."""
    source = getattr(dictionary, "source", None)
    if not source or not os.path.isfile(source):
        return f"an in-memory dictionary of {len(dictionary)} symbols"
    folder = os.path.dirname(os.path.abspath(source))
    try:
        with open(os.path.join(folder, META_FILE), encoding="utf-8") as f:
            kind = json.load(f).get("type")
    except (OSError, ValueError, AttributeError):
        return f"the dictionary {os.path.abspath(source)}"
    return tokenizer_description(kind, folder)


def tokenizer_description(kind: str, folder: str) -> str:
    """'KIND (FILE)': the tokenizer of ``kind`` saved in ``folder``, named by its model file."""
    tokenizer_file = SPM_FILE if kind == SentencePieceTokenizer.kind else WORDPIECE_FILE
    return f"{kind} ({os.path.join(folder, tokenizer_file)})"
