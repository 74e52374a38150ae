"""The documentation points at things that exist: its links, their anchors, and the commands it shows.

Checks README.md, docs/*.md, benchmarks/README.md and the page of each benchmarks/ group. Every relative link
resolves to a file or folder of the repository, and its #anchor to a heading of the target page, derived as
GitHub derives it. Every command a fenced shell block shows that starts with `spanbert-`,
`fairseq-train`/`fairseq-hydra-train --config-name X`, `python X.py` or `make X` names an existing console
script, recipe, script or Makefile target: a renamed file or option fails here instead of in a reader's shell.
Reads files only (no network, no subprocess).
"""
import glob
import os
import re
import shlex

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(["README.md", "benchmarks/README.md",
               *(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))),
               *(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "benchmarks", "*", "README.md")))])

FENCE = re.compile(r"^\s*```")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def split_fences(text):
    """(prose lines, [(language, code lines)]): fenced blocks apart from the text around them."""
    prose, blocks, block, language = [], [], None, ""
    for line in text.splitlines():
        if FENCE.match(line):
            if block is None:
                block, language = [], line.strip()[3:].strip().lower()
            else:
                blocks.append((language, block))
                block = None
            continue
        (prose if block is None else block).append(line)
    return prose, blocks


def github_anchor(heading):
    """GitHub's anchor of a heading: its rendered text lower-cased, punctuation but '-' and '_' removed,
    spaces turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a page, repeated headings numbered as GitHub numbers them (x, x-1, x-2, ...)."""
    seen, result = {}, set()
    for line in split_fences(read(path))[0]:
        match = HEADING.match(line)
        if match:
            anchor = github_anchor(match.group(2))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            result.add(anchor if count == 0 else f"{anchor}-{count}")
    return result


def links(path):
    """The link targets of a page's prose (code spans and fenced blocks hold no links)."""
    prose = INLINE_CODE.sub("", "\n".join(split_fences(read(path))[0]))
    return LINK.findall(prose)


def console_scripts():
    return set(re.findall(r'"(spanbert-[a-z0-9-]+)=', read("setup.py")))


def make_targets():
    return set(re.findall(r"^([A-Za-z_][\w-]*):(?!=)", read("Makefile"), re.M))


def shell_commands(path):
    """The commands of a page's shell blocks: continuation lines joined, comments and `.venv/bin/` dropped."""
    for language, lines in split_fences(read(path))[1]:
        if language not in SHELL_LANGUAGES:
            continue
        logical = re.sub(r"\\\n", " ", "\n".join(lines))
        for line in logical.splitlines():
            line = re.sub(r"(^|\s)#.*", "", line).strip()
            try:
                words = shlex.split(line)
            except ValueError:  # an unbalanced quote in an illustrative line: its words still name the command
                words = line.split()
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # OMP_NUM_THREADS=1 ...
                words = words[1:]
            if words:
                words[0] = words[0].removeprefix(".venv/bin/")
                yield line, words


def option(words, name):
    return words[words.index(name) + 1] if name in words[:-1] else None


def command_problem(words):
    """Why a command names nothing that exists, or None."""
    program = words[0]
    if program.startswith("spanbert-"):
        return None if program in console_scripts() else f"no console script {program} in setup.py"
    if program in ("fairseq-train", "fairseq-hydra-train"):
        name = option(words, "--config-name")
        if name is None:
            return None
        directory = option(words, "--config-dir")
        found = ([os.path.join(directory, f"{name}.yaml")] if directory else
                 glob.glob(os.path.join("configs", "**", f"{name}.yaml"), root_dir=ROOT, recursive=True))
        return None if any(os.path.isfile(os.path.join(ROOT, f)) for f in found) else f"no recipe {name}.yaml"
    if program in ("python", "python3"):
        scripts = [w for w in words[1:] if w.endswith(".py")]
        if "-m" in words or not scripts:
            return None
        return None if os.path.isfile(os.path.join(ROOT, scripts[0])) else f"no script {scripts[0]}"
    if program == "make":
        missing = [t for t in words[1:] if not t.startswith("-") and "=" not in t and t not in make_targets()]
        return f"no Makefile target {', '.join(missing)}" if missing else None
    return None


@pytest.mark.parametrize("rule", [
    ("Output folders and `--force`", "output-folders-and---force"),
    ("Masking ablation (the paper's Tables 6 and 7)", "masking-ablation-the-papers-tables-6-and-7"),
    ("SST-2, all 67,349 training sentences, 1 epoch (CPU)", "sst-2-all-67349-training-sentences-1-epoch-cpu"),
    ("The torch_adamw optimizer", "the-torch_adamw-optimizer"),
])
def test_github_anchor_rule(rule):
    heading, anchor = rule
    assert github_anchor(heading) == anchor


def test_every_page_is_checked():
    assert {"README.md", "benchmarks/README.md", "docs/pretraining.md", "docs/qa.md",
            "benchmarks/pretraining/README.md", "benchmarks/coreference/README.md"} <= set(DOCS)


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_and_anchors_resolve(doc):
    broken = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not checked offline
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(os.path.join(ROOT, resolved)):
            broken.append(f"{target}: no {resolved}")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor} in {resolved}")
    assert not broken, f"{doc}:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", DOCS)
def test_commands_name_existing_scripts_recipes_and_targets(doc):
    problems = [f"{line}\n    {problem}" for line, words in shell_commands(doc)
                if (problem := command_problem(words)) is not None]
    assert not problems, f"{doc}:\n" + "\n".join(problems)


def test_command_check_catches_what_does_not_exist():
    """The command check fails on a missing console script, recipe, script and target, not only passes."""
    assert command_problem(["spanbert-prepare-nothing"])
    assert command_problem(["fairseq-hydra-train", "--config-dir", "configs/finetune", "--config-name", "squad3"])
    assert command_problem(["fairseq-hydra-train", "--config-name", "no_such_recipe"])
    assert command_problem(["python", "benchmarks/no_such_script.py"])
    assert command_problem(["make", "no-such-target"])
    assert command_problem(["fairseq-hydra-train", "--config-dir", "configs/finetune", "--config-name", "squad1"]) is None
    assert command_problem(["make", "test"]) is None
