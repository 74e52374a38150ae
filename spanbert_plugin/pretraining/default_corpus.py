"""The embedded default corpus: English prose from the standard library's docstrings.

Generated on the fly from the running Python's own sources (parsed with ``ast``,
never imported), one module per document, one paragraph per line, so that the
demo and the tests work offline with no data from the user and no copied text
in this repository.
"""
import ast
import os
import re
import sysconfig
from typing import Iterator, List, Optional

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_CODE_LINE = re.compile(r"^\s*(>>>|\.\.\.|[$%]|[{}\[\]()]|[\w.]+\(.*\)\s*$|[-=~*]{3,})")


def _paragraphs(docstring: str) -> Iterator[str]:
    for block in re.split(r"\n\s*\n", docstring):
        lines = [ln.strip() for ln in block.splitlines()]
        if not lines or any(_CODE_LINE.match(ln) for ln in lines):
            continue
        text = " ".join(lines)
        words = text.split()
        letters = sum(c.isalpha() or c.isspace() for c in text)
        # prose: several words, mostly letters and spaces
        if len(words) >= 5 and letters >= 0.85 * len(text):
            yield text


def module_documents(stdlib_dir: Optional[str] = None) -> Iterator[List[str]]:
    """Yield one document (a list of paragraphs) per standard-library module."""
    stdlib_dir = stdlib_dir or sysconfig.get_paths()["stdlib"]
    for root, dirs, files in os.walk(stdlib_dir):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            nodes = [tree] + [
                n for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            ]
            paragraphs = []
            for node in nodes:
                doc = ast.get_docstring(node)
                if doc:
                    paragraphs.extend(_paragraphs(doc))
            if paragraphs:
                yield list(dict.fromkeys(paragraphs))  # drop repeated paragraphs, keep order


def write_default_corpus(train_path: str, valid_path: str, valid_every: int = 20, max_docs: Optional[int] = None):
    """Write the corpus as train/valid text files (every ``valid_every``-th module to valid)."""
    counts = {"train": 0, "valid": 0}
    with open(train_path, "w", encoding="utf-8") as train, open(valid_path, "w", encoding="utf-8") as valid:
        for i, doc in enumerate(module_documents()):
            if max_docs is not None and i >= max_docs:
                break
            split = "valid" if i % valid_every == valid_every - 1 else "train"
            out = valid if split == "valid" else train
            if counts[split]:
                out.write("\n")
            out.write("\n".join(doc) + "\n")
            counts[split] += 1
    return counts
