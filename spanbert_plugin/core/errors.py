"""The plugin's user-facing error: one line, no traceback.

``UsageError`` is raised for bad input or options (the message names the file,
line or flag and says what was expected). Our own commands catch it and exit
1; inside ``fairseq-train`` and ``fairseq-hydra-train`` (which the plugin does
not control) an uncaught ``UsageError`` is printed alone by the hook installed
here, and Python's exit status for an uncaught exception is 1.
"""
import sys


class UsageError(ValueError):
    """Bad input or options; the message alone is shown to the user."""


def _shown_usage_error(value):
    """The UsageError behind an uncaught exception, or None.

    fairseq's ``Trainer.load_checkpoint`` re-raises whatever loading the weights
    raised as a bare ``Exception`` ("please ensure that the architectures match").
    """
    if isinstance(value, UsageError):
        return value
    if type(value) is Exception and isinstance(value.__context__, UsageError):
        return value.__context__
    return None


def _hook(previous):
    def excepthook(kind, value, tb):
        error = _shown_usage_error(value)
        if error is not None:
            print(f"error: {error}", file=sys.stderr)
            return
        previous(kind, value, tb)

    excepthook.spanbert = True
    return excepthook


def _hydra_reraises_usage_errors(is_env_set):
    """hydra's ``run_and_report`` prints any exception as a trimmed traceback ending in "Set the environment
    variable HYDRA_FULL_ERROR=1 ...", unless that variable is set, when it re-raises. It asks while the exception
    is being handled, so a plugin error can be let through to the hook above (one line); others are left to hydra."""
    def reraise_usage_errors(name):
        if name == "HYDRA_FULL_ERROR" and _shown_usage_error(sys.exc_info()[1]) is not None:
            return True
        return is_env_set(name)

    reraise_usage_errors.spanbert = True
    return reraise_usage_errors


def install_excepthook() -> None:
    """Print uncaught UsageErrors as one line, also under ``fairseq-hydra-train`` (idempotent)."""
    if not getattr(sys.excepthook, "spanbert", False):
        sys.excepthook = _hook(sys.excepthook)
    hydra_utils = sys.modules.get("hydra._internal.utils")  # loaded: the plugin runs inside fairseq-hydra-train
    if hydra_utils is not None and hasattr(hydra_utils, "_is_env_set") and not getattr(hydra_utils._is_env_set, "spanbert", False):
        hydra_utils._is_env_set = _hydra_reraises_usage_errors(hydra_utils._is_env_set)
