"""Hydra imports every module under ``hydra_plugins`` when an application starts, to find its plugins; this one
defines none. ``fairseq-hydra-train`` works out the distributed world (fairseq's ``call_main``) before it imports
``common.user_dir``, so the plugin's handling of torchrun's and srun's processes and its one-line errors are
installed here, as ``fairseq-train`` has them through ``--user-dir`` before its ``call_main``."""
import sys

if "fairseq_cli.hydra_train" in sys.modules:  # fairseq-hydra-train only, not every hydra application
    from spanbert_plugin.core import launchers
    from spanbert_plugin.core.errors import install_excepthook

    install_excepthook()
    launchers.install()
