"""SpanDrop and Beta-SpanDrop (SPEC §2): drop random spans of a sequence, keep the label.

``sample_keep_mask`` draws which spans survive; ``SpanDropDataset`` applies it on
the fly to any dataset whose items carry token ids and a span segmentation,
removing the dropped spans (``drop``) or replacing them by the mask symbol
(``mask``, the SpanMask baseline), remapping label positions, and drawing fresh
samples every epoch, reproducibly from (seed, epoch, index).
"""
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..core.errors import UsageError
from ..core.datasets import ItemRandom
from ..core.tasks import register_options_check

UNITS = ("token", "chunk", "separator", "explicit")
MODES = ("drop", "mask")


def check_span_drop_args(p, gamma=None):
    """Reject invalid SpanDrop settings with a message naming the option."""
    if not 0 <= p < 1:
        raise UsageError(f"--span-drop-p must be in [0, 1), got {p}")
    if gamma is not None and gamma <= 0:
        raise UsageError(f"--span-drop-gamma must be > 0 (or unset for Bernoulli SpanDrop), got {gamma}")


@register_options_check
def span_drop_options_while_off(options):
    if "span_drop_p" not in options:
        return []
    if options["span_drop_p"] == 0:
        return [([name for name in options if name.startswith("span_drop_") and name != "span_drop_p"],
                 "since SpanDrop is off (--span-drop-p 0)")]
    if "span_drop_unit" in options and str(options["span_drop_unit"]) != "chunk":
        return [(("span_drop_chunk_size",), f"since --span-drop-unit is {options['span_drop_unit']}, not chunk")]
    return []


def sample_keep_mask(num_spans: int, p: float, gamma: Optional[float], rng: np.random.Generator, protected=None,
                     required=None) -> np.ndarray:
    """Which of ``num_spans`` spans to keep: SpanDrop(p) if gamma is None, else Beta-SpanDrop(p, gamma).

    Beta-SpanDrop draws one drop rate pi ~ Beta(gamma, gamma (1 - p) / p) per
    call, then drops each span independently with probability pi; the expected
    drop rate is p either way. ``protected`` span indices are always kept.
    ``required`` span indices are kept too, and the draw is the one conditioned on
    their survival, exactly what drawing again until they all survive gives (rejection
    sampling): SpanDrop's spans are independent, so the others are drawn as before;
    under Beta-SpanDrop, m required spans that are not protected all survive with
    probability (1 - pi)^m, so pi comes from its posterior Beta(gamma, gamma (1 - p) / p + m).
    """
    check_span_drop_args(p, gamma)
    protected = np.zeros(0, np.int64) if protected is None else np.asarray(protected, dtype=np.int64)
    required = np.zeros(0, np.int64) if required is None else np.asarray(required, dtype=np.int64)
    drop_rate = p
    if gamma is not None and p > 0:
        at_risk = len(np.setdiff1d(required, protected))
        drop_rate = rng.beta(gamma, gamma * (1 - p) / p + at_risk)
    keep = rng.random(num_spans) >= drop_rate
    keep[protected] = True
    keep[required] = True
    return keep


def segment(tokens: np.ndarray, droppable: np.ndarray, unit: str, chunk_size: int = 1, separator: Optional[int] = None):
    """Span index per token (-1: never dropped) for the droppable tokens.

    ``token``: every token its own span; ``chunk``: consecutive chunks of
    ``chunk_size`` droppable tokens; ``separator``: units ending with the
    ``separator`` token (e.g. sentences ending in '.'), the tail forming a last unit.
    """
    span_ids = np.full(len(tokens), -1, dtype=np.int64)
    positions = droppable.nonzero()[0]
    if unit == "token":
        span_ids[positions] = np.arange(len(positions))
    elif unit == "chunk":
        span_ids[positions] = np.arange(len(positions)) // chunk_size
    elif unit == "separator":
        ends = tokens[positions] == separator
        span_ids[positions] = np.cumsum(ends) - ends  # a separator closes its own unit
    else:
        raise UsageError(f"--span-drop-unit {unit}: this task's items carry no span_ids; use token, chunk or separator")
    return span_ids


class SpanDropDataset(BaseWrapperDataset):
    """Applies SpanDrop to items ``{"source", ...}`` of the wrapped dataset.

    Optional item keys: ``droppable`` (bool per token; default all but the first
    and last token), ``span_ids`` (explicit segmentation, -1 = keep), ``label_positions``
    (positions into ``source``, remapped after removal; their spans are always
    kept so they never point at removed tokens) and ``supporting`` (positions of
    supporting evidence: protected with ``protect_supporting``, or required to
    survive with ``require_supporting``: the draw conditioned on their survival,
    as rejection sampling would give it, ``sample_keep_mask``).
    """

    def __init__(self, dataset, p: float, gamma: Optional[float] = None, unit: str = "token", mode: str = "drop",
                 mask_index: Optional[int] = None, chunk_size: int = 1, separator: Optional[int] = None,
                 protect_supporting: bool = False, require_supporting: bool = False, seed: int = 1):
        super().__init__(dataset)
        check_span_drop_args(p, gamma)
        if unit not in UNITS:
            raise UsageError(f"--span-drop-unit must be one of {', '.join(UNITS)}, got {unit!r}")
        if mode not in MODES:
            raise UsageError(f"--span-drop-mode must be drop or mask, got {mode!r}")
        if unit == "chunk" and chunk_size < 1:
            raise UsageError(f"--span-drop-chunk-size must be >= 1, got {chunk_size}")
        if unit == "separator" and separator is None:
            raise UsageError("--span-drop-unit separator needs a separator token")
        if mode == "mask" and mask_index is None:
            raise UsageError("--span-drop-mode mask needs a mask symbol")
        self.p, self.gamma, self.unit, self.mode = p, gamma, unit, mode
        self.mask_index, self.chunk_size, self.separator = mask_index, chunk_size, separator
        self.protect_supporting, self.require_supporting = protect_supporting, require_supporting
        self.seed, self.epoch = seed, 0
        self.item_random = ItemRandom()

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False  # lengths change with the samples, so batches are rebuilt each epoch

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index):
        return self._dropped(self.seed, self.epoch, index)

    @lru_cache(maxsize=8)
    def _dropped(self, seed, epoch, index):
        item = dict(self.dataset[index])
        if self.p == 0:
            return item
        source = item["source"].numpy()
        if "span_ids" in item:
            span_ids = np.asarray(item["span_ids"], dtype=np.int64)
        else:
            droppable = item.get("droppable")
            if droppable is None:
                droppable = np.ones(len(source), dtype=bool)
                droppable[[0, -1]] = False
            span_ids = segment(source, np.asarray(droppable, dtype=bool), self.unit, self.chunk_size, self.separator)
        num_spans = int(span_ids.max()) + 1 if len(span_ids) else 0
        fixed = span_ids < 0
        protected = [span_ids[np.asarray(item["label_positions"])]] if "label_positions" in item else []
        supporting = span_ids[np.asarray(item.get("supporting", []), dtype=np.int64)]
        supporting = supporting[supporting >= 0]
        if self.protect_supporting:
            protected.append(supporting)
        protected = np.concatenate(protected) if protected else np.zeros(0, dtype=np.int64)
        protected = protected[protected >= 0]

        rng = self.item_random(seed, epoch, index)
        keep = sample_keep_mask(num_spans, self.p, self.gamma, rng, protected,
                                required=supporting if self.require_supporting else None)
        token_keep = fixed | keep[np.maximum(span_ids, 0)]
        if self.mode == "mask":
            masked = source.copy()
            masked[~token_keep] = self.mask_index
            item["source"] = torch.from_numpy(masked)
            return item
        item["source"] = torch.from_numpy(source[token_keep])
        new_position = np.cumsum(token_keep) - 1
        for key in ("label_positions", "supporting"):
            if key in item:
                old = np.asarray(item[key], dtype=np.int64)
                kept = token_keep[old]
                item[key] = torch.from_numpy(new_position[old[kept]])
        item.pop("span_ids", None)
        item.pop("droppable", None)
        return item

    @property
    def sizes(self):
        return self.dataset.sizes  # upper bounds: dropping only shortens

    def size(self, index):
        return self.dataset.size(index)

    def num_tokens(self, index):
        return self.dataset.num_tokens(index)


@dataclass
class SpanDropSampling(FairseqDataclass):
    """The ``--span-drop-*`` options every task shares: how many spans, Bernoulli or Beta, drop or mask."""

    span_drop_p: float = field(default=0.0, metadata={"help": "expected share of spans dropped from training inputs (0: off)"})
    span_drop_gamma: Optional[float] = field(
        default=None, metadata={"help": "Beta-SpanDrop concentration gamma (the paper uses 1); unset: Bernoulli SpanDrop"}
    )
    span_drop_chunk_size: int = field(default=1, metadata={"help": "tokens per span for --span-drop-unit chunk"})
    span_drop_mode: ChoiceEnum(MODES) = field(default="drop", metadata={"help": "drop (remove spans) or mask (SpanMask baseline)"})


@dataclass
class SpanDropOptions(SpanDropSampling):
    """Task options for SpanDrop on training data (``--span-drop-*``)."""

    # the units find_animals' items can be cut into (separator and explicit need items carrying them)
    span_drop_unit: ChoiceEnum(("token", "chunk")) = field(default="token", metadata={"help": "span unit: token or chunk"})
    span_drop_require_supporting: bool = field(
        default=False, metadata={"help": "SpanDrop conditioned on every supporting span surviving (what resampling "
                                 "until they do gives)"}
    )


def apply_span_drop(dataset, cfg, dictionary, seed, separator=None):
    """Wrap ``dataset`` with SpanDrop as configured by ``SpanDropOptions`` (identity when p = 0)."""
    if cfg.span_drop_p == 0:
        return dataset
    return SpanDropDataset(
        dataset, cfg.span_drop_p, cfg.span_drop_gamma, unit=str(cfg.span_drop_unit), mode=str(cfg.span_drop_mode),
        mask_index=getattr(dictionary, "mask_index", None), chunk_size=cfg.span_drop_chunk_size, separator=separator,
        require_supporting=cfg.span_drop_require_supporting, seed=seed,
    )
