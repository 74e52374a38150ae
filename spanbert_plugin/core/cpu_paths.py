"""Where the plugin runs something else on a CPU than on a GPU, for the CPU's speed: dropout masks from numpy
(``model/dropout.py``), attention dropout outside the fused kernel and no attention mask for a batch found to have no
padding where the data loader has not said (``model/layers.py``), the vocabulary cross-entropy in cache-sized chunks
(``pretraining/vocab_cross_entropy.py``). ``CPU_PATHS = False`` runs on a CPU what runs on a GPU: the
update-cost benchmark counts a GPU's operators so."""
import torch

CPU_PATHS = True


def cpu_path(x: torch.Tensor) -> bool:
    """Does ``x`` take the CPU's own paths?"""
    return CPU_PATHS and x.device.type == "cpu"
