"""Writing output folders all at once, without ever deleting a user's files.

Every command that writes a folder goes through ``atomic_directory``: the
output is built in a temporary folder beside the destination and moved into
place only when everything succeeded. A manifest (``MANIFEST``) inside the
output names the command that wrote it and the files it wrote; ``--force``
replaces only such a folder, only when the same command wrote it, and only
when it holds nothing else. A
destination that is the working directory or one of its parents, that is or
contains one of the command's inputs, that is a link, or that holds foreign
files is refused before any work starts. An existing empty folder is used as
if it were absent (nothing in it can be lost).

SIGTERM and SIGHUP are turned into ``Interrupted`` (a KeyboardInterrupt, like
Ctrl-C) inside ``atomic_directory`` so the temporary folder is removed; the
final swap into place runs with those signals held back, so a signal never
lands between moving the old output aside and moving the new one in.
"""
import errno
import gzip
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import tokenize
import zipfile
import zlib
from contextlib import contextmanager
from typing import Iterable, List, Optional

from .errors import UsageError

MANIFEST = ".spanbert-output.json"
TMP_PREFIX = ".spanbert-tmp-"
_DEFERRED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class OutputError(UsageError):
    """A destination that may not be written; the message names it and says why."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal; ``exit_status`` is the shell's 128 + signal number."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.exit_status = 128 + signum


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _inside(path: str, folder: str) -> bool:
    """Is ``path`` ``folder`` itself or somewhere below it?"""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _listing(folder: str) -> List[str]:
    """Relative paths of every file, link and empty folder under ``folder``."""
    found = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        found += [os.path.relpath(os.path.join(root, name), folder) for name in files + links]
        if not files and not dirs and root != folder:
            found.append(os.path.relpath(root, folder) + os.sep)  # a folder someone made by hand
    return sorted(found)


def _stamp(path: str):
    """[size, modification time in ns] of a regular file (not followed through a link), else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return [info.st_size, info.st_mtime_ns] if stat.S_ISREG(info.st_mode) else None


def _changed_since_written(folder: str, manifest: dict) -> List[str]:
    """The files of ``manifest`` whose size or modification time differ from those it recorded (edited since);
    a manifest without stamps (older outputs) names none."""
    stamps = manifest.get("stamps")
    if not isinstance(stamps, dict):
        return []
    return sorted(name for name, stamp in stamps.items()
                  if isinstance(name, str) and os.path.lexists(os.path.join(folder, name))
                  and _stamp(os.path.join(folder, name)) != stamp)


def write_manifest(folder: str, command: str, files: List[str]) -> None:
    """Record in ``folder`` that ``command`` wrote ``files`` (paths relative to it), with each regular file's size and
    modification time: a file edited after the run is the user's, and --force does not replace it."""
    stamps = {name: stamp for name in files if (stamp := _stamp(os.path.join(folder, name))) is not None}
    with open(os.path.join(folder, MANIFEST), "w", encoding="utf-8") as f:
        json.dump({"command": command, "files": files, "stamps": stamps}, f, indent=2)


def read_manifest(folder: str):
    """The manifest of a folder a spanbert command wrote, or None."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        return None
    return manifest


def _shown(paths: List[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


class FolderReadWhole(str):
    """An input folder a command reads whole (a corpus folder): a destination inside it would be read as input the
    next time, so none may lie there."""


def check_destination(destination: str, command: str, inputs: Iterable[str] = (), force: bool = False,
                      flag: str = "--destdir") -> None:
    """Refuse (OutputError) a destination that this command may not create or replace.

    Call it before any expensive work; ``atomic_directory`` calls it again.
    """
    destination = _destination_path(destination, flag)
    where = f"{flag} {destination}"
    dest, dest_abs = _real(destination), os.path.abspath(destination)
    if _inside(_real(os.getcwd()), dest):
        raise OutputError(f"{where}: is the working directory or one of its parents; choose a new folder")
    if os.path.basename(destination) in (".", ".."):  # 'out/.': a folder that cannot be moved aside by that name
        raise OutputError(f"{where}: ends in '{os.path.basename(destination)}'; name the folder itself")
    # the nearest existing ancestor must be a folder we can write into
    parent = os.path.dirname(dest)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputError(f"{where}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"{where}: {parent} is not writable")
    for path in inputs:
        # compared both as written and resolved: a link inside the destination counts as inside it
        if path and (_inside(_real(path), dest) or _inside(os.path.abspath(path), dest_abs)):
            raise OutputError(f"{where}: is or holds the input {path}; choose another destination")
        if isinstance(path, FolderReadWhole) and (_inside(dest, _real(path)) or _inside(dest_abs, os.path.abspath(path))):
            raise OutputError(f"{where}: lies inside the input folder {path}; choose a destination outside it")
    if not os.path.lexists(destination):
        return
    if os.path.islink(destination):
        raise OutputError(f"{where}: is a symbolic link; give the real folder or a new one")
    if not os.path.isdir(destination):
        raise OutputError(f"{where}: exists and is not a folder")
    listing = _listing(destination)
    if not listing:
        return  # an empty folder: nothing to lose
    manifest = read_manifest(destination)
    if manifest is None:
        raise OutputError(
            f"{where}: exists and was not written by a spanbert command (no {MANIFEST}); it is never "
            "replaced, even with --force: choose a new folder, or move it away yourself"
        )
    writer = manifest.get("command")
    writer = writer if isinstance(writer, str) and writer else "a spanbert command"
    foreign = sorted(set(listing) - set(manifest["files"]) - {MANIFEST})
    if foreign:
        raise OutputError(
            f"{where}: holds files that {writer} did not write ({_shown(foreign)}); it is never replaced, "
            "even with --force: move them away first"
        )
    if writer != command:
        # --force replaces the command's own earlier output, never another command's (an input of this one, maybe)
        raise OutputError(f"{where}: is an output of {writer}, not of {command}; it is never replaced by {command}, "
                          "even with --force: choose another folder")
    changed = _changed_since_written(destination, manifest)
    if changed:
        raise OutputError(f"{where}: {_shown(changed)} changed since {writer} wrote it; it is never replaced with "
                          "those changes, even with --force: move the folder away first")
    if not force:
        raise OutputError(f"{where}: exists (an output of {writer}); pass --force to replace it")


def _destination_path(destination: str, flag: str) -> str:
    """The destination without trailing separators ('out/' is 'out', and a link 'lk/' is the link, not the folder
    it points to); OutputError when empty."""
    if not destination:
        raise OutputError(f"{flag}: empty path")
    return destination.rstrip(os.sep + (os.altsep or "")) or destination


@contextmanager
def signals_held():
    """Hold SIGINT/SIGTERM/SIGHUP back inside the block; they are delivered when it ends.

    Blocking them covers the main thread only: the kernel may deliver a signal to another thread (a progress bar's,
    a data loader's), and Python then runs its handler in the main thread at once. So the block's handlers only
    record a signal, and each recorded one is raised again after the block, under the handlers of before.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    handlers = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in _DEFERRED_SIGNALS}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a signal held back runs the recording handler now
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for signum in dict.fromkeys(received):
            signal.raise_signal(signum)


@contextmanager
def signals_as_interrupt():
    """Turn SIGTERM and SIGHUP into Interrupted inside the block, so cleanup runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


PAUSE_ENV = "SPANBERT_PAUSE_IN_OUTPUT"


def _pause_for_tests() -> None:
    """With $SPANBERT_PAUSE_IN_OUTPUT set to a path: create that file, then wait for a signal.

    Tests use it to signal a command at a known moment (its temporary output folder
    exists) instead of racing a run that may finish first on a fast or loaded machine.
    """
    marker = os.environ.get(PAUSE_ENV)
    if marker and threading.current_thread() is threading.main_thread():
        with open(marker, "w"):
            pass
        signal.pause()


def _swap_into_place(work: str, destination: str, parent: str) -> None:
    """Move ``work`` to ``destination``; an old output is moved aside first and put back on failure."""
    if not os.path.lexists(destination):
        os.replace(work, destination)
        return
    if not os.listdir(destination):
        # an empty folder check_destination accepted: the output takes its permissions
        os.chmod(work, stat.S_IMODE(os.stat(destination).st_mode))
        os.rmdir(destination)
        os.replace(work, destination)
        return
    old = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
    previous = os.path.join(old, "previous")
    try:
        os.replace(destination, previous)
        try:
            os.replace(work, destination)
        except BaseException:
            os.replace(previous, destination)
            raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _current_umask() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def is_disk_full(err: BaseException) -> bool:
    """A write that failed for want of space (or quota): OSError's ENOSPC/EDQUOT, or safetensors' 'os error 28'."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(err, UsageError):  # already one line of the plugin's
        return False
    return "No space left on device" in str(err) or "os error 28" in str(err)


def disk_full_message(what: str, folder: str) -> str:
    """One line: the device of ``folder`` is full, with the space left there."""
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)  # removed since (the parents a failed output made): its device is its parent's
    try:
        free = f"{shutil.disk_usage(folder).free / 2**20:,.1f} MiB free there now"
    except OSError:
        free = "its free space unknown"
    return f"{what}: no space left on the device ({free}); free some space or choose a folder on another device"


@contextmanager
def atomic_directory(destination: str, command: str, inputs: Iterable[str] = (), force: bool = False,
                     flag: str = "--destdir"):
    """Yield a temporary folder beside ``destination``; move it into place only if the block succeeds.

    ``command`` is recorded in the output's manifest with every file written;
    ``inputs`` are paths the command reads (the destination may not hold
    them). A failed run (bad input, a failed check, Ctrl-C, SIGTERM, SIGHUP)
    leaves no half-written destination and no temporary folder behind.
    """
    inputs = list(inputs)
    destination = _destination_path(destination, flag)
    check_destination(destination, command, inputs, force, flag)
    parent = os.path.dirname(_real(destination))
    created = []  # parent folders this call makes, deepest first: removed again if the run fails
    folder = parent
    while not os.path.lexists(folder):
        created.append(folder)
        folder = os.path.dirname(folder)
    with signals_as_interrupt():
        work, placed = None, False
        try:
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as err:
                raise OutputError(f"{flag} {destination}: cannot create {parent} ({err.strerror})") from None
            # a signal held back here is raised when the block ends, with ``work`` already set
            with signals_held():
                work = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent)
            os.chmod(work, 0o777 & ~_current_umask())  # mkdtemp makes it private; a folder as mkdir makes it
            _pause_for_tests()
            yield work
            write_manifest(work, command, [f for f in _listing(work) if f != MANIFEST])
            with signals_held():
                check_destination(destination, command, inputs, force, flag)  # nothing changed meanwhile
                try:
                    _swap_into_place(work, destination, parent)
                except OSError as err:
                    raise OutputError(f"{flag} {destination}: cannot move the output into place ({err.strerror})") from None
                placed = True
        except BaseException as err:
            if placed:  # a signal held back during the swap: the whole output is in place, and says so
                if isinstance(err, KeyboardInterrupt):
                    err.output_written = destination
                raise
            with signals_held():
                if work is not None:
                    shutil.rmtree(work, ignore_errors=True)
                for folder in created:
                    if not os.path.lexists(folder):  # never made: the run failed making the ones above it
                        continue
                    try:
                        os.rmdir(folder)
                    except OSError:  # no longer empty: someone else uses it now
                        break
            if is_disk_full(err):
                raise OutputError(disk_full_message(f"{flag} {destination}", parent)) from None
            raise


def checkpoint_inputs(checkpoint: str, data: Optional[str] = None) -> List[str]:
    """Every path a command reading ``checkpoint`` reads: the checkpoint and its data folder(s).

    Without ``data`` the data folder comes from the checkpoint (the ``task.data``
    it was trained on, possibly several folders joined by ``:``), so it counts as
    an input like a given one. A relative stored folder is taken both from the
    working directory and from the checkpoint's folder, as the loaders do. An
    unreadable checkpoint adds nothing here: its loader reports it in one line.
    """
    if data:
        return [checkpoint, data]
    stored = _stored_data(checkpoint)
    found = [checkpoint]
    for folder in (stored.split(os.pathsep) if stored else []):
        if folder:
            found.append(folder)
            if not os.path.isabs(folder):
                found.append(os.path.join(os.path.dirname(checkpoint), folder))
    return found


def _stored_data(checkpoint: str) -> Optional[str]:
    """The ``data`` a fairseq checkpoint's task was given, or None (read without building anything)."""
    if not os.path.isfile(checkpoint):
        return None
    from .checkpoint_loading import stored_checkpoint

    state = stored_checkpoint(checkpoint)  # {} when damaged or foreign: the real loader names the problem later
    cfg = state.get("cfg")
    task = cfg.get("task") if hasattr(cfg, "get") else None
    data = task.get("data") if hasattr(task, "get") else getattr(state.get("args"), "data", None)
    return str(data) if data else None


def read_text(path: str, flag: str = "", allow_gzip: bool = False) -> str:
    """The whole text of a UTF-8 input file (a leading byte-order mark dropped, as everywhere).

    UsageError, one line naming the file (and ``flag``), when it is missing, not a
    file, a damaged gzip file or not UTF-8. ``allow_gzip``: a gzip-compressed file is
    decompressed first.
    """
    shown = f"{flag} {path}" if flag else path
    if not os.path.exists(path):
        raise UsageError(f"{shown}: no such file")
    if not os.path.isfile(path):
        raise UsageError(f"{shown}: not a regular file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as err:
        raise UsageError(f"{shown}: cannot be read ({err.strerror})") from None
    if allow_gzip and raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:  # zlib.error: a valid header with damaged data after it
            raise UsageError(f"{shown}: damaged gzip file ({err})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise UsageError(f"{shown}:{line}: not valid UTF-8 (byte 0x{raw[err.start]:02x})") from None


# \uD800-\uDFFF escapes: a high one followed by a low one is a pair (one character), any other is lone;
# other escapes (\\ in particular) are consumed so that an escaped backslash before "u" is not taken for one
_ESCAPES = re.compile(r"\\(?:u([dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}|u([dD][89a-fA-F][0-9a-fA-F]{2})|.)",
                      re.DOTALL)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_json(text: str, where: str):
    """``json.loads(text)`` for an input file; ``where`` (file or file:line) names it in errors.

    JSON may spell lone UTF-16 surrogates (``"\\ud800"``), which are no text: every
    tokenizer fails on them later, so they are refused here, with their line. Nesting
    deeper than Python's recursion limit is refused too. A syntax error is left to the
    caller (``json.JSONDecodeError``), whose message says what the file should be.
    """
    if _SURROGATE_ESCAPE.search(text):
        for match in _ESCAPES.finditer(text):
            if match.group(2):
                line = text.count("\n", 0, match.start())
                shown = f"{where}:{line + 1}" if line or "\n" in text else where
                raise UsageError(f"{shown}: \\u{match.group(2)} is a lone UTF-16 surrogate escape, not a character "
                                 "(a string cut in the middle of a pair?)")
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"{where}: JSON nested too deeply (more than about {sys.getrecursionlimit()} levels)") from None


def is_json_integer(value) -> bool:
    """A JSON integer: ``true`` and ``false`` are Python ints too, and no offset or count."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_json(path: str, flag: str = ""):
    """The JSON value of an input or metadata file; UsageError (one line naming it) when it is not JSON."""
    shown = f"{flag} {path}" if flag else path
    try:
        return parse_json(read_text(path, flag), shown)
    except json.JSONDecodeError as err:
        raise UsageError(f"{shown}:{err.lineno}: not valid JSON ({err.msg}, column {err.colno})") from None


# what reading a cut-short or overwritten binary file raises: numpy's EOF and header errors are ValueErrors (a header
# it parses as Python: SyntaxError or tokenize's TokenError), an .npz is a zip archive (a flipped byte: an unknown zip
# version is NotImplementedError), and a compressed member that ends early is a zlib error
_DAMAGED_FILE_ERRORS = (OSError, ValueError, EOFError, SyntaxError, tokenize.TokenError, NotImplementedError,
                        zipfile.BadZipFile, zlib.error)


def damaged_file_error(path: str, reason) -> UsageError:
    """The one-line error for a file of a prepared folder that cannot be read back."""
    return UsageError(f"{path}: damaged or truncated ({reason}); copy it again or prepare the folder again")


def load_arrays(path: str):
    """The array of a prepared ``.npy`` file, or the arrays of an ``.npz`` file (name -> array, all read now, so a
    damaged member shows here); UsageError naming the file when it is missing, damaged or truncated."""
    import numpy as np

    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            return loaded
        with loaded:
            return {name: loaded[name] for name in loaded.files}
    except _DAMAGED_FILE_ERRORS as err:
        raise damaged_file_error(path, err) from None


def read_jsonl(path: str, expected: Optional[int] = None) -> list:
    """The records of a prepared JSON Lines file; UsageError naming the file (and line) when it is missing, damaged,
    or holds another number of records than ``expected`` (a copy cut short at a line's end)."""
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    records = []
    with open(path, "rb") as f:  # decoded line by line: a text stream decodes ahead, and would name a line too early
        try:
            for line in f:
                records.append(json.loads(line.decode("utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise damaged_file_error(f"{path}:{len(records) + 1}", err) from None
    if expected is not None and len(records) != expected:
        raise damaged_file_error(path, f"{len(records)} records where the split has {expected}")
    return records
