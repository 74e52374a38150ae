"""A FairseqDataset whose item sizes are a precomputed array."""
from fairseq.data import FairseqDataset


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
