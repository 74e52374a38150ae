"""spanbert-prepare on generated corpora, both tokenizers, and every bad input."""
import codecs
import json
import os
import re

import numpy as np
import pytest

from conftest import bin_path, run_cli
from spanbert_plugin.core.dictionary import SpanBertDictionary
from spanbert_plugin.cli.prepare import main as cli_main
from spanbert_plugin.pretraining.prepare import PrepareError, held_out_count, read_documents
from spanbert_plugin.core.tokenization import SPM_WORD_PREFIX, WordPieceTokenizer, load_tokenizer, read_wordpiece_vocab
from test_file_safety import leftovers, write_wordpiece_corpus


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


def test_bad_inputs(tmp_path, corpus_files, capsys):
    """Each bad input: one line naming the file (and line), exit 1, nothing written.

    In-process through the command's main(); the console wrapper itself is
    exercised by test_file_safety (each start of it costs seconds of imports).
    """
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    (tmp_path / "latin1.txt").write_bytes("good line\nsecond\ncaf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\nhello\n")
    (tmp_path / "tiny.txt").write_text("a small text\nwith few pieces\n\nanother doc\n")
    (tmp_path / "control.txt").write_text("\x07\n")  # a document the tokenizer keeps nothing of
    # one paragraph of 5,000 bytes (a corpus of a document per line): longer than any line sentencepiece trains on
    (tmp_path / "one_line.txt").write_text(" ".join(f"word{i % 97}" for i in range(800)) + "\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "no_files").mkdir()
    cases = [
        (["--train", str(tmp_path / "missing.txt")], "missing.txt: no such file"),
        (["--train", str(tmp_path / "empty.txt")], "empty.txt: file is empty"),
        (["--train", str(tmp_path / "blank.txt")], "no non-blank line"),
        (["--train", str(tmp_path / "latin1.txt")], "latin1.txt:3: not valid UTF-8 (byte 0xe9 at byte column 4)"),
        (["--train", str(tmp_path / "fifo")], "fifo: not a regular file"),
        (["--train", str(tmp_path / "no_files")], "--train " + str(tmp_path / "no_files") + ": folder holds no files"),
        (["--train", str(tmp_path / "*.none")], "no file matches this pattern"),
        (["--train", corpus_files[0], "--wordpiece-vocab", str(tmp_path / "vocab.txt")],
         "vocab.txt: missing required special tokens [SEP] [MASK]"),
        (["--train", str(tmp_path / "tiny.txt"), "--vocab-size", "5000"], "largest that fits is"),
        (["--train", corpus_files[1], "--vocab-size", "20"], "--vocab-size 20 is too small: this text needs at least"),
        (["--train", corpus_files[1], "--valid", str(tmp_path / "control.txt"), "--vocab-size", "300"],
         "control.txt: the valid split's 1 documents hold no token the tokenizer keeps"),
        (["--train", str(tmp_path / "one_line.txt")],
         "one_line.txt: no line of at most 4192 bytes for sentencepiece to train on (it skips longer ones): put each "
         "sentence or paragraph on a line of its own"),
    ]
    if os.geteuid() != 0:  # root reads a mode-000 file anyway; test_unreadable_corpus_in_process simulates it
        (tmp_path / "locked.txt").write_text("text\n")
        os.chmod(tmp_path / "locked.txt", 0)
        cases.append((["--train", str(tmp_path / "locked.txt")], "locked.txt: cannot read (Permission denied)"))
    dest = str(tmp_path / "dest")
    for args, expected in cases:
        assert cli_main([*args, "--destdir", dest]) == 1, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("spanbert-prepare: error:") and expected in err[0], (expected, err)
        assert not os.path.exists(dest) and not leftovers(tmp_path)
        if "largest" in expected:
            assert int(err[0].rsplit(" ", 1)[1]) < 5000
        if "too small" in expected:
            assert int(re.search(r"at least (\d+) pieces", err[0]).group(1)) > 20


def test_unreadable_corpus_in_process(tmp_path, monkeypatch, capsys):
    """A PermissionError (simulated: the tests may run as root) is a one-line error naming the file."""
    import builtins

    locked = tmp_path / "locked.txt"
    locked.write_text("some text\n\nmore text\n")
    real_open = builtins.open

    def guarded_open(path, *args, **kwargs):
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    assert cli_main(["--train", str(locked), "--destdir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"spanbert-prepare: error: {locked}: cannot read (Permission denied)"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["1", "2", "0", "-0.5", "nan", "inf"])
def test_valid_fraction_must_be_inside_zero_one(value, tmp_path, corpus_files, capsys):
    assert cli_main(["--train", corpus_files[1], "--destdir", str(tmp_path / "out"), "--valid-fraction", value]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--valid-fraction must be in (0, 1)" in err[0] and "pass --valid FILE" in err[0]
    assert not (tmp_path / "out").exists()


def test_held_out_documents_leave_train_and_valid_non_empty():
    for fraction, expected_valid in ((0.99, 2), (0.5, 2), (0.01, 1), (0.34, 1)):
        assert held_out_count(3, "c.txt", fraction) == expected_valid
    with pytest.raises(PrepareError, match="single document"):
        held_out_count(1, "c.txt", 0.5)


def test_the_last_documents_are_held_out_in_order_and_blank_lines_count_as_said(tmp_path):
    """Ten documents, the i-th of word w{i}: --valid-fraction 0.2 holds out documents 8 and 9, in order, and trains on
    0-7. A blank first line is no empty document; a second blank line in a row is one."""
    _, vocab = write_wordpiece_corpus(str(tmp_path), 10)
    corpus = tmp_path / "ten.txt"
    documents = [f"w{i} w{i} w{i}" for i in range(10)]
    corpus.write_text("\n" + "\n\n".join(documents[:5]) + "\n\n\n" + "\n\n".join(documents[5:]) + "\n", encoding="utf-8")
    dest = str(tmp_path / "out")
    assert cli_main(["--train", str(corpus), "--wordpiece-vocab", vocab, "--valid-fraction", "0.2", "--destdir", dest]) == 0
    for split, expected in (("train", range(8)), ("valid", (8, 9))):
        dictionary, docs = _load_docs(dest, split)
        assert [docs[i].tolist() for i in range(len(docs))] == [[dictionary.index(f"w{i}")] * 3 for i in expected]
    assert json.load(open(os.path.join(dest, "prepare_stats.json")))["train"]["empty_documents_skipped"] == 1


@pytest.mark.parametrize("args, expected", [
    (["--tokenizer", "sentencepiece", "--wordpiece-vocab", "V"], "--wordpiece-vocab needs --tokenizer wordpiece"),
    (["--tokenizer", "wordpiece"], "--tokenizer wordpiece needs --wordpiece-vocab"),
    (["--wordpiece-vocab", "V", "--vocab-size", "500"], "--vocab-size applies to sentencepiece only"),
    (["--valid", "V", "--valid-fraction", "0.1"], "--valid-fraction and --valid exclude each other"),
    (["--vocab-size", "5"], "--vocab-size must be at least 8"),
    (["--character-coverage", "0"], "--character-coverage must be in (0, 1], got 0.0"),
    (["--character-coverage", "1.5"], "--character-coverage must be in (0, 1], got 1.5"),
])
def test_conflicting_options(args, expected, tmp_path, corpus_files, capsys):
    assert cli_main(["--train", corpus_files[1], "--destdir", str(tmp_path / "out"), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def test_wordpiece_vocab_implies_wordpiece_and_bom_is_accepted(tmp_path, capsys):
    """--wordpiece-vocab alone selects WordPiece; a vocab.txt starting with a byte-order mark reads as without."""
    corpus, vocab = write_wordpiece_corpus(str(tmp_path), 300)
    with open(vocab, encoding="utf-8") as f:
        lines = f.read().splitlines()
    bom_vocab = tmp_path / "bom_vocab.txt"
    bom_vocab.write_bytes(codecs.BOM_UTF8 + "\n".join(lines).encode("utf-8") + b"\n")
    assert read_wordpiece_vocab(str(bom_vocab)) == lines
    tok = WordPieceTokenizer(str(bom_vocab))
    assert tok.encode("[PAD] w1 w2").tokens == ["[PAD]", "w1", "w2"] and list(tok.encode("[PAD]").ids) == [0]
    dest = tmp_path / "out"
    assert cli_main(["--train", corpus, "--wordpiece-vocab", str(bom_vocab), "--destdir", str(dest)]) == 0
    stats = json.load(open(dest / "prepare_stats.json"))
    assert stats["tokenizer"] == "wordpiece" and stats["train"]["unk_tokens"] == 0
    assert SpanBertDictionary.load(str(dest / "dict.txt")).symbols == lines
    assert load_tokenizer(str(dest)).vocab == lines


def test_sentencepiece_lowercase(tmp_path, corpus_files):
    """--lowercase trains a case-folding model: encoding folds case, offsets index the original text."""
    dest = tmp_path / "out"
    assert cli_main(["--train", corpus_files[1], "--destdir", str(dest), "--vocab-size", "300", "--lowercase"]) == 0
    assert json.load(open(dest / "spanbert_tokenizer.json")) == {"type": "sentencepiece", "lowercase": True}
    assert json.load(open(dest / "prepare_stats.json"))["lowercase"] is True
    tok = load_tokenizer(str(dest))
    assert tok.lowercase and not any(p != p.lower() for p in tok.vocab if not p.startswith("<"))
    text = "Return THE Value of the Named ATTRIBUTE, if Present."
    upper, lower = tok.encode(text), tok.encode(text.lower())
    assert list(upper.ids) == list(lower.ids) and upper.offsets == lower.offsets
    unk = tok.vocab.index("<unk>")
    for i, piece, (start, end) in zip(upper.ids, upper.tokens, upper.offsets):
        if i != unk:
            assert text[start:end].lower() == piece.lstrip(SPM_WORD_PREFIX), (piece, text[start:end])


def test_default_vocab_size_fits_small_corpus(tmp_path, capsys):
    """Without --vocab-size a small text gets the largest vocabulary it supports, with a warning."""
    small = tmp_path / "small.txt"
    small.write_text("".join(f"Line {i} of a small text about span masking.\n" + ("\n" if i % 5 == 4 else "")
                             for i in range(40)))
    dest = tmp_path / "out"
    assert cli_main(["--train", str(small), "--destdir", str(dest)]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(warning) == 1 and "too small for the default vocabulary of 8000" in warning[0]
    fitted = int(re.search(r"using (\d+)", warning[0]).group(1))
    stats = json.load(open(dest / "prepare_stats.json"))
    assert stats["vocab_size"] == fitted + 1 < 8000  # + the mask symbol sentencepiece lacks


def test_corpus_byte_order_mark_is_not_text(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(codecs.BOM_UTF8 + b"First line.\nSecond.\n\nOther document.\n")
    documents, _ = read_documents(str(path))
    assert documents == [["First line.", "Second."], ["Other document."]]


def test_script_entry_point(tmp_path, corpus_files):
    import sys

    proc = run_cli([sys.executable, "scripts/spanbert_prepare.py", "--help"])
    assert "--destdir" in proc.stdout


@pytest.mark.parametrize("change", ["emptied", "shortened"])
def test_an_input_that_changes_while_it_is_read_is_one_line_and_nothing_written(change, tmp_path, monkeypatch,
                                                                              wordpiece_vocab, capsys):
    """The corpus is read twice (counted, then encoded): emptied or cut between the two, the folder would hold an
    empty valid split that training cannot open, or another split than counted. The file changes right after the
    counting pass (simulated there: ``held_out_count`` runs between the passes)."""
    from spanbert_plugin.pretraining import prepare

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"document {i} has some words.\n\n" for i in range(6)))
    counted = prepare.held_out_count

    def changes_after_counting(*args, **kwargs):
        corpus.write_text("" if change == "emptied" else "document 0 has some words.\n\ndocument 1 too.\n")
        return counted(*args, **kwargs)

    monkeypatch.setattr(prepare, "held_out_count", changes_after_counting)
    assert cli_main(["--train", str(corpus), "--wordpiece-vocab", wordpiece_vocab, "--destdir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    expected = (f"{corpus}: no non-blank line" if change == "emptied" else
                f"--train {corpus}: changed while it was read (6 documents counted, 2 encoded); prepare again once it "
                "is complete")
    assert err == [f"spanbert-prepare: error: {expected}"]
    assert not (tmp_path / "out").exists()


def test_an_unknown_character_does_not_start_a_word(spm_data):
    """sentencepiece's <unk> stands for one character the model does not know, inside a word (or after the lone '▁'
    that starts it): words with such characters stay whole words for whole-word masking and SpanDrop's units."""
    from spanbert_plugin.core.tokenization import SentencePieceTokenizer

    tok = load_tokenizer(spm_data)
    text = "Zoë Müller łódź ĳssel"
    enc = tok.encode(text)
    unk = tok.vocab.index("<unk>")
    assert unk in enc.ids.tolist()  # the test's characters are unknown to the 1,000-piece model
    assert int(np.sum(enc.word_starts)) == len(text.split())
    assert not SentencePieceTokenizer.is_word_start_piece("<unk>")
    assert all(SentencePieceTokenizer.is_word_start_piece(p) for p in ("<s>", "</s>", "<mask>", "\u2581a"))


def test_each_file_must_hold_text_and_documents_without_tokens_are_counted_apart(tmp_path, wordpiece_vocab, capsys):
    """Among good files, a blank one or a compressed file of nothing is a one-line error naming it (it used to add
    nothing, silently); a document the tokenizer keeps nothing of is not stored, and counted apart."""
    import gzip

    good = tmp_path / "good.txt"
    good.write_text("one document here.\n\nanother document there.\n", encoding="utf-8")
    (tmp_path / "blank.txt").write_text("\n\n   \n\t\n", encoding="utf-8")
    with gzip.open(tmp_path / "nothing.txt.gz", "wb"):
        pass
    for bad in ("blank.txt", "nothing.txt.gz"):
        assert cli_main(["--train", str(good), str(tmp_path / bad), "--wordpiece-vocab", wordpiece_vocab,
                         "--destdir", str(tmp_path / "out")]) == 1
        assert capsys.readouterr().err.strip() == f"spanbert-prepare: error: {tmp_path / bad}: no non-blank line"
        assert not (tmp_path / "out").exists()
    (tmp_path / "control.txt").write_bytes(b"\x00\x01\x02\n\x03\x07\n")  # valid UTF-8, yet no token
    assert cli_main(["--train", str(good), str(tmp_path / "control.txt"), str(good), "--wordpiece-vocab",
                     wordpiece_vocab, "--valid", str(good), "--destdir", str(tmp_path / "out")]) == 0
    stats = json.load(open(tmp_path / "out" / "prepare_stats.json"))
    assert stats["train"]["documents"] == 4 and stats["train"]["documents_without_tokens"] == 1
    _, train = _load_docs(str(tmp_path / "out"), "train")
    assert len(train) == 4 and min(train.sizes) > 0


def test_hidden_folders_are_skipped_and_a_pattern_may_name_folders(tmp_path, wordpiece_vocab):
    corpus = tmp_path / "corpus"
    (corpus / ".ipynb_checkpoints").mkdir(parents=True)
    (corpus / "part").mkdir()
    (corpus / "a.txt").write_text("the first book.\n", encoding="utf-8")
    (corpus / "part" / "b.txt").write_text("the second book.\n", encoding="utf-8")
    (corpus / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("the first book.\n", encoding="utf-8")
    (corpus / ".hidden.txt").write_text("not read\n", encoding="utf-8")
    from spanbert_plugin.pretraining.prepare import expand_inputs

    expected = [str(corpus / "a.txt"), str(corpus / "part" / "b.txt")]
    assert expand_inputs([str(corpus)], "--train") == expected
    assert expand_inputs([str(tmp_path / "corp*")], "--train") == expected  # a pattern matching the folder
    for recursive in ("**", "**/*"):  # '**' matches folders and the files under them: each file once
        assert expand_inputs([str(corpus / recursive)], "--train") == expected
    (tmp_path / "empty_folder").mkdir()
    with pytest.raises(PrepareError, match="the folders this pattern matches hold no files"):
        expand_inputs([str(tmp_path / "empty_fold*")], "--train")


def test_a_pattern_matching_a_folder_that_holds_the_destination_is_refused(tmp_path, capsys, caplog):
    """A folder a pattern matches is read whole: a destination inside it would be read as text by the next run."""
    from spanbert_plugin.pretraining.prepare import check_patterns_miss_destination, expand_inputs

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("text.\n", encoding="utf-8")
    with pytest.raises(PrepareError, match=r"the pattern .*corpus/\* matches the folder .*corpus/out, which is read whole"):
        check_patterns_miss_destination([str(tmp_path / "corpus" / "*")], str(tmp_path / "corpus" / "out" / "data"))
    check_patterns_miss_destination([str(tmp_path / "corpus" / "*.txt")], str(tmp_path / "corpus" / "out"))
    # the same file named twice is read twice, and said so
    files = expand_inputs([str(tmp_path / "corpus" / "a.txt"), str(tmp_path / "corpus")], "--train")
    assert files == [str(tmp_path / "corpus" / "a.txt")] * 2 and "named twice" in caplog.text


def test_sentencepiece_vocabulary_is_the_same_on_every_machine_and_every_run(corpus_files, tmp_path, monkeypatch):
    """sentencepiece's vocabulary depends on its thread count (each thread sums its share of the EM statistics), and
    its own sampling of a text longer than its sample is unseeded. spanbert-prepare ran it with one thread per core:
    on this corpus 1 and 4 threads gave 1,000-piece vocabularies differing in 2 pieces and 143 ids; and a corpus of
    more than 2 million paragraphs got another vocabulary on every run."""
    from spanbert_plugin.core import tokenization

    def vocabulary(name):
        out = tmp_path / name
        out.mkdir()
        return tokenization.SentencePieceTokenizer.train(corpus_files[0], str(out), 1000).vocab

    by_cores = []
    for cores in (1, 4):
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        by_cores.append(vocabulary(f"cores{cores}"))
    assert by_cores[0] == by_cores[1]
    monkeypatch.setattr(tokenization, "SPM_TRAINING_LINES", 500)  # the corpus has about 1,900 lines
    sampled = [vocabulary(f"sampled{run}") for run in range(2)]
    assert sampled[0] == sampled[1] != by_cores[0]
    assert sorted(p.name for p in tmp_path.glob("sampled*/*")) == ["spm.model"] * 2 + ["spm.vocab"] * 2  # no sample


def test_a_text_whose_path_holds_a_comma_trains_the_sentencepiece_model_of_its_content(corpus_files, tmp_path,
                                                                                       monkeypatch):
    """sentencepiece reads its input option as a comma-separated list of files: spanbert-prepare of a corpus under
    a folder named with a comma failed ("/tmp/odd dir": No such file or directory). Relative paths still work."""
    import shutil

    from spanbert_plugin.core import tokenization

    odd, plain = tmp_path / "odd dir,1", tmp_path / "plain"
    for folder in (odd, plain):
        folder.mkdir()
        shutil.copyfile(corpus_files[0], folder / "train.txt")
    for folder in (odd, plain):
        (folder / "out").mkdir()
        tokenization.SentencePieceTokenizer.train(str(folder / "train.txt"), str(folder / "out"), 300)
    # the pieces and their scores (the model file also records the paths it was trained from)
    assert (odd / "out" / "spm.vocab").read_bytes() == (plain / "out" / "spm.vocab").read_bytes()
    assert sorted(p.name for p in odd.iterdir()) == ["out", "train.txt"]
    assert sorted(p.name for p in (odd / "out").iterdir()) == ["spm.model", "spm.vocab"]  # the link's folder gone
    monkeypatch.chdir(odd)
    (odd / "relative").mkdir()
    tokenization.SentencePieceTokenizer.train("train.txt", "relative", 300)
    assert (odd / "relative" / "spm.vocab").read_bytes() == (plain / "out" / "spm.vocab").read_bytes()


def test_the_sentencepiece_sample_is_a_file_of_its_own_and_gone_when_writing_it_fails(corpus_files, tmp_path,
                                                                                       monkeypatch):
    """The seeded sample of a long text is written into the output folder under a name of its own: a file of that
    folder named as the sample was (spm_training_sample.txt) was written over, then removed after training; and a
    sample whose writing failed (a full disk, Ctrl-C) was left there half-written."""
    import errno

    from spanbert_plugin.core import tokenization

    monkeypatch.setattr(tokenization, "SPM_TRAINING_LINES", 500)  # the corpus has about 1,900 lines
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "spm_training_sample.txt"
    mine.write_text("not the sample\n")
    tokenization.SentencePieceTokenizer.train(corpus_files[0], str(out), 1000)
    assert mine.read_text() == "not the sample\n"
    assert sorted(p.name for p in out.iterdir()) == ["spm.model", "spm.vocab", "spm_training_sample.txt"]

    real_fdopen = os.fdopen

    class FullDisk:
        def __init__(self, handle, mode):
            self.file = real_fdopen(handle, mode)

        def __enter__(self):
            return self

        def __exit__(self, *error):
            self.file.close()

        def writelines(self, lines):
            self.file.write(next(iter(lines)))
            raise OSError(errno.ENOSPC, "No space left on device")

    failing = tmp_path / "failing"
    failing.mkdir()
    monkeypatch.setattr(tokenization.os, "fdopen", FullDisk)
    with pytest.raises(OSError, match="No space left"):
        tokenization.sampled_training_text(corpus_files[0], str(failing), 500, 0)
    assert list(failing.iterdir()) == []


def test_sentencepiece_sample_counts_a_last_line_without_a_line_break(tmp_path):
    """Three lines, the last without its line break, and a limit of 2: a sample of 2 of the lines is written (the
    unterminated last line counts); a limit of 3 keeps the text itself."""
    from spanbert_plugin.core import tokenization

    text = tmp_path / "text.txt"
    text.write_bytes(b"one\ntwo\nthree")
    assert tokenization.sampled_training_text(str(text), str(tmp_path), 3, 0) == str(text)
    sample = tokenization.sampled_training_text(str(text), str(tmp_path), 2, 0)
    assert sample != str(text)
    lines = open(sample, "rb").read().splitlines()
    assert len(lines) == 2 and set(lines) < {b"one", b"two", b"three"}


def test_control_symbols_include_the_mask_and_symbols_may_hold_spaces(tmp_path):
    """special_mask() marks every control symbol ([MASK] too: it is never masked or drawn as a random token);
    dict.txt's count is the field after the last space, so a symbol with a space reads back whole."""
    symbols = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a b", "c"]
    dictionary = SpanBertDictionary(symbols, [0, 0, 0, 0, 0, 7, 3])
    assert dictionary.special_mask().tolist() == [True] * 5 + [False, False]
    dictionary.save(str(tmp_path / "dict.txt"))
    again = SpanBertDictionary.load(str(tmp_path / "dict.txt"))
    assert again.symbols == symbols and again.count == [0, 0, 0, 0, 0, 7, 3] and again.index("a b") == 5


def test_a_sentencepiece_dictionary_appends_the_mask_with_count_0_after_the_counted_pieces(spm_data):
    """spanbert-prepare counts the tokenizer's pieces; from_tokenizer adds <mask> after them, counted 0."""
    tokenizer = load_tokenizer(spm_data)
    counts = np.arange(len(tokenizer.vocab), dtype=np.int64)
    dictionary = SpanBertDictionary.from_tokenizer(tokenizer, counts)
    assert dictionary.symbols == list(tokenizer.vocab) + ["<mask>"] and dictionary.mask_index == len(tokenizer.vocab)
    assert dictionary.count == counts.tolist() + [0]


def test_a_vocabulary_bound_that_keeps_shrinking_is_one_line(tmp_path, corpus_files, monkeypatch, capsys):
    """Without --vocab-size, prepare retries with the largest size sentencepiece says the text supports; should the
    bound shrink on every retry (three tries), the command stops with one line asking for --vocab-size."""
    from spanbert_plugin.core.tokenization import SentencePieceTokenizer, VocabSizeTooLarge

    asked = []

    def always_too_large(text_file, workdir, vocab_size, **options):
        asked.append(vocab_size)
        raise VocabSizeTooLarge(f"{text_file}: too large", 900 - len(asked))

    monkeypatch.setattr(SentencePieceTokenizer, "train", staticmethod(always_too_large))
    dest = tmp_path / "out"
    assert cli_main(["--train", corpus_files[1], "--destdir", str(dest)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"spanbert-prepare: error: {corpus_files[1]}: could not fit a sentencepiece vocabulary to this "
                       "text; pass --vocab-size")
    assert asked == [8000, 899, 898]
    assert [re.search(r"using (\d+)", line).group(1) for line in err[:-1]] == ["899", "898"]  # each size it then tries
    assert not dest.exists() and not leftovers(tmp_path)


def test_another_sentencepiece_failure_is_one_line_naming_the_text(tmp_path, monkeypatch):
    from spanbert_plugin.core import tokenization
    from spanbert_plugin.core.tokenization import SentencePieceTokenizer, TokenizerError

    def fails(**options):
        raise RuntimeError("INTERNAL: something else")

    monkeypatch.setattr(tokenization, "_train_sentencepiece", fails)
    (tmp_path / "text.txt").write_text("a line\n")
    with pytest.raises(TokenizerError) as raised:
        SentencePieceTokenizer.train(str(tmp_path / "text.txt"), str(tmp_path), 100)
    assert str(raised.value) == f"{tmp_path / 'text.txt'}: sentencepiece training failed: INTERNAL: something else"


def test_sentencepiece_training_interrupted_stops_its_child_process(monkeypatch):
    """Training runs in a child process: Ctrl-C (here raised by the wait itself) kills it and waits for it."""
    from spanbert_plugin.core import tokenization

    calls = []

    class Child:
        def __init__(self, *args, **kwargs):
            calls.append("start")

        def communicate(self):
            raise KeyboardInterrupt

        def kill(self):
            calls.append("kill")

        def wait(self):
            calls.append("wait")

    monkeypatch.setattr(tokenization.subprocess, "Popen", Child)
    with pytest.raises(KeyboardInterrupt):
        tokenization._train_sentencepiece(input="text.txt", model_prefix="spm", vocab_size=100)
    assert calls == ["start", "kill", "wait"]


def test_the_default_corpus_skips_sources_that_do_not_parse(tmp_path):
    """A standard library may hold files this Python cannot parse (another version's syntax, a legacy encoding, a
    null byte): they are left out, the other modules still give their documents."""
    from spanbert_plugin.pretraining.default_corpus import module_documents

    docstring = "This module explains how the value of a named attribute is found and returned."
    (tmp_path / "a_good.py").write_text(f'"""{docstring}"""\n', encoding="utf-8")
    (tmp_path / "b_syntax.py").write_text('"""A docstring that is fine but the code after it is not."""\nprint "old"\n')
    (tmp_path / "c_latin1.py").write_bytes('"""Caf\xe9 docstring written in a legacy encoding of bytes."""\n'.encode("latin-1"))
    (tmp_path / "d_null.py").write_bytes(b'"""A docstring followed by a null byte in the source code."""\n\x00\n')
    assert list(module_documents(str(tmp_path))) == [[docstring]]
