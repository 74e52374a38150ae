"""Shared fixtures: a small real-text corpus and prepared data directories."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def run_cli(args, timeout=600, check=True, env=None):
    """Run a console command of the venv; return the CompletedProcess."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def free_port():
    """A TCP port free on localhost right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_gloo_ranks(command, world_size=2, timeout=600):
    """Run ``command(rank)`` once per rank as CPU gloo workers (one process each); return their outputs."""
    port, procs = free_port(), []
    for rank in range(world_size):
        args = [*command(rank), "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
                "--distributed-world-size", str(world_size), "--distributed-rank", str(rank),
                "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn"]
        procs.append(subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=dict(os.environ, OMP_NUM_THREADS="1")))
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-4000:]
    return outputs


def bin_path(name):
    return os.path.join(BIN, name)


@pytest.fixture(scope="session")
def corpus_files(tmp_path_factory):
    """Train/valid text from the embedded default corpus (about 60 modules)."""
    from spanbert_plugin.data.default_corpus import write_default_corpus

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
    return str(d / "vocab.txt")


@pytest.fixture(scope="session")
def spm_data(corpus_files, tmp_path_factory):
    """A spanbert-prepare directory with a 1,000-piece sentencepiece model."""
    from spanbert_plugin.prepare import cli_main

    dest = str(tmp_path_factory.mktemp("data") / "spm")
    assert cli_main(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", dest, "--vocab-size", "1000"]) == 0
    return dest


@pytest.fixture(scope="session")
def wordpiece_data(corpus_files, wordpiece_vocab, tmp_path_factory):
    from spanbert_plugin.prepare import cli_main

    dest = str(tmp_path_factory.mktemp("data") / "wp")
    assert cli_main(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", dest,
                     "--tokenizer", "wordpiece", "--wordpiece-vocab", wordpiece_vocab]) == 0
    return dest
