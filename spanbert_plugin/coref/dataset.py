"""Prepared coreference documents as a fairseq dataset: one document (all its segments) per batch.

A batch holds ``net_input.src_tokens`` (segments x longest segment, padded),
``coref`` (what the head needs: each real token's word, sentence, segment and
speaker, the genre, the number of words and the trainable gold mentions as
token spans) and ``gold`` (every gold mention as a word span and its cluster,
for the metrics).

SpanDrop (training only): ``--span-drop-unit sentence`` drops whole sentences,
``token`` drops whole words; a unit holding a word of any gold mention is never
dropped, so every cluster survives; mention positions are remapped (``drop``)
or the tokens become ``[MASK]`` (``mask``). Fresh units every epoch,
reproducibly from (seed, epoch, document).
"""
from typing import Optional

import numpy as np
import torch
from fairseq.data import FairseqDataset

from ..spandrop.sampler import sample_keep_mask
from .prepare import load_split_arrays


class CorefDataset(FairseqDataset):
    """The documents of a prepared split (``arrays``: its ``S.npz`` by name), one item and one batch each."""

    def __init__(self, arrays: dict, pad_index: int, shuffle: bool = False, seed: int = 1, span_drop=None,
                 mask_index: Optional[int] = None, max_segments: int = 0):
        self.arrays = arrays
        self.max_segments = max_segments  # > 0: a random window of that many segments per document and epoch
        self.pad_index, self.shuffle, self.seed, self.epoch = pad_index, shuffle, seed, 1
        self.span_drop = span_drop  # (p, gamma, unit, mode) or None
        self.mask_index = mask_index
        self._sizes = np.diff(arrays["doc_tokens"]).astype(np.int64)

    @classmethod
    def load(cls, folder: str, split: str, pad_index: int, **kwargs):
        return cls(load_split_arrays(folder, split), pad_index, **kwargs)

    def __len__(self):
        return len(self._sizes)

    @property
    def sizes(self):
        return self._sizes

    def size(self, index):
        return int(self._sizes[index])

    def num_tokens(self, index):
        return int(self._sizes[index])

    def set_epoch(self, epoch, **unused):
        self.epoch = epoch

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        """SpanDrop and the training window draw anew every epoch, and a shuffled split's order is the epoch's:
        fairseq would otherwise keep epoch 1's batches, and a run resumed in a later epoch would make that epoch's."""
        return self.span_drop is None and not self.max_segments and not self.shuffle

    def ordered_indices(self):
        if self.shuffle:
            return np.random.default_rng([self.seed, self.epoch]).permutation(len(self))
        return np.arange(len(self))

    def document(self, index: int) -> dict:
        """Numpy arrays of one document (tokens and per-token information, mentions)."""
        a = self.arrays
        t0, t1 = a["doc_tokens"][index], a["doc_tokens"][index + 1]
        s0, s1 = a["doc_segments"][index], a["doc_segments"][index + 1]
        g0, g1 = a["doc_gold"][index], a["doc_gold"][index + 1]
        r0, r1 = a["doc_target"][index], a["doc_target"][index + 1]
        lengths = a["segment_lengths"][s0:s1].astype(np.int64)
        return {
            "tokens": a["tokens"][t0:t1].astype(np.int64), "token_word": a["token_word"][t0:t1].astype(np.int64),
            "token_sentence": a["token_sentence"][t0:t1].astype(np.int64),
            "token_speaker": a["token_speaker"][t0:t1].astype(np.int64),
            "token_segment": np.repeat(np.arange(len(lengths)), lengths),
            "gold": a["gold"][g0:g1], "target": a["target"][r0:r1].copy(),
            "genre": int(a["doc_genre"][index]), "num_words": int(a["doc_words"][index]),
        }

    def _span_dropped(self, doc: dict, index: int) -> dict:
        p, gamma, unit, mode = self.span_drop
        rng = np.random.default_rng([self.seed, self.epoch, index])
        size = max(int(doc["token_word"].max()), int(doc["gold"][:, 1].max(initial=-1))) + 2
        covered = np.zeros(size, dtype=np.int64)  # words inside a gold mention (ids of the whole document)
        np.add.at(covered, doc["gold"][:, 0], 1)
        np.add.at(covered, doc["gold"][:, 1] + 1, -1)
        covered = np.cumsum(covered)[:-1] > 0
        word = doc["token_word"]
        real = word >= 0
        unit_of_token = np.where(real, doc["token_sentence"] if unit == "sentence" else word, -1)
        units, unit_index = np.unique(unit_of_token[real], return_inverse=True)
        protected_units = np.unique(unit_index[covered[word[real]]])
        keep_unit = sample_keep_mask(len(units), p, gamma, rng, protected_units)
        keep = np.ones(len(word), dtype=bool)
        keep[real] = keep_unit[unit_index]
        if mode == "mask":
            doc["tokens"] = np.where(keep, doc["tokens"], self.mask_index)
            return doc
        segment = doc["token_segment"]
        kept_real = np.bincount(segment[keep & real], minlength=segment.max() + 1)
        keep &= kept_real[segment] > 0  # a segment left with [CLS] [SEP] only goes too
        new_index = np.cumsum(keep) - 1
        for key in ("tokens", "token_word", "token_sentence", "token_speaker"):
            doc[key] = doc[key][keep]
        _, doc["token_segment"] = np.unique(segment[keep], return_inverse=True)
        doc["target"][:, :2] = new_index[doc["target"][:, :2]]
        doc["num_words"] = int(len(np.unique(doc["token_word"][doc["token_word"] >= 0])))
        return doc

    def _segment_window(self, doc: dict, index: int) -> dict:
        """c2f-coref's training truncation: a random run of ``max_segments`` consecutive segments."""
        n = int(doc["token_segment"][-1]) + 1
        if n <= self.max_segments:
            return doc
        first = int(np.random.default_rng([self.seed, self.epoch, index, 1]).integers(n - self.max_segments + 1))
        keep = (doc["token_segment"] >= first) & (doc["token_segment"] < first + self.max_segments)
        offset = int(np.argmax(keep))
        for key in ("tokens", "token_word", "token_sentence", "token_speaker"):
            doc[key] = doc[key][keep]
        doc["token_segment"] = doc["token_segment"][keep] - first
        target = doc["target"]
        inside = (target[:, 0] >= offset) & (target[:, 1] < offset + int(keep.sum()))
        doc["target"] = target[inside] - np.array([offset, offset, 0])
        doc["num_words"] = int(len(np.unique(doc["token_word"][doc["token_word"] >= 0])))
        return doc

    def __getitem__(self, index):
        doc = self.document(index)
        if self.max_segments:
            doc = self._segment_window(doc, index)
        if self.span_drop is not None:
            doc = self._span_dropped(doc, index)
        doc["id"] = index
        return doc

    def collater(self, samples):
        if not samples:
            return {}
        if len(samples) != 1:
            raise ValueError(f"coreference batches hold one document, got {len(samples)}")
        return collate_document(samples[0], self.pad_index)


def collate_document(doc: dict, pad_index: int) -> dict:
    """The batch of one document (a dict as ``CorefDataset.document`` gives, with its ``id``)."""
    lengths = np.bincount(doc["token_segment"])
    src = torch.full((len(lengths), int(lengths.max())), pad_index, dtype=torch.long)
    mask = torch.arange(src.size(1))[None, :] < torch.from_numpy(lengths)[:, None]
    src[mask] = torch.from_numpy(np.asarray(doc["tokens"], dtype=np.int64))

    def tensor(key):
        return torch.from_numpy(np.ascontiguousarray(doc[key], dtype=np.int64))

    return {
        "id": torch.tensor([doc["id"]]),
        "nsentences": 1,
        "ntokens": int(len(doc["tokens"])),
        "net_input": {"src_tokens": src, "src_lengths": torch.from_numpy(lengths)},
        "coref": {
            "token_word": tensor("token_word"), "token_sentence": tensor("token_sentence"),
            "token_segment": tensor("token_segment"), "token_speaker": tensor("token_speaker"),
            "genre": torch.tensor([doc["genre"]]), "num_words": doc["num_words"],
            "target": tensor("target").reshape(-1, 3),
        },
        "gold": tensor("gold").reshape(-1, 3),
    }
