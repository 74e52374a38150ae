"""The fixed entity-marker table of relation extraction and how its symbols get token ids.

Every marker symbol has a fixed place in ``MARKER_TABLE``, whatever the data:
first the start (or replacement) markers, subject then object, each over
``ENTITY_TYPES`` then ``[SUBJ-OTHER]`` (a type outside the table) and ``[SUBJ]``
(no type given); then the end markers ``[/SUBJ-PERSON]`` ... in the same order.
``--entity-marker ner`` uses the first half (46 symbols), ``typed_marker`` all 92,
``typed_marker_punct`` none (its markers are ordinary punctuation and words).

A symbol already in the dictionary keeps its id; the others take the
vocabulary's ``[unusedN]`` entries in order of N (BERT uncased: ``[SUBJ-PERSON]``
is ``[unused0]``; BERT cased starts at ``[unused1]``); markers past the last
``[unusedN]`` are appended to the dictionary. The assignment depends only on
the vocabulary and the mode, never on the data (SpanBERT's released code
assigned ``[unused]`` entries in the order the training data showed the types).
"""
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

ROLES = ("SUBJ", "OBJ")

# TACRED's entity types (Stanford CoreNLP NER), then the other CoreNLP types.
ENTITY_TYPES = (
    "PERSON", "ORGANIZATION", "LOCATION", "CITY", "STATE_OR_PROVINCE", "COUNTRY", "NATIONALITY",
    "RELIGION", "TITLE", "IDEOLOGY", "CRIMINAL_CHARGE", "CAUSE_OF_DEATH", "DATE", "DURATION",
    "NUMBER", "URL", "MISC", "EMAIL", "MONEY", "PERCENT", "TIME",
)
OTHER_TYPE = "OTHER"  # any type outside ENTITY_TYPES
# Short names of the same types (CoNLL style).
TYPE_ALIASES = {"PER": "PERSON", "ORG": "ORGANIZATION", "LOC": "LOCATION"}

ENTITY_MARKERS = ("ner", "typed_marker", "typed_marker_punct")
# typed_marker_punct (Zhou & Chen 2021): "@ * person * Bill Gates @", "# ^ city ^ Seattle #"; the type
# is written as lower-case words (table name, or the raw type when outside the table), so no type is lost
PUNCT_MARKERS = {"SUBJ": ("@", "*"), "OBJ": ("#", "^")}

_UNUSED = re.compile(r"^\[unused(\d+)\]$")


def normalise_type(raw) -> Optional[str]:
    """The table type of a raw entity type: None when untyped, ``OTHER`` when outside the table."""
    if raw is None:
        return None
    name = str(raw).strip().upper()
    if not name:
        return None
    name = TYPE_ALIASES.get(name, name)
    return name if name in ENTITY_TYPES else OTHER_TYPE


def start_marker(role: str, entity_type: Optional[str]) -> str:
    """``[SUBJ-PERSON]``, or ``[SUBJ]`` when untyped."""
    return f"[{role}-{entity_type}]" if entity_type else f"[{role}]"


def end_marker(role: str, entity_type: Optional[str]) -> str:
    """``[/SUBJ-PERSON]``, or ``[/SUBJ]`` when untyped."""
    return f"[/{role}-{entity_type}]" if entity_type else f"[/{role}]"


def _types_with_fallbacks():
    return (*ENTITY_TYPES, OTHER_TYPE, None)


START_MARKERS = tuple(start_marker(r, t) for r in ROLES for t in _types_with_fallbacks())
END_MARKERS = tuple(end_marker(r, t) for r in ROLES for t in _types_with_fallbacks())
MARKER_TABLE = START_MARKERS + END_MARKERS


def mode_markers(mode: str) -> Sequence[str]:
    """The marker symbols a mode inserts, in table order."""
    if mode not in ENTITY_MARKERS:
        raise ValueError(f"unknown entity marker mode {mode!r}; expected one of {', '.join(ENTITY_MARKERS)}")
    return {"ner": START_MARKERS, "typed_marker": MARKER_TABLE, "typed_marker_punct": ()}[mode]


def punct_marker_words(role: str, entity_type: Optional[str]):
    """(words before, words after) the mention in ``typed_marker_punct`` mode."""
    outer, inner = PUNCT_MARKERS[role]
    if entity_type is None:
        return [outer], [outer]
    return [outer, inner, *entity_type.lower().split("_"), inner], [outer]


@dataclass
class MarkerVocabulary:
    """Token id of every marker symbol of a mode, and the symbols appended to the dictionary."""

    mode: str
    ids: Dict[str, int] = field(default_factory=dict)
    appended: List[str] = field(default_factory=list)
    from_unused: Dict[str, str] = field(default_factory=dict)  # marker -> the [unusedN] it took


def assign_marker_ids(symbols: Sequence[str], mode: str) -> MarkerVocabulary:
    """Give each marker of ``mode`` an id in a dictionary of ``symbols`` (see the module docstring)."""
    present = {s: i for i, s in enumerate(symbols)}
    unused = sorted((int(m.group(1)), present[s]) for s in symbols if (m := _UNUSED.match(s)))
    free = iter(unused)
    vocab = MarkerVocabulary(mode)
    next_id = len(symbols)
    for marker in mode_markers(mode):
        if marker in present:
            vocab.ids[marker] = present[marker]
            continue
        slot = next(free, None)
        if slot is not None:
            vocab.ids[marker] = slot[1]
            vocab.from_unused[marker] = symbols[slot[1]]
        else:
            vocab.ids[marker] = next_id
            vocab.appended.append(marker)
            next_id += 1
    return vocab
