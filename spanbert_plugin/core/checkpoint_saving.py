"""A checkpoint save that fails (a full disk, above all) leaves nothing half-written and says so in one line.

fairseq writes ``checkpoint_E_N.pt.tmp`` and renames it into place; when the write fails the temporary file stays,
often hundreds of MB on the very disk that is full, and the run ends in a traceback. The wrapper removes the
temporary file this save created, and turns a full disk into a one-line error naming the file and the space left.
"""
import logging
import os

from fairseq import checkpoint_utils

from .errors import UsageError
from .file_utils import disk_full_message, is_disk_full


def install():
    """Wrap ``fairseq.checkpoint_utils.torch_persistent_save`` once (the trainer calls it through the module)."""
    original = checkpoint_utils.torch_persistent_save
    if getattr(original, "spanbert", False):
        return

    def torch_persistent_save(obj, filename, async_write: bool = False):
        partial = f"{filename}.tmp"
        existed = os.path.lexists(partial)
        fairseq_log = logging.getLogger(checkpoint_utils.__name__)
        level = fairseq_log.level
        fairseq_log.setLevel(logging.CRITICAL)  # fairseq logs the traceback of a failed save, then raises it anyway
        try:
            return original(obj, filename, async_write)
        except BaseException as err:
            if not async_write and not existed and os.path.isfile(partial):
                os.remove(partial)
            if is_disk_full(err):
                folder = os.path.dirname(os.path.abspath(filename))
                raise UsageError(disk_full_message(f"saving {filename}", folder)) from None
            raise
        finally:
            fairseq_log.setLevel(level)

    torch_persistent_save.spanbert = True
    checkpoint_utils.torch_persistent_save = torch_persistent_save
