"""spanbert-prepare on generated corpora, both tokenizers, and every bad input."""
import json
import os

import numpy as np
import pytest

from conftest import bin_path, run_cli
from spanbert_plugin.data.dictionary import SpanBertDictionary
from spanbert_plugin.prepare import cli_main
from spanbert_plugin.tokenization import load_tokenizer


def _load_docs(dest, split):
    from fairseq.data import data_utils

    d = SpanBertDictionary.load(os.path.join(dest, "dict.txt"))
    return d, data_utils.load_indexed_dataset(os.path.join(dest, split), d, "mmap")


def _count_docs(path):
    text = open(path, encoding="utf-8").read()
    return len([b for b in text.split("\n\n") if b.strip()])


@pytest.mark.parametrize("which", ["spm_data", "wordpiece_data"])
def test_prepared_directory(which, request, corpus_files):
    dest = request.getfixturevalue(which)
    for name in ("dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx", "spanbert_tokenizer.json"):
        assert os.path.isfile(os.path.join(dest, name)), name
    stats = json.load(open(os.path.join(dest, "prepare_stats.json")))
    d, docs = _load_docs(dest, "train")
    assert d.mask_index is not None and d.bos_word in ("<s>", "[CLS]")
    # one item per document: boundaries are kept, nothing dropped
    assert len(docs) == stats["train"]["documents"] == _count_docs(corpus_files[0])
    assert int(docs.sizes.sum()) == stats["train"]["tokens"]
    # ids are the tokenizer's own and decode back to the text
    tok = load_tokenizer(dest)
    first_line = open(corpus_files[0], encoding="utf-8").readline().strip()
    ids = tok.encode(first_line).ids
    assert np.array_equal(docs[0].numpy()[: len(ids)], ids)
    assert [d[i] for i in ids] == tok.encode(first_line).tokens


def test_wordpiece_ids_are_vocab_lines(wordpiece_data, wordpiece_vocab):
    d = SpanBertDictionary.load(os.path.join(wordpiece_data, "dict.txt"))
    vocab = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    assert d.symbols == vocab
    assert d.pad() == vocab.index("[PAD]") and d.mask_index == vocab.index("[MASK]")


@pytest.mark.parametrize("which", ["spm_data", "wordpiece_data"])
def test_offsets_and_word_starts(which, request):
    tok = load_tokenizer(request.getfixturevalue(which))
    text = "Return the  value of an  attribute, if present."
    enc = tok.encode(text)
    assert len(enc.ids) == len(enc.offsets) == len(enc.word_starts)
    words = text.split()
    starts = [text[s:e] for (s, e), w in zip(enc.offsets, enc.word_starts) if w]
    # every word-initial token's text starts one of the whitespace-separated words
    assert len(starts) >= len(words)
    for s, e in enc.offsets:
        assert 0 <= s <= e <= len(text) and not text[s:e].startswith(" ")


def test_console_command_and_empty_documents(tmp_path):
    text = "First document line one.\nLine two of it.\n\n\n\nSecond document here.\n\nThird one, short.\n\n"
    src = tmp_path / "c.txt"
    src.write_text(text * 30)
    proc = run_cli([bin_path("spanbert-prepare"), "--train", str(src), "--destdir", str(tmp_path / "out"),
                    "--vocab-size", "30", "--valid-fraction", "0.1"])
    stats = json.load(open(tmp_path / "out" / "prepare_stats.json"))
    assert stats["train"]["documents"] + stats["valid"]["documents"] == 90
    assert stats["train"]["empty_documents_skipped"] == 60  # two extra blank lines per repeat
    assert "wrote" in proc.stdout


def _bad(args, tmp_path, expect):
    dest = tmp_path / "dest"
    proc = run_cli([bin_path("spanbert-prepare"), *args, "--destdir", str(dest)], check=False)
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spanbert-prepare: error:") and expect in err[0], proc.stderr
    assert not dest.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".spanbert-")]
    return err[0]


def test_bad_inputs(tmp_path, corpus_files):
    _bad(["--train", str(tmp_path / "missing.txt")], tmp_path, "missing.txt: no such file")
    (tmp_path / "empty.txt").write_text("")
    _bad(["--train", str(tmp_path / "empty.txt")], tmp_path, "empty.txt: file is empty")
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    _bad(["--train", str(tmp_path / "blank.txt")], tmp_path, "no non-blank line")
    (tmp_path / "latin1.txt").write_bytes("good line\nsecond\ncaf\xe9 au lait\n".encode("latin-1"))
    _bad(["--train", str(tmp_path / "latin1.txt")], tmp_path, "latin1.txt:3: not valid UTF-8")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\nhello\n")
    _bad(["--train", corpus_files[0], "--tokenizer", "wordpiece", "--wordpiece-vocab", str(vocab)],
         tmp_path, "missing required special tokens [SEP] [MASK]")
    (tmp_path / "tiny.txt").write_text("a small text\nwith few pieces\n\nanother doc\n")
    msg = _bad(["--train", str(tmp_path / "tiny.txt"), "--vocab-size", "5000"], tmp_path, "largest that fits is")
    assert int(msg.rsplit(" ", 1)[1]) < 5000


def test_existing_destdir_needs_force(tmp_path, corpus_files):
    dest = tmp_path / "exists"
    dest.mkdir()
    (dest / "keep.txt").write_text("user file")
    proc = run_cli([bin_path("spanbert-prepare"), "--train", corpus_files[1], "--destdir", str(dest)], check=False)
    assert proc.returncode == 1 and "pass --force" in proc.stderr
    assert (dest / "keep.txt").exists()
    assert cli_main(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", str(dest),
                     "--vocab-size", "500", "--force"]) == 0
    assert not (dest / "keep.txt").exists() and (dest / "dict.txt").exists()


def test_script_entry_point(tmp_path, corpus_files):
    import sys

    proc = run_cli([sys.executable, "scripts/spanbert_prepare.py", "--help"])
    assert "--destdir" in proc.stdout
