"""Output safety: --force never deletes a user's files, and a stopped run leaves nothing behind.

The refusals are checked through the real ``spanbert-prepare`` console command
(several at once, since each start imports torch and fairseq); the folder
shapes of spanbert-export-hf / spanbert-import-hf through ``check_destination``.
At the end: the install noise of issue 8 (Makefile filter, tensorboardX).
"""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import ROOT, bin_path, served_command
from spanbert_plugin.core import file_utils
from spanbert_plugin.core.file_utils import MANIFEST, TMP_PREFIX, OutputError, atomic_directory, check_destination

PREPARE = bin_path("spanbert-prepare")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def snapshot(folder):
    """Every path under ``folder`` (files, links, folders) with a digest of each file's bytes."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[rel] = "link:" + os.readlink(path)
            elif os.path.isfile(path):
                found[rel] = hashlib.sha1(open(path, "rb").read()).hexdigest()
            else:
                found[rel] = "dir"
    return found


def leftovers(folder):
    return [os.path.join(r, d) for r, ds, _ in os.walk(folder) for d in ds if d.startswith(TMP_PREFIX)]


def run_concurrently(jobs, timeout=300, at_once=2):
    """Run (args, cwd) console commands, ``at_once`` side by side (the suite shares 2 cores), each in a fork of the
    tests' command server (as run_cli runs them); return their CompletedProcess-like results in order."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    results = []
    for first in range(0, len(jobs), at_once):
        procs = [subprocess.Popen(served_command(args), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
                 for args, cwd in jobs[first:first + at_once]]
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def assert_one_line_error(result, expected):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, (result.args, result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("spanbert-prepare: error:"), result.stderr
    assert expected in lines[0], (expected, lines[0])


def write_wordpiece_corpus(folder, num_lines, seed=0):
    """A vocab.txt of 500 words plus BERT's special tokens, and text made of those words (10 lines a document)."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(500)])
    vocab, corpus = os.path.join(folder, "vocab.txt"), os.path.join(folder, "corpus.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.write("\n".join(SPECIALS + list(words)) + "\n")
    rows = words[rng.integers(0, len(words), size=(num_lines, 16))]
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("".join(" ".join(r) + ("\n\n" if i % 10 == 9 else "\n") for i, r in enumerate(rows)))
    return corpus, vocab


@pytest.fixture(scope="module")
def previous_output(tmp_path_factory):
    """A real spanbert-prepare output (WordPiece, small), to copy where a test needs one."""
    folder = tmp_path_factory.mktemp("previous")
    corpus, vocab = write_wordpiece_corpus(str(folder), 200)
    dest = str(folder / "out")
    result = run_concurrently([([PREPARE, "--train", corpus, "--wordpiece-vocab", vocab, "--destdir", dest], ROOT)])[0]
    assert result.returncode == 0, result.stderr
    return dest


def test_force_refusals_through_console(tmp_path, corpus_files, previous_output):
    """Every destination the issue reproduced as data loss is refused, one line, exit 1, nothing touched."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    corpus = str(work / "corpus.txt")
    shutil.copy(corpus_files[1], corpus)
    (work / "notes.txt").write_text("the user's own notes")
    (work / "data").mkdir()
    shutil.copy(corpus, work / "data" / "corpus.txt")
    (work / "mine").mkdir()
    (work / "mine" / "keep.txt").write_text("user file")
    shutil.copytree(previous_output, work / "extra")
    (work / "extra" / "results.txt").write_text("added by the user after the run")
    shutil.copytree(previous_output, work / "owned")
    run = [PREPARE, "--train", corpus, "--force", "--destdir"]
    cases = [
        (run + ["data", "--train", "data/corpus.txt"], work, "is or holds the input data/corpus.txt"),
        # a corpus folder is read whole: an output inside it would be read as text the next time
        ([PREPARE, "--train", "data", "--destdir", "data/out"], work, "lies inside the input folder data"),
        ([PREPARE, "--train", "data/**/*.txt", "--destdir", "data/out"], work, "lies inside the input folder data"),
        # a pattern that matches the output's own files reads them the next time too
        ([PREPARE, "--train", "*/*.txt", "--destdir", "prepared"], work, "the pattern */*.txt matches its output (dict.txt)"),
        (run + [corpus], work, "is or holds the input"),
        (run + ["."], work, "is the working directory or one of its parents"),
        (run + [".."], work / "sub", "is the working directory or one of its parents"),
        (run + ["mine"], work, f"was not written by a spanbert command (no {MANIFEST})"),
        (run + ["extra"], work, "holds files that spanbert-prepare did not write (results.txt)"),
        (run + ["notes.txt"], work, "exists and is not a folder"),
        (run + ["notes.txt/out"], work, "notes.txt is a file, not a folder"),
        ([PREPARE, "--train", corpus, "--destdir", "owned"], work, "exists (an output of spanbert-prepare); pass --force"),
    ]
    before = snapshot(tmp_path)
    results = run_concurrently([(args, str(cwd)) for args, cwd, _ in cases])
    for (args, cwd, expected), result in zip(cases, results):
        assert_one_line_error(result, expected)
    assert snapshot(tmp_path) == before
    assert not leftovers(tmp_path)


def test_force_replaces_previous_output(tmp_path, previous_output):
    """--force over an earlier output replaces it whole: files of the old output that the new one lacks go."""
    dest = tmp_path / "data"
    shutil.copytree(previous_output, dest)
    assert (dest / "vocab.txt").exists()
    corpus, _ = write_wordpiece_corpus(str(tmp_path), 200, seed=1)
    result = run_concurrently([([PREPARE, "--train", corpus, "--destdir", str(dest), "--vocab-size", "60", "--force"], ROOT)])[0]
    assert result.returncode == 0, result.stderr
    manifest = json.load(open(dest / MANIFEST))
    assert manifest["command"] == "spanbert-prepare"
    assert sorted(manifest["files"]) == sorted(p for p in os.listdir(dest) if p != MANIFEST)
    assert not (dest / "vocab.txt").exists() and (dest / "spm.model").exists()
    assert json.load(open(dest / "prepare_stats.json"))["tokenizer"] == "sentencepiece"
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("signum, tokenizer", [(signal.SIGTERM, "sentencepiece"), (signal.SIGINT, "wordpiece"),
                                               (signal.SIGHUP, "wordpiece")])
def test_signal_leaves_no_temporary_folder(tmp_path, previous_output, signum, tokenizer):
    """A run stopped while its temporary output folder exists removes it, and the old output is kept.

    The command pauses at that moment and says so (``PAUSE_ENV``), so the signal never races the run.
    """
    corpus, vocab = write_wordpiece_corpus(str(tmp_path), 2_000)
    dest = tmp_path / "out"
    shutil.copytree(previous_output, dest)
    before = snapshot(dest)
    marker = tmp_path / "paused"
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **{file_utils.PAUSE_ENV: str(marker)})
    options = ["--wordpiece-vocab", vocab] if tokenizer == "wordpiece" else ["--vocab-size", "300"]
    proc = subprocess.Popen([PREPARE, "--train", corpus, *options, "--destdir", str(dest), "--force"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():  # a marker the command writes, then it waits for the signal
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the command never reached its output phase"
            time.sleep(0.05)
        assert leftovers(tmp_path), "paused without a temporary folder"
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:  # a command that failed the test must not stay paused behind it
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, (proc.returncode, err[-2000:])
    assert "interrupted" in err.strip().splitlines()[-1]
    assert not leftovers(tmp_path)
    assert snapshot(dest) == before


@pytest.fixture
def shapes(tmp_path, monkeypatch):
    """Folders shaped like the export/import cases: checkpoints, a HuggingFace model, a previous output."""
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("checkpoint_last.pt", "checkpoint1.pt"):
        (ck / name).write_bytes(b"weights")
    bert = tmp_path / "bert_dir"
    bert.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        (bert / name).write_text(name)
    export = tmp_path / "hf"
    export.mkdir()
    (export / "config.json").write_text("{}")
    (export / MANIFEST).write_text(json.dumps({"command": "spanbert-export-hf", "files": ["config.json"]}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _refused(expected, *args, **kwargs):
    with pytest.raises(OutputError, match=expected):
        check_destination(*args, **kwargs)


def test_check_destination_export_import_shapes(shapes):
    before = snapshot(shapes)
    export = dict(command="spanbert-export-hf", force=True, flag="--out")
    # spanbert-export-hf --checkpoint ck/checkpoint_last.pt --out ck --force
    _refused("is or holds the input ck/checkpoint_last.pt", "ck", inputs=["ck/checkpoint_last.pt"], **export)
    # the checkpoint folder, exporting a checkpoint kept elsewhere: still foreign files
    _refused("not written by a spanbert command", "ck", inputs=["other.pt"], **export)
    # spanbert-import-hf --hf bert_dir --out bert_dir --force (and --out bert_dir/. spelled differently)
    for out in ("bert_dir", "./bert_dir/", str(shapes / "bert_dir")):
        _refused("is or holds the input", out, "spanbert-import-hf", ["bert_dir"], True, "--out")
    # --out . and parents of the working directory
    _refused("working directory", ".", inputs=["ck/checkpoint_last.pt"], **export)
    os.chdir(shapes / "ck")
    _refused("working directory", "..", inputs=[], **export)
    _refused("working directory", "/", inputs=[], **export)
    os.chdir(shapes)
    _refused("working directory", str(shapes), inputs=[], **export)
    # links: to an output, dangling, and an input reached through a link inside the destination
    os.symlink(shapes / "hf", shapes / "hf_link")
    _refused("symbolic link", "hf_link", inputs=[], **export)
    os.symlink(shapes / "missing", shapes / "dangling")
    _refused("symbolic link", "dangling", inputs=[], **export)
    os.symlink(shapes / "ck" / "checkpoint_last.pt", shapes / "hf" / "model.pt")
    _refused("is or holds the input hf/model.pt", "hf", inputs=["hf/model.pt"], **export)
    os.remove(shapes / "hf" / "model.pt")
    # a folder made by hand inside an earlier export counts as foreign, even empty
    (shapes / "hf" / "logs").mkdir()
    _refused(r"did not write \(logs/\)", "hf", inputs=[], **export)
    (shapes / "hf" / "logs").rmdir()
    # an earlier export: replaced only with --force
    _refused("pass --force", "hf", "spanbert-export-hf", [], False, "--out")
    check_destination("hf", inputs=["ck/checkpoint_last.pt"], **export)
    # new and empty folders are fine
    check_destination("new/deeper", inputs=[], **export)
    (shapes / "empty").mkdir()
    check_destination("empty", "spanbert-export-hf", [], False, "--out")
    for link in ("hf_link", "dangling"):
        os.remove(shapes / link)
    assert snapshot(shapes) == dict(before, empty="dir")


def test_atomic_directory_failure_keeps_previous_output(shapes):
    before = snapshot(shapes)
    with pytest.raises(RuntimeError):
        with atomic_directory("hf", "spanbert-export-hf", [], True, "--out") as work:
            open(os.path.join(work, "config.json"), "w").write("new")
            raise RuntimeError("the export's self-check failed")
    assert snapshot(shapes) == before and not leftovers(shapes)
    with pytest.raises(KeyboardInterrupt):  # parent folders made for a new destination go too
        with atomic_directory("new/deeper/hf", "spanbert-export-hf", [], False, "--out"):
            raise KeyboardInterrupt
    assert snapshot(shapes) == before


def test_atomic_directory_restores_previous_when_swap_fails(shapes, monkeypatch):
    real_replace, calls = os.replace, []

    def failing_replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:  # moving the new output in
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    before = snapshot(shapes)
    monkeypatch.setattr(file_utils.os, "replace", failing_replace)
    with pytest.raises(OutputError, match="cannot move the output into place"):
        with atomic_directory("hf", "spanbert-export-hf", [], True, "--out") as work:
            open(os.path.join(work, "config.json"), "w").write("new")
    assert snapshot(shapes) == before and not leftovers(shapes)


def test_destinations_spelled_with_a_trailing_separator_or_dot(shapes):
    """'link/' is the link (refused before any work, not followed to the folder it names); 'folder/.' cannot be moved
    aside by that name (it failed only after the work, leaving a temporary folder)."""
    before = snapshot(shapes)
    os.symlink(shapes / "hf", shapes / "hf_link")
    export = dict(command="spanbert-export-hf", inputs=[], force=True, flag="--out")
    _refused("symbolic link", "hf_link/", **export)
    _refused("symbolic link", "hf_link//", **export)
    _refused("ends in '.'; name the folder itself", "hf/.", **export)
    with pytest.raises(OutputError, match="symbolic link"):
        with atomic_directory("hf_link/", "spanbert-export-hf", [], True, "--out"):
            pass
    os.remove(shapes / "hf_link")
    with atomic_directory("hf/", "spanbert-export-hf", [], True, "--out") as work:  # 'hf/' is 'hf'
        open(os.path.join(work, "config.json"), "w").write("new")
    assert (shapes / "hf" / "config.json").read_text() == "new" and not leftovers(shapes)
    assert set(snapshot(shapes)) == set(before)


def test_an_empty_destination_keeps_its_permissions_and_new_ones_follow_the_umask(shapes):
    (shapes / "private").mkdir(mode=0o700)
    os.chmod(shapes / "private", 0o700)
    with atomic_directory("private", "spanbert-export-hf", [], False, "--out") as work:
        open(os.path.join(work, "config.json"), "w").write("new")
    assert os.stat(shapes / "private").st_mode & 0o777 == 0o700 and (shapes / "private" / "config.json").exists()
    umask = os.umask(0o077)
    try:
        with atomic_directory("fresh", "spanbert-export-hf", [], False, "--out") as work:
            open(os.path.join(work, "config.json"), "w").write("new")
    finally:
        os.umask(umask)
    assert os.stat(shapes / "fresh").st_mode & 0o777 == 0o700  # was 0o755 whatever the umask


def test_a_parent_that_cannot_be_made_is_one_line_and_leaves_nothing(shapes):
    before = snapshot(shapes)
    with pytest.raises(OutputError, match=r"--out newparent/a+/out: cannot create .*File name too long"):
        with atomic_directory("newparent/" + "a" * 300 + "/out", "spanbert-export-hf", [], False, "--out"):
            pass
    assert snapshot(shapes) == before and not leftovers(shapes)


def test_a_signal_another_thread_receives_during_the_swap_waits_for_it(shapes, monkeypatch):
    """Blocking signals covers the main thread only: the kernel gave a SIGINT to another thread (a progress bar's,
    a data loader's) and Python raised KeyboardInterrupt between the swap's two renames, with the earlier output
    moved aside and the new one not in place. Now it is raised after the swap, and says the output was written."""
    import threading

    real_replace = os.replace

    def interrupt_this_thread():
        # a thread started inside the held block inherits the block: unblock, then signal this thread alone, so the
        # kernel gives the signal to it and not (later) to the main thread
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    def replace_with_a_signal_in_between(src, dst):
        real_replace(src, dst)
        if dst.endswith("previous"):  # the earlier output moved aside; the new one next
            sender = threading.Thread(target=interrupt_this_thread)
            sender.start()
            sender.join()
            for _ in range(1000):  # bytecodes, at which Python runs a pending signal's handler
                pass

    monkeypatch.setattr(file_utils.os, "replace", replace_with_a_signal_in_between)
    with pytest.raises(KeyboardInterrupt) as raised:
        with atomic_directory("hf", "spanbert-export-hf", [], True, "--out") as work:
            open(os.path.join(work, "config.json"), "w").write("new")
    assert raised.value.output_written == "hf"
    assert (shapes / "hf" / "config.json").read_text() == "new" and not leftovers(shapes)


@pytest.mark.parametrize("split", ["../evil/valid", "/abs/valid", "sub/valid", "..", ".", ""])
def test_predict_splits_are_names_not_paths(split):
    """The split names the files written into --out (coreference's S.conll): '../evil/valid' wrote outside it,
    over a user's file of that name."""
    import argparse

    from spanbert_plugin.cli import check_predict_arguments
    from spanbert_plugin.core.errors import UsageError

    args = argparse.Namespace(split=split, bf16=False, batch_size=None, max_tokens=None, checkpoint="ck.pt")
    with pytest.raises(UsageError, match="must be a split's name"):
        check_predict_arguments(args)
    check_predict_arguments(argparse.Namespace(**{**vars(args), "split": "valid"}))


def test_atomic_directory_replaces_and_records_manifest(shapes):
    with atomic_directory("hf", "spanbert-export-hf", [], True, "--out") as work:
        os.makedirs(os.path.join(work, "sub"))
        open(os.path.join(work, "sub", "weights.bin"), "w").write("new")
    manifest = json.load(open(shapes / "hf" / MANIFEST))
    info = os.stat(shapes / "hf" / "sub" / "weights.bin")
    assert manifest == {"command": "spanbert-export-hf", "files": ["sub/weights.bin"],
                        "stamps": {"sub/weights.bin": [info.st_size, info.st_mtime_ns]}}
    assert not (shapes / "hf" / "config.json").exists() and not leftovers(shapes)
    check_destination("hf", "spanbert-export-hf", [], True, "--out")  # unchanged: --force replaces it
    (shapes / "hf" / "sub" / "weights.bin").write_text("the user's own analysis")  # edited after the run
    _refused(r"sub/weights.bin changed since spanbert-export-hf wrote it; it is never replaced", "hf",
             "spanbert-export-hf", [], True, "--out")


# Install noise (issue 8): pip's torchaudio report is filtered by the Makefile without hiding
# failures, and fairseq finds tensorboardX instead of asking for it at every start.
TORCHAUDIO_REPORT = (
    "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed. "
    "This behaviour is the source of the following dependency conflicts.\n"
    "fairseq-fixed 0.12.3.1 requires torchaudio>=0.8.0, which is not installed.\n"
)
OTHER_CONFLICT = "other-pkg 0.1 requires fake-dep>=5, but you have fake-dep 0.1 which is incompatible.\n"


def _make_filter(tmp_path, text, status):
    """Run ``printf TEXT; exit STATUS`` through the Makefile's PIP_FILTER, as its recipes do."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    (tmp_path / "text").write_text(text)
    (tmp_path / "check.mk").write_text(
        f"include {ROOT}/Makefile\ncheck:\n\t@(cat {tmp_path}/text; exit {status}) $(PIP_FILTER)\n")
    return subprocess.run(["make", "-s", "-f", str(tmp_path / "check.mk"), "check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_makefile_drops_only_the_torchaudio_report(tmp_path):
    quiet = _make_filter(tmp_path, "Successfully installed x\n" + TORCHAUDIO_REPORT, 0)
    assert quiet.returncode == 0 and quiet.stdout == "Successfully installed x\n", quiet
    other = _make_filter(tmp_path, TORCHAUDIO_REPORT + OTHER_CONFLICT, 0)
    assert other.returncode == 0
    assert other.stdout == TORCHAUDIO_REPORT.splitlines(True)[0] + OTHER_CONFLICT
    failed = _make_filter(tmp_path, "ERROR: No matching distribution found for x\n", 1)
    assert failed.returncode != 0 and "No matching distribution" in failed.stdout


def test_fairseq_import_does_not_ask_for_tensorboardx():
    """fairseq logs "Please install tensorboardX" at import exactly when this import failed."""
    from fairseq.tasks import text_to_speech

    assert text_to_speech.SummaryWriter is not None


def test_a_sibling_whose_name_extends_the_destinations_is_not_inside_it(tmp_path, monkeypatch):
    """'out2/...' and 'outside.txt' are beside 'out', not inside it; a working directory 'out_run' is no part of
    'out': none of them is a reason to refuse --out out."""
    (tmp_path / "out_run").mkdir()
    (tmp_path / "out2").mkdir()
    (tmp_path / "out2" / "model.pt").write_bytes(b"weights")
    (tmp_path / "outside.txt").write_text("x")
    monkeypatch.chdir(tmp_path / "out_run")
    out = str(tmp_path / "out")
    check_destination(out, "spanbert-export-hf", [str(tmp_path / "out2" / "model.pt"), str(tmp_path / "outside.txt")],
                      False, "--out")
    check_destination(out, "spanbert-prepare", [file_utils.FolderReadWhole(str(tmp_path / "out2"))], False)
    with pytest.raises(OutputError, match="is or holds the input"):
        check_destination(out, "spanbert-export-hf", [os.path.join(out, "model.pt")], False, "--out")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match="working directory"):
        check_destination(str(tmp_path), "spanbert-export-hf", [], False, "--out")


def test_a_destination_inside_a_corpus_folder_as_written_is_refused(tmp_path, monkeypatch):
    """A destination reached through a link inside a folder read whole lies inside it as written (the next run reads
    the folder through the link): refused like one inside it after resolving links."""
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("text\n")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "corpus" / "linked")
    monkeypatch.chdir(tmp_path)
    corpus = file_utils.FolderReadWhole("corpus")
    with pytest.raises(OutputError, match="lies inside the input folder corpus"):
        check_destination("corpus/linked/out", "spanbert-prepare", [corpus], False)
    with pytest.raises(OutputError, match="lies inside the input folder corpus"):
        check_destination("corpus/new", "spanbert-prepare", [corpus], False)
    check_destination("elsewhere/out", "spanbert-prepare", [corpus], False)


def test_files_a_user_puts_in_the_destination_during_the_run_are_never_lost(shapes):
    """The destination is checked again just before the swap: a file written into it while the command ran (or a
    folder of files made where there was none) stops the swap, and stays."""
    with pytest.raises(OutputError, match=r"did not write \(notes.txt\)"):
        with atomic_directory("hf", "spanbert-export-hf", [], True, "--out") as work:
            open(os.path.join(work, "config.json"), "w").write("new")
            (shapes / "hf" / "notes.txt").write_text("mine")
    assert (shapes / "hf" / "notes.txt").read_text() == "mine" and (shapes / "hf" / "config.json").read_text() == "{}"
    with pytest.raises(OutputError, match="not written by a spanbert command"):
        with atomic_directory("fresh", "spanbert-export-hf", [], False, "--out") as work:
            open(os.path.join(work, "config.json"), "w").write("new")
            (shapes / "fresh").mkdir()
            (shapes / "fresh" / "results.txt").write_text("mine")
    assert os.listdir(shapes / "fresh") == ["results.txt"] and not leftovers(shapes)


def test_links_and_a_linked_manifest_in_a_destination_are_never_replaced(shapes):
    """A link to a folder that a user put in an earlier output is a file of theirs (the listing names it); a
    manifest that is a link (to another output's) does not make a folder a spanbert output."""
    (shapes / "elsewhere").mkdir()
    os.symlink(shapes / "elsewhere", shapes / "hf" / "data")
    _refused(r"did not write \(data\)", "hf", "spanbert-export-hf", [], True, "--out")
    os.remove(shapes / "hf" / "data")
    (shapes / "mine").mkdir()
    (shapes / "mine" / "config.json").write_text("mine")
    os.symlink(shapes / "hf" / MANIFEST, shapes / "mine" / MANIFEST)
    _refused("not written by a spanbert command", "mine", "spanbert-export-hf", [], True, "--out")
    (shapes / "only_a_link").mkdir()
    os.symlink(shapes / "elsewhere", shapes / "only_a_link" / "data")
    _refused("not written by a spanbert command", "only_a_link", "spanbert-export-hf", [], True, "--out")


@pytest.mark.parametrize("manifest", ["{not json", "[]", '{"command": "spanbert-export-hf"}'],
                         ids=["not JSON", "not an object", "no file list"])
def test_a_damaged_manifest_makes_the_folder_a_users_own(shapes, manifest):
    """Without a readable list of the files a command wrote, nothing in the folder is known to be replaceable."""
    before = snapshot(shapes)
    (shapes / "hf" / MANIFEST).write_text(manifest)
    _refused(f"--out hf: exists and was not written by a spanbert command \\(no {MANIFEST}\\); it is never replaced",
             "hf", "spanbert-export-hf", [], True, "--out")
    (shapes / "hf" / MANIFEST).write_text(json.dumps({"command": "spanbert-export-hf", "files": ["config.json"]}))
    assert snapshot(shapes) == before


def test_an_empty_destination_path_is_refused(shapes):
    _refused("^--out: empty path$", "", "spanbert-export-hf", [], False, "--out")


def test_a_destination_under_a_folder_that_is_not_writable_is_refused(shapes, monkeypatch):
    """(The tests may run as root, whom permissions do not stop: the answer of os.access is simulated.)"""
    real_access = os.access
    monkeypatch.setattr(file_utils.os, "access", lambda path, mode, **kw: False if mode == os.W_OK else real_access(path, mode))
    _refused(f"^--out new/hf: {shapes} is not writable$", "new/hf", "spanbert-export-hf", [], False, "--out")
    assert not (shapes / "new").exists()


def test_an_output_is_written_from_a_thread_other_than_the_main_one(shapes):
    """Only the main thread can set signal handlers: a command's library code run from another thread (a caller's
    worker) writes its output without them, and leaves the main thread's handlers as they were."""
    import threading

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    errors = []

    def export():
        try:
            with atomic_directory("hf", "spanbert-export-hf", [], True, "--out") as work:
                with open(os.path.join(work, "config.json"), "w") as f:
                    f.write("new")
        except BaseException as err:  # noqa: BLE001 - reported by the test below
            errors.append(err)

    worker = threading.Thread(target=export)
    worker.start()
    worker.join()
    assert errors == []
    assert (shapes / "hf" / "config.json").read_text() == "new" and not leftovers(shapes)
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_a_parent_folder_someone_else_uses_meanwhile_is_kept_when_the_run_fails(shapes):
    """The parents a failed run made are removed, deepest first, up to one that is no longer empty."""
    with pytest.raises(RuntimeError, match="the run failed"):
        with atomic_directory("new/deeper/hf", "spanbert-export-hf", [], False, "--out"):
            (shapes / "new" / "theirs.txt").write_text("another process's file")
            raise RuntimeError("the run failed")
    assert sorted(os.listdir(shapes / "new")) == ["theirs.txt"] and not leftovers(shapes)
