"""Hydra imports every module under ``hydra_plugins`` when an application starts, to find its plugins; this one
defines none. ``fairseq-hydra-train`` works out the distributed world (fairseq's ``call_main``) before it imports
``common.user_dir``, so the plugin's handling of torchrun's and srun's processes and its one-line errors are
installed here, as ``fairseq-train`` has them through ``--user-dir`` before its ``call_main``."""
import sys

HYDRA_TRAIN = "fairseq_cli.hydra_train"


def _in_fairseq_hydra_train() -> bool:
    """fairseq-hydra-train's console script imports it; ``python -m fairseq_cli.hydra_train`` runs it as __main__."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return HYDRA_TRAIN in sys.modules or getattr(main_spec, "name", None) == HYDRA_TRAIN


if _in_fairseq_hydra_train():  # not in every hydra application
    from spanbert_plugin.core import launchers
    from spanbert_plugin.core.errors import install_excepthook

    install_excepthook()
    launchers.install()
