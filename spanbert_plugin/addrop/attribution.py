"""AD-DROP (SPEC §3): attribution -> candidate set -> drop mask, reproducible from seeds.

Shapes: attention maps and masks are B x heads x T (queries) x T (keys);
``key_padding_mask`` is B x T, True on padding. A drop mask is True where the
attention logit gets the dtype's most negative finite value added before the
softmax (see ``model.layers.additive_drop_mask``).

Candidates: in every (example, head, query row) the ``ceil(p * n)`` real keys of
highest attribution, ``n`` being the example's number of real (non-pad) keys;
this is the authors' rule (they keep the ``floor((1 - p) * n)`` lowest), so the
candidate share lies in [p, p + 1/n). Ties are broken by ``torch.topk``.
Padding is never a candidate. Each candidate is dropped independently with
probability q.
"""
import functools
import operator
from typing import Dict, Iterable, Optional

import numpy as np
import torch
import torch.nn.functional as F

ATTRIBUTIONS = ("gradient", "attention", "random")


def candidate_counts(real_keys: torch.Tensor, p: float) -> torch.Tensor:
    """Candidates per row, ``ceil(p * n)`` (a tiny tolerance keeps p * n = 3.0000000001 at 3)."""
    return torch.ceil(real_keys.double() * p - 1e-9).clamp_(min=0).long()


def candidate_mask(attribution: torch.Tensor, key_padding_mask: torch.Tensor, p: float, rows=None) -> torch.Tensor:
    """B x heads x T x T bool: the ``ceil(p * n)`` real keys of highest attribution in every row (``rows``: those
    numbers and their largest, as :func:`row_candidates` gives them, when the caller has them already)."""
    counts, most = rows or row_candidates(key_padding_mask, p)
    candidates = torch.zeros(attribution.shape, dtype=torch.bool, device=attribution.device)
    if most == 0:
        return candidates
    scores = attribution.float().nan_to_num(0.0, posinf=0.0, neginf=0.0)
    scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))  # padding ranks last
    top = scores.topk(most, dim=-1).indices  # B x heads x T x most, by decreasing attribution
    within = torch.arange(most, device=top.device) < counts.to(top.device)[:, None, None, None]
    return candidates.scatter_(-1, top, within.expand_as(top))


def row_candidates(key_padding_mask: torch.Tensor, p: float):
    """(candidates per example, their largest): the largest is read on the host, once per batch."""
    counts = candidate_counts((~key_padding_mask).sum(-1), p)  # B
    return counts, int(counts.max()) if counts.numel() else 0


def drop_mask(candidates: torch.Tensor, q: float, generator: torch.Generator) -> torch.Tensor:
    """Drop each candidate with probability q (one uniform draw per entry from ``generator``)."""
    draws = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    return candidates & (draws < q)


def mask_generator(device, seed: int, epoch: int, update: int, micro_batch: int = 0, rank: int = 0) -> torch.Generator:
    """A generator seeded from (seed, epoch, update, micro-batch, data-parallel rank): masks survive a resume."""
    state = np.random.SeedSequence([seed, epoch, update, micro_batch, rank]).generate_state(1, dtype=np.uint64)[0]
    generator = torch.Generator(device=device)
    generator.manual_seed(int(state))
    return generator


def drop_masks(
    attributions: Dict[int, Optional[torch.Tensor]],
    key_padding_mask: torch.Tensor,
    p: float,
    q: float,
    generator: torch.Generator,
    shape=None,
) -> Dict[int, torch.Tensor]:
    """{layer: drop mask}. An attribution of ``None`` means random attribution (the RD baseline) of ``shape``."""
    masks = {}
    rows = row_candidates(key_padding_mask, p)  # the same rows in every layer: one host read per batch
    for layer in sorted(attributions):
        attribution = attributions[layer]
        if attribution is None:
            attribution = torch.rand(shape, generator=generator, device=key_padding_mask.device)
        masks[layer] = drop_mask(candidate_mask(attribution, key_padding_mask, p, rows), q, generator)
    return masks


def drop_counts(masks: Iterable[torch.Tensor], key_padding_mask: torch.Tensor, maps: int):
    """(dropped, entries): dropped real (query, key) pairs, and real pairs times ``maps`` (heads x layers), as
    tensors on the device: logged as they are, read at the log interval (no host sync per update)."""
    real = ~key_padding_mask
    pairs = real[:, None, :, None] & real[:, None, None, :]  # B x 1 x T x T
    counts = [(mask & pairs).sum() for mask in masks]
    dropped = functools.reduce(operator.add, counts) if counts else real.new_zeros((), dtype=torch.long)
    return dropped, real.sum(-1).pow(2).sum() * maps


def pseudo_label_logit_sum(logits: torch.Tensor) -> torch.Tensor:
    """Classification: the sum over the batch of each example's logit of its predicted (argmax) class."""
    logits = logits.float()
    return logits.gather(-1, logits.argmax(dim=-1, keepdim=True)).sum()


def pseudo_label_span_objective(start_logits: torch.Tensor, end_logits: torch.Tensor) -> torch.Tensor:
    """Token level (QA): minus the cross-entropy of the predicted start and end positions, summed over the batch.

    Minus the pseudo-label loss, so that, as for classification's logits, high attribution means support for the
    prediction: the authors' token-level code ranks attention entries by the negated gradient of that loss.
    """
    total = 0.0
    for logits in (start_logits, end_logits):
        log_probs = F.log_softmax(logits.float(), dim=-1)
        total = total + log_probs.gather(-1, log_probs.argmax(dim=-1, keepdim=True)).sum()
    return total
