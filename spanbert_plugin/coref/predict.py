"""Coreference prediction: every document of a prepared split (``spanbert-predict-coref``), or raw text (``hub.coref``).

Documents go through the model one at a time, exactly as at validation, so the
scores written here equal the ones fairseq-train logged for the same checkpoint
and split.
"""
import json
import logging
import os
import re
import sys
import time
from collections import Counter
from typing import List, Optional, Sequence

import numpy as np
import regex
import torch
from omegaconf import DictConfig, open_dict
from tqdm import tqdm

from ..core.progress import progress_bar
from ..core.errors import UsageError
from ..core.file_utils import atomic_directory, check_destination, checkpoint_inputs, read_text
from ..core.finetune_io import load_finetuned_checkpoint
from ..core.tokenization import load_tokenizer
from .conll import GENRES, CorefDocument, with_coref_column
from .criterion import coref_outputs, gold_clusters
from .dataset import collate_document
from .head import predicted_clusters
from .long_document import bounded_notice, bounded_prediction, predicts_bounded
from .metrics import CONVENTIONS, METRICS, OTHER_METRICS, SCORED, add_counts, convention_counts, coref_scores
from .prepare import DocumentEncoder, load_documents

COMMAND = "spanbert-predict-coref"
TASK = "coreference"
logger = logging.getLogger(__name__)
# sentence-final punctuation: Latin, Devanagari dandas, CJK full-width, Arabic and Urdu
_SENTENCE_END = {".", "!", "?", "\u0964", "\u0965", "\u3002", "\uff01", "\uff1f", "\uff0e", "\u061f", "\u06d4"}
# a line break: LF, CRLF, a lone CR (old Mac files), NEL and the Unicode line and paragraph separators
_LINE_BREAK = re.compile("\r\n?|[\n\x85\u2028\u2029]")


# A word is a run of letters and digits with the combining marks of every script (decomposed accents, Devanagari,
# Thai and Arabic vowel signs: \w alone would cut "René" into "Rene" and "मुझे" into four words), joined by hyphens or
# apostrophes; any other visible character is a word of its own, with its marks, an emoji with its skin-tone modifier,
# and the rest of a ZWJ sequence or flag. Format and control characters (zero-width spaces, byte-order marks,
# bidirectional marks) are no words: like white space they only separate them; a zero-width joiner or non-joiner
# inside a word (Persian) is part of it, as regex's \w has them.
# A CJK ideograph is a word of its own, as BERT's tokenizer makes it (its handle_chinese_chars ranges): text in
# Chinese has no spaces, and a run of ideographs as one word could hold no mention smaller than itself.
_IDEOGRAPH = (r"[\u3400-\u4DBF\u4E00-\u9FFF\uF900-\uFAFF\U00020000-\U0002A6DF\U0002A700-\U0002B73F"
              r"\U0002B740-\U0002B81F\U0002B820-\U0002CEAF\U0002F800-\U0002FA1F]")
# regex's \w leaves out the other numbers (No) that Python's re counts: "km²", "H₂O" and "10½" stay one word each, as
# BERT's tokenizer keeps them
_LETTER = rf"(?:(?!{_IDEOGRAPH})[\w\p{{No}}])"
_SYMBOL = r"[^\w\s\p{Cf}\p{Cc}][\p{M}\U0001F3FB-\U0001F3FF\U000E0020-\U000E007F]*"
_WORD = regex.compile(rf"{_LETTER}(?:{_LETTER}|\p{{M}})*(?:[-'’]{_LETTER}(?:{_LETTER}|\p{{M}})*)*"
                      rf"|{_IDEOGRAPH}\p{{M}}*"
                      r"|[\U0001F1E6-\U0001F1FF]{2}"  # a flag: two regional indicators
                      rf"|{_SYMBOL}(?:\u200d{_SYMBOL})*")


def _to_device(sample, device):
    from fairseq import utils

    return utils.apply_to_sample(lambda t: t.to(device), sample)


def document_outputs(model, sample) -> dict:
    """The coreference head's outputs (top spans, antecedent and mention scores) of one collated document."""
    with torch.no_grad():
        return coref_outputs(model, sample)


def document_clusters(model, task, sample, singleton_threshold: Optional[float] = None, notice=logger.info,
                      progress=None) -> list:
    """Predicted clusters (word spans) of one collated document (one-mention ones with ``singleton_threshold``):
    exactly, or in bounded memory for a long document (the task's ``--coref-prediction``; ``notice`` gets the line
    saying so, ``progress(words)`` each block's words)."""
    num_words = sample["coref"]["num_words"]
    if predicts_bounded(task.cfg, num_words):
        notice(bounded_notice(task.cfg, num_words))
        with torch.no_grad():
            return bounded_prediction(model, task.cfg, sample, singleton_threshold, progress)[0]
    clusters = predicted_clusters(document_outputs(model, sample), sample["coref"]["token_word"], singleton_threshold)
    if progress is not None:
        progress(num_words)
    return clusters


def predict_documents(model, task, split: str, swept_thresholds: Sequence[float] = (), notice=logger.info):
    """(predicted clusters, gold clusters, {threshold: predicted clusters} for each of ``swept_thresholds``) of
    every document of ``split``, in order. The exact head runs once per document whatever the thresholds; a
    document predicted in bounded memory runs again for each threshold (its entity cache holds the spans likely
    to be one-mention clusters, so the threshold shapes the links too)."""
    task.load_dataset(split, training=False)  # whole documents, no SpanDrop, whatever the split is called
    dataset = task.dataset(split)
    device = next(model.parameters()).device
    predicted, gold, swept = [], [], {threshold: [] for threshold in swept_thresholds}
    for index in range(len(dataset)):
        sample = _to_device(dataset.collater([dataset[index]]), device)
        if predicts_bounded(task.cfg, sample["coref"]["num_words"]):
            predicted.append(document_clusters(model, task, sample, task.singleton_threshold, notice))
            for threshold, clusters in swept.items():
                clusters.append(document_clusters(model, task, sample, threshold, lambda line: None))
        else:
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
    return {**{m: nested[m] for m in METRICS}, "conll_f1": flat["conll_f1"],
            **{m: nested[m] for m in OTHER_METRICS}, "mentions": nested["mentions"]}


def evaluation(gold: list, predicted: list, convention: str) -> dict:
    """eval.json: the scores of ``convention`` and its summed counts at the top (as before both conventions
    existed), ``convention``, and each convention's scores under its name."""
    totals = {c: {} for c in CONVENTIONS}
    for key, response in zip(gold, predicted):
        for c, counts in convention_counts(key, response).items():
            totals[c] = add_counts(totals[c], counts)
    return {**scores_of(totals[convention]), "counts": totals[convention], "convention": convention,
            **{c: scores_of(totals[c]) for c in CONVENTIONS}}


def apply_prediction_options(task, no_singletons=None, singleton_threshold=None, scoring_convention=None,
                             coref_prediction=None, max_antecedent_distance=None, entity_cache_size=None) -> None:
    """Override the checkpoint's singleton, scoring and long-document settings (None keeps the checkpoint's)."""
    options = {"singleton_threshold": singleton_threshold, "no_singletons": no_singletons,
               "scoring_convention": scoring_convention, "coref_prediction": coref_prediction,
               "max_antecedent_distance": max_antecedent_distance, "entity_cache_size": entity_cache_size}
    for name, value in options.items():
        if value is None:
            continue
        if isinstance(task.cfg, DictConfig):
            with open_dict(task.cfg):  # checkpoints trained before an option existed lack its key
                setattr(task.cfg, name, value)
        else:
            setattr(task.cfg, name, value)


def check_prediction_options(singleton_threshold=None, no_singletons=None, max_antecedent_distance=None,
                             entity_cache_size=None) -> None:
    if singleton_threshold is not None and not 0 < singleton_threshold < 1:
        raise UsageError(f"--singleton-threshold must be in (0, 1), got {singleton_threshold}")
    if singleton_threshold is not None and no_singletons:
        raise UsageError("--singleton-threshold has no effect with --no-singletons (no one-mention cluster is "
                         "predicted); give one of them")
    for flag, value in (("--max-antecedent-distance", max_antecedent_distance),
                        ("--entity-cache-size", entity_cache_size)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")


def refuse_thresholds_without_singletons(task, singleton_threshold, singleton_threshold_sweep) -> None:
    """A checkpoint trained without one-mention clusters predicts none (unless --singletons says so): a threshold
    for them would be ignored, and a sweep would score singletons eval.json does not predict."""
    if task.cfg.no_singletons and (singleton_threshold is not None or singleton_threshold_sweep):
        flag = "--singleton-threshold" if singleton_threshold is not None else "--singleton-threshold-sweep"
        raise UsageError(f"{flag}: this checkpoint predicts no one-mention clusters (its training data held none, or "
                         "--no-singletons); add --singletons to predict them at a threshold")


def predict_split(checkpoint, data, split, out, force=False, batch_size=None, max_tokens=None, cpu=False,
                  no_singletons=None, singleton_threshold=None, scoring_convention=None,
                  singleton_threshold_sweep=None, text=None, join_wrapped_lines=False, coref_prediction=None,
                  max_antecedent_distance=None, entity_cache_size=None, genre=None) -> dict:
    """Write ``<split>.conll``, ``<split>.gold.conll``, ``clusters.jsonl`` and ``eval.json`` to ``out``, and with
    ``singleton_threshold_sweep`` (thresholds) ``singleton_thresholds.json``: {threshold: eval.json's scores at it}.
    With ``text`` (a raw text file), ``predict_text`` instead.

    ``batch_size``/``max_tokens`` are accepted for the shared predict options; a batch is always one document.
    The singleton, scoring and long-document options override the checkpoint's (None keeps them).
    """
    check_prediction_options(singleton_threshold, no_singletons, max_antecedent_distance, entity_cache_size)
    options = {"no_singletons": no_singletons, "singleton_threshold": singleton_threshold,
               "scoring_convention": scoring_convention, "coref_prediction": coref_prediction,
               "max_antecedent_distance": max_antecedent_distance, "entity_cache_size": entity_cache_size}
    if text is not None:
        for flag, given in (("--singleton-threshold-sweep", singleton_threshold_sweep), ("--split", split),
                            ("--scoring-convention", scoring_convention)):
            if given:
                raise UsageError(f"{flag} concerns a prepared split (its scores); it has no effect with --text")
        return predict_text(checkpoint, text, out, force, cpu, join_wrapped_lines, data, options, genre)
    split = split or "test"
    for flag, given in (("--join-wrapped-lines", join_wrapped_lines), ("--genre", genre)):
        if given:  # a prepared document's genre comes from its name
            raise UsageError(f"{flag} applies to --text only")
    for threshold in singleton_threshold_sweep or ():
        if not 0 < threshold < 1:
            raise UsageError(f"--singleton-threshold-sweep: every threshold must be in (0, 1), got {threshold:g}")
    inputs = checkpoint_inputs(checkpoint, data)  # the data folder the checkpoint names counts too
    check_destination(out, COMMAND, inputs, force, "--out")
    model, task, _ = load_finetuned_checkpoint(checkpoint, TASK, data, cpu)
    apply_prediction_options(task, **options)
    refuse_thresholds_without_singletons(task, singleton_threshold, singleton_threshold_sweep)
    documents = load_documents(task.cfg.data, split)
    predicted, gold, swept = predict_documents(model, task, split, singleton_threshold_sweep or (),
                                               lambda line: print(f"{COMMAND}: {line}", file=sys.stderr))
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


def split_words(text: str, line_breaks: str = "space"):
    """Words of raw text with character offsets, and sentence ids.

    A sentence ends after . ! ? and, with ``line_breaks`` "sentence", at every line break (a file with one
    paragraph or sentence per line), with "paragraph", at blank lines only (wrapped lines, as Project Gutenberg's);
    "space": line breaks are spaces."""
    matches = list(_WORD.finditer(text))
    words = [m.group(0) for m in matches]
    if not words:
        return words, [], np.zeros(0, dtype=np.int64)
    ends = np.array([w in _SENTENCE_END for w in words], dtype=bool)
    if line_breaks != "space":
        newlines = np.array([m.start() for m in _LINE_BREAK.finditer(text)], dtype=np.int64)
        word_ends = np.array([m.end() for m in matches], dtype=np.int64)
        next_starts = np.array([m.start() for m in matches[1:]] + [len(text)], dtype=np.int64)
        # the gap after a word holds only whitespace and invisible characters (everything else is a word), so its
        # line breaks are its breaks
        breaks = np.searchsorted(newlines, next_starts) - np.searchsorted(newlines, word_ends)
        ends |= breaks >= (1 if line_breaks == "sentence" else 2)
    sentence_ids = np.concatenate([[0], np.cumsum(ends)[:-1]]).astype(np.int64)
    return words, [(m.start(), m.end()) for m in matches], sentence_ids


def words_sample(tokenizer, dictionary, meta: dict, words: List[str], sentence_ids: np.ndarray,
                 genre: str = "other") -> dict:
    """The collated batch of one document given as words and sentence ids (segmented as the prepared data)."""
    encoder = DocumentEncoder(tokenizer, dictionary, meta["max_segment_length"], meta["max_span_width"])
    doc = CorefDocument(f"{genre}/text", words, np.asarray(sentence_ids, dtype=np.int64), ["-"] * len(words), [],
                        "text")
    enc = encoder.encode(doc, tokenizer.encode_ids(words), Counter())
    item = {**enc, "id": 0, "num_words": len(words),
            "token_segment": np.repeat(np.arange(len(enc["segment_lengths"])), enc["segment_lengths"])}
    return collate_document(item, dictionary.pad())


def text_line_breaks(join_wrapped_lines: bool) -> str:
    """How raw text's line breaks split sentences: each line one, or (wrapped lines joined) only blank lines."""
    return "paragraph" if join_wrapped_lines else "sentence"


def resolve_text(model, task, tokenizer, text: str, line_breaks: str = "sentence", notice=logger.info,
                 progress=None, split=None, genre: Optional[str] = None) -> List[List[dict]]:
    """Clusters of raw text in the order of their first mentions: each a list of {text, start, end} (character
    offsets, end exclusive); long texts in bounded memory (``document_clusters``). ``split``:
    ``split_words(text, line_breaks)`` when the caller has it already; ``genre``: an OntoNotes genre or ``other``
    (default: ``task.raw_text_genre()``)."""
    genre = genre or task.raw_text_genre()
    if genre not in GENRES:
        raise UsageError(f"genre {genre!r}: expected one of {', '.join(GENRES)}")
    words, offsets, sentence_ids = split if split is not None else split_words(text, line_breaks)
    if not words:
        return []
    sample = words_sample(tokenizer, task.dictionary, task.meta, words, sentence_ids, genre)
    clusters = document_clusters(model, task, _to_device(sample, next(model.parameters()).device),
                                 task.singleton_threshold, notice, progress)
    resolved = [[{"text": text[offsets[s][0]:offsets[e][1]], "start": offsets[s][0], "end": offsets[e][1]}
                 for s, e in cluster] for cluster in clusters]
    return sorted(resolved, key=lambda mentions: (mentions[0]["start"], mentions[0]["end"]))


def read_input_text(path: str) -> str:
    """The text of ``--text`` (gzip decompressed, a byte-order mark dropped, as every input's); UsageError naming
    the file when it cannot be read or holds no word (an empty prediction would pass for a result)."""
    text = read_text(path, "--text", allow_gzip=True)
    if _WORD.search(text) is None:  # zero-width and other invisible characters are no words either
        raise UsageError(f"--text {path}: empty or only white space and invisible characters, no word (expected the "
                         "text to resolve)")
    return text


def predict_text(checkpoint: str, text_path: str, out: str, force: bool = False, cpu: bool = False,
                 join_wrapped_lines: bool = False, data: Optional[str] = None, options: Optional[dict] = None,
                 genre: Optional[str] = None) -> dict:
    """Write ``clusters.jsonl`` (one cluster a line, by first mention: {"id", "mentions": [{text, start, end}]},
    character offsets into the text as read, end exclusive) and ``summary.json`` to ``out``; ``genre``: the
    OntoNotes genre to predict under (default: the checkpoint's ``raw_text_genre``)."""
    text = read_input_text(text_path)
    inputs = [*checkpoint_inputs(checkpoint, data), text_path]  # the tokenizer comes from the data folder
    check_destination(out, COMMAND, inputs, force, "--out")
    model, task, _ = load_finetuned_checkpoint(checkpoint, TASK, data, cpu)
    apply_prediction_options(task, **(options or {}))
    refuse_thresholds_without_singletons(task, (options or {}).get("singleton_threshold"), None)
    tokenizer = load_tokenizer(task.cfg.data)  # the one the checkpoint's data was prepared with, as hub.coref uses
    started = time.perf_counter()
    line_breaks = text_line_breaks(join_wrapped_lines)
    split = split_words(text, line_breaks)
    words = len(split[0])
    genre = genre or task.raw_text_genre()
    with progress_bar(total=words, unit="word", unit_scale=True, desc=COMMAND) as bar, torch.no_grad():
        clusters = resolve_text(model, task, tokenizer, text, line_breaks,
                                lambda line: tqdm.write(f"{COMMAND}: {line}", file=sys.stderr), bar.update, split,
                                genre)
    summary = {"text": text_path, "characters": len(text), "words": words, "genre": genre, "clusters": len(clusters),
               "mentions": sum(len(c) for c in clusters),
               "prediction": "bounded" if predicts_bounded(task.cfg, words) else "exact",
               "seconds": round(time.perf_counter() - started, 1)}
    with atomic_directory(out, COMMAND, inputs, force, "--out") as work:
        with open(os.path.join(work, "clusters.jsonl"), "w", encoding="utf-8") as f:
            for number, mentions in enumerate(clusters):
                f.write(json.dumps({"id": number, "mentions": mentions}, ensure_ascii=False) + "\n")
        with open(os.path.join(work, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    return summary
