"""No module defines a function, class or test of one name twice at the same level: the later one silently
replaces the earlier, so a pasted helper of a name already taken breaks every caller of the first, and a second test
of a name already taken makes pytest run only the last. Property setters and deleters, and ``typing.overload``
stubs, reuse a name by design."""
import ast
import collections
import glob
import os

from conftest import ROOT

FOLDERS = ("spanbert_plugin", "tests", "benchmarks", "scripts")
SKIPPED_FOLDERS = ("cache", "out")  # fetched models and scratch output


def _reuses_a_name_by_design(node) -> bool:
    for decorator in getattr(node, "decorator_list", []):
        if isinstance(decorator, ast.Attribute) and decorator.attr in ("setter", "deleter"):
            return True
        if (isinstance(decorator, ast.Name) and decorator.id == "overload") or (
                isinstance(decorator, ast.Attribute) and decorator.attr == "overload"):
            return True
    return False


def shadowed(body, where):
    """'where: name (lines a, b)' for each name defined twice in ``body``, and in the bodies of its classes."""
    lines = collections.defaultdict(list)
    found = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not _reuses_a_name_by_design(node):
            lines[node.name].append(node.lineno)
        if isinstance(node, ast.ClassDef):
            found += shadowed(node.body, f"{where}: class {node.name}")
    return found + [f"{where}: {name} (lines {', '.join(map(str, at))})" for name, at in lines.items() if len(at) > 1]


def python_files():
    for folder in FOLDERS:
        for path in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            if not set(os.path.relpath(path, ROOT).split(os.sep)[1:-1]) & set(SKIPPED_FOLDERS):
                yield path


def test_no_module_defines_a_name_twice():
    paths = list(python_files())
    assert len(paths) > 150, len(paths)
    found = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            found += shadowed(ast.parse(f.read(), path).body, os.path.relpath(path, ROOT))
    assert not found, "\n".join(found)


def test_a_helper_pasted_under_a_name_already_taken_is_found():
    source = "def helper(x):\n    return x\n\n\ndef test_a():\n    helper(1)\n\n\ndef helper():\n    return 2\n"
    assert shadowed(ast.parse(source).body, "m.py") == ["m.py: helper (lines 1, 9)"]
    properties = "class A:\n    @property\n    def v(self):\n        return 1\n\n    @v.setter\n    def v(self, x):\n        pass\n"
    assert shadowed(ast.parse(properties).body, "m.py") == []
