"""Dataset building blocks every feature shares: precomputed sizes, per-item random generators keyed by
(seed, epoch, index), and batching that never drops an example."""
import itertools
import os
import struct

import numpy as np
from fairseq.data import BaseWrapperDataset, FairseqDataset, data_utils
from fairseq.data.indexed_dataset import MMapIndexedDataset, _code_to_dtype

from .errors import UsageError
from .file_utils import damaged_file_error

# fairseq's MMapIndexedDataset.Index: magic, version 1, token dtype code, item count; then the item sizes (int32)
# and their byte offsets in the .bin (int64)
_INDEX_HEADER = struct.Struct("<9sQBQ")
_INDEX_BYTES_PER_ITEM = 4 + 8


def check_token_ids(prefix: str, dictionary, dtype) -> None:
    """UsageError naming ``prefix``.bin (of token ``dtype``) when a token id lies beyond ``dictionary`` (a dict.txt of
    another folder: the model's embedding lookup would fail mid-step, on a GPU as a device-side assert). One pass over
    the file: for fine-tuning splits, not for pre-training corpora of billions of tokens."""
    if os.path.getsize(prefix + ".bin") == 0:
        return
    refuse_token_ids_beyond(prefix + ".bin", int(np.memmap(prefix + ".bin", dtype=dtype, mode="r").max()), dictionary)


def refuse_token_ids_beyond(path: str, largest: int, dictionary) -> None:
    """UsageError naming ``path`` (a split's file in a prepared folder) when its ``largest`` token id has no symbol
    in ``dictionary``, the folder's dict.txt."""
    if largest >= len(dictionary):
        dict_txt = os.path.join(os.path.dirname(path) or ".", "dict.txt")
        raise UsageError(f"{path}: token id {largest}, beyond the {len(dictionary)} symbols of {dict_txt}: that "
                         "dict.txt is not the one the folder was prepared with; copy it again or prepare the folder again")


def check_token_item_files(prefix: str):
    """The token dtype of ``prefix``.idx/.bin; UsageError naming either when the index does not parse or the .bin is
    not the size it gives.

    fairseq maps both files as they are: a cut-short .idx fails with numpy's "buffer is smaller than requested
    size" (and a second error from its ``__del__``), a cut-short .bin only when a missing item is read, mid-run."""
    index_path, data_path = prefix + ".idx", prefix + ".bin"
    try:
        with open(index_path, "rb") as f:
            header = f.read(_INDEX_HEADER.size)
            if len(header) < _INDEX_HEADER.size:
                raise damaged_file_error(index_path, f"{len(header)} bytes, shorter than a fairseq index's header")
            magic, version, dtype_code, count = _INDEX_HEADER.unpack(header)
            if magic != MMapIndexedDataset.Index._HDR_MAGIC or version != 1 or dtype_code not in _code_to_dtype:
                raise damaged_file_error(index_path, "not a fairseq memory-mapped index")
            index_bytes, expected = os.fstat(f.fileno()).st_size, _INDEX_HEADER.size + count * _INDEX_BYTES_PER_ITEM
            if index_bytes != expected:
                raise damaged_file_error(index_path, f"{index_bytes} bytes where its header gives {expected}")
            sizes = np.fromfile(f, dtype=np.int32, count=count)
        data_bytes = os.path.getsize(data_path)
    except OSError as err:
        raise damaged_file_error(err.filename or index_path, err.strerror) from None
    dtype = np.dtype(_code_to_dtype[dtype_code])
    expected = int(sizes.sum(dtype=np.int64)) * dtype.itemsize
    if data_bytes != expected:
        raise damaged_file_error(data_path, f"{data_bytes} bytes where {os.path.basename(index_path)} gives {expected}")
    return dtype


def load_token_items(prefix: str, dictionary, split: str, combine: bool = False, check_ids: bool = False):
    """fairseq's memory-mapped dataset of a prepared split (None where its files are missing); a damaged pair of
    files (:func:`check_token_item_files`) or an empty ``.bin``, which fairseq cannot map, is a UsageError naming it,
    and with ``check_ids`` (fine-tuning splits) a token id beyond ``dictionary`` too (:func:`check_token_ids`)."""
    for k in itertools.count():  # the files fairseq reads: with ``combine``, also prefix1, prefix2, ...
        prefix_k = prefix + (str(k) if k > 0 else "")
        if not MMapIndexedDataset.exists(prefix_k):
            break
        dtype = check_token_item_files(prefix_k)
        if check_ids:
            check_token_ids(prefix_k, dictionary, dtype)
        if not combine:
            break
    if os.path.isfile(prefix + ".bin") and os.path.getsize(prefix + ".bin") == 0:
        raise UsageError(f"{prefix}.bin: empty, split {split!r} holds no tokens; prepare it again from examples")
    return data_utils.load_indexed_dataset(prefix, dictionary, "mmap", combine=combine)


class SizedDataset(FairseqDataset):
    """``sizes``, ``num_tokens`` and ``size`` read from ``self._sizes`` (set by the subclass)."""

    _sizes = None

    @property
    def sizes(self):
        return self._sizes

    def num_tokens(self, index):
        return self._sizes[index]

    def size(self, index):
        return self._sizes[index]


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of x."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class EpochKeyedWrapper(BaseWrapperDataset):
    """A wrapper whose items are drawn anew each epoch: it follows ``set_epoch`` and never lets fairseq reuse an
    iterator across epochs (a reused iterator keeps persistent DataLoader workers, whose copy of the dataset would
    never see the new epoch: its items would be drawn as the first epoch's, unlike a resumed run's)."""

    epoch = 1

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch


class ItemRandom:
    """A numpy Generator re-seeded from (seed, epoch, index), for one dataset in one process.

    Setting a PCG64 state from a hash of the triple costs ~2 us, against ~12 us
    for building ``default_rng((seed, epoch, index))``: it matters at tens of
    thousands of blocks per second. DataLoader workers are separate processes,
    each with its own copy.
    """

    def __init__(self):
        self.bit_generator = np.random.PCG64()
        self.generator = np.random.Generator(self.bit_generator)

    def __call__(self, seed: int, epoch: int, index: int) -> np.random.Generator:
        high = _mix64(_mix64(_mix64(int(seed)) ^ int(epoch)) ^ int(index))
        low = _mix64(high ^ 0x5851F42D4C957F2D)
        self.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": (high << 64) | low, "inc": ((low << 64) | high) | 1},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self.generator


def every_example_batched(batch_by_size, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
    """fairseq's batching (``batch_by_size``: the base class's, bound) plus the trailing group it may drop
    (:func:`complete_batches`); an example longer than ``max_tokens``, which fairseq asserts against, is a
    UsageError naming the option."""
    try:
        batches = batch_by_size(indices, max_tokens, max_sentences, required_batch_size_multiple)
    except AssertionError as err:
        if "should not exceed max_tokens" not in str(err):
            raise
        raise max_tokens_error(max_tokens) from None
    return complete_batches(indices, batches)


def max_tokens_error(max_tokens) -> UsageError:
    """The one-line error for a ``--max-tokens`` below the longest example (a batch holds whole examples)."""
    return UsageError(f"--max-tokens {max_tokens}: an example is longer, and a batch holds whole examples; give at "
                      "least the longest example's length, or leave --max-tokens out")


def check_max_tokens(sizes, max_tokens) -> None:
    """Before a task's batches are made: fairseq-train filters the training split by the least of the task's, the
    model's and ``--max-tokens``' limits, and skips what exceeds it with a warning (a dataset that refuses to drop
    examples would blame the model's positions). An example longer than ``--max-tokens`` is that option's error, as
    in batching."""
    if max_tokens is not None and len(sizes) and int(np.max(sizes)) > max_tokens:
        raise max_tokens_error(max_tokens)


def check_validation_max_tokens(datasets, max_tokens_valid) -> None:
    """``check_max_tokens`` for the validation splits (name: dataset), by ``--max-tokens-valid``. fairseq-train batches
    them only at its first validation, an epoch or more into the run; asked when the training batches are made, a
    validation example longer than the limit is refused before the first update."""
    for split, dataset in datasets.items():
        sizes = getattr(dataset, "sizes", ())
        if max_tokens_valid is not None and len(sizes) and int(np.max(sizes)) > max_tokens_valid:
            raise UsageError(f"--max-tokens-valid {max_tokens_valid}: an example of the '{split}' split is longer "
                             f"({int(np.max(sizes))} tokens), and a batch holds whole examples; give "
                             "--max-tokens-valid at least that (it defaults to --max-tokens)")


def complete_batches(indices, batches):
    """Append the indices missing from ``batches`` (in their order) as one more batch."""
    batched = sum(len(b) for b in batches)
    if batched == len(indices):
        return batches
    seen = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    missing = np.asarray(indices)[~np.isin(indices, seen)]
    return list(batches) + [missing.astype(np.int64)]


class BatchesEveryExample:
    """Mixin for a FairseqDataset: fairseq's batching, plus any trailing indices it leaves out as one last batch.

    fairseq-fixed's ``batch_by_size`` drops a final group smaller than
    ``required_batch_size_multiple`` (8 by default: a 50-example test set is
    evaluated on 48, a 1-block validation set gets no batch at all); a run
    must never silently drop data. Put it before the dataset's base class.
    """

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        return every_example_batched(super().batch_by_size, indices, max_tokens, max_sentences,
                                     required_batch_size_multiple)
