"""Writing output folders all at once, without ever deleting a user's files.

Every command that writes a folder goes through ``atomic_directory``: the
output is built in a temporary folder beside the destination and moved into
place only when everything succeeded. A manifest (``MANIFEST``) inside the
output names the command that wrote it and the files it wrote; ``--force``
replaces only such a folder, and only when it holds nothing else. A
destination that is the working directory or one of its parents, that is or
contains one of the command's inputs, or that holds foreign files is refused
before any work starts.
"""
import json
import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterable, List

MANIFEST = ".spanbert-output.json"
TMP_PREFIX = ".spanbert-tmp-"


class OutputError(ValueError):
    """A destination that may not be written; the message names it and says why."""


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _inside(path: str, folder: str) -> bool:
    """Is ``path`` ``folder`` itself or somewhere below it (both resolved)?"""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _listing(folder: str) -> List[str]:
    """Relative paths of every file and link under ``folder`` (folders themselves left out)."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            found.append(os.path.relpath(os.path.join(root, name), folder))
    return sorted(found)


def read_manifest(folder: str):
    """The manifest of a folder a spanbert command wrote, or None."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        return None
    return manifest


def check_destination(destination: str, command: str, inputs: Iterable[str] = (), force: bool = False,
                      flag: str = "--destdir") -> None:
    """Refuse (OutputError) a destination that this command may not create or replace.

    Call it before any expensive work; ``atomic_directory`` calls it again.
    """
    if not destination:
        raise OutputError(f"{flag}: empty path")
    dest = _real(destination)
    cwd = _real(os.getcwd())
    if _inside(cwd, dest):
        raise OutputError(f"{flag} {destination}: is the working directory or one of its parents; choose a new folder")
    # the nearest existing ancestor must be a folder we can write into
    parent = os.path.dirname(dest)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputError(f"{flag} {destination}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{flag} {destination}: {parent} is not writable")
    for path in inputs:
        if path and _inside(_real(path), dest):
            raise OutputError(f"{flag} {destination}: holds the input {path}; choose another destination")
    if not os.path.lexists(destination):
        return
    if not os.path.isdir(destination) or os.path.islink(destination):
        raise OutputError(f"{flag} {destination}: exists and is not a folder")
    if not force:
        raise OutputError(f"{flag} {destination}: exists; pass --force to replace an output of this command")
    manifest = read_manifest(destination)
    if manifest is None:
        raise OutputError(
            f"{flag} {destination}: not written by a spanbert command (no {MANIFEST}); "
            "--force replaces only such outputs, so remove or rename it yourself"
        )
    foreign = sorted(set(_listing(destination)) - set(manifest["files"]) - {MANIFEST})
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise OutputError(
            f"{flag} {destination}: holds files that {manifest.get('command', 'a spanbert command')} did not write "
            f"({shown}); --force will not delete them"
        )


@contextmanager
def _terminate_as_interrupt():
    """Turn SIGTERM into KeyboardInterrupt inside the block, so cleanup runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def atomic_directory(destination: str, command: str, inputs: Iterable[str] = (), force: bool = False,
                     flag: str = "--destdir"):
    """Yield a temporary folder beside ``destination``; move it into place only if the block succeeds.

    ``command`` is recorded in the output's manifest with every file written;
    ``inputs`` are paths the command reads (the destination may not hold
    them). A failed run (bad input, a failed check, Ctrl-C, SIGTERM) leaves no
    half-written destination and no temporary folder behind.
    """
    inputs = list(inputs)
    check_destination(destination, command, inputs, force, flag)
    parent = os.path.dirname(_real(destination))
    os.makedirs(parent, exist_ok=True)
    with _terminate_as_interrupt():
        work = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
        try:
            os.chmod(work, 0o755)
            yield work
            files = [f for f in _listing(work) if f != MANIFEST]
            with open(os.path.join(work, MANIFEST), "w", encoding="utf-8") as f:
                json.dump({"command": command, "files": files}, f, indent=2)
            check_destination(destination, command, inputs, force, flag)  # nothing changed meanwhile
            if os.path.lexists(destination):
                old = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
                os.replace(destination, os.path.join(old, "previous"))
                os.replace(work, destination)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(work, destination)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
