"""One small tokenizer interface over sentencepiece and BERT WordPiece.

Both tokenizers give token ids that equal the fairseq dictionary's ids (the
dictionary is written from the tokenizer's vocabulary in id order), the
character offsets of every token, and whether each token starts a word, which
span masking needs (spans are whole words). Later tasks (QA, relation
extraction) map character spans through ``Encoding.offsets``.
"""
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unicodedata
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np
import regex

from .errors import UsageError
from .file_utils import is_json_integer, read_json, read_text

META_FILE = "spanbert_tokenizer.json"
SPM_FILE = "spm.model"
WORDPIECE_FILE = "vocab.txt"

# Control symbols by role, BERT spelling first, fairseq/sentencepiece second.
SPECIAL_SYMBOLS = {
    "bos": ("[CLS]", "<s>"),
    "pad": ("[PAD]", "<pad>"),
    "eos": ("[SEP]", "</s>"),
    "unk": ("[UNK]", "<unk>"),
    "mask": ("[MASK]", "<mask>"),
}
WORDPIECE_REQUIRED = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
SPM_WORD_PREFIX = "\u2581"  # sentencepiece's word-start marker '▁'
CASE_FOLDING_RULE = "nmt_nfkc_cf"  # sentencepiece's NFKC + case folding normalisation
# sentencepiece trains on at most this many lines (paragraphs) of its text: of a longer text, a uniform sample drawn
# here with a fixed seed. sentencepiece's own sampling (shuffle_input_sentence) is unseeded: each run of the same
# command on the same corpus got another vocabulary.
SPM_TRAINING_LINES = 2_000_000
SPM_SAMPLE_SEED = 0
SPM_MAX_LINE_BYTES = 4192  # sentencepiece's max_sentence_length: it trains on no longer line


class TokenizerError(UsageError):
    """Bad tokenizer input: the message names the file and the problem."""


class VocabSizeTooLarge(TokenizerError):
    """The text supports at most ``largest`` sentencepiece pieces."""

    def __init__(self, message: str, largest: int):
        super().__init__(message)
        self.largest = largest


@dataclass
class Encoding:
    """Token ids of one text, with each token's string, offsets and word-start flag."""

    ids: np.ndarray
    tokens: List[str]
    offsets: List[Tuple[int, int]]  # [start, end) character offsets into the text
    word_starts: np.ndarray


# a run of combining marks (accents in decomposed text, Devanagari and Thai vowel signs, ...)
_MARK_RUN = regex.compile(r"\p{M}+")


def cover_dropped_marks(text: str, offsets: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """``offsets`` with each token's end moved over the combining marks right after it that no token covers.

    BERT's accent stripping removes non-spacing marks (NFD, then category Mn), and the offsets it reports leave the
    removed marks out: in decomposed "cafe\u0301" the token "cafe" ends before the accent, in Hindi "मुझे" the last
    token ends before the vowel sign. A span cut from the text by such offsets would end inside a character (the base
    letter without its accent or vowel sign). A mark the next token starts on (a spacing mark it keeps) stays with it.
    A token can also end inside a run: in Hindi "हाँ" the token keeps the spacing vowel sign and loses the candrabindu
    after it, so the run is the one holding the token's end, not only one starting there.
    """
    if text.isascii() or not offsets:
        return list(offsets)
    runs = np.array([m.span() for m in _MARK_RUN.finditer(text)], dtype=np.int64).reshape(-1, 2)
    if not len(runs):
        return list(offsets)
    spans = np.array(offsets, dtype=np.int64).reshape(-1, 2)
    ends = spans[:, 1]
    run = np.searchsorted(runs[:, 0], ends, side="right") - 1  # the last run starting at or before a token's end
    following = np.append(spans[1:, 0], len(text))
    widen = (run >= 0) & (runs[run, 1] > ends) & (following > ends)
    spans[widen, 1] = np.minimum(runs[run[widen], 1], following[widen])
    return list(map(tuple, spans.tolist()))


UNK_WARNING_FRACTION = 0.01  # more [UNK] tokens than this means the vocabulary does not fit the text
_CONTROL_RE = re.compile(r"^(\[[^\]]*\]|<[^>]*>)$")


def lowercase_vocabulary(vocab: Sequence[str]) -> bool:
    """Is the vocabulary uncased: no word piece (control symbols aside) with an upper-case letter?"""
    return not any(piece != piece.lower() for piece in vocab if not _CONTROL_RE.match(piece))


@dataclass
class VocabularyFit:
    """What a tokenizer met: tokens, [UNK] tokens, and whether the text had upper-case letters."""

    tokens: int = 0
    unk_tokens: int = 0
    upper_case_seen: bool = False

    def warnings(self, tokenizer: "SpanTokenizer", source: str) -> List[str]:
        """One line per way the vocabulary does not fit the text (none when it fits)."""
        lines = []
        if self.upper_case_seen and not tokenizer.lowercase and lowercase_vocabulary(tokenizer.vocab):
            lines.append(f"{source}: the vocabulary is lower-case (uncased) but the tokenizer keeps case, and the text has "
                         "upper-case letters, which become [UNK] or rarer pieces: lower-case the text (spanbert-prepare "
                         "--lowercase)")
        if self.tokens and self.unk_tokens > UNK_WARNING_FRACTION * self.tokens:
            lines.append(f"{source}: {self.unk_tokens:,} of {self.tokens:,} tokens "
                         f"({100 * self.unk_tokens / self.tokens:.1f}%) are unknown to the vocabulary ([UNK]); more than "
                         f"{100 * UNK_WARNING_FRACTION:g}% means the vocabulary does not fit this text")
        return lines


class SpanTokenizer:
    """Common interface: ``encode``, ``encode_ids``, ``decode``, ``vocab`` and word starts.

    ``fit`` counts what the tokenizer has encoded (tokens, [UNK]s, upper-case letters), so that every
    prepare command can warn when the vocabulary does not fit the text (``fit.warnings``).
    """

    kind = ""
    vocab: List[str]
    lowercase = False
    model_max_length = None  # an imported HuggingFace tokenizer's longest input (its model_max_length), else None

    @property
    def fit(self) -> VocabularyFit:
        if getattr(self, "_fit", None) is None:
            self._fit = VocabularyFit()
            unk = self.special_symbols()["unk"]
            self._unk_id = self.vocab.index(unk) if unk is not None else -1
            # upper-case letters matter only to a case-keeping tokenizer over an uncased vocabulary
            self._watch_case = not self.lowercase and lowercase_vocabulary(self.vocab)
        return self._fit

    def _note(self, texts: Sequence[str], ids: Sequence[Sequence[int]]) -> None:
        fit = self.fit
        for text, row in zip(texts, ids):
            fit.tokens += len(row)
            fit.unk_tokens += row.count(self._unk_id) if isinstance(row, list) else int(np.count_nonzero(row == self._unk_id))
            if self._watch_case and not fit.upper_case_seen and text != text.lower():
                fit.upper_case_seen = True

    def encode(self, text: str) -> Encoding:
        raise NotImplementedError

    def encode_ids(self, texts: Sequence[str]) -> List[List[int]]:
        """Token ids for a batch of texts (fast path for corpus preparation)."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def save(self, directory: str) -> None:
        raise NotImplementedError

    @staticmethod
    def is_word_start_piece(piece: str) -> bool:
        raise NotImplementedError

    def word_start_table(self) -> np.ndarray:
        """Boolean array over the vocabulary: does this token start a word? (computed once)"""
        if getattr(self, "_word_starts", None) is None:
            self._word_starts = np.array([self.is_word_start_piece(p) for p in self.vocab], dtype=bool)
        return self._word_starts

    def special_symbols(self):
        """The vocabulary's control symbols by role (bos, pad, eos, unk, mask)."""
        present = set(self.vocab)
        return {
            role: next((s for s in names if s in present), None)
            for role, names in SPECIAL_SYMBOLS.items()
        }


def _is_invisible(char: str) -> bool:
    """A format or control character (zero-width space, byte-order mark, BEL, ...): no text of its own."""
    return unicodedata.category(char) in ("Cf", "Cc")


class SentencePieceTokenizer(SpanTokenizer):
    """sentencepiece model; ids 0..3 are <s>, <pad>, </s>, <unk> as in fairseq.

    A lower-casing model is trained with the normalisation rule ``nmt_nfkc_cf``
    (NFKC + case folding), which sentencepiece stores in the model: encoding
    folds case too, and offsets still index the original text.
    """

    kind = "sentencepiece"

    def __init__(self, model_file: str):
        import sentencepiece as spm

        self.model_file = model_file
        self.sp = spm.SentencePieceProcessor(model_file=model_file)
        self.lowercase = self._normalizer_name(model_file) == CASE_FOLDING_RULE
        self.vocab = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]

    @staticmethod
    def is_word_start_piece(piece: str) -> bool:
        # control symbols (<s>, <mask>, ...) stand alone; <unk> stands for one unknown character, inside a word or
        # after a lone '▁' that starts it, never a word start of its own
        return piece.startswith(SPM_WORD_PREFIX) or (piece.startswith("<") and piece != "<unk>")

    def encode(self, text: str) -> Encoding:
        proto = self.sp.encode(text, return_type="proto")
        # sentencepiece reports byte offsets; convert them to character offsets.
        char_of_byte = np.zeros(len(text.encode("utf-8")) + 1, dtype=np.int64)
        byte_lengths = np.fromiter((len(c.encode("utf-8")) for c in text), np.int64, len(text))
        char_of_byte[np.cumsum(byte_lengths)] = 1
        char_of_byte = np.cumsum(char_of_byte)
        ids = np.array([p.id for p in proto.pieces], dtype=np.int64)
        tokens = [p.piece for p in proto.pieces]
        offsets = []
        for p in proto.pieces:
            start, end = int(char_of_byte[p.begin]), int(char_of_byte[p.end])
            # the '▁' of a word-initial piece stands for the space before it, and for the zero-width and control
            # characters that normalisation turned into that space or removed (U+200B, U+FEFF, ...)
            word_initial = p.piece.startswith(SPM_WORD_PREFIX)
            while start < end and (text[start].isspace() or word_initial and _is_invisible(text[start])):
                start += 1
            offsets.append((start, end))
        self._note((text,), (ids,))
        return Encoding(ids, tokens, offsets, self.word_start_table()[ids] if len(ids) else np.zeros(0, bool))

    def encode_ids(self, texts):
        texts = list(texts)
        ids = self.sp.encode(texts)
        self._note(texts, ids)
        return ids

    def decode(self, ids):
        return self.sp.decode([int(i) for i in ids if int(i) < len(self.vocab)])

    def save(self, directory):
        import shutil

        if os.path.abspath(self.model_file) != os.path.abspath(os.path.join(directory, SPM_FILE)):
            shutil.copyfile(self.model_file, os.path.join(directory, SPM_FILE))
        _write_meta(directory, {"type": self.kind, "lowercase": self.lowercase}, self.model_max_length)

    @staticmethod
    def _normalizer_name(model_file):
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        with open(model_file, "rb") as f:
            proto.ParseFromString(f.read())
        return proto.normalizer_spec.name

    @classmethod
    def train(cls, text_file, out_dir, vocab_size, character_coverage=0.9995, model_type="unigram",
              lowercase=False):
        """Train a sentencepiece model on ``text_file``; errors say the largest vocabulary that fits."""

        prefix = os.path.join(out_dir, SPM_FILE[: -len(".model")])
        training_text = sampled_training_text(text_file, out_dir, SPM_TRAINING_LINES, SPM_SAMPLE_SEED)
        try:
            _train_sentencepiece(
                input=training_text,
                model_prefix=prefix,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                normalization_rule_name=CASE_FOLDING_RULE if lowercase else "nmt_nfkc",
                bos_id=0,
                pad_id=1,
                eos_id=2,
                unk_id=3,
                input_sentence_size=SPM_TRAINING_LINES,  # the whole of the (sampled) text
                shuffle_input_sentence=False,
                # num_threads left at sentencepiece's default (16), not the machine's cores: the vocabulary depends
                # on the thread count (each thread sums its share of the EM statistics)
                minloglevel=2,
            )
        except RuntimeError as err:
            message = str(err)
            fits = re.search(r"value <= (\d+)", message)
            if fits:
                raise VocabSizeTooLarge(
                    f"{text_file}: --vocab-size {vocab_size} is larger than this text supports; "
                    f"the largest that fits is {fits.group(1)}",
                    int(fits.group(1)),
                ) from None
            if "smaller than required_chars" in message:
                need = re.search(r"\d+ vs (\d+)", message)  # "<vocab size> vs <characters + special pieces>"
                raise TokenizerError(
                    f"{text_file}: --vocab-size {vocab_size} is too small: this text needs at least "
                    f"{need.group(1) if need else 'more'} pieces (one per character, plus the special symbols)"
                ) from None
            if "!sentences_.empty()" in message:  # sentencepiece's own check: it kept no line to train on
                raise TokenizerError(
                    f"{text_file}: no line of at most {SPM_MAX_LINE_BYTES} bytes for sentencepiece to train on (it "
                    "skips longer ones): put each sentence or paragraph on a line of its own"
                ) from None
            raise TokenizerError(f"{text_file}: sentencepiece training failed: {message}") from None
        finally:
            if training_text != text_file:
                os.remove(training_text)
        return cls(prefix + ".model")


class WordPieceTokenizer(SpanTokenizer):
    """BERT-style WordPiece over a ``vocab.txt`` (ids are line numbers), via HF ``tokenizers``."""

    kind = "wordpiece"

    def __init__(self, vocab_file: str, lowercase: bool = False, strip_accents=None, extra_special_tokens=(),
                 tokenize_chinese_chars: bool = True):
        self._build(vocab_file, read_wordpiece_vocab(vocab_file), lowercase, strip_accents, extra_special_tokens,
                    tokenize_chinese_chars)

    def _build(self, vocab_file, vocab, lowercase, strip_accents, extra_special_tokens=(), tokenize_chinese_chars=True):
        """``strip_accents`` None follows ``lowercase``, as BERT's normaliser does; ``tokenize_chinese_chars`` puts
        spaces around CJK characters (BERT's ``handle_chinese_chars``), so that each is a word. ``extra_special_tokens``
        (vocabulary tokens such as entity markers in ``[unusedN]`` slots) are kept whole, as transformers'
        ``additional_special_tokens`` are: matched in the raw text before normalisation."""
        from tokenizers import BertWordPieceTokenizer

        self.vocab_file = vocab_file
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else bool(strip_accents)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.vocab = vocab
        self.extra_special_tokens = []
        # built from the checked list, not the file: tokenizers would keep a byte-order mark in token 0
        self.tok = BertWordPieceTokenizer(
            {piece: i for i, piece in enumerate(self.vocab)},
            lowercase=lowercase, strip_accents=self.strip_accents, clean_text=True,
            handle_chinese_chars=self.tokenize_chinese_chars,
        )
        self.add_special_tokens(extra_special_tokens)

    def add_special_tokens(self, tokens) -> None:
        """Keep ``tokens`` (of the vocabulary: no new ids) whole, as transformers' ``additional_special_tokens``."""
        present = set(self.vocab)
        outside = [t for t in tokens if t not in present]
        if outside:
            raise TokenizerError(f"{self.vocab_file}: has no token {outside[0]!r}, declared a special token")
        new = [t for t in dict.fromkeys(tokens) if t not in self.extra_special_tokens]
        self.extra_special_tokens += new
        self.tok.add_special_tokens(new)

    def with_appended_tokens(self, tokens, special=()) -> "WordPieceTokenizer":
        """A copy whose vocabulary continues with ``tokens`` (new ids, in order), those in ``special`` kept whole as
        special tokens: symbols appended to the dictionary, such as entity markers that found no ``[unusedN]`` (special)
        or the padding words of a dictionary padded to a multiple (plain)."""
        vocab, special = [*self.vocab, *tokens], set(special)
        check_wordpiece_vocab(vocab, self.vocab_file)
        extended = type(self).__new__(type(self))
        extended._build(self.vocab_file, vocab, self.lowercase, self.strip_accents,
                        [*self.extra_special_tokens, *(t for t in tokens if t in special)], self.tokenize_chinese_chars)
        extended.model_max_length = self.model_max_length
        return extended

    @classmethod
    def from_tokenizer_json(cls, path: str, lowercase=None, strip_accents=None,
                            tokenize_chinese_chars=None) -> "WordPieceTokenizer":
        """The WordPiece tokenizer a HuggingFace ``tokenizer.json`` describes (folders that ship no ``vocab.txt``).

        The vocabulary comes from its WordPiece model (ids as stored); lower-casing and accent stripping from its
        ``BertNormalizer`` unless ``lowercase`` is given, and CJK handling unless ``tokenize_chinese_chars`` is (a
        ``tokenizer_config.json``'s settings, which transformers puts over the file's). Its special added tokens are
        the importer's to declare (``add_special_tokens``), with those the folder's other files list. Anything this class
        could not reproduce exactly (another model or pre-tokenizer, other normaliser options, a word-piece prefix
        other than ``##``, added tokens outside the vocabulary) is a
        TokenizerError naming the file.
        """
        try:
            spec = read_json(path)
        except UsageError as err:
            raise TokenizerError(str(err)) from None
        model = spec.get("model") if isinstance(spec, dict) else None
        if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
            kind = model.get("type") if isinstance(model, dict) else None
            raise TokenizerError(f"{path}: a {kind or 'unknown'} tokenizer model; only WordPiece (BERT) can be read")
        if model.get("continuing_subword_prefix", "##") != "##":
            raise TokenizerError(f"{path}: word-piece prefix {model['continuing_subword_prefix']!r}; BERT's is '##'")
        normalizer, pre_tokenizer = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
        if normalizer.get("type") != "BertNormalizer" or not normalizer.get("clean_text", True):
            raise TokenizerError(f"{path}: normalizer {json.dumps(normalizer)[:120]}; expected BERT's (BertNormalizer "
                                 "with clean_text)")
        if pre_tokenizer.get("type") != "BertPreTokenizer":
            raise TokenizerError(f"{path}: pre_tokenizer {pre_tokenizer.get('type')!r}; expected BertPreTokenizer")
        by_id = {}
        for piece, index in model["vocab"].items():
            if not is_json_integer(index) or index in by_id:
                raise TokenizerError(f"{path}: token {piece!r} has id {index!r}, not a unique integer")
            by_id[index] = piece
        if sorted(by_id) != list(range(len(by_id))):
            raise TokenizerError(f"{path}: the WordPiece ids are not 0..{len(by_id) - 1} without gaps")
        vocab = [by_id[i] for i in range(len(by_id))]
        outside = [t for t in spec.get("added_tokens") or [] if by_id.get(t.get("id")) != t.get("content")]
        if outside:
            token, index = outside[0].get("content"), outside[0].get("id")
            if isinstance(index, int) and index >= len(vocab):  # add_tokens + resize_token_embeddings
                raise TokenizerError(f"{path}: added token {token!r} (id {index}) lies beyond the {len(vocab)} WordPiece "
                                     "tokens; tokens added after the vocabulary are not imported")
            raise TokenizerError(f"{path}: added token {token!r} (id {index}) is not the WordPiece vocabulary's token "
                                 "of that id")
        check_wordpiece_vocab(vocab, path)
        tokenizer = cls.__new__(cls)
        if lowercase is None:
            lowercase, strip_accents = bool(normalizer.get("lowercase", True)), normalizer.get("strip_accents")
        if tokenize_chinese_chars is None:
            tokenize_chinese_chars = normalizer.get("handle_chinese_chars", True)
        tokenizer._build(path, vocab, lowercase, strip_accents, tokenize_chinese_chars=tokenize_chinese_chars)
        return tokenizer

    @staticmethod
    def normaliser_settings(path: str):
        """(lowercase, strip_accents, handle_chinese_chars) of a ``tokenizer.json``'s ``BertNormalizer``, or None when
        it has none."""
        try:
            normalizer = read_json(path).get("normalizer") or {}
        except (UsageError, AttributeError):
            return None
        if normalizer.get("type") != "BertNormalizer":
            return None
        return (bool(normalizer.get("lowercase", True)), normalizer.get("strip_accents"),
                bool(normalizer.get("handle_chinese_chars", True)))

    @staticmethod
    def is_word_start_piece(piece: str) -> bool:
        return not piece.startswith("##")

    def encode(self, text: str) -> Encoding:
        enc = self.tok.encode(text, add_special_tokens=False)
        ids = np.array(enc.ids, dtype=np.int64)
        self._note((text,), (ids,))
        return Encoding(ids, list(enc.tokens), cover_dropped_marks(text, enc.offsets),
                        self.word_start_table()[ids] if len(ids) else np.zeros(0, bool))

    def encode_ids(self, texts):
        texts = list(texts)
        ids = [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]
        self._note(texts, ids)
        return ids

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory):
        with open(os.path.join(directory, WORDPIECE_FILE), "w", encoding="utf-8") as f:
            f.write("".join(p + "\n" for p in self.vocab))
        meta = {"type": self.kind, "lowercase": self.lowercase}
        if self.strip_accents != self.lowercase:  # recorded only where it departs from BERT's rule
            meta["strip_accents"] = self.strip_accents
        if not self.tokenize_chinese_chars:  # recorded only where it departs from BERT's
            meta["tokenize_chinese_chars"] = False
        if self.extra_special_tokens:
            meta["extra_special_tokens"] = self.extra_special_tokens
        _write_meta(directory, meta, self.model_max_length)


def sampled_training_text(text_file: str, folder: str, limit: int, seed: int) -> str:
    """``text_file``, or where it has more than ``limit`` lines a new file in ``folder`` (the caller removes it)
    holding ``limit`` of them in their order, drawn uniformly from (``seed``, the line count): the same lines on
    every run."""
    with open(text_file, "rb") as f:
        count, last = 0, b"\n"
        for chunk in iter(lambda: f.read(1 << 24), b""):
            count, last = count + chunk.count(b"\n"), chunk[-1:]
    count += last != b"\n"  # a last line without its line break
    if count <= limit:
        return text_file
    keep = np.zeros(count, dtype=bool)
    keep[np.random.default_rng([seed, count]).choice(count, limit, replace=False)] = True
    # a name of its own: a file of the folder's (even the text itself) is never written over, nor removed after
    handle, sample = tempfile.mkstemp(prefix=".spm_training_sample.", suffix=".txt", dir=folder)
    try:
        with os.fdopen(handle, "wb") as out, open(text_file, "rb") as f:
            out.writelines(line for line, kept in zip(f, keep) if kept)
    except BaseException:  # a full disk or Ctrl-C while writing: no partial sample left behind
        os.remove(sample)
        raise
    return sample


_TRAIN_SPM = "import json, sys, sentencepiece as spm; spm.SentencePieceTrainer.train(**json.loads(sys.argv[1]))"


def _train_sentencepiece(**options):
    """sentencepiece training in a child process, killed if this one is interrupted.

    Training is one long C++ call: in this process a SIGTERM would wait for it
    to end (and a scheduler's SIGKILL after its grace period would leave the
    temporary output folder behind). Raises RuntimeError with sentencepiece's
    message on failure.

    sentencepiece reads ``input`` as a comma-separated list of files: a path with a comma in it reaches it as a
    comma-free link, relative to a folder of its own beside the model that the child works in (removed afterwards).
    """
    options = dict(options, input=os.path.abspath(options["input"]), model_prefix=os.path.abspath(options["model_prefix"]))
    with contextlib.ExitStack() as stack:
        links = None
        if "," in options["input"]:
            links = stack.enter_context(tempfile.TemporaryDirectory(prefix=".spm_input.",
                                                                    dir=os.path.dirname(options["model_prefix"])))
            os.symlink(options["input"], os.path.join(links, "input.txt"))
            options["input"] = "input.txt"
        proc = subprocess.Popen([sys.executable, "-c", _TRAIN_SPM, json.dumps(options)], cwd=links,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if proc.returncode != 0:
        lines = err.strip().splitlines() or [f"exit status {proc.returncode}"]
        raise RuntimeError(lines[-1].split("RuntimeError: ", 1)[-1])


def read_wordpiece_vocab(vocab_file: str) -> List[str]:
    """Read a BERT vocab.txt (one token per line, UTF-8 with or without a byte-order mark) and check it."""
    try:
        text = read_text(vocab_file)
    except UsageError as err:
        raise TokenizerError(str(err)) from None
    # universal newlines, as a file opened in text mode reads them
    vocab = [line.rstrip("\n") for line in io.StringIO(text, newline=None)]
    if vocab and vocab[-1] == "":
        vocab.pop()
    check_wordpiece_vocab(vocab, vocab_file)
    return vocab


def check_wordpiece_vocab(vocab: List[str], source: str) -> None:
    """TokenizerError naming ``source`` when BERT's special tokens are missing or a token repeats."""
    missing = [s for s in WORDPIECE_REQUIRED if s not in set(vocab)]
    if missing:
        raise TokenizerError(f"{source}: missing required special tokens {' '.join(missing)}")
    seen = {}
    for line_no, piece in enumerate(vocab, 1):
        if piece in seen:
            raise TokenizerError(
                f"{source}:{line_no}: duplicate token {piece!r} (first on line {seen[piece]})"
            )
        seen[piece] = line_no


def _write_meta(directory, meta, model_max_length=None):
    if model_max_length is not None:
        meta["model_max_length"] = model_max_length
    with open(os.path.join(directory, META_FILE), "w") as f:
        json.dump(meta, f, indent=2)


def _load_sentencepiece(model_file: str) -> "SentencePieceTokenizer":
    """The folder's sentencepiece model; TokenizerError naming it when it is missing or cannot be read (sentencepiece
    raises a RuntimeError for both)."""
    if not os.path.isfile(model_file):
        raise TokenizerError(f"{model_file}: no such file, though {META_FILE} beside it names a sentencepiece "
                             "tokenizer; copy it from the spanbert-prepare output")
    try:
        return SentencePieceTokenizer(model_file)
    except (RuntimeError, OSError) as err:
        raise TokenizerError(f"{model_file}: cannot load the sentencepiece model ({str(err).strip()}); copy it again "
                             "from the spanbert-prepare output") from None


def read_tokenizer_meta(meta_path: str) -> dict:
    """The JSON object of a prepared folder's ``META_FILE``; TokenizerError naming it when damaged or not an object."""
    try:
        meta = read_json(meta_path)
    except UsageError as err:
        raise TokenizerError(f"{err} (a damaged {META_FILE}: copy it again from the spanbert-prepare output)") from None
    if not isinstance(meta, dict):
        raise TokenizerError(f"{meta_path}: expected a JSON object with the tokenizer's type")
    return meta


def load_tokenizer(directory: str) -> SpanTokenizer:
    """Load the tokenizer that ``spanbert-prepare`` saved in ``directory``."""
    meta_path = os.path.join(directory, META_FILE)
    if not os.path.isfile(meta_path):
        raise TokenizerError(f"{meta_path}: no such file (not a spanbert-prepare directory?)")
    meta = read_tokenizer_meta(meta_path)
    max_length = meta.get("model_max_length")
    if max_length is not None and (not is_json_integer(max_length) or max_length <= 0):
        raise TokenizerError(f"{meta_path}: model_max_length must be a positive integer, found {max_length!r}")
    if meta.get("type") == SentencePieceTokenizer.kind:
        tokenizer = _load_sentencepiece(os.path.join(directory, SPM_FILE))
    elif meta.get("type") == WordPieceTokenizer.kind:
        extra = meta.get("extra_special_tokens", [])
        if not isinstance(extra, list) or not all(isinstance(t, str) for t in extra):
            raise TokenizerError(f"{meta_path}: extra_special_tokens must be a list of vocabulary tokens, found {extra!r}")
        tokenizer = WordPieceTokenizer(os.path.join(directory, WORDPIECE_FILE), meta.get("lowercase", False),
                                       meta.get("strip_accents"), extra, meta.get("tokenize_chinese_chars", True))
    else:
        raise TokenizerError(f"{meta_path}: unknown tokenizer type {meta.get('type')!r}")
    tokenizer.model_max_length = max_length
    return tokenizer
