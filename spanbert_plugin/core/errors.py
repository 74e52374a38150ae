"""The plugin's user-facing error: one line, no traceback.

``UsageError`` is raised for bad input or options (the message names the file,
line or flag and says what was expected). Our own commands catch it and exit
1; inside ``fairseq-train`` (which the plugin does not control) an uncaught
``UsageError`` is printed alone by the hook installed here, and Python's
exit status for an uncaught exception is 1.
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


def install_excepthook() -> None:
    """Print uncaught UsageErrors as one line (idempotent)."""
    if not getattr(sys.excepthook, "spanbert", False):
        sys.excepthook = _hook(sys.excepthook)
