"""spanbert-prepare on corpora as they come: several files, folders, globs, gzip, hard-wrapped
paragraphs, one document per file; several encoding processes; memory bounded by the chunk size."""
import gzip
import json
import os
import shutil
import tracemalloc

import numpy as np
import pytest

from conftest import needs_shared_data, require_spacy_pipeline, shared_path, skip_unless_required

from spanbert_plugin.cli.prepare import main as cli_main
from spanbert_plugin.pretraining import prepare as prepare_module
from spanbert_plugin.pretraining.prepare import CorpusReader, expand_inputs
from test_file_safety import write_wordpiece_corpus

LITBANK_NOVELS = shared_path("litbank", "novels")


def _binaries(dest):
    """Every output file's bytes (the manifest names the temporary folder's files only, so it is left out)."""
    return {name: open(os.path.join(dest, name), "rb").read() for name in sorted(os.listdir(dest)) if not name.startswith(".")}


def _split_corpus(tmp_path, corpus):
    """The corpus's documents spread over a folder, a gzip file and plain files (in that sorted order)."""
    documents = open(corpus, encoding="utf-8").read().split("\n\n")
    parts = tmp_path / "parts"
    (parts / "sub").mkdir(parents=True)
    third = len(documents) // 3
    (parts / "sub" / "a.txt").write_text("\n\n".join(documents[:third]) + "\n")
    with gzip.open(parts / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n\n".join(documents[third : 2 * third]) + "\n")
    (parts / "c.txt").write_text("\n\n".join(documents[2 * third :]))
    return parts


def test_files_folders_globs_and_gzip_read_as_one_text(tmp_path):
    corpus, vocab = write_wordpiece_corpus(str(tmp_path), 600)
    parts = _split_corpus(tmp_path, corpus)
    assert [os.path.relpath(p, parts) for p in expand_inputs([str(parts / "sub"), str(parts / "*.txt*")], "--train")] == [
        "sub/a.txt", "b.txt.gz", "c.txt"]
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    common = ["--wordpiece-vocab", vocab, "--valid-fraction", "0.05"]
    assert cli_main(["--train", corpus, "--destdir", one, *common]) == 0
    assert cli_main(["--train", str(parts / "sub"), str(parts / "*.txt*"), "--destdir", many, *common]) == 0
    assert _binaries(one) == _binaries(many)
    stats = json.load(open(os.path.join(many, "prepare_stats.json")))
    assert stats["train"]["documents"] + stats["valid"]["documents"] == 60 and stats["train"]["lines"] + stats["valid"]["lines"] == 600


def test_join_wrapped_lines_and_document_per_file(tmp_path):
    (tmp_path / "book1.txt").write_text("CHAPTER I\n\nIt was a dark\nand stormy night;\nthe rain fell.\n\n\n\nThen\nit stopped.\n")
    with gzip.open(tmp_path / "book2.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\ufeffOne  line\n  wrapped here\n\nand one more\n")
    files = [str(tmp_path / "book1.txt"), str(tmp_path / "book2.txt.gz")]
    assert list(CorpusReader(files, join_wrapped_lines=True)) == [
        ["CHAPTER I", "It was a dark and stormy night; the rain fell.", "Then it stopped."],
        ["One  line wrapped here", "and one more"],
    ]
    assert list(CorpusReader(files, document_per_file=True)) == [
        ["CHAPTER I", "It was a dark", "and stormy night;", "the rain fell.", "Then", "it stopped."],
        ["One  line", "wrapped here", "and one more"],
    ]
    default = CorpusReader(files)
    assert list(default) == [["CHAPTER I"], ["It was a dark", "and stormy night;", "the rain fell."], ["Then", "it stopped."],
                             ["One  line", "wrapped here"], ["and one more"]]
    assert default.empty_documents == 2


def test_errors_name_the_file_and_line_inside_gzip(tmp_path, capsys):
    with gzip.open(tmp_path / "bad.txt.gz", "wb") as f:
        f.write(b"fine\nalso fine\ncaf\xe9\n")
    (tmp_path / "damaged.txt.gz").write_bytes(gzip.compress(b"some text\n" * 50)[:-12])
    # a valid gzip header with garbage after it: zlib's own error, not an OSError
    (tmp_path / "garbage.txt.gz").write_bytes(gzip.compress(b"")[:10] + bytes(range(256)) * 4)
    for name, expected in (("bad.txt.gz", "bad.txt.gz:3: not valid UTF-8 (byte 0xe9"), ("damaged.txt.gz", "damaged.txt.gz: cannot read"),
                           ("garbage.txt.gz", "garbage.txt.gz: cannot read")):
        assert cli_main(["--train", str(tmp_path / name), "--destdir", str(tmp_path / "out"), "--vocab-size", "20"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", ["0", "-3"])
def test_workers_below_one_are_refused(workers, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("some text\n")
    assert cli_main(["--train", str(tmp_path / "c.txt"), "--destdir", str(tmp_path / "out"), "--workers", workers]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--workers must be at least 1, got {workers}" in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tokenizer", ["sentencepiece", "wordpiece"])
def test_workers_write_the_same_bytes(tokenizer, tmp_path, monkeypatch):
    """Two encoding processes, many small chunks: byte-identical to one process."""
    corpus, vocab = write_wordpiece_corpus(str(tmp_path), 1500)
    monkeypatch.setattr(prepare_module, "DEFAULT_CHUNK_CHARS", 4000)  # about 20 chunks
    options = ["--wordpiece-vocab", vocab] if tokenizer == "wordpiece" else ["--vocab-size", "300"]
    outputs = []
    for workers in ("1", "2"):
        dest = str(tmp_path / f"w{workers}")
        assert cli_main(["--train", corpus, "--destdir", dest, "--workers", workers, *options]) == 0
        files = _binaries(dest)
        files.pop("spm.model", None)  # sentencepiece training itself varies in the last bits of its scores
        outputs.append(files)
    assert outputs[0] == outputs[1]
    assert set(outputs[0]) >= {"train.bin", "train.idx", "valid.bin", "valid.idx", "dict.txt"}


def test_patterns_that_would_read_the_output_and_those_that_would_not():
    """glob's rule per component: '*' stays inside a name, '**' spans folders."""
    from spanbert_plugin.pretraining.prepare import PrepareError, check_patterns_miss_destination

    for pattern, destination in (("corp/*/*.txt", "corp/out"), ("corp/**", "corp/a/b/out"), ("*/*.idx", "out"),
                                 ("corp/o?t/*", "corp/out")):
        with pytest.raises(PrepareError, match="matches its output|which is read whole"):
            check_patterns_miss_destination([pattern], destination)
    for pattern, destination in (("corp/*.txt", "corp/out"), ("corp/*/*.gz", "corp/out"), ("corp/*/*.txt", "elsewhere"),
                                 ("corp/*/*/*.txt", "corp/out")):
        check_patterns_miss_destination([pattern], destination)


def test_encoding_workers_leave_ctrl_c_to_the_parent(tmp_path):
    """Ctrl-C in a terminal signals the whole process group: a worker that died of it holding the pool's queue lock
    left the parent's pool.terminate() waiting for ever. The workers ignore it (and a hang-up); the parent stops them."""
    import signal

    corpus, vocab = write_wordpiece_corpus(str(tmp_path), 50)
    dest = str(tmp_path / "prepared")  # a folder with the tokenizer files the workers load
    assert cli_main(["--train", corpus, "--destdir", dest, "--wordpiece-vocab", vocab]) == 0
    with prepare_module.encoding_pool(1, dest, None) as pool:  # the pool spanbert-prepare --workers N starts
        assert pool.apply(signal.getsignal, (signal.SIGINT,)) == signal.SIG_IGN
        assert pool.apply(signal.getsignal, (signal.SIGHUP,)) == signal.SIG_IGN
        assert pool.apply(signal.getsignal, (signal.SIGTERM,)) == signal.SIG_DFL  # pool.terminate's signal


def _peak_python_memory(tmp_path, vocab, corpus, name):
    dest = str(tmp_path / name)
    tracemalloc.start()
    try:
        assert cli_main(["--train", corpus, "--wordpiece-vocab", vocab, "--destdir", dest, "--valid-fraction", "0.01"]) == 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_is_bounded_by_the_chunk_not_the_corpus(tmp_path, monkeypatch):
    """Peak Python/numpy memory (tracemalloc) does not grow with the corpus: 4x the text, same peak.

    The corpus is streamed document by document and encoded in chunks of
    DEFAULT_CHUNK_CHARS characters, written item by item: with 16 kB chunks, a
    0.8 MB and a 3.2 MB gzip corpus (about 50 and 200 chunks) peak at the same
    memory, well under the size of the smaller text.
    """
    monkeypatch.setattr(prepare_module, "DEFAULT_CHUNK_CHARS", 16_000)
    small_dir, large_dir = tmp_path / "small", tmp_path / "large"
    small_dir.mkdir()
    large_dir.mkdir()
    small, vocab = write_wordpiece_corpus(str(small_dir), 8_000, seed=1)
    text = open(small, "rb").read()
    large = str(large_dir / "corpus.txt.gz")
    with gzip.open(large, "wb", compresslevel=1) as f:
        for _ in range(4):
            f.write(text)
    small_gz = str(small_dir / "corpus.txt.gz")
    with gzip.open(small_gz, "wb", compresslevel=1) as f:
        f.write(text)
    os.remove(small)
    warm_up = write_wordpiece_corpus(str(tmp_path), 100)[0]  # imports (fairseq, torch) are not the corpus's memory
    _peak_python_memory(tmp_path, vocab, warm_up, "out_warm_up")
    peak_small = _peak_python_memory(tmp_path, vocab, small_gz, "out_small")
    peak_large = _peak_python_memory(tmp_path, vocab, large, "out_large")
    assert peak_large < 1.25 * peak_small, (peak_small, peak_large)
    assert peak_small < len(text), (peak_small, len(text))
    stats = json.load(open(tmp_path / "out_large" / "prepare_stats.json"))
    assert stats["train"]["lines"] + stats["valid"]["lines"] == 4 * 8_000


@needs_shared_data("litbank/novels")
def test_gutenberg_novels_as_they_come(tmp_path):
    """Two LitBank novels (gzip, hard-wrapped): one document each, paragraphs joined."""
    novels = sorted(os.listdir(LITBANK_NOVELS))[:2]
    for name in novels:
        shutil.copy(os.path.join(LITBANK_NOVELS, name), tmp_path / name)
    documents = list(CorpusReader([str(tmp_path / n) for n in novels], join_wrapped_lines=True))
    assert len(documents) == 2
    with gzip.open(tmp_path / novels[0], "rt", encoding="utf-8-sig") as f:
        raw = f.read()
    paragraphs = [p for p in raw.split("\n\n") if p.strip()]
    assert len(documents[0]) == len(paragraphs)
    assert documents[0][1] == " ".join(line.strip() for line in paragraphs[1].strip().splitlines() if line.strip())
    assert np.mean([len(p) for p in documents[0]]) > 70  # joined: longer than one wrapped line


def test_annotation_without_spacy_is_one_line(tmp_path, monkeypatch, capsys):
    import sys

    corpus, vocab = write_wordpiece_corpus(str(tmp_path), 40)
    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy -> ImportError
    assert cli_main(["--train", corpus, "--wordpiece-vocab", vocab, "--annotate", "spacy", "--destdir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["spanbert-prepare: error: --annotate spacy needs spaCy: pip install -e .[linguistic] "
                   "(spaCy and the default English pipeline)"]
    assert cli_main(["--train", corpus, "--wordpiece-vocab", vocab, "--spacy-model", "x", "--destdir", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == "spanbert-prepare: error: --spacy-model needs --annotate spacy"
    assert not (tmp_path / "out").exists()


@needs_shared_data("litbank/novels")
def test_annotation_on_workers_writes_the_same_bytes(tmp_path, monkeypatch):
    """spaCy annotation on two processes: the same token and span files as on one."""
    require_spacy_pipeline()
    for name in sorted(os.listdir(LITBANK_NOVELS))[:2]:
        with gzip.open(os.path.join(LITBANK_NOVELS, name), "rt", encoding="utf-8-sig") as f:
            paragraphs = [p for p in f.read().split("\n\n") if p.strip()][40:80]
        (tmp_path / name).write_bytes(gzip.compress("\n\n".join(paragraphs).encode("utf-8")))
    monkeypatch.setattr(prepare_module, "DEFAULT_CHUNK_CHARS", 3000)
    vocab = shared_path("bert_uncased_vocab", "vocab.txt")
    outputs = []
    for workers in ("1", "2"):
        dest = str(tmp_path / f"w{workers}")
        assert cli_main(["--train", str(tmp_path / "*.gz"), "--join-wrapped-lines", "--wordpiece-vocab", vocab, "--lowercase",
                         "--annotate", "spacy", "--workers", workers, "--destdir", dest]) == 0
        outputs.append(_binaries(dest))
    assert outputs[0] == outputs[1]
    stats = json.loads(outputs[0]["prepare_stats.json"])
    assert stats["train"]["annotations"]["entities"] > 0 and stats["train"]["annotations"]["noun_phrases"] > 0


def test_character_spans_become_whole_word_token_spans():
    """spaCy's character spans on tokens with offsets: a token belongs to a span when its characters overlap it
    (touching is not overlapping), and the span grows to whole words; one over no token is dropped."""
    from spanbert_plugin.pretraining.annotate import char_spans_to_words

    # "(Paris) obamacare": ( paris ) obama ##care, each punctuation mark a word of its own
    offsets = [(0, 1), (1, 6), (6, 7), (8, 13), (13, 17)]
    word_starts = [True, True, True, True, False]
    spans = char_spans_to_words([(1, 6), (8, 13), (7, 8)], offsets, word_starts)
    assert spans.tolist() == [[1, 2], [3, 5]]  # "paris" alone; "obama" widened to its word; the space dropped
    assert spans.dtype == np.int32


def test_a_documents_spans_shift_by_the_tokens_of_the_lines_before():
    from spanbert_plugin.pretraining.annotate import SPAN_KINDS, document_spans

    none = np.zeros((0, 2), np.int32)
    lines = [{"entities": np.array([[1, 2]], np.int32), "noun_phrases": np.array([[0, 1]], np.int32)},
             {"entities": none, "noun_phrases": none},
             {"entities": np.array([[0, 2]], np.int32), "noun_phrases": np.array([[1, 3]], np.int32)}]
    joined = document_spans(lines, np.array([5, 4, 3]))
    assert set(joined) == set(SPAN_KINDS)
    assert joined["entities"].tolist() == [[1, 2], [9, 11]] and joined["noun_phrases"].tolist() == [[0, 1], [10, 12]]


def test_a_spacy_pipeline_that_cannot_annotate_is_one_line(tmp_path, capsys):
    """--spacy-model naming no installed pipeline, or a pipeline without the parser and the entity recogniser that
    the annotations come from: one line before the corpus is read, nothing written."""
    try:
        import spacy
    except ImportError:
        skip_unless_required("spaCy is not installed (pip install -e .[linguistic])")
    corpus, vocab = write_wordpiece_corpus(str(tmp_path), 40)
    spacy.blank("en").to_disk(tmp_path / "blank_pipeline")
    cases = [("no_such_pipeline_xyz", "--spacy-model no_such_pipeline_xyz: cannot load this spaCy pipeline ([E050] "),
             (str(tmp_path / "blank_pipeline"), f"--spacy-model {tmp_path / 'blank_pipeline'}: the pipeline lacks ner and "
                                                "parser (named entities need ner, noun phrases need parser)")]
    for model, expected in cases:
        assert cli_main(["--train", corpus, "--wordpiece-vocab", vocab, "--annotate", "spacy", "--spacy-model", model,
                         "--destdir", str(tmp_path / "out")]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"spanbert-prepare: error: {expected}"), err
    assert not (tmp_path / "out").exists()
