"""What a QA model answers by beyond its weights, beside a HuggingFace export: ``qa_settings.json``.

``BertForQuestionAnswering`` holds the start/end logits only. How ``hub.answer`` windows a context, whether the
empty answer competes (SQuAD 2.0 rules), and the answer options validation used (``n_best``,
``max_answer_length``, ``null_threshold``, the validated threshold) are written beside it by
``spanbert-export-hf`` and kept in the task state of the checkpoint ``spanbert-import-hf`` writes, so that the
imported model answers as the exported one did, and a second export writes the same file.
"""
import json
import math
import os

from ..core.errors import UsageError
from ..core.file_utils import is_json_integer, read_json
from ..core.tasks import task_state_of
from .prepare import QAConfig

QA_SETTINGS = "qa_settings.json"
TASK_STATE_KEY = "qa_settings"
WINDOW_KEYS = ("max_seq_length", "doc_stride", "max_query_length")
ANSWER_KEYS = ("n_best", "max_answer_length")


def recorded_qa_settings(task):
    """The settings an imported checkpoint's task state keeps, or None (a fine-tuning task keeps its own)."""
    if hasattr(task, "qa_config"):
        return None
    return task_state_of(task).get(TASK_STATE_KEY)


def qa_settings_of(hub) -> dict:
    """The settings ``hub.answer`` uses by default on this checkpoint, as one JSON object."""
    from .answer import fitting_config, trained_with_negative
    from .scoring import answer_options_of

    recorded = recorded_qa_settings(hub.task)
    if recorded is not None:
        return dict(recorded)
    qa_config = getattr(hub.task, "qa_config", None)
    fitted = None if qa_config else fitting_config(hub.model.max_positions())
    windows = {key: int(qa_config[key] if qa_config else getattr(fitted, key)) for key in WINDOW_KEYS}
    options = answer_options_of(hub.cfg)
    validated = getattr(hub.task, "validated_null_threshold", lambda: None)()
    return {**windows, "with_negative": trained_with_negative(hub.task), "n_best": int(options.n_best),
            "max_answer_length": int(options.max_answer_length), "null_threshold": float(options.null_threshold),
            "validated_null_threshold": None if validated is None else float(validated)}


def write_qa_settings(hub, directory: str) -> None:
    settings = qa_settings_of(hub)
    with open(os.path.join(directory, QA_SETTINGS), "w", encoding="utf-8") as f:
        json.dump({**settings, "rules": "squad2: the empty answer competes" if settings["with_negative"] else
                   "squad1: every question gets a span"}, f, indent=2)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_qa_settings(path: str) -> dict:
    """The settings in an export's ``qa_settings.json``, checked; UsageError naming the file and key."""
    found = read_json(path)
    if not isinstance(found, dict):
        raise UsageError(f"{path}: expected a JSON object, found {type(found).__name__}")
    for key in WINDOW_KEYS + ANSWER_KEYS:
        value = found.get(key)
        if not is_json_integer(value) or value < 1:
            raise UsageError(f"{path}: {key} must be a positive integer, found {value!r}")
    try:  # the rules spanbert-prepare-qa holds its windows to: room for a passage, no passage token skipped
        QAConfig(*(found[key] for key in WINDOW_KEYS)).check()
    except UsageError as err:
        raise UsageError(f"{path}: {err} (its {', '.join(WINDOW_KEYS)})") from None
    if not isinstance(found.get("with_negative"), bool):
        raise UsageError(f"{path}: with_negative must be true or false, found {found.get('with_negative')!r}")
    if not _number(found.get("null_threshold")):
        raise UsageError(f"{path}: null_threshold must be a number, found {found.get('null_threshold')!r}")
    validated = found.get("validated_null_threshold")
    if validated is not None and not _number(validated):
        raise UsageError(f"{path}: validated_null_threshold must be a number or null, found {validated!r}")
    return {key: found[key] for key in WINDOW_KEYS + ("with_negative",) + ANSWER_KEYS + ("null_threshold",)} | {
        "validated_null_threshold": None if validated is None else float(validated)}
