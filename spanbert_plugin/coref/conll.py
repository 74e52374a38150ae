"""Coreference documents from CoNLL-2012 files or c2f-coref JSON lines (the format is read from the content).

CoNLL-2012: ``#begin document (NAME); part N`` ... ``#end document``, several
parts per file, one token per line (columns separated by white space), word in
column 4, speaker in column 10 when a line has at least 11 columns,
coreference in the last column (``(n``, ``n)``, ``(n)``, ``|``-joined; ``-`` or
``_`` for none); a blank line ends a sentence. Each part is one document whose
key is the text after ``#begin document`` (what the reference scorer matches).

JSON lines (e2e/c2f-coref): one document per line with ``doc_key``,
``sentences`` (lists of words), optional ``speakers`` (same shape) and
``clusters`` (lists of inclusive ``[start, end]`` word spans over the whole document).

Every document keeps its CoNLL lines (synthesised for JSON lines), so a
prediction can be written as the input with the last column replaced.
"""
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..core.errors import UsageError
from ..core.file_utils import is_json_integer, parse_json, read_text

logger = logging.getLogger(__name__)

Span = Tuple[int, int]
# OntoNotes genres (the first path element of its document names); anything else is "other"
GENRES = ("bc", "bn", "mz", "nw", "pt", "tc", "wb", "other")
_BEGIN = re.compile(r"^#\s*begin document (.*)$")
_END = re.compile(r"^#\s*end document")
_SINGLE = re.compile(r"\((\d+)\)")
_OPEN = re.compile(r"\((\d+)")
_CLOSE = re.compile(r"(\d+)\)")
_LAST_FIELD = re.compile(r"\S+(\s*)$")
# what splits a synthesised CoNLL line into columns (a tab) or the file into lines (str.splitlines, as read_conll)
_CONLL_BREAKS = re.compile("[\t\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


@dataclass
class CorefDocument:
    """One document: words, sentence of each word, speakers, gold clusters (inclusive word spans)."""

    doc_key: str
    words: List[str]
    sentence_ids: np.ndarray  # sentence index of every word
    speakers: List[str]
    clusters: List[List[Span]]
    source: str  # "file:line" of the document's first line
    lines: List[str] = field(default_factory=list)  # CoNLL lines, #begin ... #end
    token_lines: Optional[np.ndarray] = None  # index into ``lines`` of every word

    @property
    def genre(self) -> str:
        name = self.doc_key.strip().lstrip("(").split("/")[0]
        return name if name in GENRES else "other"


def genre_index(genre: str) -> int:
    return GENRES.index(genre if genre in GENRES else "other")


def _coref_field(value: str, where: str) -> Tuple[List[int], List[int], List[int]]:
    """(single-word mentions, opened, closed) cluster ids of a coreference column, read as the reference scorer does.

    The scorer takes ``(n)`` first, then ``(n``, then ``n)``, so ``(0(12`` reads like ``(0|(12``.
    """
    if value in ("", "-", "_"):
        return [], [], []
    singles = [int(n) for n in _SINGLE.findall(value)]
    rest = _SINGLE.sub("", value)
    opens = [int(n) for n in _OPEN.findall(rest)]
    rest = _OPEN.sub("", rest)
    closes = [int(n) for n in _CLOSE.findall(rest)]
    if _CLOSE.sub("", rest).replace("|", ""):
        raise UsageError(f"{where}: malformed coreference field {value!r} (expected parts like (3, 3) or (3), "
                         "joined by |)")
    return singles, opens, closes


class _ConllDocumentBuilder:
    def __init__(self, doc_key: str, path: str, line_no: int, header: str):
        self.doc_key, self.path, self.begin_line = doc_key, path, line_no
        self.lines = [header]
        self.words, self.sentence_ids, self.speakers, self.token_lines = [], [], [], []
        self.sentence = 0
        self.open: Dict[int, List[Tuple[int, int]]] = {}  # cluster id -> stack of (word, line number)
        self.clusters: Dict[int, List[Span]] = {}  # in order of first mention

    def blank(self, line: str):
        self.lines.append(line)
        if self.words and self.sentence_ids[-1] == self.sentence:
            self.sentence += 1

    def token(self, line: str, line_no: int):
        where = f"{self.path}:{line_no}"
        columns = line.split("\t") if "\t" in line else line.split()
        if len(columns) < 5:
            raise UsageError(f"{where}: a token line needs at least 5 columns (word in column 4, coreference last), "
                             f"got {len(columns)}")
        word = len(self.words)
        self.token_lines.append(len(self.lines))
        self.lines.append(line)
        self.words.append(_unescaped(columns[3].strip()))
        self.sentence_ids.append(self.sentence)
        self.speakers.append(columns[9].strip() if len(columns) >= 11 else "-")
        singles, opens, closes = _coref_field(columns[-1].strip(), where)
        for cluster in singles:
            self.clusters.setdefault(cluster, []).append((word, word))
        for cluster in opens:
            self.open.setdefault(cluster, []).append((word, line_no))
        for cluster in closes:
            if not self.open.get(cluster):
                raise UsageError(f"{where}: unbalanced brackets: mention of cluster {cluster} closes but was "
                                 f"never opened in document {self.doc_key}")
            self.clusters.setdefault(cluster, []).append((self.open[cluster].pop()[0], word))

    def finish(self, line: str, line_no: int) -> CorefDocument:
        for cluster, stack in self.open.items():
            if stack:
                raise UsageError(
                    f"{self.path}:{stack[-1][1]}: unbalanced brackets: mention of cluster {cluster} is not closed "
                    f"before the end of document {self.doc_key} (line {line_no}); a mention may not cross a part"
                )
        if not self.words:
            raise UsageError(f"{self.path}:{self.begin_line}: empty document {self.doc_key} (no token lines)")
        self.lines.append(line)
        read = sorted((sorted(set(spans)) for spans in self.clusters.values()), key=lambda c: c[0])
        clusters = merge_clusters_sharing_a_span(read, self.doc_key, f"{self.path}:{self.begin_line}")
        doc = CorefDocument(self.doc_key, self.words, np.asarray(self.sentence_ids, dtype=np.int64), self.speakers,
                            clusters, f"{self.path}:{self.begin_line}", self.lines,
                            np.asarray(self.token_lines, dtype=np.int64))
        if len(clusters) < len(read):  # the gold file written for the scorer holds the clusters scored
            doc.lines = with_coref_column(doc, clusters)
        return doc


def _unescaped(word: str) -> str:
    """OntoNotes writes a sentence's final "." and "?" as "/." and "/?" in some documents; SpanBERT's minimize.py
    (normalize_word) reads them as the marks (the key file keeps them)."""
    return word[1:] if word in ("/.", "/?") else word


def merge_clusters_sharing_a_span(clusters: Sequence[Sequence[Span]], doc_key: str, where: str) -> List[List[Span]]:
    """Clusters that share a span merged into one, as SpanBERT's and e2e-coref's minimize.py do (the reference
    scorer reads such a key, warning "Repeated mention in the key"); a warning names the document."""
    if sum(map(len, clusters)) == len({span for cluster in clusters for span in cluster}):
        return [list(c) for c in clusters]  # no span in two clusters: the usual case
    merged: List[set] = []
    for cluster in map(set, clusters):
        for other in [m for m in merged if m & cluster]:  # every earlier cluster it joins, merged transitively
            cluster |= other
            merged.remove(other)
        merged.append(cluster)
    logger.warning(f"{where}: {len(clusters) - len(merged)} cluster(s) of document {doc_key} share a span with "
                   "another and were merged into it (as SpanBERT's minimize.py does)")
    return sorted((sorted(c) for c in merged), key=lambda c: c[0])


def read_conll(path: str, text: str) -> List[CorefDocument]:
    """Every document part of a CoNLL-2012 file's text."""
    documents, current = [], None
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip("\r")
        begin = _BEGIN.match(line)
        if begin:
            if current is not None:
                raise UsageError(f"{path}:{line_no}: #begin document inside document {current.doc_key} "
                                 f"(line {current.begin_line}) without its #end document")
            current = _ConllDocumentBuilder(begin.group(1).strip(), path, line_no, line)
        elif _END.match(line):
            if current is None:
                raise UsageError(f"{path}:{line_no}: #end document without #begin document")
            documents.append(current.finish(line, line_no))
            current = None
        elif not line.strip():
            if current is not None:
                current.blank(line)
        elif line.startswith("#"):
            if current is not None:
                current.lines.append(line)  # comments are copied to the prediction unchanged
        else:
            if current is None:
                raise UsageError(f"{path}:{line_no}: token line outside a document (expected #begin document first)")
            current.token(line, line_no)
    if current is not None:
        raise UsageError(f"{path}: document {current.doc_key} (line {current.begin_line}) has no #end document")
    if not documents:
        raise UsageError(f"{path}: no documents (expected #begin document ... #end document)")
    return documents


def _synthesised_lines(doc_key: str, sentences: Sequence[Sequence[str]], speakers,
                       clusters) -> Tuple[List[str], np.ndarray]:
    """CoNLL-2012 lines for a JSON-lines document (word, speaker and the gold coreference column)."""
    n_words = sum(len(s) for s in sentences)
    marks = [[] for _ in range(n_words)]
    for cluster_id, cluster in enumerate(clusters):
        for start, end in cluster:
            if start == end:
                marks[start].append(f"({cluster_id})")
            else:
                marks[start].append(f"({cluster_id}")
                marks[end].append(f"{cluster_id})")
    # e2e-coref's get_doc_key, "{name}_{int(part)}", of an OntoNotes name (genre/source/NN/source_NNNN)
    onto = re.match(r"^((?:bc|bn|mz|nw|pt|tc|wb)/[^/]+/\d+/[^/]+_\d{4})_(\d+)$", doc_key)
    header = (f"#begin document ({onto.group(1)}); part {int(onto.group(2)):03d}" if onto
              else f"#begin document ({doc_key}); part 000")
    lines, token_lines, word = [header], [], 0
    for s, sentence in enumerate(sentences):
        for i, w in enumerate(sentence):
            speaker = speakers[s][i] if speakers else "-"
            token_lines.append(len(lines))
            lines.append("\t".join([doc_key, "0", str(i), w, "-", "-", "-", "-", "-", speaker, "*", "*",
                                    "|".join(marks[word]) or "-"]))
            word += 1
        lines.append("")
    lines.append("#end document")
    return lines, np.asarray(token_lines, dtype=np.int64)


def _is_text_grid(value) -> bool:
    """A list of lists of strings (the shape of ``sentences`` and ``speakers``)."""
    return isinstance(value, list) and all(isinstance(row, list) and all(isinstance(item, str) for item in row)
                                           for row in value)


def _check_conll_field(value: str, what: str, where: str) -> None:
    """UsageError for a value holding a tab or line break: written into the synthesised CoNLL lines (and the
    predicted .conll files), it would split a column or a line and the file would no longer read back."""
    if _CONLL_BREAKS.search(value):
        raise UsageError(f"{where}: {what} {value!r} holds a tab or line break, which would split a CoNLL column "
                         "or line; remove it from the input")


def read_jsonlines(path: str, text: str) -> List[CorefDocument]:
    """Every document of a c2f-coref JSON-lines file's text."""
    documents = []
    for line_no, line in enumerate(text.split("\n"), 1):  # JSON lines end at \n only: U+2028 may sit in a string
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:  # parse_json refuses a lone surrogate escape (\\ud800: no UTF-8 output can hold it) and deep nesting
            record = parse_json(line, where)
        except json.JSONDecodeError as err:
            raise UsageError(f"{where}: not valid JSON ({err})") from None
        if not isinstance(record, dict) or "doc_key" not in record or "sentences" not in record:
            raise UsageError(f"{where}: a JSON-lines document needs doc_key and sentences")
        sentences = record["sentences"]
        if "subtoken_map" in record or (_is_text_grid(sentences) and sentences and sentences[0][:1] == ["[CLS]"]):
            raise UsageError(f"{where}: this is SpanBERT's subtoken-level file (minimize.py's *.384.jsonlines: "
                             "[CLS]/[SEP] segments, subtoken clusters); give the CoNLL-2012 *.v4_gold_conll files "
                             "or word-level c2f/e2e-coref JSON lines")
        if not _is_text_grid(sentences):
            raise UsageError(f"{where}: sentences must be a list of lists of strings (the words)")
        words = [_unescaped(w) for s in sentences for w in s]
        doc_key = str(record["doc_key"])
        _check_conll_field(doc_key, "doc_key", where)
        for word in words:
            _check_conll_field(word, "word", where)
        if not words:
            raise UsageError(f"{where}: empty document {doc_key} (no words)")
        speakers = record.get("speakers")
        if speakers is not None:
            if not _is_text_grid(speakers) or [len(s) for s in speakers] != [len(s) for s in sentences]:
                raise UsageError(f"{where}: speakers must be a list of lists of strings with the shape of sentences "
                                 "(one speaker per word)")
            for speaker in (w for s in speakers for w in s):
                _check_conll_field(speaker, "speaker", where)
        clusters_given = record.get("clusters")
        if clusters_given is None:
            clusters_given = []
        if not isinstance(clusters_given, list) or not all(isinstance(c, list) for c in clusters_given):
            raise UsageError(f"{where}: clusters must be a list of clusters, each a list of [start, end] word spans")
        clusters = []
        for cluster in clusters_given:
            spans = []
            for span in cluster:
                if (not isinstance(span, list) or len(span) != 2 or not all(is_json_integer(i) for i in span)
                        or not 0 <= span[0] <= span[1] < len(words)):
                    raise UsageError(f"{where}: cluster span {span} is outside document {doc_key} of "
                                     f"{len(words)} words (expected [start, end], inclusive word indices)")
                spans.append((span[0], span[1]))
            if spans:
                clusters.append(sorted(set(spans)))
        clusters.sort(key=lambda c: c[0])
        clusters = merge_clusters_sharing_a_span(clusters, doc_key, where)
        sentence_ids = np.repeat(np.arange(len(sentences)), [len(s) for s in sentences])
        lines, token_lines = _synthesised_lines(doc_key, sentences, speakers, clusters)
        documents.append(CorefDocument(doc_key, words, sentence_ids,
                                       [w for s in speakers for w in s] if speakers else ["-"] * len(words),
                                       clusters, where, lines, token_lines))
    if not documents:
        raise UsageError(f"{path}: no documents")
    return documents


def read_documents(path: str) -> List[CorefDocument]:
    """Documents of one CoNLL-2012 or JSON-lines file, the format detected from its first non-blank line
    (CoNLL-2012 also when a ``#begin document`` line comes later: ``read_conll`` names the stray lines)."""
    text = read_text(path)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith("{"):
        return read_jsonlines(path, text)
    if any(_BEGIN.match(line) for line in text.splitlines()):
        return read_conll(path, text)
    if not first:
        raise UsageError(f"{path}: empty (expected CoNLL-2012 or JSON lines)")
    raise UsageError(f"{path}: no '#begin document (NAME); part N' line, so not CoNLL-2012, and not JSON lines "
                     f"(first line: {first[:60]!r}); a CoNLL-2003 or other column file needs converting first")


_DOCUMENT_EXTENSIONS = (".conll", ".gold_conll", ".jsonlines", ".jsonl", ".json", ".txt")


def _is_list_entry(line: str) -> bool:
    """Could this line name a file: no tab, not CoNLL or JSON, one field (or a name with a document extension)?"""
    return ("\t" not in line and not line.startswith(("#", "{"))
            and (len(line.split()) == 1 or line.lower().endswith(_DOCUMENT_EXTENSIONS)))


def expand_inputs(spec: str, flag: str) -> List[str]:
    """Files of an input option: a file, a folder (its .conll, .gold_conll, .jsonlines, .jsonl files), a glob or a list.

    A list file is a text file of paths (relative to the list file), one per line, as LitBank's fold lists.
    """
    import glob

    if os.path.isdir(spec):
        found = sorted(p for ext in ("conll", "gold_conll", "v4_gold_conll", "jsonlines", "jsonl")
                       for p in glob.glob(os.path.join(spec, f"*.{ext}")))
        if not found:
            raise UsageError(f"{flag} {spec}: a folder without .conll or .jsonlines files")
        return found
    if any(c in spec for c in "*?["):
        found = sorted(glob.glob(spec))
        if not found:
            raise UsageError(f"{flag} {spec}: the pattern matches no file")
        return found
    if not os.path.isfile(spec):
        raise UsageError(f"{flag} {spec}: no such file or folder")
    with open(spec, encoding="utf-8-sig", errors="replace") as f:  # utf-8-sig: a byte-order mark is not text
        head = [line.strip() for line in f.read(65536).splitlines() if line.strip()]
    if head and all(_is_list_entry(line) for line in head[:-1] or head):  # a list of document files (the last
        base = os.path.dirname(os.path.abspath(spec))                    # line read may be cut)
        # read_text: strictly UTF-8 (the sniffing above replaced bad bytes), or one line naming the file and line
        entries = [(n, line.strip()) for n, line in enumerate(read_text(spec, flag).splitlines(), 1) if line.strip()]
        paths = []
        for n, entry in entries:
            path = entry if os.path.isabs(entry) else os.path.join(base, entry)
            if not os.path.isfile(path):
                raise UsageError(f"{spec}:{n}: {entry}: no such file (list files name one document file per line)")
            paths.append(path)
        return paths
    return [spec]


def read_split(spec: str, flag: str) -> List[CorefDocument]:
    """Documents of every file of an input option; duplicate document keys are an error, and so are two documents
    written under one "#begin document" line (the reference scorer would read them as one)."""
    documents, seen, written = [], {}, {}
    for path in expand_inputs(spec, flag):
        for doc in read_documents(path):
            if doc.doc_key in seen:
                raise UsageError(f"{doc.source}: duplicate document {doc.doc_key} (first at {seen[doc.doc_key]})")
            header = doc.lines[0] if doc.lines else doc.doc_key
            if header in written:
                raise UsageError(f"{doc.source}: document {doc.doc_key} is written as {header!r}, as the document at "
                                 f"{written[header]} is (the reference scorer would read them as one)")
            seen[doc.doc_key], written[header] = doc.source, doc.source
            documents.append(doc)
    return documents


def coref_column(n_words: int, clusters: Iterable[Iterable[Span]]) -> List[str]:
    """The CoNLL coreference column of a document for the given clusters (cluster ids in the given order)."""
    opens = [[] for _ in range(n_words)]
    singles = [[] for _ in range(n_words)]
    closes = [[] for _ in range(n_words)]
    for cluster_id, cluster in enumerate(clusters):
        for start, end in cluster:
            if start == end:
                singles[start].append(cluster_id)
            else:
                opens[start].append((end, cluster_id))
                closes[end].append((start, cluster_id))
    column = []
    for w in range(n_words):
        # longer mentions open first and close last, so nested brackets read back as written
        parts = [f"({c}" for _, c in sorted(opens[w], key=lambda x: -x[0])]
        parts += [f"({c})" for c in singles[w]]
        parts += [f"{c})" for _, c in sorted(closes[w], key=lambda x: -x[0])]
        column.append("|".join(parts) or "-")
    return column


def _replace_last_column(line: str, value: str) -> str:
    if "\t" in line:  # tab-separated (LitBank): the last field, even an empty one after a trailing tab
        fields = line.split("\t")
        fields[-1] = value
        return "\t".join(fields)
    return _LAST_FIELD.sub(lambda m: value + m.group(1), line, count=1)


def with_coref_column(doc: CorefDocument, clusters: Sequence[Sequence[Span]]) -> List[str]:
    """The document's CoNLL lines with the last column of every token line replaced by ``clusters``."""
    lines = list(doc.lines)
    for line_index, value in zip(doc.token_lines, coref_column(len(doc.words), clusters)):
        lines[line_index] = _replace_last_column(lines[line_index], value)
    return lines
