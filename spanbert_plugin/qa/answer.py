"""Answer one question about one context with a QA model (``hub.answer``), windowed like prepared data."""
import numbers
import warnings
from typing import List, Optional

import numpy as np
import torch

from ..model.hub_interface import check_count, check_text, register_hub_feature
from .postprocess import postprocess
from .prepare import QAConfig, QAFile, featurize
from .hf_settings import WINDOW_KEYS, qa_settings_of

DEFAULT_WINDOWS = QAConfig(max_seq_length=384, doc_stride=128, max_query_length=64)


@torch.no_grad()
def answer_question(model, tokenizer, dictionary, question: str, context: str, topk: int = 1,
                    config: Optional[QAConfig] = None, with_negative: bool = False, n_best: int = 20,
                    max_answer_length: int = 30, null_threshold: float = 0.0) -> List[dict]:
    """The ``topk`` best answers: dicts with ``text``, character ``start``/``end``, ``score`` and ``probability``.

    ``score`` is the start plus end logit; with ``with_negative`` (a SQuAD 2.0 model) the empty answer
    (start = end = -1) competes with its null score less ``null_threshold``, so that it comes first exactly when
    ``spanbert-predict-qa`` at that threshold predicts no answer.
    """
    check_text("answer", "question", question)
    check_text("answer", "context", context)
    if not question.strip():
        raise ValueError("answer() needs a non-empty question")
    if not context.strip():
        raise ValueError("answer() needs a non-empty context")
    topk = check_count("answer", "topk", topk)
    n_best = check_count("answer", "n_best", n_best)
    max_answer_length = check_count("answer", "max_answer_length", max_answer_length)
    null_threshold = check_null_threshold(null_threshold)
    config = config or fitting_config(model.max_positions())
    qa = QAFile(path="<answer>", format="squad2" if with_negative else "squad1", with_negative=with_negative,
                contexts=[context],
                questions=[{"id": "0", "question": question, "context_index": 0, "answers": [], "is_impossible": False}],
                where=["<answer>"], answer_start=np.array([-1]), answer_end=np.array([-1]))
    features = featurize(qa, tokenizer, dictionary.bos(), dictionary.eos(), config, training=False)
    split, offsets = features.split, features.window_offsets
    # text of zero-width or control characters only passes strip() and tokenizes to nothing: no span to answer with
    if int(split.passage_offset[0]) <= 2:  # [CLS] question [SEP]: the question left no token
        raise ValueError(f"answer(): the question {question!r} has no token the tokenizer keeps")
    if int(split.token_offsets[-1]) == 0:
        raise ValueError(f"answer(): the context {context[:40]!r} has no token the tokenizer keeps")
    lengths = np.diff(offsets)
    tokens = torch.full((len(lengths), int(lengths.max())), dictionary.pad(), dtype=torch.long)
    segments = torch.zeros_like(tokens)
    for w, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:])):
        tokens[w, : hi - lo] = torch.from_numpy(features.tokens[lo:hi])
        segments[w, int(split.passage_offset[w]): hi - lo] = 1
    device = next(model.parameters()).device
    (start, end), _ = model(tokens.to(device), segment_labels=segments.to(device), qa=True)
    padding = tokens.eq(dictionary.pad()).to(device)
    fill = torch.finfo(torch.float32).min
    start = start.float().masked_fill(padding, fill).cpu().numpy()
    end = end.float().masked_fill(padding, fill).cpu().numpy()
    result = postprocess(split, np.arange(len(lengths)), start, end, n_best=max(n_best, topk),
                         max_answer_length=max_answer_length, null_threshold=null_threshold)
    answers = [
        {"text": e["text"], "start": e["start"], "end": e["end"],
         "score": float(e["start_logit"] + e["end_logit"]), "probability": float(e["probability"])}
        for e in result.nbest["0"]
    ]
    if with_negative:  # a tie goes to the span, as the prediction's strict null_odds > threshold has it
        answers.sort(key=lambda a: (-(a["score"] - null_threshold) if a["start"] < 0 else -a["score"], a["start"] < 0))
    return answers[:topk]


def check_null_threshold(value) -> float:
    """``null_threshold`` as a float: a number (numpy's too), not a bool, not NaN; 'validation' is resolved before."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise ValueError(f"hub.answer: null_threshold must be a number or 'validation', got {value!r}")
    return float(value)


def fitting_config(max_positions: int) -> QAConfig:
    """BERT's usual windows (384 / 128 / 64), shrunk to the model's positions."""
    length = min(DEFAULT_WINDOWS.max_seq_length, max_positions)
    query = min(DEFAULT_WINDOWS.max_query_length, max(1, length // 4))
    stride = min(DEFAULT_WINDOWS.doc_stride, max(1, (length - query - 3) // 2))
    return QAConfig(max_seq_length=length, doc_stride=stride, max_query_length=query)


def trained_with_negative(task) -> bool:
    """Whether the checkpoint's data has unanswerable questions (SQuAD 2.0 rules): its validation split says so, or,
    without one, the formats of the files ``qa_config.json`` records."""
    if not hasattr(task, "qa_split"):
        return False
    try:
        return bool(task.qa_split("valid").with_negative)
    except FileNotFoundError:
        splits = (getattr(task, "qa_config", None) or {}).get("splits") or {}
        return any(isinstance(s, dict) and s.get("format") == "squad2" for s in splits.values())


@register_hub_feature("answer")
def hub_answer(hub, question: str, context: str, topk: int = 1, **kwargs):
    """``hub.answer``: the checkpoint's window settings, ``n_best``, ``max_answer_length`` and ``null_threshold``
    (when it was fine-tuned with extractive_qa) unless given; ``null_threshold="validation"`` takes the best
    threshold of the validation before the checkpoint was saved, as ``--null-threshold-from-validation`` does."""
    if getattr(hub.model, "qa_outputs", None) is None:
        raise ValueError("this checkpoint has no QA head; fine-tune it with --task extractive_qa first")
    given = set(kwargs)
    settings = qa_settings_of(hub)  # the checkpoint's, or those an imported checkpoint recorded from its export
    kwargs.setdefault("config", QAConfig(*(settings[key] for key in WINDOW_KEYS)))
    for key in ("n_best", "max_answer_length", "null_threshold"):
        kwargs.setdefault(key, settings[key])
    if kwargs["null_threshold"] == "validation":
        validated = settings["validated_null_threshold"]
        if validated is None:
            raise ValueError("null_threshold='validation': this checkpoint holds no validated threshold (saved before "
                             "a validation with unanswerable questions, or by an older version); give a number")
        kwargs["null_threshold"] = validated
    check_null_threshold(kwargs["null_threshold"])
    explicit_threshold = "null_threshold" in given
    kwargs.setdefault("with_negative", settings["with_negative"])
    if explicit_threshold and not kwargs["with_negative"]:
        warnings.warn("answer(): null_threshold has no effect: this checkpoint's data has no unanswerable questions, "
                      "so the empty answer never competes (with_negative=True makes it)", stacklevel=3)
    return answer_question(hub.model, hub.tokenizer, hub.dictionary, question, context, topk, **kwargs)
