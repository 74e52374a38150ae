"""Checkpoint files are never half-written, and a save that fails (a full disk, above all) says so in one line.

fairseq writes ``checkpoint_E_N.pt.tmp`` and renames it into place; when the write fails the temporary file stays,
often hundreds of MB on the very disk that is full, and the run ends in a traceback. The first wrapper removes the
temporary file this save created, and turns a full disk into a one-line error naming the file and the space left.
fairseq then copies that file onto ``checkpoint_last.pt`` (and the others a save updates) in place: a process
killed during the copy (a preempted node, an elastic restart) left ``checkpoint_last.pt`` truncated. The second
wrapper copies local files to a temporary name beside the destination and renames it into place, so the
destination is always the old file or the new one.
"""
import logging
import os
import shutil

from fairseq import checkpoint_utils

from .errors import UsageError
from .file_utils import disk_full_message, is_disk_full


def atomic_copy(copy):
    """``PathManager.copy`` that replaces a local destination in one rename (other paths: ``copy`` itself)."""
    def copy_then_rename(src_path, dst_path, overwrite=False):
        if "://" in str(src_path) or "://" in str(dst_path):
            return copy(src_path, dst_path, overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        # one name per destination, as fairseq's own ``.tmp``: what a killed copy leaves is replaced by the next
        partial = f"{dst_path}.tmp"
        try:
            shutil.copyfile(src_path, partial)
            os.replace(partial, dst_path)
        except BaseException as err:
            if os.path.isfile(partial):
                os.remove(partial)
            if is_disk_full(err):
                folder = os.path.dirname(os.path.abspath(dst_path))
                raise UsageError(disk_full_message(f"copying {src_path} to {dst_path}", folder)) from None
            raise
        return True

    copy_then_rename.spanbert = True
    return copy_then_rename


def install():
    """Wrap ``fairseq.checkpoint_utils.torch_persistent_save`` (the trainer calls it through the module) and
    ``PathManager.copy``, once."""
    original = checkpoint_utils.torch_persistent_save
    if getattr(original, "spanbert", False):
        return
    checkpoint_utils.PathManager.copy = staticmethod(atomic_copy(checkpoint_utils.PathManager.copy))

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
