"""Where the plugin runs something else on a CPU than on a GPU, for the CPU's speed: dropout masks from numpy
(``model/dropout.py``), attention dropout outside the fused kernel and no attention mask for a batch found to have no
padding where the data loader has not said (``model/layers.py``), the vocabulary cross-entropy in cache-sized chunks
(``pretraining/vocab_cross_entropy.py``), and malloc told to keep freed memory for reuse while training
(``keep_freed_memory``). ``CPU_PATHS = False`` runs on a CPU what runs on a GPU: the update-cost benchmark counts
a GPU's operators so."""
import ctypes
import logging
import os

import torch

logger = logging.getLogger(__name__)

CPU_PATHS = True


def cpu_path(x: torch.Tensor) -> bool:
    """Does ``x`` take the CPU's own paths?"""
    return CPU_PATHS and x.device.type == "cpu"


# glibc's mallopt parameters
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
KEPT_FREE_BYTES = 1 << 30
_malloc_tuned = False


def keep_freed_memory(x: torch.Tensor) -> bool:
    """Training on a CPU (glibc), have malloc keep freed memory for the next update instead of returning it to
    the system (once per process; not where the user set a ``MALLOC_*`` variable).

    glibc serves an allocation above 32 MB from a fresh memory map and unmaps it when freed: an update then
    pays for unmapping the previous update's large tensors and for a page fault on every 4 KB page of the new
    ones. With a 30,522-word vocabulary the word embeddings' gradient alone is 47 MB (384 dimensions): zeroing a
    fresh one took several times as long as in memory already mapped (``benchmarks/cpu_speed/malloc_zeroing.py``
    measures it). Without memory maps
    (``M_MMAP_MAX`` 0) such tensors come from the heap, and freed heap memory stays mapped up to
    ``KEPT_FREE_BYTES`` (``M_TRIM_THRESHOLD``): the process holds on to its peak, as it would for the next
    update anyway.
    """
    global _malloc_tuned
    if _malloc_tuned or not cpu_path(x) or any(name.startswith("MALLOC_") for name in os.environ):
        return False
    _malloc_tuned = True
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:  # not glibc
        return False
    kept = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, KEPT_FREE_BYTES) == 1
    if kept:
        logger.info("training on the CPU: malloc keeps freed memory for reuse (no memory maps, up to 1 GB kept "
                    "free); set any MALLOC_* environment variable to leave malloc as it is")
    return kept
