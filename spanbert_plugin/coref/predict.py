"""Coreference prediction: every document of a prepared split (``spanbert-predict-coref``), or raw text (``hub.coref``).

Documents go through the model one at a time, exactly as at validation, so the
scores written here equal the ones fairseq-train logged for the same checkpoint
and split.
"""
import json
import os
import re
from collections import Counter
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..core.errors import UsageError
from ..core.file_utils import atomic_directory, check_destination
from ..core.finetune_io import load_finetuned_checkpoint
from .conll import CorefDocument, with_coref_column
from .criterion import coref_outputs, gold_clusters
from .dataset import collate_document
from .head import predicted_clusters
from .metrics import CONVENTIONS, METRICS, SCORED, add_counts, convention_counts, coref_scores
from .prepare import DocumentEncoder, load_documents

COMMAND = "spanbert-predict-coref"
TASK = "coreference"
# combining marks (decomposed accents, NFD) belong to the word they follow: \w alone would cut "René" into "Rene"
_MARKS = "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
_WORD = re.compile(rf"\w[\w{_MARKS}]*(?:[-'’]\w[\w{_MARKS}]*)*|[^\w\s]")
_SENTENCE_END = {".", "!", "?"}


def _to_device(sample, device):
    from fairseq import utils

    return utils.apply_to_sample(lambda t: t.to(device), sample)


def document_outputs(model, sample) -> dict:
    """The coreference head's outputs (top spans, antecedent and mention scores) of one collated document."""
    with torch.no_grad():
        return coref_outputs(model, sample)


def document_clusters(model, sample, singleton_threshold: Optional[float] = None) -> list:
    """Predicted clusters (word spans) of one collated document (one-mention ones with ``singleton_threshold``)."""
    return predicted_clusters(document_outputs(model, sample), sample["coref"]["token_word"], singleton_threshold)


def predict_documents(model, task, split: str, swept_thresholds: Sequence[float] = ()):
    """(predicted clusters, gold clusters, {threshold: predicted clusters} for each of ``swept_thresholds``) of
    every document of ``split``, in order; the model runs once per document whatever the thresholds."""
    task.cfg.span_drop_p = 0.0  # prediction never drops spans, whatever the split is called
    task.load_dataset(split)
    dataset = task.dataset(split)
    device = next(model.parameters()).device
    predicted, gold, swept = [], [], {threshold: [] for threshold in swept_thresholds}
    for index in range(len(dataset)):
        sample = _to_device(dataset.collater([dataset[index]]), device)
        out, token_word = document_outputs(model, sample), sample["coref"]["token_word"]
        predicted.append(predicted_clusters(out, token_word, task.singleton_threshold))
        for threshold, clusters in swept.items():
            clusters.append(predicted_clusters(out, token_word, threshold))
        gold.append(gold_clusters(sample["gold"]))
    return predicted, gold, swept


def scores_of(counts: dict) -> dict:
    """One convention's scores: each metric's and mention identification's p/r/f1 (percent), and conll_f1."""
    flat = coref_scores(counts)
    nested = {m: {part: flat[f"{m}_{part}"] for part in ("p", "r", "f1")} for m in SCORED}
    return {**{m: nested[m] for m in METRICS}, "conll_f1": flat["conll_f1"], "mentions": nested["mentions"]}


def evaluation(gold: list, predicted: list, convention: str) -> dict:
    """eval.json: the scores of ``convention`` and its summed counts at the top (as before both conventions
    existed), ``convention``, and each convention's scores under its name."""
    totals = {c: {} for c in CONVENTIONS}
    for key, response in zip(gold, predicted):
        for c, counts in convention_counts(key, response).items():
            totals[c] = add_counts(totals[c], counts)
    return {**scores_of(totals[convention]), "counts": totals[convention], "convention": convention,
            **{c: scores_of(totals[c]) for c in CONVENTIONS}}


def apply_prediction_options(task, no_singletons=None, singleton_threshold=None, scoring_convention=None) -> None:
    """Override the checkpoint's singleton and scoring settings (None keeps the checkpoint's)."""
    if singleton_threshold is not None:
        task.cfg.singleton_threshold = singleton_threshold
    if no_singletons is not None:
        task.cfg.no_singletons = no_singletons
    if scoring_convention is not None:
        task.cfg.scoring_convention = scoring_convention


def predict_split(checkpoint, data, split, out, force=False, batch_size=None, max_tokens=None, cpu=False,
                  no_singletons=None, singleton_threshold=None, scoring_convention=None,
                  singleton_threshold_sweep=None) -> dict:
    """Write ``<split>.conll``, ``<split>.gold.conll``, ``clusters.jsonl`` and ``eval.json`` to ``out``, and with
    ``singleton_threshold_sweep`` (thresholds) ``singleton_thresholds.json``: {threshold: eval.json's scores at it}.

    ``batch_size``/``max_tokens`` are accepted for the shared predict options; a batch is always one document.
    The singleton and scoring options override the checkpoint's (None keeps them).
    """
    if singleton_threshold is not None and not 0 < singleton_threshold < 1:
        raise UsageError(f"--singleton-threshold must be in (0, 1), got {singleton_threshold}")
    if singleton_threshold is not None and no_singletons:
        raise UsageError("--singleton-threshold has no effect with --no-singletons (no one-mention cluster is "
                         "predicted); give one of them")
    for threshold in singleton_threshold_sweep or ():
        if not 0 < threshold < 1:
            raise UsageError(f"--singleton-threshold-sweep: every threshold must be in (0, 1), got {threshold:g}")
    inputs = [checkpoint] + ([data] if data else [])
    check_destination(out, COMMAND, inputs, force, "--out")
    model, task, _ = load_finetuned_checkpoint(checkpoint, TASK, data, cpu)
    apply_prediction_options(task, no_singletons, singleton_threshold, scoring_convention)
    documents = load_documents(task.cfg.data, split)
    predicted, gold, swept = predict_documents(model, task, split, singleton_threshold_sweep or ())
    if len(predicted) != len(documents):
        raise UsageError(f"{task.cfg.data}: {split}.npz holds {len(predicted)} documents but {split}.docs.jsonl "
                         f"{len(documents)}; prepare the folder again")
    scores = {**evaluation(gold, predicted, task.scoring_convention), "split": split, "documents": len(documents)}
    with atomic_directory(out, COMMAND, inputs, force, "--out") as work:
        with open(os.path.join(work, f"{split}.conll"), "w", encoding="utf-8") as pred_file, \
                open(os.path.join(work, f"{split}.gold.conll"), "w", encoding="utf-8") as gold_file, \
                open(os.path.join(work, "clusters.jsonl"), "w", encoding="utf-8") as clusters_file:
            for record, clusters in zip(documents, predicted):
                doc = CorefDocument(record["doc_key"], record["words"], np.zeros(0), [], [], record["source"],
                                    record["lines"], np.asarray(record["token_lines"], dtype=np.int64))
                pred_file.write("\n".join(with_coref_column(doc, clusters)) + "\n")
                gold_file.write("\n".join(record["lines"]) + "\n")
                words = record["words"]
                clusters_file.write(json.dumps({
                    "doc_key": record["doc_key"], "clusters": [[list(span) for span in c] for c in clusters],
                    "text": [[" ".join(words[s:e + 1]) for s, e in c] for c in clusters],
                }, ensure_ascii=False) + "\n")
        with open(os.path.join(work, "eval.json"), "w", encoding="utf-8") as f:
            json.dump(scores, f, indent=2)
        if singleton_threshold_sweep:
            with open(os.path.join(work, "singleton_thresholds.json"), "w", encoding="utf-8") as f:
                json.dump({f"{threshold:g}": {**evaluation(gold, clusters, task.scoring_convention),
                                              "singleton_threshold": threshold}
                           for threshold, clusters in swept.items()}, f, indent=2)
    return scores


def split_words(text: str):
    """Words of raw text with character offsets, and sentence ids (a sentence ends after . ! ?)."""
    matches = list(_WORD.finditer(text))
    words = [m.group(0) for m in matches]
    ends = np.array([w in _SENTENCE_END for w in words], dtype=np.int64)
    sentence_ids = np.concatenate([[0], np.cumsum(ends)[:-1]]) if words else np.zeros(0, dtype=np.int64)
    return words, [(m.start(), m.end()) for m in matches], sentence_ids


def words_sample(tokenizer, dictionary, meta: dict, words: List[str], sentence_ids: np.ndarray) -> dict:
    """The collated batch of one document given as words and sentence ids (segmented as the prepared data)."""
    encoder = DocumentEncoder(tokenizer, dictionary, meta["max_segment_length"], meta["max_span_width"])
    doc = CorefDocument("text", words, np.asarray(sentence_ids, dtype=np.int64), ["-"] * len(words), [], "text")
    enc = encoder.encode(doc, tokenizer.encode_ids(words), Counter())
    item = {**enc, "id": 0, "num_words": len(words),
            "token_segment": np.repeat(np.arange(len(enc["segment_lengths"])), enc["segment_lengths"])}
    return collate_document(item, dictionary.pad())


def resolve_text(model, task, tokenizer, text: str) -> List[List[dict]]:
    """Clusters of raw text: each a list of {text, start, end} (character offsets, end exclusive)."""
    words, offsets, sentence_ids = split_words(text)
    if not words:
        return []
    sample = words_sample(tokenizer, task.dictionary, task.meta, words, sentence_ids)
    clusters = document_clusters(model, _to_device(sample, next(model.parameters()).device), task.singleton_threshold)
    return [[{"text": text[offsets[s][0]:offsets[e][1]], "start": offsets[s][0], "end": offsets[e][1]}
             for s, e in cluster] for cluster in clusters]


def load_coref_checkpoint(checkpoint: str, data: Optional[str] = None, cpu: bool = False):
    return load_finetuned_checkpoint(checkpoint, TASK, data, cpu)
