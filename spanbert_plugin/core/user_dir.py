"""Where the plugin's ``--user-dir`` folder is, and registering the plugin through it (no torch at import)."""
import os

# the folder fairseq's --user-dir imports to register the plugin (beside the package in a checkout or install)
USER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "user_dir")


def register_plugin() -> None:
    """Register every component of the plugin the way ``--user-dir`` does (``user_dir`` imports the registry).

    Code that loads a checkpoint needs its task and model registered; going through fairseq's own mechanism keeps
    the lower layers from importing the registry above them.
    """
    from argparse import Namespace

    from fairseq import utils

    utils.import_user_module(Namespace(user_dir=USER_DIR))
