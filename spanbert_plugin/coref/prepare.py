"""spanbert-prepare-coref: CoNLL-2012 or JSON-lines documents -> a ``coreference`` data folder.

Documents become independent segments (SpanBERT's coreference setting): whole
sentences are packed into segments of up to ``--max-segment-length`` tokens,
``[CLS] ... [SEP]`` each; a sentence longer than a segment is cut at a word
boundary (a single word longer than a segment is cut inside, both counted).

Output, for each split ``S`` (train, valid, test):

* ``S.npz``: the document's tokens, segment and document offsets, and per token
  the word, sentence and speaker it belongs to (-1 for [CLS]/[SEP]); every gold
  mention as inclusive word spans with its cluster (for evaluation), and the
  trainable ones as inclusive token spans (``target_*``);
* ``S.docs.jsonl``: per document its key, words, source and CoNLL lines (the
  prediction is written as these lines with the last column replaced);

plus ``coref_meta.json``, ``dict.txt`` and the tokenizer files of
``--tokenizer-from``, and ``prepare_stats.json``.
"""
import json
import logging
import os
from collections import Counter
from itertools import chain
from typing import Dict, List

import numpy as np

from ..core.errors import UsageError
from ..core.file_utils import atomic_directory, check_destination, load_arrays, read_jsonl
from ..core.progress import progress_bar
from ..core.finetune_io import (
    copy_tokenizer_files, load_tokenizer_folder, read_prepared_json, register_finetuning_folder,
    warn_if_vocabulary_does_not_fit, write_json,
)
from .conll import GENRES, CorefDocument, genre_index, read_split

COMMAND = "spanbert-prepare-coref"
META_FILE = register_finetuning_folder("coref_meta.json", COMMAND, "coreference")
STATS_FILE = "prepare_stats.json"
SPLIT_FLAGS = (("train", "--train"), ("valid", "--valid"), ("test", "--test"))
STAT_KEYS = ("documents", "segments", "sentences", "words", "tokens", "cut_sentences", "cut_words", "mentions",
             "clusters", "singletons", "trainable_mentions", "mentions_wider_than_max_span_width",
             "mentions_across_segments", "mentions_across_sentences")


class DocumentEncoder:
    """Tokenizes documents word by word and packs their sentences into independent segments."""

    def __init__(self, tokenizer, dictionary, max_segment_length: int, max_span_width: int):
        self.tokenizer, self.dictionary = tokenizer, dictionary
        self.capacity = max_segment_length - 2
        self.max_span_width = max_span_width
        self.cls, self.sep, self.unk = dictionary.bos(), dictionary.eos(), dictionary.unk()

    def _segment_ends(self, counts: np.ndarray, sentence_ids: np.ndarray, stats: Counter) -> np.ndarray:
        """Where each segment ends among the document's word pieces: a segment is a run of consecutive pieces (whole
        sentences while they fit; a longer sentence cut at word ends; a word longer than a segment cut inside)."""
        piece_offsets = np.concatenate([[0], np.cumsum(counts)])
        sentence_starts = np.concatenate([[0], np.flatnonzero(np.diff(sentence_ids)) + 1, [len(counts)]])
        ends, start, position = [], 0, 0  # the current segment is pieces [start, position)
        for first, stop in zip(sentence_starts[:-1].tolist(), sentence_starts[1:].tolist()):
            size = int(piece_offsets[stop] - piece_offsets[first])
            if position - start + size <= self.capacity:
                position += size
                continue
            if position > start:
                ends.append(position)
                start = position
            if size <= self.capacity:
                position += size
                continue
            stats["cut_sentences"] += 1
            for pieces in counts[first:stop].tolist():
                if position - start + pieces > self.capacity and position > start:
                    ends.append(position)
                    start = position
                while pieces > self.capacity:  # one word longer than a segment: cut inside it
                    stats["cut_words"] += 1
                    position += self.capacity
                    ends.append(position)
                    start = position
                    pieces -= self.capacity
                position += pieces
        if position > start:
            ends.append(position)
        return np.asarray(ends, dtype=np.int64)

    def encode(self, doc: CorefDocument, word_ids: List[List[int]], stats: Counter) -> Dict[str, np.ndarray]:
        word_ids = [ids if len(ids) else [self.unk] for ids in word_ids]  # a word the tokenizer drops becomes [UNK]
        counts = np.fromiter(map(len, word_ids), dtype=np.int64, count=len(word_ids))
        pieces = np.fromiter(chain.from_iterable(word_ids), dtype=np.int64, count=int(counts.sum()))
        ends = self._segment_ends(counts, doc.sentence_ids, stats)
        starts = np.concatenate([[0], ends[:-1]]) if len(ends) else ends
        lengths = ends - starts + 2  # [CLS] pieces [SEP]
        # piece j of segment i sits after i segments' [CLS] and [SEP] and its own [CLS]
        piece_position = np.arange(len(pieces)) + 2 * np.repeat(np.arange(len(ends)), ends - starts) + 1
        tokens = np.full(int(lengths.sum()), self.cls, dtype=np.int64)
        tokens[piece_position] = pieces
        tokens[np.cumsum(lengths) - 1] = self.sep
        token_word = np.full(len(tokens), -1, dtype=np.int64)
        token_word[piece_position] = np.repeat(np.arange(len(counts)), counts)
        special = token_word < 0
        speakers = {s: i for i, s in enumerate(dict.fromkeys(doc.speakers))}
        speaker_of_word = np.array([speakers[s] for s in doc.speakers], dtype=np.int64)
        token_sentence = np.where(special, -1, doc.sentence_ids[token_word])
        token_speaker = np.where(special, -1, speaker_of_word[token_word])
        token_segment = np.repeat(np.arange(len(lengths)), lengths)
        positions = np.arange(len(token_word))
        word_first = np.full(len(doc.words), len(token_word), dtype=np.int64)
        word_last = np.full(len(doc.words), -1, dtype=np.int64)
        np.minimum.at(word_first, token_word[~special], positions[~special])
        np.maximum.at(word_last, token_word[~special], positions[~special])

        spans = np.array([span for cluster in doc.clusters for span in cluster], dtype=np.int64).reshape(-1, 2)
        cluster_of = np.repeat(np.arange(len(doc.clusters)), [len(c) for c in doc.clusters])
        start_tok, end_tok = word_first[spans[:, 0]], word_last[spans[:, 1]]
        too_wide = end_tok - start_tok + 1 > self.max_span_width
        across_segments = token_segment[start_tok] != token_segment[end_tok]
        across_sentences = doc.sentence_ids[spans[:, 0]] != doc.sentence_ids[spans[:, 1]]
        trainable = ~(too_wide | across_segments | across_sentences)
        stats["mentions"] += len(spans)
        stats["clusters"] += len(doc.clusters)
        stats["singletons"] += sum(len(c) == 1 for c in doc.clusters)
        stats["mentions_wider_than_max_span_width"] += int(too_wide.sum())
        stats["mentions_across_segments"] += int(across_segments.sum())
        stats["mentions_across_sentences"] += int(across_sentences.sum())
        stats["trainable_mentions"] += int(trainable.sum())
        stats["documents"] += 1
        stats["segments"] += len(lengths)
        stats["words"] += len(doc.words)
        stats["tokens"] += len(tokens)
        stats["sentences"] += int(doc.sentence_ids[-1]) + 1
        return {  # per token in int32, as the folder stores them (a split of a whole library stays in memory)
            "tokens": tokens.astype(np.int32), "segment_lengths": lengths, "token_word": token_word.astype(np.int32),
            "token_sentence": token_sentence.astype(np.int32), "token_speaker": token_speaker.astype(np.int32),
            "gold": np.concatenate([spans, cluster_of[:, None]], axis=1),
            "target": np.stack([start_tok, end_tok, cluster_of], axis=1)[trainable],
            "genre": genre_index(doc.genre), "words": len(doc.words),
        }


def _offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def write_split(encoded: List[dict], documents: List[CorefDocument], prefix: str) -> None:
    """``prefix``.npz (flat arrays with per-document offsets) and ``prefix``.docs.jsonl."""
    def cat(key, dtype=np.int64):
        return np.concatenate([e[key] for e in encoded]).astype(dtype)

    np.savez(
        prefix + ".npz",
        tokens=cat("tokens", np.int32), segment_lengths=cat("segment_lengths", np.int32),
        doc_segments=_offsets([len(e["segment_lengths"]) for e in encoded]),
        doc_tokens=_offsets([len(e["tokens"]) for e in encoded]),
        token_word=cat("token_word", np.int32), token_sentence=cat("token_sentence", np.int32),
        token_speaker=cat("token_speaker", np.int32),
        gold=np.concatenate([e["gold"] for e in encoded]).astype(np.int64).reshape(-1, 3),
        doc_gold=_offsets([len(e["gold"]) for e in encoded]),
        target=np.concatenate([e["target"] for e in encoded]).astype(np.int64).reshape(-1, 3),
        doc_target=_offsets([len(e["target"]) for e in encoded]),
        doc_genre=np.array([e["genre"] for e in encoded], dtype=np.int64),
        doc_words=np.array([e["words"] for e in encoded], dtype=np.int64),
    )
    with open(prefix + ".docs.jsonl", "w", encoding="utf-8") as f:
        for doc in documents:
            f.write(json.dumps({"doc_key": doc.doc_key, "source": doc.source, "words": doc.words, "lines": doc.lines,
                                "token_lines": doc.token_lines.tolist()}, ensure_ascii=False) + "\n")


def encode_documents(encoder: DocumentEncoder, documents: List[CorefDocument], stats: Counter, split: str = "") -> List[dict]:
    """Encode every document, each one's words in one tokenizer call (the pieces of a whole split's words, as Python
    lists, took about 1 KB a word)."""
    encoded = []
    with progress_bar(total=sum(len(doc.words) for doc in documents), desc=f"{split} encode".strip(), unit="word",
                      unit_scale=True) as bar:
        for doc in documents:
            encoded.append(encoder.encode(doc, encoder.tokenizer.encode_ids(doc.words), stats))
            bar.update(len(doc.words))
    return encoded


def check_shared_documents(documents: Dict[str, List[CorefDocument]], refuse: bool) -> None:
    """Warn (or, with ``refuse``, stop) when a valid/test document is also a training document: the same key or the
    same words. Evaluating on training documents is almost always a mistake."""
    if "train" not in documents:
        return
    keys = {doc.doc_key for doc in documents["train"]}
    texts = {tuple(doc.words) for doc in documents["train"]}
    for split, flag in SPLIT_FLAGS[1:]:
        shared = [doc for doc in documents.get(split, []) if doc.doc_key in keys or tuple(doc.words) in texts]
        if not shared:
            continue
        message = (f"{len(shared)} of the {len(documents[split])} {flag} documents are also in --train (the same key "
                   f"or the same words), the first {shared[0].doc_key} ({shared[0].source})")
        if refuse:
            raise UsageError(message + "; --refuse-shared-documents was given")
        logging.getLogger(__name__).warning(message + ": scores on them measure memory, not generalisation")


def prepare_coref_data(args) -> dict:
    """Read, check and encode every split, then write the folder at once; returns the statistics."""
    if not 8 <= args.max_segment_length:
        raise UsageError(f"--max-segment-length must be at least 8, got {args.max_segment_length}")
    if args.max_span_width < 1:
        raise UsageError(f"--max-span-width must be at least 1, got {args.max_span_width}")
    specs = [(split, flag, getattr(args, split)) for split, flag in SPLIT_FLAGS if getattr(args, split)]
    if not specs:
        raise UsageError("give at least one of --train, --valid, --test")
    inputs = [spec for _, _, spec in specs] + [args.tokenizer_from]
    check_destination(args.destdir, COMMAND, inputs, args.force)
    tokenizer, dictionary = load_tokenizer_folder(args.tokenizer_from)
    encoder = DocumentEncoder(tokenizer, dictionary, args.max_segment_length, args.max_span_width)
    read = {split: read_split(spec, flag) for split, flag, spec in specs}
    check_shared_documents(read, getattr(args, "refuse_shared_documents", False))
    splits, stats = {}, {}
    for split, flag, spec in specs:
        documents = read[split]
        counts = Counter()
        splits[split] = (documents, encode_documents(encoder, documents, counts, split))
        stats[split] = {key: counts[key] for key in STAT_KEYS}
    meta = {"max_segment_length": args.max_segment_length, "max_span_width": args.max_span_width,
            "genres": list(GENRES), "splits": sorted(splits), "tokenizer": tokenizer.kind,
            "singletons": {split: stats[split]["singletons"] for split in splits}}
    with atomic_directory(args.destdir, COMMAND, inputs, args.force) as work:
        copy_tokenizer_files(args.tokenizer_from, work)
        for split, (documents, encoded) in splits.items():
            write_split(encoded, documents, os.path.join(work, split))
        write_json(os.path.join(work, META_FILE), meta)
        write_json(os.path.join(work, STATS_FILE), stats)
    warn_if_vocabulary_does_not_fit(tokenizer, [spec for _, _, spec in specs])
    return stats


def load_coref_meta(folder: str) -> dict:
    """``coref_meta.json`` of a spanbert-prepare-coref folder (UsageError when it is not one)."""
    return read_prepared_json(folder, META_FILE, COMMAND)


def data_has_singletons(folder: str, meta: dict) -> bool:
    """Whether the folder's gold clusters include one-mention clusters: its training split's, else any split's.

    Folders written before ``coref_meta.json`` counted them are read from ``prepare_stats.json``.
    """
    counts = meta.get("singletons")
    if counts is None:
        stats_path = os.path.join(folder, STATS_FILE)
        stats = read_prepared_json(folder, STATS_FILE, COMMAND) if os.path.isfile(stats_path) else {}
        counts = {split: values.get("singletons", 0) for split, values in stats.items()}
    if "train" in counts:
        return counts["train"] > 0
    return any(count > 0 for count in counts.values())


def load_documents(folder: str, split: str) -> List[dict]:
    """The ``S.docs.jsonl`` records of a split (key, words, CoNLL lines), in order."""
    path = os.path.join(folder, split + ".docs.jsonl")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file; the folder has no split {split!r}")
    return read_jsonl(path)


def load_split_arrays(folder: str, split: str) -> Dict[str, np.ndarray]:
    """The arrays of a prepared split's ``S.npz`` by name; FileNotFoundError when the split was not prepared."""
    path = os.path.join(folder, split + ".npz")
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    return load_arrays(path)
