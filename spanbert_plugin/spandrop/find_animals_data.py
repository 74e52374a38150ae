"""FINDANIMALS synthetic data (SPEC §2.1), generated from seeds with numpy.

Does the animal's name occur in a string of lowercase letters *as a
subsequence*? Negatives are drawn letter by letter while tracking how much of
the name has been matched, and the name's last letter is never drawn once the
rest is matched, so negatives provably do not contain it. Positives are such
strings with the name's letters written over positions chosen in increasing
order (uniformly, at fixed indices, or within the first 100).
"""
import string

import numpy as np
import torch
from fairseq.data import data_utils

from ..core.errors import UsageError
from ..core.datasets import SizedDataset
from ..core.datasets import BatchesEveryExample

LETTERS = string.ascii_lowercase
DEFAULT_ANIMALS = ("cat", "dog", "cow", "pig", "owl", "bee", "ant", "bat", "elk", "fox", "rat", "eel", "yak", "emu")
POSITION_BIASES = ("uniform", "fixed", "first100")


def parse_animals(text: str, seq_len: int = None):
    """The animal names of ``--animals`` (comma-separated, lowercase a-z); UsageError otherwise."""
    animals = [a.strip() for a in text.split(",") if a.strip()]
    if not animals or any(c not in LETTERS for a in animals for c in a):
        raise UsageError(f"--animals {text!r}: expected comma-separated lowercase a-z names")
    if seq_len is not None and seq_len < max(len(a) for a in animals):
        raise UsageError(f"--seq-len {seq_len} is shorter than the longest animal name ({max(len(a) for a in animals)} letters)")
    return animals


def letters_to_ids(word):
    return np.array([LETTERS.index(c) for c in word], dtype=np.int64)


def contains_subsequence(strings: np.ndarray, names: np.ndarray, name_lengths: np.ndarray) -> np.ndarray:
    """Vectorised check, per row: does ``names[i, :name_lengths[i]]`` occur in ``strings[i]`` in order?"""
    matched = np.zeros(len(strings), dtype=np.int64)
    rows = np.arange(len(strings))
    for column in range(strings.shape[1]):
        wanted = names[rows, np.minimum(matched, names.shape[1] - 1)]
        matched += (matched < name_lengths) & (strings[:, column] == wanted)
    return matched == name_lengths


def generate(num, seq_len, animals, positive_ratio, position_bias, rng):
    """Return animal index, letter ids (num x seq_len), labels and planted positions (-1 for negatives)."""
    if position_bias not in POSITION_BIASES:
        raise UsageError(f"--position-bias must be one of {', '.join(POSITION_BIASES)}, got {position_bias!r}")
    names = [letters_to_ids(a) for a in animals]
    longest = max(len(n) for n in names)
    if seq_len < longest:
        raise UsageError(f"--seq-len {seq_len} is shorter than the longest animal name ({longest} letters)")
    name_table = np.stack([np.pad(n, (0, longest - len(n))) for n in names])
    name_lengths = np.array([len(n) for n in names])
    animal = rng.integers(0, len(animals), num)
    lengths = name_lengths[animal]
    last_letter = name_table[animal, lengths - 1]
    strings = np.empty((num, seq_len), dtype=np.int64)
    matched = np.zeros(num, dtype=np.int64)
    for column in range(seq_len):
        letter = rng.integers(0, 26, num)
        # once all but the last letter are matched, draw from the other 25 letters
        blocked = matched == lengths - 1
        other = rng.integers(0, 25, num)
        letter = np.where(blocked, other + (other >= last_letter), letter)
        strings[:, column] = letter
        matched += (matched < lengths - 1) & (letter == name_table[animal, np.minimum(matched, longest - 1)])

    labels = (rng.random(num) < positive_ratio).astype(np.int64)
    planted = np.full((num, longest), -1, dtype=np.int64)
    for i in np.flatnonzero(labels):
        m = lengths[i]
        if position_bias == "uniform":
            pos = np.sort(rng.choice(seq_len, m, replace=False))
        elif position_bias == "first100":
            pos = np.sort(rng.choice(min(100, seq_len), m, replace=False))
        else:  # fixed: indices 10, 110, 210 for three letters
            pos = np.round(np.linspace(10, 10 + 100 * (m - 1), m)).astype(np.int64)
        strings[i, pos] = name_table[animal[i], :m]
        planted[i, :m] = pos
    return animal, strings, labels, planted


class FindAnimalsDataset(BatchesEveryExample, SizedDataset):
    """Items "[CLS] animal [SEP] letters [SEP]" with a binary label; the letters are droppable."""

    def __init__(self, dictionary, animals, animal, strings, labels, planted):
        self.dictionary = dictionary
        letter_ids = np.array([dictionary.index(c) for c in LETTERS])
        self.animal_tokens = [letter_ids[letters_to_ids(a)] for a in animals]
        self.animal, self.strings, self.labels, self.planted = animal, letter_ids[strings], labels, planted
        self._sizes = np.array([len(self.animal_tokens[a]) for a in animal]) + strings.shape[1] + 3

    def __getitem__(self, index):
        d = self.dictionary
        name = self.animal_tokens[self.animal[index]]
        source = np.concatenate(([d.bos()], name, [d.eos()], self.strings[index], [d.eos()]))
        droppable = np.zeros(len(source), dtype=bool)
        start = len(name) + 2
        droppable[start:-1] = True  # SpanDrop applies to the letters only
        planted = self.planted[index]
        return {
            "id": index,
            "source": torch.from_numpy(source),
            "target": int(self.labels[index]),
            "droppable": droppable,
            "supporting": planted[planted >= 0] + start,
        }

    def __len__(self):
        return len(self.labels)

    def collater(self, samples):
        if not samples:
            return {}
        src = data_utils.collate_tokens([s["source"] for s in samples], self.dictionary.pad())
        return {
            "id": torch.LongTensor([s["id"] for s in samples]),
            "net_input": {"src_tokens": src, "src_lengths": torch.LongTensor([len(s["source"]) for s in samples])},
            "target": torch.LongTensor([s["target"] for s in samples]),
            "nsentences": len(samples),
            "ntokens": sum(len(s["source"]) for s in samples),
        }
