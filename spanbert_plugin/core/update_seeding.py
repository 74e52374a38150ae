"""fairseq seeds torch's random generators before every update; for the plugin's tasks without formatting the
Python stack.

``Trainer._set_seed`` (fairseq 0.12) seeds with ``--seed`` plus the update number, so that a resumed run draws
what an uninterrupted one draws, through ``fairseq.utils.set_torch_seed`` and so ``torch.manual_seed``. For each
device type whose runtime has not started (XPU's and MTIA's on a GPU machine, CUDA's too on a CPU),
``torch.manual_seed`` queues the seed for when it starts, and queueing formats the whole Python stack
(``traceback.format_stack``): under ``fairseq-train``'s stack about 0.4 ms per such device type, every update.

For the plugin's tasks the update's seed goes straight to the generators that exist, as ``torch.manual_seed``
sets them: the CPU's, those of every device type whose runtime has started (CUDA's on a GPU), MPS's and a custom
device's. The seeds torch queued when fairseq seeded at start stay queued: a device type that started during
training would get those, where ``torch.manual_seed`` would give it the last update's; none starts then in a
fairseq run, whose model, criterion and batches are on their device before the first update. fairseq's
``set_torch_seed`` also saves the generators' states for a ``with`` block, which ``_set_seed`` drops unused.

Only over the code it was written against: ``SOURCE_SHA256`` is the hash of fairseq's two methods and of
``torch.random._manual_seed_impl``; another one, or torch_xla, leaves fairseq's method in place with a warning
(``tests/test_update_cost.py`` fails then).
"""
import logging

import torch
from fairseq import utils as fairseq_utils
from fairseq.trainer import Trainer

from .source_hash import source_sha256

logger = logging.getLogger(__name__)
# fairseq-fixed 0.12.3.1's Trainer._set_seed and set_torch_seed.__init__, torch 2.13's _manual_seed_impl
SOURCE_SHA256 = "0fd854327593eaefc091438c36f32023921c13a6777b284d3b2b6c3c9fdf650f"
LAZILY_SEEDED = ("cuda", "xpu", "mtia")  # device types whose seeds torch queues until their runtime starts


def seed_started_generators(seed: int) -> None:
    """``torch.manual_seed(seed)`` for every generator that exists, queueing nothing (see the module's docstring)."""
    seed = int(seed)
    for name in LAZILY_SEEDED:
        device = getattr(torch, name)
        if device.is_initialized():  # False in a forked child whose parent had started it, as torch checks
            device.manual_seed_all(seed)
    if not torch.mps._is_in_bad_fork():
        torch.mps.manual_seed(seed)
    torch.random._seed_custom_device(seed)
    torch.default_generator.manual_seed(seed)


def source_sha256_now() -> str:
    original = getattr(Trainer._set_seed, "__wrapped__", Trainer._set_seed)
    return source_sha256(original, fairseq_utils.set_torch_seed.__init__, torch.random._manual_seed_impl)


def install(is_plugin_task):
    """Route ``Trainer._set_seed`` of tasks for which ``is_plugin_task(task)`` holds (idempotent)."""
    original = Trainer._set_seed
    if hasattr(original, "__wrapped__"):
        return
    if source_sha256_now() != SOURCE_SHA256 or fairseq_utils.xm is not None:
        logger.warning("fairseq's Trainer._set_seed or torch.manual_seed is not the one the plugin was written "
                       "against (or torch_xla is installed): every update seeds through torch.manual_seed")
        return

    def _set_seed(self):
        if not is_plugin_task(self.task):
            return original(self)
        seed_started_generators(self.cfg.common.seed + self.get_num_updates())

    _set_seed.__wrapped__ = original
    Trainer._set_seed = _set_seed
