"""Every benchmark and helper script still starts on the current code: ``--help`` of each Python script under
benchmarks/ and scripts/ exits 0 (its imports, the helpers it loads and its argument parser work), and every shell
script parses (``bash -n``). Most scripts are run by no other test, so a renamed module or attribute would
otherwise show only when someone runs them again for a published number."""
import glob
import json
import os
import subprocess
import sys

from conftest import ROOT

SKIPPED_FOLDERS = ("cache", "out")  # fetched models and scratch output, not scripts


def scripts(pattern):
    found = []
    for folder in ("benchmarks", "scripts"):
        for path in glob.glob(os.path.join(ROOT, folder, "**", pattern), recursive=True):
            parts = os.path.relpath(path, ROOT).split(os.sep)
            if not set(parts[1:-1]) & set(SKIPPED_FOLDERS):
                found.append(path)
    return sorted(found)


# One process for all of them (torch and fairseq imported once): each script runs as __main__ with --help and its
# folder first on sys.path, as `python SCRIPT --help` runs it; the script-local modules it loaded (its helpers) are
# dropped before the next.
HELP_ALL = r"""
import contextlib, io, json, os, runpy, sys, traceback
root, paths = sys.argv[1], sys.argv[2:]
local = (os.path.join(root, "benchmarks") + os.sep, os.path.join(root, "scripts") + os.sep)
failed = {}
for path in paths:
    saved_path = list(sys.path)
    sys.path.insert(0, os.path.dirname(path))  # as `python SCRIPT` puts it first
    sys.argv = [path, "--help"]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (0, None):
            failed[path] = f"exit {exit.code}: {out.getvalue()[-800:]}"
    except BaseException:
        failed[path] = traceback.format_exc()[-2000:]
    sys.path[:] = saved_path
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(local):
            del sys.modules[name]
print(json.dumps(failed))
"""


def test_every_python_script_answers_help():
    paths = scripts("*.py")
    assert len(paths) > 40, paths
    proc = subprocess.run([sys.executable, "-c", HELP_ALL, ROOT, *paths], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "\n\n".join(f"{os.path.relpath(path, ROOT)}: {why}" for path, why in failed.items())


def test_every_shell_script_parses():
    paths = scripts("*.sh")
    assert paths
    for path in paths:
        proc = subprocess.run(["bash", "-n", path], capture_output=True, text=True)
        assert proc.returncode == 0, f"{os.path.relpath(path, ROOT)}: {proc.stderr}"


def test_ad_drop_step_time_times_both_steps(monkeypatch, capsys):
    """benchmarks/cpu_speed/ad_drop_step_time.py at a tiny shape: its AD-DROP step runs the task mixin as training does
    (the mixin once called a task method its bench task lacked)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ad_drop_step_time", os.path.join(ROOT, "benchmarks", "cpu_speed", "ad_drop_step_time.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "argv", ["ad_drop_step_time.py", "--layers", "1", "--dim", "32", "--heads", "2", "--ffn",
                                      "64", "--batch", "2", "--seq", "16", "--steps", "1", "--runs", "1", "--threads", "1"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts --root first
    script.main()
    assert "AD-DROP / plain:" in capsys.readouterr().out
