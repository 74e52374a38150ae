"""Writing output folders all at once."""
import os
import shutil
import tempfile
from contextlib import contextmanager


@contextmanager
def atomic_directory(destination: str):
    """Yield a temporary folder beside ``destination``; move it into place only if the block succeeds.

    A failed run (bad input, a failed check, Ctrl-C) leaves no half-written
    destination and no temporary folder behind.
    """
    parent = os.path.dirname(os.path.abspath(destination))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".spanbert-tmp-", dir=parent)
    os.chmod(work, 0o755)
    try:
        yield work
        if os.path.exists(destination):
            shutil.rmtree(destination)
        os.replace(work, destination)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
