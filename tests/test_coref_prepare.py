"""spanbert-prepare-coref: segments, word maps, gold mentions and statistics; bad input; SpanDrop on documents."""

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import needs_shared_data, shared_path
from spanbert_plugin.cli.prepare_coref import main as prepare_main
from spanbert_plugin.coref.conll import read_conll, read_split
from spanbert_plugin.coref.dataset import CorefDataset
from spanbert_plugin.coref.prepare import load_coref_meta, load_documents, load_split_arrays
from spanbert_plugin.core.finetune_io import load_tokenizer_folder

LITBANK = "litbank"
VOCAB = "bert_uncased_vocab/vocab.txt"


@pytest.fixture(scope="module")
def uncased_tokenizer(tmp_path_factory):
    """A spanbert-prepare folder with the BERT uncased WordPiece vocabulary."""
    from spanbert_plugin.cli.prepare import main as cli_main

    d = tmp_path_factory.mktemp("tok")
    text = d / "t.txt"
    text.write_text("A few words.\n")
    dest = str(d / "tok")
    assert (
        cli_main(
            [
                "--train",
                str(text),
                "--valid",
                str(text),
                "--destdir",
                dest,
                "--tokenizer",
                "wordpiece",
                "--wordpiece-vocab",
                shared_path(VOCAB),
                "--lowercase",
            ]
        )
        == 0
    )
    return dest


def write_jsonl(path, docs):
    with open(path, "w") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    return str(path)


def prepare(args):
    return prepare_main(args)


@needs_shared_data(LITBANK, VOCAB)
def test_litbank_fold0(uncased_tokenizer, tmp_path, capsys):
    splits = shared_path(LITBANK, "splits", "fold0")
    dest = str(tmp_path / "coref")
    assert (
        prepare(
            [
                "--train",
                os.path.join(splits, "train.txt"),
                "--valid",
                os.path.join(splits, "dev.txt"),
                "--test",
                os.path.join(splits, "test.txt"),
                "--tokenizer-from",
                uncased_tokenizer,
                "--destdir",
                dest,
                "--max-segment-length",
                "128",
            ]
        )
        == 0
    )
    stats = json.load(open(os.path.join(dest, "prepare_stats.json")))
    assert [stats[s]["documents"] for s in ("train", "valid", "test")] == [80, 10, 10]
    tokenizer, dictionary = load_tokenizer_folder(uncased_tokenizer)
    for split, flag in (("valid", "dev.txt"), ("test", "test.txt")):
        docs = read_split(os.path.join(splits, flag), "--valid")
        s, a = stats[split], load_split_arrays(dest, split)
        # every gold mention is kept for evaluation, counted once
        assert s["mentions"] == sum(len(c) for d in docs for c in d.clusters) == len(a["gold"])
        assert s["trainable_mentions"] == len(a["target"])
        assert s["mentions"] - s["trainable_mentions"] <= (
            s["mentions_wider_than_max_span_width"] + s["mentions_across_segments"] + s["mentions_across_sentences"]
        )
        assert s["words"] == sum(len(d.words) for d in docs)
        lengths = a["segment_lengths"]
        assert lengths.max() <= 128 and lengths.sum() == len(a["tokens"]) == s["tokens"]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        assert (a["tokens"][starts] == dictionary.bos()).all() and (
            a["tokens"][starts + lengths - 1] == dictionary.eos()
        ).all()
        # the word map gives back each word's own pieces, in order
        doc, t0, t1 = docs[0], a["doc_tokens"][0], a["doc_tokens"][1]
        words, tokens = a["token_word"][t0:t1], a["tokens"][t0:t1]
        pieces = tokenizer.encode_ids(doc.words)
        for w in (0, 7, len(doc.words) - 1):
            assert tokens[words == w].tolist() == (pieces[w] or [dictionary.unk()])
        # gold word spans and their cluster ids reproduce the clusters
        g = a["gold"][a["doc_gold"][0] : a["doc_gold"][1]]
        rebuilt = {}
        for start, end, cluster in g.tolist():
            rebuilt.setdefault(cluster, []).append((start, end))
        assert sorted(rebuilt.values()) == sorted(doc.clusters)
    meta = load_coref_meta(dest)
    assert meta["max_segment_length"] == 128 and meta["max_span_width"] == 30


def test_long_sentence_and_long_word_are_cut(wordpiece_data, tmp_path):
    long_sentence = [f"w{i}" for i in range(40)]
    docs = [
        {
            "doc_key": "a",
            "sentences": [["Short", "one", "."], long_sentence, ["x" * 60]],
            "clusters": [[[0, 0], [5, 6]]],
        }
    ]
    dest = str(tmp_path / "d")
    assert (
        prepare(
            [
                "--train",
                write_jsonl(tmp_path / "a.jsonl", docs),
                "--tokenizer-from",
                wordpiece_data,
                "--destdir",
                dest,
                "--max-segment-length",
                "16",
            ]
        )
        == 0
    )
    stats = json.load(open(os.path.join(dest, "prepare_stats.json")))["train"]
    assert stats["cut_sentences"] == 2 and stats["cut_words"] >= 1
    a = load_split_arrays(dest, "train")
    assert a["segment_lengths"].max() <= 16
    sentence = a["token_sentence"]
    segment = np.repeat(np.arange(len(a["segment_lengths"])), a["segment_lengths"])
    # no segment holds two sentences when one of them was cut
    assert len(np.unique(segment[sentence == 1])) >= 2


@pytest.mark.parametrize(
    "files,message",
    [
        (
            {
                "a.jsonl": '{"doc_key": "d", "sentences": [["x"]]}\n',
                "b.jsonl": '{"doc_key": "d", "sentences": [["y"]]}\n',
            },
            "b.jsonl:1: duplicate document d (first at",
        ),
        (
            {"a.conll": "#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ (1\n\n#end document\n"},
            "a.conll:2: unbalanced brackets",
        ),
        (
            {"a.jsonl": '{"doc_key": "d", "sentences": [["x"]], "clusters": [[[0, 1]]]}\n'},
            "a.jsonl:1: cluster span [0, 1]",
        ),
        ({"a.txt": "hello\n"}, "a.txt:1: hello: no such file (list files"),
        ({"a.jsonl": '{"doc_key": "d\\ud800", "sentences": [["x"]]}\n'},
         "a.jsonl:1: \\ud800 is a lone UTF-16 surrogate escape, not a character"),
        ({"a.jsonl": '{"doc_key": "d", "sentences": ' + "[" * 200000 + "]" * 200000 + "}\n"},
         "a.jsonl:1: JSON nested too deeply"),
        ({"a.jsonl": '{"doc_key": "d", "sentences": [["Hi", ["x"]]]}\n'},
         "a.jsonl:1: sentences must be a list of lists of strings"),
        ({"a.jsonl": '{"doc_key": "d", "sentences": [["Hi"]], "speakers": 5}\n'},
         "a.jsonl:1: speakers must be a list of lists of strings with the shape of sentences"),
        ({"a.jsonl": '{"doc_key": "d", "sentences": [["Hi"]], "speakers": [5]}\n'},
         "a.jsonl:1: speakers must be a list of lists of strings with the shape of sentences"),
        ({"a.jsonl": '{"doc_key": "d", "sentences": [["Hi"]], "clusters": 5}\n'},
         "a.jsonl:1: clusters must be a list of clusters, each a list of [start, end] word spans"),
        # a tab or line break in a word, speaker or key would split a column or line of the CoNLL files written
        ({"a.jsonl": '{"doc_key": "d", "sentences": [["Hi", "a\\tb"]]}\n'},
         "a.jsonl:1: word 'a\\tb' holds a tab or line break"),
        ({"a.jsonl": '{"doc_key": "d", "sentences": [["Hi"], ["a\\nb"]]}\n'},
         "a.jsonl:1: word 'a\\nb' holds a tab or line break"),
        ({"a.jsonl": '{"doc_key": "d", "sentences": [["Hi"]], "speakers": [["x\\u2028y"]]}\n'},
         "a.jsonl:1: speaker 'x\\u2028y' holds a tab or line break"),
        ({"a.txt": "doc.conll\ncaf\xe9.conll\n".encode("latin-1")}, "a.txt:2: not valid UTF-8 (byte 0xe9)"),
        ({"a.conll": "stray header\n#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ (1)\n\n#end document\n"},
         "a.conll:1: token line outside a document (expected #begin document first)"),
        ({"a.conll": "d 0 0 w _ _ _ _ _ _ _ _ (1)\n\n"}, "a.conll: no '#begin document (NAME); part N' line"),
        ({"a.conll": "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"},
         "a.conll: no '#begin document (NAME); part N' line, so not CoNLL-2012, and not JSON lines "
         "(first line: '-DOCSTART- -X- -X- O'); a CoNLL-2003"),
        # e2e-coref's key of part 1, twice: both would be written "(bc/cctv/00/cctv_0000); part 001"
        ({"a.jsonl": '{"doc_key": "bc/cctv/00/cctv_0000_1", "sentences": [["x"]]}\n'
                     '{"doc_key": "bc/cctv/00/cctv_0000_01", "sentences": [["y"]]}\n'},
         "a.jsonl:2: document bc/cctv/00/cctv_0000_01 is written as '#begin document (bc/cctv/00/cctv_0000); part 001', "
         "as the document at"),
        # SpanBERT's minimize.py output: [CLS]/[SEP] segments of subtokens, clusters in subtoken positions
        ({"a.jsonl": '{"doc_key": "nw/d_0", "sentences": [["[CLS]", "sum", "##mer", "[SEP]"]], "clusters": [], '
                     '"subtoken_map": [0, 0, 0, 0]}\n'},
         "a.jsonl:1: this is SpanBERT's subtoken-level file"),
        ({"a.jsonl": '{"doc_key": "nw/d_0", "sentences": [["[CLS]", "sum", "##mer", "[SEP]"]], "clusters": []}\n'},
         "a.jsonl:1: this is SpanBERT's subtoken-level file"),
    ],
)
def test_bad_input_one_line_nothing_written(wordpiece_data, tmp_path, capsys, files, message):
    for name, text in files.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    spec = str(tmp_path / next(iter(files))) if len(files) == 1 else str(tmp_path / "*.jsonl")
    dest = tmp_path / "out"
    assert prepare(["--train", spec, "--tokenizer-from", wordpiece_data, "--destdir", str(dest)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not dest.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".spanbert-tmp")]


def test_clusters_sharing_a_span_are_merged_as_minimize_py_does(wordpiece_data, tmp_path, capsys):
    """A span in two clusters of a key: the reference scorer warns ("Repeated mention in the key") and scores on,
    and SpanBERT's minimize.py merges the two clusters; the whole split was refused."""
    conll = ("#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ (3)|(9)\nd 0 1 v _ _ _ _ _ _ _ _ (3)\n"
             "d 0 2 u _ _ _ _ _ _ _ _ (9)\nd 0 3 t _ _ _ _ _ _ _ _ (5)\nd 0 4 s _ _ _ _ _ _ _ _ (5)\n\n#end document\n")
    jsonl = json.dumps({"doc_key": "e", "sentences": [["w", "v", "u", "t", "s"]],
                        "clusters": [[[0, 0], [1, 1]], [[0, 0], [2, 2]], [[3, 3], [4, 4]]]}) + "\n"
    for name, text, key in (("a.conll", conll, "(d); part 0"), ("a.jsonl", jsonl, "e")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        dest = tmp_path / f"out_{name}"
        assert prepare(["--train", str(tmp_path / name), "--tokenizer-from", wordpiece_data, "--destdir", str(dest)]) == 0
        assert f"1 cluster(s) of document {key} share a span with another and were merged" in capsys.readouterr().err
        [doc] = read_split(str(tmp_path / name), "--train")
        assert doc.clusters == [[(0, 0), (1, 1), (2, 2)], [(3, 3), (4, 4)]]
        # the gold lines written for the scorer hold the merged clusters, as eval.json scores them
        [again] = read_conll("gold.conll", "\n".join(doc.lines) + "\n")
        assert again.clusters == doc.clusters and "were merged" not in capsys.readouterr().err


def test_ontonotes_escaped_marks_are_read_as_the_marks(tmp_path):
    """OntoNotes' "/." and "/?" are "." and "?" to the tokenizer, as SpanBERT's minimize.py feeds them; the lines
    written back keep them as the key file has them."""
    conll = ("#begin document (tc/ch/00/ch_0001); part 000\n"
             + "".join(f"tc/ch/00/ch_0001 0 {i} {w} _ _ _ _ _ A _ -\n" for i, w in enumerate(["Yes", "/.", "Why", "/?"]))
             + "\n#end document\n")
    (tmp_path / "a.conll").write_text(conll, encoding="utf-8")
    [doc] = read_split(str(tmp_path / "a.conll"), "--train")
    assert doc.words == ["Yes", ".", "Why", "?"] and doc.lines[2].split()[3] == "/."


def test_ontonotes_json_lines_keys_are_written_as_the_official_key_files_name_them(wordpiece_data, tmp_path):
    """e2e-coref's JSON lines key a part "bc/cctv/00/cctv_0000_1"; the CoNLL files written for scoring named it so,
    and the reference scorer matched none of its documents against the official key file's
    "(bc/cctv/00/cctv_0000); part 001" (recall 0, no error)."""
    records = [{"doc_key": "bc/cctv/00/cctv_0000_1", "sentences": [["Hi", "there"]], "clusters": []},
               {"doc_key": "my_story_2", "sentences": [["Hi"]], "clusters": []},
               {"doc_key": "nw/wsj/00/wsj_0012", "sentences": [["Hi"]], "clusters": []},  # a name without a part
               {"doc_key": "nw/foo_bar_12", "sentences": [["Hi"]], "clusters": []}]
    dest = tmp_path / "out"
    assert prepare(["--train", write_jsonl(tmp_path / "a.jsonl", records), "--tokenizer-from", wordpiece_data,
                    "--destdir", str(dest)]) == 0
    assert [doc["lines"][0] for doc in load_documents(str(dest), "train")] == [
        "#begin document (bc/cctv/00/cctv_0000); part 001", "#begin document (my_story_2); part 000",
        "#begin document (nw/wsj/00/wsj_0012); part 000", "#begin document (nw/foo_bar_12); part 000"]


def test_byte_order_marks_are_dropped_from_conll_and_list_files(wordpiece_data, tmp_path):
    """A CoNLL file and a list file that start with a UTF-8 byte-order mark read as without it."""
    conll = "#begin document (d); part 0\nd 0 0 w _ _ _ _ _ _ _ _ (1)\nd 0 1 v _ _ _ _ _ _ _ _ (1)\n\n#end document\n"
    (tmp_path / "doc.conll").write_text("\ufeff" + conll, encoding="utf-8")
    (tmp_path / "list.txt").write_text("\ufeffdoc.conll\n", encoding="utf-8")
    for spec in ("doc.conll", "list.txt"):
        dest = tmp_path / f"out_{spec}"
        assert prepare(["--train", str(tmp_path / spec), "--tokenizer-from", wordpiece_data, "--destdir", str(dest)]) == 0
        assert (dest / "train.docs.jsonl").exists()


def prepared_sentence_document(tmp_path, tokenizer_folder, clusters):
    """Arrays of a prepared one-document split: 12 sentences of 6 words, segments of 32 tokens."""
    sentences = [[f"s{s}w{i}" for i in range(6)] for s in range(12)]
    doc = {"doc_key": "a", "sentences": sentences, "clusters": clusters}
    dest = str(tmp_path / "d")
    args = ["--train", write_jsonl(tmp_path / "a.jsonl", [doc]), "--tokenizer-from", tokenizer_folder,
            "--destdir", dest, "--max-segment-length", "32"]
    assert prepare(args) == 0
    return load_split_arrays(dest, "train")


def test_span_drop_keeps_every_gold_mention(wordpiece_data, tmp_path):
    clusters = [[[0, 1], [30, 30]], [[13, 13]]]  # sentences 0, 5 and 2 hold mentions
    arrays = prepared_sentence_document(tmp_path, wordpiece_data, clusters)
    plain = CorefDataset(arrays, pad_index=1)[0]
    kept_sizes = []
    for unit in ("sentence", "token"):
        for epoch in range(1, 6):
            ds = CorefDataset(arrays, pad_index=1, span_drop=(0.5, None, unit, "drop"), seed=3)
            ds.set_epoch(epoch)
            doc = ds[0]
            kept_sizes.append(len(doc["tokens"]))
            # every target still points at the same pieces of the same words
            for (s, e, c), (s0, e0, c0) in zip(doc["target"], plain["target"]):
                assert c == c0
                assert doc["tokens"][s : e + 1].tolist() == plain["tokens"][s0 : e0 + 1].tolist()
                assert doc["token_word"][s : e + 1].tolist() == plain["token_word"][s0 : e0 + 1].tolist()
            sentences_kept = set(doc["token_sentence"][doc["token_sentence"] >= 0].tolist())
            assert {0, 2, 5} <= sentences_kept
            assert doc["token_segment"].max() + 1 == len(np.unique(doc["token_segment"]))
            batch = ds.collater([doc])
            assert (batch["net_input"]["src_tokens"][:, 0] == plain["tokens"][0]).all()
    assert min(kept_sizes) < len(plain["tokens"])  # something was dropped
    # same (seed, epoch, document) -> same draw
    a, b = (CorefDataset(arrays, pad_index=1, span_drop=(0.5, 1.0, "sentence", "drop"), seed=3)[0] for _ in range(2))
    assert a["tokens"].tolist() == b["tokens"].tolist()


def test_span_drop_mask_mode_masks_with_the_tokenizers_own_mask_symbol(spm_data, tmp_path):
    """sentencepiece spells it <mask>: the task looked up [MASK] only and masked with <unk> there."""
    from spanbert_plugin.coref.task import CoreferenceConfig, CoreferenceTask

    arrays_folder = tmp_path / "d"
    prepared_sentence_document(tmp_path, spm_data, [[[0, 1], [30, 30]]])
    task = CoreferenceTask.setup_task(CoreferenceConfig(data=str(arrays_folder), span_drop_p=0.5,
                                                        span_drop_mode="mask"))
    task.load_dataset("train")
    mask = task.dictionary.index("<mask>")
    assert mask != task.dictionary.unk() and task.datasets["train"].mask_index == mask


def test_training_window_of_segments(wordpiece_data, tmp_path):
    """--max-training-segments: a run of consecutive segments, targets shifted with it; composes with SpanDrop."""
    clusters = [[[0, 1], [30, 30], [66, 67]], [[13, 13], [40, 41]]]
    arrays = prepared_sentence_document(tmp_path, wordpiece_data, clusters)
    plain = CorefDataset(arrays, pad_index=1)[0]
    assert plain["token_segment"].max() + 1 > 2
    firsts = set()
    for epoch in range(1, 8):
        for span_drop in (None, (0.3, None, "token", "drop")):
            ds = CorefDataset(arrays, pad_index=1, max_segments=2, seed=5, span_drop=span_drop)
            ds.set_epoch(epoch)
            doc = ds[0]
            assert doc["token_segment"].max() + 1 <= 2
            firsts.add(int(doc["token_word"][1]))
            for s, e, c in doc["target"]:
                match = [
                    (s0, e0)
                    for s0, e0, c0 in plain["target"]
                    if c0 == c and plain["token_word"][s0 : e0 + 1].tolist() == doc["token_word"][s : e + 1].tolist()
                ]
                assert (
                    match
                    and doc["tokens"][s : e + 1].tolist() == plain["tokens"][match[0][0] : match[0][1] + 1].tolist()
                )
            assert doc["num_words"] == len(set(doc["token_word"][doc["token_word"] >= 0].tolist()))
    assert len(firsts) > 1  # the window moves between epochs


def test_documents_shared_between_splits_warn_or_stop(wordpiece_data, tmp_path, capsys):
    """The same document in --train and --valid: one warning with the count and the first; refused on request."""
    docs = [{"doc_key": f"d{i}", "sentences": [[f"w{i}", "x"]], "clusters": []} for i in range(3)]
    train = write_jsonl(tmp_path / "train.jsonl", docs)
    renamed = dict(docs[1], doc_key="copy")  # same words under another key
    valid = write_jsonl(tmp_path / "valid.jsonl", [docs[0], renamed, {"doc_key": "new", "sentences": [["y"]]}])
    common = ["--train", train, "--valid", valid, "--tokenizer-from", wordpiece_data]
    assert prepare(common + ["--destdir", str(tmp_path / "warned")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "2 of the 3 --valid documents are also in --train" in warnings[0], warnings
    assert "the first d0" in warnings[0]
    assert prepare(common + ["--destdir", str(tmp_path / "refused"), "--refuse-shared-documents"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--refuse-shared-documents was given" in err, err
    assert not (tmp_path / "refused").exists()


def _coref_encode(word_pieces, sentence_ids, max_segment_length, speakers=None, clusters=(), max_span_width=30):
    """DocumentEncoder.encode on words of the given piece counts (piece ids 10, 11, ...): (arrays, stats)."""
    from collections import Counter

    from spanbert_plugin.coref.conll import CorefDocument
    from spanbert_plugin.coref.prepare import DocumentEncoder

    dictionary = SimpleNamespace(bos=lambda: 0, eos=lambda: 2, unk=lambda: 3)
    encoder = DocumentEncoder(None, dictionary, max_segment_length, max_span_width)
    n = len(word_pieces)
    doc = CorefDocument("nw/x", [f"w{i}" for i in range(n)], np.asarray(sentence_ids, dtype=np.int64),
                        speakers or ["-"] * n, [list(c) for c in clusters], "x:1")
    ids, next_id = [], 10
    for count in word_pieces:
        ids.append(list(range(next_id, next_id + count)))
        next_id += count
    stats = Counter()
    return encoder.encode(doc, ids, stats), stats


def _greedy_segments(sentence_sizes, capacity):
    """Whole sentences packed greedily while they fit (every sentence here fits a segment)."""
    segments, current = [], 0
    for size in sentence_sizes:
        if current + size > capacity:
            segments.append(current)
            current = 0
        current += size
    return [s + 2 for s in segments + [current]]


def test_coref_sentences_that_exactly_fill_a_segment_share_it():
    """--max-segment-length 8 holds 6 pieces: sentences of 3 and 3 pieces make one full segment [CLS] 6 [SEP], then
    4, 2 fill the next; random documents pack as the greedy rule does."""
    out, _ = _coref_encode([1, 2, 3, 2, 2, 2], [0, 0, 1, 2, 2, 3], 8)
    assert out["segment_lengths"].tolist() == [8, 8]
    rng = np.random.default_rng(0)
    for _ in range(20):
        sizes = rng.integers(1, 7, size=15)
        out, _ = _coref_encode(sizes.tolist(), np.arange(15), 8)
        assert out["segment_lengths"].tolist() == _greedy_segments(sizes.tolist(), 6)


def test_coref_every_token_carries_its_own_words_speaker():
    """Speakers change inside a sentence and across sentences: tokens share a speaker value exactly when their
    words share a speaker; [CLS]/[SEP] are -1."""
    speakers = ["ann", "ann", "bob", "bob", "ann", "cy"]
    out, _ = _coref_encode([1, 2, 1, 1, 2, 1], [0, 0, 0, 1, 1, 1], 8, speakers=speakers)
    word, speaker = out["token_word"], out["token_speaker"]
    assert (speaker[word < 0] == -1).all() and (speaker[word >= 0] >= 0).all()
    real = np.flatnonzero(word >= 0)
    for i in real:
        for j in real:
            assert (speaker[i] == speaker[j]) == (speakers[word[i]] == speakers[word[j]])


def test_coref_a_mention_of_exactly_max_span_width_tokens_is_trainable():
    """--max-span-width 3: a mention over 3 word pieces is a training target, one over 4 pieces is not (counted as
    wider than the width)."""
    # words 0..3 of 1, 2, 1, 1 pieces; tokens: [CLS]=0, w0=1, w1=2-3, w2=4, w3=5; (0, 1): tokens 1..3, (0, 2): 1..4
    out, stats = _coref_encode([1, 2, 1, 1], [0, 0, 0, 0], 16, clusters=[[(0, 1), (0, 2)]], max_span_width=3)
    assert out["target"].tolist() == [[1, 3, 0]] and stats["mentions_wider_than_max_span_width"] == 1


def test_coref_a_word_exactly_one_segment_long_is_not_cut_and_sentences_are_counted():
    """Capacity 6: sentences of 1, 10 (words of 2, 6, 2 pieces) and 1 pieces. As c2f-coref's split_into_segments
    (fill 6 pieces, back off to a sentence end, else to a word end): [1] [2] [6] [2 + 1]; the 6-piece word fills a
    segment whole, so no word is cut inside. Three sentences are counted as three."""
    out, stats = _coref_encode([1, 2, 6, 2, 1], [0, 1, 1, 1, 2], 8)
    assert out["segment_lengths"].tolist() == [1 + 2, 2 + 2, 6 + 2, 3 + 2]
    assert stats["cut_sentences"] == 1 and stats["cut_words"] == 0
    assert stats["sentences"] == 3


def _one_sentence_segments(num_segments):
    """Arrays of one document of ``num_segments`` segments [CLS] w w [SEP], one sentence each; one gold mention, the
    first word (cluster 0)."""
    tokens, words, sentences = [], [], []
    for s in range(num_segments):
        tokens += [2, 10 + 2 * s, 11 + 2 * s, 3]
        words += [-1, 2 * s, 2 * s + 1, -1]
        sentences += [s] * 4
    n = len(tokens)
    return {"doc_tokens": np.array([0, n]), "doc_segments": np.array([0, num_segments]), "doc_gold": np.array([0, 1]),
            "doc_target": np.array([0, 1]), "segment_lengths": np.full(num_segments, 4), "tokens": np.array(tokens),
            "token_word": np.array(words), "token_sentence": np.array(sentences), "token_speaker": np.zeros(n, np.int64),
            "gold": np.array([[0, 0, 0]]), "target": np.array([[1, 1, 0]]), "doc_genre": np.array([0]),
            "doc_words": np.array([2 * num_segments])}


def test_span_drop_removes_a_segment_left_without_words():
    """A segment whose one sentence is dropped goes whole: no [CLS] [SEP] row of no words is left in the batch."""
    arrays = _one_sentence_segments(2)
    dropped = 0
    for epoch in range(1, 21):
        ds = CorefDataset(arrays, pad_index=1, span_drop=(0.9, None, "sentence", "drop"), seed=1)
        ds.set_epoch(epoch)
        doc = ds[0]
        if 2 in doc["token_word"].tolist():
            continue
        dropped += 1
        assert doc["tokens"].tolist() == [2, 10, 11, 3] and doc["token_segment"].tolist() == [0, 0, 0, 0]
        assert doc["target"].tolist() == [[1, 1, 0]] and doc["num_words"] == 2
        assert ds.collater([{**doc, "id": 0}])["net_input"]["src_tokens"].tolist() == [[2, 10, 11, 3]]
    assert dropped > 0


def test_training_window_starts_at_every_possible_segment():
    """Three segments, a window of two: it starts at segment 0 or 1 (both drawn over epochs), never beyond."""
    arrays = _one_sentence_segments(3)
    firsts = set()
    for epoch in range(1, 31):
        ds = CorefDataset(arrays, pad_index=1, max_segments=2, seed=1)
        ds.set_epoch(epoch)
        doc = ds[0]
        assert doc["token_segment"].tolist() == [0] * 4 + [1] * 4
        firsts.add(int(doc["token_word"][1]) // 2)
    assert firsts == {0, 1}


def test_a_folder_reads_its_conll_and_json_lines_files_in_name_order(tmp_path):
    """A folder given as a split: its .conll, .gold_conll, .v4_gold_conll, .jsonlines and .jsonl files, sorted by
    path; other files (a README, a .txt) are not documents."""
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "b.v4_gold_conll").write_text("#begin document (b); part 000\nb 0 0 w x x x x x - (0)\n\n#end document\n")
    write_jsonl(folder / "a.jsonl", [{"doc_key": "a", "sentences": [["x"]]}])
    write_jsonl(folder / "c.jsonlines", [{"doc_key": "c", "sentences": [["y"]]}])
    (folder / "README.txt").write_text("not a document\n")
    assert [doc.doc_key for doc in read_split(str(folder), "--train")] == ["a", "(b); part 000", "c"]


@pytest.mark.parametrize("make_spec,message", [
    (lambda t: (t / "empty").mkdir() or str(t / "empty"), "--train {}: a folder without .conll or .jsonlines files"),
    (lambda t: str(t / "*.conll"), "--train {}: the pattern matches no file"),
    (lambda t: str(t / "gone.conll"), "--train {}: no such file or folder"),
    (lambda t: (t / "blank.conll").write_text("\n \n") and str(t / "blank.conll"),
     "{}: empty (expected CoNLL-2012 or JSON lines)"),
])
def test_an_input_that_names_no_document_is_one_line_and_writes_nothing(wordpiece_data, tmp_path, capsys, make_spec,
                                                                         message):
    spec = make_spec(tmp_path)
    dest = tmp_path / "out"
    assert prepare(["--train", spec, "--tokenizer-from", wordpiece_data, "--destdir", str(dest)]) == 1
    assert capsys.readouterr().err == f"spanbert-prepare-coref: error: {message.format(spec)}\n"
    assert not dest.exists()


@pytest.mark.parametrize("args,message", [
    (["--train", "a.jsonl", "--max-segment-length", "7"], "--max-segment-length must be at least 8, got 7"),
    (["--train", "a.jsonl", "--max-span-width", "0"], "--max-span-width must be at least 1, got 0"),
    ([], "give at least one of --train, --valid, --test"),
])
def test_bad_prepare_options_are_one_line_and_write_nothing(wordpiece_data, tmp_path, capsys, args, message):
    write_jsonl(tmp_path / "a.jsonl", [{"doc_key": "d", "sentences": [["x"]]}])
    args = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in args]
    dest = tmp_path / "out"
    assert prepare([*args, "--tokenizer-from", wordpiece_data, "--destdir", str(dest)]) == 1
    assert capsys.readouterr().err == f"spanbert-prepare-coref: error: {message}\n"
    assert not dest.exists()


def test_documents_shared_by_valid_and_test_without_train_are_not_checked():
    """The check compares --valid and --test with --train only: without --train there is nothing to leak from."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.coref.conll import CorefDocument
    from spanbert_plugin.coref.prepare import check_shared_documents

    doc = CorefDocument("d", ["x"], np.zeros(1, np.int64), ["-"], [], "a.jsonl:1")
    check_shared_documents({"valid": [doc], "test": [doc]}, refuse=True)  # no UsageError
    with pytest.raises(UsageError, match="1 of the 1 --valid documents are also in --train"):
        check_shared_documents({"train": [doc], "valid": [doc]}, refuse=True)


@pytest.mark.parametrize("stats,expected", [
    (None, False),  # no prepare_stats.json either: no singleton known
    ({"train": {"singletons": 0}, "valid": {"singletons": 3}}, False),  # the training split decides
    ({"train": {"singletons": 2}}, True),
    ({"valid": {"singletons": 0}, "test": {"singletons": 1}}, True),  # without a training split: any split
    ({"valid": {"documents": 4}}, False),  # stats written before singletons were counted
])
def test_a_folder_prepared_before_coref_meta_counted_singletons_reads_them_from_its_stats(tmp_path, stats, expected):
    from spanbert_plugin.coref.prepare import data_has_singletons

    if stats is not None:
        (tmp_path / "prepare_stats.json").write_text(json.dumps(stats))
    assert data_has_singletons(str(tmp_path), {"max_segment_length": 384}) is expected


def test_documents_of_a_split_that_was_not_prepared_are_one_line(tmp_path):
    from spanbert_plugin.core.errors import UsageError

    with pytest.raises(UsageError) as caught:
        load_documents(str(tmp_path), "test")
    assert str(caught.value) == f"{tmp_path / 'test.docs.jsonl'}: no such file; the folder has no split 'test'"


def test_span_drop_mask_mode_masks_whole_unprotected_units_in_place():
    """--span-drop-mode mask: nothing is removed; the tokens of dropped sentences become the mask id, whole
    sentences at a time; [CLS]/[SEP] and the sentence holding a gold mention (the first) never are."""
    arrays = _one_sentence_segments(4)
    plain = CorefDataset(arrays, pad_index=1)[0]
    masked_sentences = set()
    for epoch in range(1, 11):
        ds = CorefDataset(arrays, pad_index=1, span_drop=(0.5, None, "sentence", "mask"), mask_index=99, seed=1)
        ds.set_epoch(epoch)
        doc = ds[0]
        for key in ("token_word", "token_sentence", "token_segment", "target"):
            assert np.array_equal(doc[key], plain[key]), key
        masked = doc["tokens"] == 99
        assert np.array_equal(doc["tokens"][~masked], plain["tokens"][~masked])
        assert not masked[plain["token_word"] < 0].any() and not masked[plain["token_sentence"] == 0].any()
        real = plain["token_word"] >= 0
        for sentence in range(1, 4):
            words = real & (plain["token_sentence"] == sentence)
            assert masked[words].all() or not masked[words].any()  # a sentence is masked whole or not at all
            if masked[words].all():
                masked_sentences.add(sentence)
    assert masked_sentences == {1, 2, 3}


def test_a_data_parallel_worker_left_without_a_document_gets_an_empty_batch(wordpiece_data, tmp_path):
    """Three documents over two workers: fairseq pads the second worker's shard with an empty batch, which the
    collater turns into {} (fairseq's dummy batch) rather than failing."""
    from spanbert_plugin.coref.task import CoreferenceConfig, CoreferenceTask

    docs = [{"doc_key": f"d{i}", "sentences": [[f"w{i}", "x"]]} for i in range(3)]
    dest = str(tmp_path / "d")
    assert prepare(["--train", write_jsonl(tmp_path / "a.jsonl", docs), "--tokenizer-from", wordpiece_data,
                    "--destdir", dest]) == 0
    task = CoreferenceTask.setup_task(CoreferenceConfig(data=dest))
    task.load_dataset("train", training=False)
    shards = [list(task.get_batch_iterator(task.dataset("train"), num_shards=2, shard_id=shard,
                                           disable_iterator_cache=True).next_epoch_itr(shuffle=False))
              for shard in (0, 1)]
    assert [[batch["id"].tolist() if batch else batch for batch in shard] for shard in shards] == [[[0], [2]],
                                                                                                  [[1], {}]]


def test_json_lines_speakers_are_read_per_word_and_written_into_the_speaker_column(tmp_path):
    """c2f-coref's ``speakers`` (one per word): each word keeps its own, and the CoNLL lines synthesised for the
    scorer carry it in column 10, so they read back with the same speakers and clusters."""
    record = {"doc_key": "bc/cctv/00/cctv_0000_0", "sentences": [["Hi", "Bob"], ["Hi", "Ann", "."]],
              "speakers": [["Ann", "Ann"], ["Bob", "Bob", "Bob"]], "clusters": [[[1, 1], [4, 4]], [[3, 3], [0, 0]]]}
    [doc] = read_split(write_jsonl(tmp_path / "a.jsonl", [record]), "--train")
    assert doc.speakers == ["Ann", "Ann", "Bob", "Bob", "Bob"]
    assert doc.sentence_ids.tolist() == [0, 0, 1, 1, 1]
    assert doc.clusters == [[(0, 0), (3, 3)], [(1, 1), (4, 4)]]
    assert [doc.lines[i].split("\t")[9] for i in doc.token_lines] == doc.speakers
    [again] = read_conll("gold.conll", "\n".join(doc.lines) + "\n")
    assert again.speakers == doc.speakers and again.clusters == doc.clusters and again.words == doc.words


def test_json_lines_empty_clusters_are_dropped_and_do_not_shift_the_others(tmp_path):
    """An empty cluster ``[]`` names no mention: it is skipped, not kept as a cluster of no spans."""
    record = {"doc_key": "d", "sentences": [["a", "b", "c"]], "clusters": [[], [[0, 0], [2, 2]], []]}
    [doc] = read_split(write_jsonl(tmp_path / "a.jsonl", [record]), "--train")
    assert doc.clusters == [[(0, 0), (2, 2)]]
    assert [doc.lines[i].split("\t")[-1] for i in doc.token_lines] == ["(0)", "-", "(0)"]


def test_conll_blank_lines_between_documents_are_skipped(tmp_path):
    """Blank lines before the first ``#begin document`` and between documents belong to no document."""
    text = ("\n#begin document (a); part 000\na 0 0 x _ _ _ _ _ _ _ _ (0)\na 0 1 y _ _ _ _ _ _ _ _ (0)\n\n"
            "#end document\n\n\n#begin document (b); part 000\nb 0 0 z _ _ _ _ _ _ _ _ -\n\n#end document\n")
    first, second = read_conll("a.conll", text)
    assert (first.doc_key, first.words, first.clusters) == ("(a); part 000", ["x", "y"], [[(0, 0), (1, 1)]])
    assert (second.doc_key, second.words, second.clusters) == ("(b); part 000", ["z"], [])
    assert first.lines[-1] == second.lines[-1] == "#end document" and second.lines[0].startswith("#begin")
    assert first.lines[0].startswith("#begin") and len(second.lines) == 4

