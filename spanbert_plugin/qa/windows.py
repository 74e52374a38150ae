"""The on-disk format of a prepared extractive-QA split, shared by prepare, training and prediction.

A split ``S`` of a ``spanbert-prepare-qa`` folder is:

* ``S.bin``/``S.idx``: one fairseq item per window, ``[CLS] question [SEP] passage window [SEP]``;
* ``S.windows.npz``: per-window and per-passage-token arrays (``QASplit`` fields below);
* ``S.questions.jsonl``: one object per question, in order: ``id``, ``question``,
  ``context_index``, ``answers`` (gold texts; [] when unanswerable), ``is_impossible``;
* ``S.contexts.jsonl``: one JSON string per line, the original passage texts;
* ``S.meta.json``: ``format`` (squad1, squad2 or mrqa) and ``with_negative``
  (unanswerable questions possible: SQuAD 2.0 rules apply).

Windows of one question are consecutive and questions keep the input order,
so ``question_index`` is sorted. Passage tokens of window ``w`` sit at token
positions ``passage_offset[w] + k`` for ``k < token_offsets[w+1] - token_offsets[w]``;
their character spans in the context are ``[char_start, char_end)``, and ``sentence_ids`` (optional)
their sentence in the context (SpanDrop's sentence units).
"""
import json
import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..core.file_utils import damaged_file_error, load_arrays, read_json, read_jsonl

ARRAYS = ("question_index", "start_positions", "end_positions", "passage_offset",
          "token_offsets", "char_start", "char_end", "max_context")
OPTIONAL_ARRAYS = ("sentence_ids",)  # absent from folders prepared before they existed
# one value per passage token per window (SQuAD's training set: 14 million): stored as int32, read back as int64
PER_TOKEN_ARRAYS = ("char_start", "char_end", "sentence_ids")


@dataclass
class QASplit:
    """Windows of one split and what post-processing needs to turn logits into answers."""

    question_index: np.ndarray  # [W] int64, sorted: the window's question
    start_positions: np.ndarray  # [W] int64 training label (0 = [CLS]: no answer in the window)
    end_positions: np.ndarray  # [W] int64
    passage_offset: np.ndarray  # [W] int64 token position of the first passage token
    token_offsets: np.ndarray  # [W + 1] int64 slices of the per-passage-token arrays
    char_start: np.ndarray  # [N] int64 character start of each passage token in its context
    char_end: np.ndarray  # [N] int64 character end (exclusive)
    max_context: np.ndarray  # [N] bool: the token has its maximum context in this window
    sentence_ids: Optional[np.ndarray] = None  # [N] int64 sentence of each passage token within its context
    questions: List[dict] = field(default_factory=list)
    contexts: List[str] = field(default_factory=list)
    format: str = "squad1"
    with_negative: bool = False

    @property
    def num_windows(self) -> int:
        return len(self.question_index)

    @property
    def num_questions(self) -> int:
        return len(self.questions)

    def passage_lengths(self) -> np.ndarray:
        """Passage tokens per window."""
        return np.diff(self.token_offsets)

    def windows_of(self, question: int) -> slice:
        """The consecutive windows of one question."""
        lo, hi = np.searchsorted(self.question_index, [question, question + 1])
        return slice(int(lo), int(hi))

    def question_bounds(self) -> np.ndarray:
        """[Q + 1] window offsets: windows of question q are bounds[q]:bounds[q+1]."""
        return np.searchsorted(self.question_index, np.arange(self.num_questions + 1))

    def save(self, folder: str, split: str) -> None:
        """Write the npz, questions, contexts and meta files of ``split`` (not the token binaries)."""
        prefix = os.path.join(folder, split)
        arrays = {name: getattr(self, name) for name in ARRAYS + OPTIONAL_ARRAYS if getattr(self, name) is not None}
        for name in PER_TOKEN_ARRAYS:
            if name in arrays:
                arrays[name] = arrays[name].astype(np.int32)  # character offsets and sentence numbers fit
        np.savez(prefix + ".windows.npz", **arrays)
        with open(prefix + ".questions.jsonl", "w", encoding="utf-8") as f:
            for q in self.questions:
                f.write(json.dumps(q, ensure_ascii=False) + "\n")
        with open(prefix + ".contexts.jsonl", "w", encoding="utf-8") as f:
            for c in self.contexts:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        with open(prefix + ".meta.json", "w") as f:
            json.dump({"format": self.format, "with_negative": self.with_negative}, f, indent=2)

    @classmethod
    def load(cls, folder: str, split: str) -> "QASplit":
        """Read a split written by ``save``."""
        prefix = os.path.join(folder, split)
        if not os.path.isfile(prefix + ".windows.npz"):
            raise FileNotFoundError(f"{prefix}.windows.npz: no such file (not a spanbert-prepare-qa split {split!r})")
        arrays = load_arrays(prefix + ".windows.npz")
        values = {name: arrays[name] for name in ARRAYS}
        values.update({name: arrays[name] for name in OPTIONAL_ARRAYS if name in arrays})
        for name in PER_TOKEN_ARRAYS:
            if name in values:
                values[name] = values[name].astype(np.int64)
        questions = read_jsonl(prefix + ".questions.jsonl")
        contexts = read_jsonl(prefix + ".contexts.jsonl")
        # files cut short at a line's end parse: the windows and questions name what must be there
        if len(values["question_index"]) and int(values["question_index"].max()) >= len(questions):
            raise damaged_file_error(prefix + ".questions.jsonl", f"{len(questions)} questions, but the windows name "
                                     f"question {int(values['question_index'].max())}")
        if questions and max(q["context_index"] for q in questions) >= len(contexts):
            raise damaged_file_error(prefix + ".contexts.jsonl", f"{len(contexts)} passages, but the questions name more")
        meta = read_json(prefix + ".meta.json")
        return cls(**values, questions=questions, contexts=contexts, format=meta["format"],
                   with_negative=bool(meta["with_negative"]))
