"""Benchmark results without ever replacing a user's files: the one JSON file a speed benchmark writes, and
the check of a results folder that a script adds to across runs.

An existing ``--out`` is replaced only with ``--force``, and only when it is a results file of the same
script (a JSON object holding that script's keys); anything else is refused in one line before the
benchmark runs. The file is written to a temporary name and moved into place, so it is never half-written.
"""
import json
import os
import sys


def check_results_file(path, script, force, keys):
    """Exit with one line naming ``--out`` when ``script`` may not write ``path``."""
    where = f"{script}: --out {path}"
    if not os.path.lexists(path):
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            sys.exit(f"{where}: {parent} is a file, not a folder")
        return
    if os.path.islink(path) or not os.path.isfile(path):
        sys.exit(f"{where}: exists and is not a plain file; choose another name")
    if not force:
        sys.exit(f"{where}: exists; pass --force to replace an earlier result of {script}, or choose another name")
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        earlier = None
    if not isinstance(earlier, dict) or not set(keys) <= set(earlier):
        sys.exit(f"{where}: is not a results file of {script} (a JSON object with {', '.join(sorted(keys))}); "
                 "it is never replaced, even with --force: choose another name")


def add_json_out_options(parser, required=True):
    """--out (a results JSON, its table written beside it as .md) and --force."""
    parser.add_argument("--out", required=required, help="results JSON (the table goes beside it, .md)")
    parser.add_argument("--force", action="store_true", help="replace an earlier --out of this script")


def check_json_out(parser, args, script, keys):
    """Exit unless ``script`` may write ``args.out`` (a .json name; see ``check_results_file``); returns the path of
    the table beside it."""
    if not args.out or not args.out.endswith(".json"):
        parser.error("--out must name a .json file (the table is written beside it with .md)")
    check_results_file(args.out, script, args.force, keys)
    return args.out[:-len(".json")] + ".md"


def write_results_file(path, results):
    """Write ``results`` as indented JSON to ``path`` in one step."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(json.dumps(results, indent=2))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def unmarked_folder(folder, flag, marks):
    """One line when ``folder`` may not take a script's results: not a folder, or holding files but none of
    ``marks`` (the files that show the script wrote there before); else None."""
    if not os.path.lexists(folder):
        return None
    if os.path.islink(folder) or not os.path.isdir(folder):
        return f"{flag} {folder}: exists and is not a folder"
    if not os.listdir(folder) or any(os.path.isfile(os.path.join(folder, mark)) for mark in marks):
        return None
    return f"{flag} {folder}: holds files, but no {' or '.join(marks)} of this script; choose a new or empty folder"


def claim_work_folder(folder, flag, mark, script):
    """Make ``folder`` ``script``'s scratch folder (a ``mark`` file in it says so; what it holds is the script's to
    replace), or exit with one line when it holds anything else."""
    refused = unmarked_folder(folder, flag, (mark,))
    if refused:
        sys.exit(f"{script}: {refused}")
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, mark), "a").close()


def add_results_options(parser, work):
    """A driver's --work (its scratch folder, default ``work``), --out (its results folder) and --force."""
    parser.add_argument("--work", default=work)
    parser.add_argument("--out", required=True)
    parser.add_argument("--force", action="store_true")


def claim_outputs(args, script, keys, work_mark):
    """Exit with one line unless ``script`` may write ``--out``/results.json (``keys``: those its results hold) and
    have ``--work``; claim ``--work``. Returns the results file's path."""
    results_path = os.path.join(args.out, "results.json")
    check_results_file(results_path, script, args.force, keys)
    claim_work_folder(args.work, "--work", work_mark, script)
    return results_path
