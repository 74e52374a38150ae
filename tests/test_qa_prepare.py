"""spanbert-prepare-qa: windows, labels and max-context flags against a per-question reference,
SQuAD / MRQA(.gz) readers, stats, every bad input, and the real SQuAD 1.1 dev set."""
import gzip
import json
import os
import random

import numpy as np
import pytest

from conftest import bert_uncased_tokenizer, bin_path, require_shared_data, run_cli, shared_path
from spanbert_plugin.cli.prepare_qa import main
from spanbert_plugin.core.finetune_io import load_tokenizer_folder
from spanbert_plugin.qa.prepare import QAConfig, featurize, read_qa_file
from spanbert_plugin.qa.windows import QASplit

BERT_VOCAB = shared_path("bert_uncased_vocab", "vocab.txt")
SQUAD_DEV = shared_path("squad", "dev-v1.1.json")

# words with accents, CJK, ligatures and punctuation; separators with tabs, newlines and unicode spaces
WORDS = ["river", "bank", "Zürich", "café", "naïve", "東京", "straße", "résumé", "Ærøskøbing", "ﬁnal", "1,234",
         "(note)", "end.", "co-op", "don't", "the", "of", "a", "x", "Ωmega", "—", "über", "ÉCOLE", "data"]
SEPARATORS = [" ", " ", " ", " ", "  ", "\t", "\n", "\u00a0", " \u3000 ", " \n\n "]
CONFIG = QAConfig(max_seq_length=40, doc_stride=7, max_query_length=8)


def make_passage(rng, n_words):
    """A passage with odd white space (leading too) and the character span of every word."""
    text, spans = rng.choice(["", "  \n", "\t "]), []
    for i in range(n_words):
        if i:
            text += rng.choice(SEPARATORS)
        word = rng.choice(WORDS)
        spans.append((len(text), len(text) + len(word)))
        text += word
    return text, spans


def generated_examples(seed=0, impossible=True):
    """Paragraphs of (context, [question dicts]) with answers at every place, several golds, unanswerables."""
    rng = random.Random(seed)
    paragraphs = []
    for p, n_words in enumerate([90, 45, 8]):  # many windows, a few windows, one window
        context, spans = make_passage(rng, n_words)
        qas = []
        for k, first in enumerate(range(0, n_words, 2 if n_words > 10 else 1)):  # answers start at every other word
            last = min(n_words - 1, first + rng.randint(0, 3))
            start, end = spans[first][0], spans[last][1]
            golds = [{"text": context[start:end], "answer_start": start}]
            if last + 1 < n_words:  # a second, longer gold answer with the same start
                golds.append({"text": context[start: spans[last + 1][1]], "answer_start": start})
            length = rng.choice([2, 5, 12])  # 12 words exceed max_query_length 8: truncated
            question = " ".join(rng.choice(WORDS) for _ in range(length)) + " ?"
            qas.append({"id": f"p{p}q{k}", "question": question, "answers": golds})
        if impossible:
            qas.append({"id": f"p{p}none", "question": "Where is nothing ?", "answers": [], "is_impossible": True,
                        "plausible_answers": [{"text": context[spans[0][0]: spans[0][1]], "answer_start": spans[0][0]}]})
        paragraphs.append({"context": context, "qas": qas})
    return paragraphs


def write_squad(path, paragraphs, version="v2.0"):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": version, "data": [{"title": "generated", "paragraphs": paragraphs}]}, f, ensure_ascii=False)
    return str(path)


def write_mrqa(path, paragraphs, compress=True):
    """The same questions as MRQA JSON lines: detected_answers with inclusive character ends."""
    lines = [json.dumps({"header": {"dataset": "generated", "split": "dev"}})]
    for i, paragraph in enumerate(paragraphs):
        qas = []
        for qa in paragraph["qas"]:
            if qa.get("is_impossible"):
                continue
            detected = [{"text": g["text"], "char_spans": [[g["answer_start"], g["answer_start"] + len(g["text"]) - 1]]}
                        for g in qa["answers"]]
            qas.append({"qid": qa["id"], "question": qa["question"], "answers": [g["text"] for g in qa["answers"]],
                        "detected_answers": detected})
        lines.append(json.dumps({"id": f"ctx{i}", "context": paragraph["context"], "qas": qas}, ensure_ascii=False))
    data = ("\n".join(lines) + "\n").encode("utf-8")
    with open(path, "wb") as f:
        f.write(gzip.compress(data) if compress else data)
    return str(path)


def reference_windows(qa, tokenizer, bos, eos, config):
    """BERT's procedure question by question with plain loops: list of window dicts per question."""
    result = []
    for q, question in enumerate(qa.questions):
        enc = tokenizer.encode(qa.contexts[question["context_index"]])
        ids, offsets = list(enc.ids), enc.offsets
        q_ids = list(tokenizer.encode(question["question"]).ids)[: config.max_query_length]
        capacity = config.max_seq_length - len(q_ids) - 3
        spans, start = [], 0
        while True:
            length = min(capacity, len(ids) - start)
            spans.append((start, length))
            if start + length >= len(ids):
                break
            start += config.doc_stride
        first = last = None
        a_start, a_end = int(qa.answer_start[q]), int(qa.answer_end[q])
        if a_start >= 0:
            first = next((i for i, (s, e) in enumerate(offsets) if e > a_start), None)
            last = max((i for i, (s, e) in enumerate(offsets) if s < a_end), default=None)
        windows = []
        for w, (start, length) in enumerate(spans):
            offset = len(q_ids) + 2
            label = (0, 0)
            if first is not None and last is not None and start <= first <= last < start + length:
                label = (offset + first - start, offset + last - start)
            flags = []
            for pos in range(start, start + length):
                # exact form of min(left, right) + 0.01 * length; the first best window wins ties
                scores = [100 * min(pos - s, s + n - 1 - pos) + n if s <= pos < s + n else -1 for s, n in spans]
                flags.append(int(np.argmax(scores)) == w)
            windows.append({"tokens": [bos] + q_ids + [eos] + ids[start: start + length] + [eos], "label": label,
                            "chars": offsets[start: start + length], "max_context": flags, "offset": offset})
        result.append(windows)
    return result


def assert_one_max_context_per_token(split, doc_stride):
    """Every passage token of every question is flagged in exactly one of the question's windows."""
    lengths = split.passage_lengths()
    rank = np.arange(split.num_windows) - split.question_bounds()[split.question_index]
    within = np.arange(int(lengths.sum())) - np.repeat(split.token_offsets[:-1], lengths)
    key = np.repeat(split.question_index, lengths) * 1_000_000 + np.repeat(rank * doc_stride, lengths) + within
    flagged = key[split.max_context]
    assert len(np.unique(flagged)) == len(flagged) == len(np.unique(key))


@pytest.fixture(scope="module")
def bert_uncased(tmp_path_factory):
    """A tokenizer folder with Google's BERT uncased vocabulary (lower-casing WordPiece)."""
    tokenizer, dictionary = bert_uncased_tokenizer()
    folder = tmp_path_factory.mktemp("bert_uncased")
    tokenizer.save(str(folder))
    dictionary.save(str(folder / "dict.txt"))
    return str(folder)


@pytest.fixture(scope="module")
def squad_file(tmp_path_factory):
    return write_squad(tmp_path_factory.mktemp("qa_gen") / "gen.json", generated_examples())


@pytest.mark.parametrize("which", ["wordpiece_data", "spm_data", "bert_uncased"])
def test_windows_labels_and_flags_match_reference(which, request, squad_file):
    tokenizer, dictionary = load_tokenizer_folder(request.getfixturevalue(which))
    qa = read_qa_file(squad_file)
    features = featurize(qa, tokenizer, dictionary.bos_index, dictionary.eos_index, CONFIG, training=False)
    split, tokens, window_offsets = features.split, features.tokens, features.window_offsets
    reference = reference_windows(qa, tokenizer, dictionary.bos_index, dictionary.eos_index, CONFIG)

    assert split.num_windows == sum(len(r) for r in reference) > 3 * split.num_questions  # many multi-window passages
    expected = [w for windows in reference for w in windows]
    starts, ends = split.start_positions, split.end_positions
    for w, ref in enumerate(expected):
        window = tokens[window_offsets[w]: window_offsets[w + 1]]
        assert window.tolist() == ref["tokens"] and len(window) <= CONFIG.max_seq_length
        assert (int(starts[w]), int(ends[w])) == ref["label"]
        assert split.passage_offset[w] == ref["offset"]
        piece = slice(split.token_offsets[w], split.token_offsets[w + 1])
        assert list(zip(split.char_start[piece].tolist(), split.char_end[piece].tolist())) == [tuple(c) for c in ref["chars"]]
        assert split.max_context[piece].tolist() == ref["max_context"]
    assert split.question_index.tolist() == [q for q, windows in enumerate(reference) for _ in windows]

    # properties that do not depend on the reference
    assert_one_max_context_per_token(split, CONFIG.doc_stride)
    cut = 0
    for q, question in enumerate(qa.questions):
        windows = split.windows_of(q)
        if question["is_impossible"]:
            assert not starts[windows].any() and not ends[windows].any()
            continue
        context = qa.contexts[question["context_index"]]
        a_start, a_end = int(qa.answer_start[q]), int(qa.answer_end[q])
        assert context[a_start:a_end] == question["answers"][0]
        holds = 0
        for w in range(windows.start, windows.stop):
            piece = slice(split.token_offsets[w], split.token_offsets[w + 1])
            chars_start, chars_end = split.char_start[piece], split.char_end[piece]
            inside = chars_start.min() <= a_start and chars_end.max() >= a_end  # answers are whole words
            if starts[w] == 0:
                assert not inside
                cut += bool(chars_end.max() > a_start and chars_start.min() < a_end)  # the window cuts the answer
                continue
            holds += 1
            s, e = piece.start + starts[w] - split.passage_offset[w], piece.start + ends[w] - split.passage_offset[w]
            # label tokens span the answer, and their first/last token reach into it
            assert split.char_start[s] <= a_start < split.char_end[s] and split.char_start[e] < a_end <= split.char_end[e]
            assert question["answers"][0] in context[split.char_start[s]: split.char_end[e]]
        # an answer no longer than the overlap of two windows is held whole by at least one window
        offsets = tokenizer.encode(context).offsets
        answer_tokens = sum(1 for b, e in offsets if e > a_start and b < a_end)
        capacity = CONFIG.max_seq_length - (split.passage_offset[windows.start] - 2) - 3
        assert holds >= 1 or answer_tokens > capacity - CONFIG.doc_stride + 1
    assert cut > 10  # answers across window boundaries were exercised


def test_prepared_folder_stats_and_warnings(wordpiece_data, tmp_path, capsys):
    paragraphs = generated_examples(seed=1)
    context = paragraphs[1]["context"]
    double = context.index("  ") if "  " in context else None
    extra = [
        # first gold does not match the context, the second does: trains on the second
        {"id": "bad_first", "question": "which ?", "answers": [{"text": "nowhere", "answer_start": 3},
                                                               paragraphs[1]["qas"][0]["answers"][0]]},
        # the only gold does not match: left out of training
        {"id": "bad_only", "question": "which ?", "answers": [{"text": "zzz", "answer_start": 0}]},
        # a gold answer of white space only covers no token: left out of training
        {"id": "blank", "question": "which ?", "answers": [{"text": context[double: double + 2], "answer_start": double}]},
    ]
    assert double is not None
    paragraphs[1]["qas"].extend(extra)
    train = write_squad(tmp_path / "train.json", paragraphs)
    valid = write_mrqa(tmp_path / "valid.jsonl.gz", generated_examples(seed=2, impossible=False))
    dest = tmp_path / "out"
    assert main(["--train", train, "--valid", valid, "--tokenizer-from", wordpiece_data, "--destdir", str(dest),
                 "--max-seq-length", "40", "--doc-stride", "7", "--max-query-length", "8"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "bad_only" in err

    stats = json.load(open(dest / "prepare_stats.json"))
    n_train = sum(len(p["qas"]) for p in paragraphs)
    long_questions = sum(len(qa["question"].split()) > 8 for p in paragraphs for qa in p["qas"])
    assert stats["train"]["format"] == "squad2" and stats["valid"]["format"] == "mrqa"
    assert stats["train"]["questions"] == n_train
    assert stats["train"]["unanswerable_questions"] == 3
    assert stats["train"]["answers_not_matching_context"] == 2
    assert stats["train"]["answers_not_aligned"] == 1
    assert stats["train"]["questions_without_label"] == stats["train"]["questions_left_out"] == 2
    assert stats["train"]["truncated_questions"] >= long_questions > 0  # a 12-word question has > 8 tokens
    assert stats["valid"]["questions_left_out"] == 0 and stats["valid"]["unanswerable_questions"] == 0

    config = json.load(open(dest / "qa_config.json"))
    assert (config["max_seq_length"], config["doc_stride"], config["max_query_length"]) == (40, 7, 8)
    assert config["tokenizer"] == "wordpiece"
    for name in ("dict.txt", "vocab.txt", "spanbert_tokenizer.json", "train.bin", "train.idx", "valid.bin", "valid.idx"):
        assert os.path.isfile(dest / name), name

    from fairseq.data import data_utils
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    dictionary = SpanBertDictionary.load(str(dest / "dict.txt"))
    for split_name, n_questions in (("train", n_train - 2), ("valid", stats["valid"]["questions"])):
        split = QASplit.load(str(dest), split_name)
        items = data_utils.load_indexed_dataset(str(dest / split_name), dictionary, "mmap")
        assert len(items) == split.num_windows == stats[split_name]["windows"]
        assert split.num_questions == n_questions
        lengths = np.array([len(items[w]) for w in range(len(items))])
        assert (lengths == split.passage_offset + split.passage_lengths() + 1).all() and lengths.max() <= 40
        assert all(items[w][0] == dictionary.bos_index and items[w][-1] == dictionary.eos_index for w in range(len(items)))
    train_split = QASplit.load(str(dest), "train")
    ids = [q["id"] for q in train_split.questions]
    assert "bad_first" in ids and "bad_only" not in ids and "blank" not in ids
    assert train_split.format == "squad2" and train_split.with_negative
    valid_split = QASplit.load(str(dest), "valid")
    assert valid_split.format == "mrqa" and not valid_split.with_negative
    # one value per passage token per window: stored as int32 (half the file), read back as int64
    with np.load(dest / "valid.windows.npz") as stored:
        for name in ("char_start", "char_end", "sentence_ids"):
            assert stored[name].dtype == np.int32 and getattr(valid_split, name).dtype == np.int64
            assert np.array_equal(stored[name], getattr(valid_split, name))
    assert (valid_split.char_end > valid_split.char_start).all()
    with_two = [q for q in valid_split.questions if len(q["answers"]) == 2]
    assert with_two, "several gold answers are kept for evaluation"


def test_mrqa_gz_gives_the_same_windows_as_squad(wordpiece_data, tmp_path):
    paragraphs = generated_examples(seed=3, impossible=False)
    tokenizer, dictionary = load_tokenizer_folder(wordpiece_data)
    results = []
    for path in (write_squad(tmp_path / "a.json", paragraphs, version="1.1"),
                 write_mrqa(tmp_path / "a.jsonl.gz", paragraphs),
                 write_mrqa(tmp_path / "a.jsonl", paragraphs, compress=False)):
        qa = read_qa_file(path)
        results.append((qa, featurize(qa, tokenizer, dictionary.bos_index, dictionary.eos_index, CONFIG, training=True)))
    (squad, a), (mrqa, b), (plain, c) = results
    assert (squad.format, mrqa.format, plain.format) == ("squad1", "mrqa", "mrqa")
    assert [q["id"] for q in squad.questions] == [q["id"] for q in mrqa.questions]
    assert [q["answers"] for q in squad.questions] == [q["answers"] for q in mrqa.questions]
    for other in (b, c):
        assert np.array_equal(a.tokens, other.tokens)
        for name in ("start_positions", "end_positions", "max_context", "char_start", "char_end"):
            assert np.array_equal(getattr(a.split, name), getattr(other.split, name)), name
    assert (a.split.start_positions > 0).sum() >= len(squad.questions)


def test_mrqa_detected_texts_match_their_spans_up_to_normalisation(tmp_path):
    """MRQA's detected_answers[].text is "<normalized answer string>" (its README): TriviaQA's spans carry aliases
    such as "dr no" for "Dr. No", and run_mrqa.py trains on the earliest span whatever its text. Such questions were
    left out of training as not matching; a span that is an MRQA marker, or another text, still is no label."""
    context = ("[DOC] [TLE] Dr. No (film) [PAR] Dr. No is a 1962 spy film with Sean Connery. Its author lived at "
               "St. Margaret's Bay. Doc Holliday is not in it.")

    def span(text, occurrence=0):
        at = -1
        for _ in range(occurrence + 1):
            at = context.index(text, at + 1)
        return [at, at + len(text) - 1]

    questions = {"film": ("dr no", [span("Dr. No", 1), span("Dr. No")]), "actor": ("sean connery", [span("Sean Connery")]),
                 "home": ("st margaret s bay", [span("St. Margaret's Bay")]), "doc": ("doc", [span("[DOC]"), span("Doc")]),
                 "wrong": ("perth", [span("Sean Connery")])}
    qas = [{"qid": qid, "question": f"What is {qid}?", "answers": [text],
            "detected_answers": [{"text": text, "char_spans": spans}]} for qid, (text, spans) in questions.items()]
    path = tmp_path / "trivia.jsonl"
    path.write_text(json.dumps({"header": {"dataset": "TriviaQA-web"}}) + "\n"
                    + json.dumps({"context": context, "qas": qas}) + "\n", encoding="utf-8")
    qa = read_qa_file(str(path))
    labels = {q["id"]: context[s:e] if s >= 0 else None
              for q, s, e in zip(qa.questions, qa.answer_start.tolist(), qa.answer_end.tolist())}
    assert labels == {"film": "Dr. No", "actor": "Sean Connery", "home": "St. Margaret's Bay", "doc": "Doc",
                      "wrong": None}
    assert [m.split(": ", 2)[2] for m in qa.mismatches] == [
        "answer 'doc' does not match the context at character 0 (found '[DOC]')",
        "answer 'perth' does not match the context at character 63 (found 'Sean Connery')"]


def test_an_answer_in_another_unicode_normal_form_than_its_context_is_said_to_be(tmp_path):
    """A decomposed context (e + U+0301) and a precomposed answer print the same: the warning says which form differs."""
    context = "We ate at the cafe\u0301 in Rene\u0301's street."
    qas = [{"id": "nfc", "question": "Where?", "answers": [{"text": "caf\u00e9", "answer_start": 14}]},
           {"id": "nfd", "question": "Where?", "answers": [{"text": "cafe\u0301", "answer_start": 14}]},
           {"id": "other", "question": "Who?", "answers": [{"text": "Anna", "answer_start": 23}]}]
    path = tmp_path / "nfd.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
    qa = read_qa_file(str(path))
    assert [q["id"] for q, s in zip(qa.questions, qa.answer_start.tolist()) if s >= 0] == ["nfd"]
    nfc, other = qa.mismatches
    assert "answer 'café' does not match the context at character 14 (found 'cafe'); the context holds it in Unicode " \
           "NFD form, the answer in another" in nfc
    assert other.endswith("(found 'Rene')")  # a plain mismatch: no hint


def test_questions_without_answers_and_without_the_flag_are_unanswerable(wordpiece_data, tmp_path, capsys):
    """The official v2.0 script never reads is_impossible: empty answers are NoAns. Such a file (a converted SQuAD 2.0,
    say) was refused; it now reads as with the flag, with a warning that counts them."""
    flagged = generated_examples(seed=5)
    unflagged = json.loads(json.dumps(flagged))
    count = 0
    for paragraph in unflagged:
        for qa in paragraph["qas"]:
            if qa.pop("is_impossible", False):
                qa.pop("plausible_answers", None)
                count += 1
    paragraphs_of = {"flagged": flagged, "unflagged": unflagged}
    tokenizer, dictionary = load_tokenizer_folder(wordpiece_data)
    read = {}
    for name, paragraphs in paragraphs_of.items():
        qa = read_qa_file(write_squad(tmp_path / f"{name}.json", paragraphs, version="1.1"))
        read[name] = (qa, featurize(qa, tokenizer, dictionary.bos_index, dictionary.eos_index, CONFIG, training=True))
    warning = capsys.readouterr().err
    assert count > 0 and f"{count} question(s) have no answers and no 'is_impossible: true'" in warning
    (a, fa), (b, fb) = read["flagged"], read["unflagged"]
    assert a.format == b.format == "squad2"
    assert [q["answers"] for q in a.questions] == [q["answers"] for q in b.questions]
    assert np.array_equal(fa.tokens, fb.tokens)
    for name in ("start_positions", "end_positions"):
        assert np.array_equal(getattr(fa.split, name), getattr(fb.split, name)), name


def test_strict_refuses_a_mismatched_answer(wordpiece_data, tmp_path, capsys):
    paragraphs = generated_examples(seed=4)
    paragraphs[0]["qas"][0]["answers"][0]["answer_start"] += 1
    path = write_squad(tmp_path / "t.json", paragraphs)
    dest = tmp_path / "out"
    code = main(["--train", path, "--tokenizer-from", wordpiece_data, "--destdir", str(dest), "--strict"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "p0q0" in err[0] and "does not match" in err[0]
    assert not dest.exists() and os.listdir(tmp_path) == ["t.json"]


def _squad_with(tmp_path, edit):
    paragraphs = generated_examples(seed=5)
    edit(paragraphs)
    return write_squad(tmp_path / "in.json", paragraphs)


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


BAD_INPUTS = {
    "not_json": (lambda t: ["--train", _write(t, "x.json", "this is { not json\n")], "not JSON"),
    "neither_format": (lambda t: ["--train", _write(t, "x.json", json.dumps({"version": "1.1", "articles": []}))],
                       "neither SQuAD"),
    "bad_jsonl_line": (lambda t: ["--train", _write(t, "x.jsonl", '{"header": {}}\n{"context": "a b", "qas": []}\n{oops\n')],
                       "x.jsonl:3"),
    "missing_id": (lambda t: ["--train", _squad_with(t, lambda p: p[0]["qas"][1].pop("id"))], "has no 'id'"),
    "duplicate_id": (lambda t: ["--train", _squad_with(t, lambda p: p[1]["qas"][0].update(id="p0q0"))],
                     "question id p0q0: duplicate"),
    "duplicate_id_mrqa": (lambda t: ["--valid", _write(t, "x.jsonl", "\n".join([
        '{"header": {}}',
        json.dumps({"context": "a b c", "qas": [{"qid": "q", "question": "?", "answers": ["a"],
                                                   "detected_answers": [{"text": "a", "char_spans": [[0, 0]]}]}]}),
        json.dumps({"context": "d e f", "qas": [{"qid": "q", "question": "?", "answers": ["d"],
                                                   "detected_answers": [{"text": "d", "char_spans": [[0, 0]]}]}]})]))],
                          "x.jsonl:3: question id q: duplicate question id (first seen on line 2)"),
    "empty_context": (lambda t: ["--train", _squad_with(t, lambda p: p[2].update(context=" \n "))], "empty context"),
    "seq_not_above_query": (lambda t: ["--train", _squad_with(t, lambda p: None), "--max-seq-length", "67"],
                            "--max-seq-length"),
    "stride_zero": (lambda t: ["--train", _squad_with(t, lambda p: None), "--doc-stride", "0"], "--doc-stride"),
    "stride_too_wide": (lambda t: ["--train", _squad_with(t, lambda p: None), "--max-seq-length", "100",
                                   "--doc-stride", "34"], "between 1 and 33"),
    "tokenizer_folder_empty": (lambda t: ["--train", _squad_with(t, lambda p: None), "--tokenizer-from", str(t)],
                               "dict.txt"),
    "tokenizer_files_missing": (lambda t: ["--train", _squad_with(t, lambda p: None), "--tokenizer-from",
                                           _tokenizer_without_vocab(t)], "vocab.txt"),
    "no_input_file": (lambda t: ["--tokenizer-from", "."], "--train"),
    "query_length_zero": (lambda t: ["--train", _squad_with(t, lambda p: None), "--max-query-length", "0"],
                          "error: --max-query-length must be at least 1, got 0"),
    "empty_file": (lambda t: ["--train", _write(t, "x.json", " \n\t\n")], "x.json: file is empty"),
    "mrqa_header_only": (lambda t: ["--train", _write(t, "x.jsonl", '{"header": {"dataset": "d"}}\n')],
                         "x.jsonl: MRQA header line but no context lines"),
    "context_not_string": (lambda t: ["--train", _squad_with(t, lambda p: p[0].update(context=["a", "b"]))],
                           "in.json: question id p0q0: context is not a string"),
    "question_not_object": (lambda t: ["--train", _squad_with(t, lambda p: p[0]["qas"].insert(1, "Where?"))],
                            "in.json: question 2 of the file is not a JSON object"),
    "question_text_missing": (lambda t: ["--train", _squad_with(t, lambda p: p[0]["qas"][0].pop("question"))],
                              "in.json: question id p0q0: 'question' is missing or not a string"),
    "no_questions": (lambda t: ["--train", _write(t, "x.json", json.dumps(
        {"version": "1.1", "data": [{"paragraphs": [{"context": "a b", "qas": []}]}]}))], "x.json: no questions"),
    "no_paragraphs": (lambda t: ["--train", _write(t, "x.json", json.dumps({"data": [{"title": "t"}]}))],
                      "x.json: data[0] has no paragraphs list (not SQuAD)"),
    "no_qas": (lambda t: ["--train", _write(t, "x.json", json.dumps({"data": [{"paragraphs": [{"context": "a"}]}]}))],
               "x.json: data[0].paragraphs[0]: no qas list (not SQuAD)"),
    "not_mrqa_record": (lambda t: ["--valid", _write(t, "x.jsonl", '{"header": {}}\n["a b", []]\n')],
                        "x.jsonl:2: neither an MRQA header nor an object with context and qas[] (not MRQA)"),
    "mrqa_answers_not_strings": (lambda t: ["--valid", _mrqa(t, answers=[["a"]])],
                                 "x.jsonl:2: question id q: 'answers' must be a list of strings"),
    "mrqa_no_detected_answers": (lambda t: ["--valid", _mrqa(t, detected_answers=[])],
                                 "x.jsonl:2: question id q: 'detected_answers' is missing or empty"),
    "mrqa_bad_detected_answer": (lambda t: ["--valid", _mrqa(t, detected_answers=[{"text": "a", "char_spans": [[0]]}])],
                                 "x.jsonl:2: question id q: detected_answers need 'text' and 'char_spans' "
                                 "[[start, end], ...]"),
    # the answer is what the context holds there, but only white space: no token to label with --strict
    "strict_answer_without_token": (lambda t: ["--train", _write(t, "x.json", json.dumps({"version": "1.1", "data": [
        {"paragraphs": [{"context": "river  bank", "qas": [
            {"id": "q1", "question": "where?", "answers": [{"text": " ", "answer_start": 5}]}]}]}]})), "--strict"],
                                    "x.json: question id q1: answer ' ' at character 5 covers no token (e.g. only "
                                    "white space); without --strict such answers are counted and left out of training"),
}


def _mrqa(tmp_path, **qa):
    """An MRQA file of one context and one question, its fields replaced by ``qa``."""
    question = {"qid": "q", "question": "?", "answers": ["a"], "detected_answers": [{"text": "a", "char_spans": [[0, 0]]}]}
    return _write(tmp_path, "x.jsonl", '{"header": {}}\n' + json.dumps({"context": "a b c", "qas": [{**question, **qa}]}))


def _tokenizer_without_vocab(tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "dict.txt").write_text("[PAD] 1\n[UNK] 1\n[CLS] 1\n[SEP] 1\n[MASK] 1\n", encoding="utf-8")
    (folder / "spanbert_tokenizer.json").write_text('{"type": "wordpiece", "lowercase": false}', encoding="utf-8")
    return str(folder)


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_writes_nothing(case, wordpiece_data, tmp_path, capsys):
    make_args, expected = BAD_INPUTS[case]
    args = make_args(tmp_path)
    if "--tokenizer-from" not in args:
        args += ["--tokenizer-from", wordpiece_data]
    dest = tmp_path / "out"
    before = sorted(os.listdir(tmp_path))
    assert main(args + ["--destdir", str(dest)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spanbert-prepare-qa: error: ") and expected in err[0], err
    assert not dest.exists() and sorted(os.listdir(tmp_path)) == before


def test_console_command_and_force(wordpiece_data, squad_file, tmp_path, capsys):
    dest = str(tmp_path / "out")
    args = ["--valid", squad_file, "--tokenizer-from", wordpiece_data, "--destdir", dest,
            "--max-seq-length", "64", "--doc-stride", "16", "--max-query-length", "16"]
    run_cli([bin_path("spanbert-prepare-qa"), *args])
    with open(squad_file, encoding="utf-8") as f:
        n_questions = sum(len(p["qas"]) for p in json.load(f)["data"][0]["paragraphs"])
    assert json.load(open(os.path.join(dest, "prepare_stats.json")))["valid"]["questions"] == n_questions
    assert main(args) == 1  # an existing destination needs --force
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--force" in err[0]
    assert main(args + ["--force"]) == 0


def test_squad_dev_with_bert_uncased(bert_uncased, tmp_path):
    """All 10,570 questions of the real SQuAD 1.1 dev set, 384-token windows every 128 tokens."""
    require_shared_data("squad/dev-v1.1.json")
    dest = tmp_path / "squad"
    assert main(["--valid", SQUAD_DEV, "--tokenizer-from", bert_uncased, "--destdir", str(dest),
                 "--max-seq-length", "384", "--doc-stride", "128", "--max-query-length", "64"]) == 0
    stats = json.load(open(dest / "prepare_stats.json"))["valid"]
    assert stats["questions"] == 10570 and stats["contexts"] == 2067
    assert stats["windows"] == windows_by_definition(bert_uncased, SQUAD_DEV, QAConfig(384, 128, 64))
    assert stats["answers_not_matching_context"] == stats["answers_not_aligned"] == stats["truncated_questions"] == 0
    split = QASplit.load(str(dest), "valid")
    with open(SQUAD_DEV, encoding="utf-8") as f:
        ids = [qa["id"] for article in json.load(f)["data"] for p in article["paragraphs"] for qa in p["qas"]]
    assert [q["id"] for q in split.questions] == ids
    # every answer is labelled in some window, and labels cover exactly its first gold answer
    labelled = np.flatnonzero(split.start_positions > 0)
    assert len(np.unique(split.question_index[labelled])) == 10570
    base = split.token_offsets[labelled] - split.passage_offset[labelled]
    first_char = split.char_start[base + split.start_positions[labelled]]
    last_char = split.char_end[base + split.end_positions[labelled]]
    for w, s, e in zip(labelled, first_char, last_char):
        question = split.questions[split.question_index[w]]
        assert question["answers"][0] in split.contexts[question["context_index"]][s:e]
    assert_one_max_context_per_token(split, 128)


def windows_by_definition(tokenizer_folder, path, config):
    """Windows of a SQuAD file counted from the definition alone: a passage of n tokens beside a question of
    q tokens (cut to max_query_length) holds c = max_seq_length - q - 3 tokens per window, windows start
    every doc_stride tokens and the one reaching the passage end is the last: 1 + ceil(max(0, n - c) / stride)."""
    tokenizer, _ = load_tokenizer_folder(tokenizer_folder)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)["data"]
    total = 0
    for article in data:
        for paragraph in article["paragraphs"]:
            n = len(tokenizer.encode(paragraph["context"]).ids)
            for qa in paragraph["qas"]:
                q = min(len(tokenizer.encode(qa["question"]).ids), config.max_query_length)
                total += 1 + -(-max(0, n - (config.max_seq_length - q - 3)) // config.doc_stride)
    return total


def load_benchmark(group, name):
    """A script of a benchmarks/ group as a module (its reference recipes are independent of the plugin's code)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", group, name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_squad_dev_windows_tokens_and_labels_equal_the_transformers_recipe(tmp_path):
    """Every 6th article of SQuAD 1.1 dev (8 articles) featurised by us and by transformers' run_qa.py recipe
    (BertTokenizerFast, return_overflowing_tokens with stride = window passage length - doc_stride):
    the same windows per question, token ids and start/end labels."""
    require_shared_data("squad/dev-v1.1.json", "bert_uncased_vocab/vocab.txt")
    from transformers import BertTokenizerFast

    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.tokenization import WordPieceTokenizer

    with open(SQUAD_DEV, encoding="utf-8") as f:
        squad = json.load(f)
    squad["data"] = squad["data"][::6]
    subset = tmp_path / "dev-subset.json"
    subset.write_text(json.dumps(squad), encoding="utf-8")
    bench = load_benchmark("cpu_speed", "qa_prepare_speed")
    settings = type("Settings", (), {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64})
    tokenizer = WordPieceTokenizer(BERT_VOCAB, lowercase=True)
    ours = bench.ours(str(subset), tokenizer, SpanBertDictionary.from_tokenizer(tokenizer), settings)
    reference = bench.transformers_recipe(str(subset), BertTokenizerFast(BERT_VOCAB, do_lower_case=True), settings)
    agreement = bench.compare(ours, reference)
    n_windows = agreement["windows_ours"]
    assert agreement["questions"] > 1500 and n_windows > agreement["questions"]  # some multi-window questions
    assert agreement == {"questions": agreement["questions"], "windows_ours": n_windows,
                         "windows_transformers": n_windows, "questions_with_same_window_count": agreement["questions"],
                         "windows_with_same_tokens": n_windows, "windows_with_same_labels": n_windows}



def test_a_split_without_usable_question_or_with_boolean_offsets_is_refused(wordpiece_data, tmp_path, capsys):
    """No window to train on (every answer unusable) or ``answer_start: true``: one error line, nothing written."""
    def squad(name, answer):
        return write_squad(tmp_path / name, [{"context": "abc def", "qas": [
            {"id": "q1", "question": "what?", "answers": [answer]}]}], version="1.1")

    for path, expected in ((squad("unusable.json", {"text": "zzz", "answer_start": -1}), "no usable question (1 left out"),
                           (squad("boolean.json", {"text": "b", "answer_start": True}), "'answers' must be a list")):
        dest = tmp_path / "out"
        assert main(["--train", str(path), "--tokenizer-from", wordpiece_data, "--destdir", str(dest)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("spanbert-prepare-qa: error: ") and expected in err[-1] and str(path) in err[-1], err
        assert "Traceback" not in "\n".join(err) and not dest.exists()


def test_qa_a_question_of_exactly_max_query_length_tokens_is_not_truncated(tmp_path):
    """Questions of 3, 4 and 5 one-token words with --max-query-length 4: only the 5-token one is cut (to 4 tokens),
    and truncated_questions counts it alone."""
    tokenizer, dictionary = bert_uncased_tokenizer()
    context = "the river bank is near the old city ."
    questions = ["where is river", "where is the river", "where is the old river"]
    assert [len(tokenizer.encode_ids([q])[0]) for q in questions] == [3, 4, 5]
    qas = [{"id": f"q{i}", "question": q, "answers": [{"text": "river bank", "answer_start": 4}]}
           for i, q in enumerate(questions)]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}))
    config = QAConfig(max_seq_length=32, doc_stride=8, max_query_length=4)
    features = featurize(read_qa_file(str(path)), tokenizer, dictionary.bos_index, dictionary.eos_index, config,
                         training=False)
    assert features.stats["truncated_questions"] == 1
    assert features.split.passage_offset.tolist() == [3 + 2, 4 + 2, 4 + 2]  # [CLS] question [SEP]


def test_qa_doc_stride_equal_to_the_window_capacity_is_accepted():
    """--doc-stride may be as large as a window's passage capacity (max_seq_length - max_query_length - 3 = 33 here:
    windows then tile the passage without overlap, skipping nothing); one more is refused."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.qa.prepare import QAConfig, window_layout

    QAConfig(max_seq_length=40, doc_stride=33, max_query_length=4).check()
    with pytest.raises(UsageError, match="between 1 and 33"):
        QAConfig(max_seq_length=40, doc_stride=34, max_query_length=4).check()
    _, _, start, length, _ = window_layout([70], [33], 33)
    assert start.tolist() == [0, 33, 66] and length.tolist() == [33, 33, 4]


def test_qa_split_whose_questions_file_lost_its_last_line_is_damaged(tmp_path):
    """Windows of questions 0 and 1, but questions.jsonl cut after question 0: load names the file as damaged."""
    from spanbert_plugin.core.errors import UsageError

    split = QASplit(question_index=np.array([0, 1]), start_positions=np.array([0, 0]), end_positions=np.array([0, 0]),
                    passage_offset=np.array([3, 3]), token_offsets=np.array([0, 1, 2]), char_start=np.array([0, 0]),
                    char_end=np.array([1, 1]), max_context=np.array([True, True]),
                    questions=[{"id": f"q{i}", "question": "x", "context_index": 0, "answers": [],
                                "is_impossible": False} for i in range(2)],
                    contexts=["a"])
    split.save(str(tmp_path), "valid")
    QASplit.load(str(tmp_path), "valid")  # whole: reads back
    path = tmp_path / "valid.questions.jsonl"
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    with pytest.raises(UsageError, match="damaged or truncated"):
        QASplit.load(str(tmp_path), "valid")


def test_qa_split_whose_contexts_file_lost_a_passage_is_damaged_and_a_missing_split_is_named(tmp_path):
    """Questions of passages 0 and 1, but contexts.jsonl cut after passage 0: load names the file as damaged. A split
    that was never prepared (spanbert-predict-qa --split test) names its windows file."""
    from spanbert_plugin.core.errors import UsageError

    split = QASplit(question_index=np.array([0, 1]), start_positions=np.array([0, 0]), end_positions=np.array([0, 0]),
                    passage_offset=np.array([3, 3]), token_offsets=np.array([0, 1, 2]), char_start=np.array([0, 0]),
                    char_end=np.array([1, 1]), max_context=np.array([True, True]),
                    questions=[{"id": f"q{i}", "question": "x", "context_index": i, "answers": [],
                                "is_impossible": False} for i in range(2)],
                    contexts=["a", "b"])
    split.save(str(tmp_path), "valid")
    assert QASplit.load(str(tmp_path), "valid").contexts == ["a", "b"]
    path = tmp_path / "valid.contexts.jsonl"
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    with pytest.raises(UsageError) as caught:
        QASplit.load(str(tmp_path), "valid")
    assert str(caught.value) == (f"{path}: damaged or truncated (1 passages, but the questions name more); copy it "
                                 "again or prepare the folder again")
    with pytest.raises(FileNotFoundError) as missing:
        QASplit.load(str(tmp_path), "test")
    assert str(missing.value) == f"{tmp_path / 'test'}.windows.npz: no such file (not a spanbert-prepare-qa split 'test')"


def test_question_bounds_and_windows_of_index_each_questions_own_windows():
    """Questions 0, 1, 2, 3 with 2, 1, 0 and 3 windows: bounds [0, 2, 3, 3, 6]; question 2 has none."""
    from spanbert_plugin.qa.windows import QASplit

    empty = np.zeros(0, np.int64)
    split = QASplit(question_index=np.array([0, 0, 1, 3, 3, 3]), start_positions=empty, end_positions=empty,
                    passage_offset=empty, token_offsets=empty, char_start=empty, char_end=empty, max_context=empty,
                    questions=[{"id": str(q)} for q in range(4)])
    assert split.question_bounds().tolist() == [0, 2, 3, 3, 6]
    assert [split.windows_of(q) for q in range(4)] == [slice(0, 2), slice(2, 3), slice(3, 3), slice(3, 6)]


def test_contexts_without_questions_are_counted_and_left_out(wordpiece_data, tmp_path):
    """A SQuAD paragraph or an MRQA context line whose qas list is empty: no context of the split (the questions'
    context_index count the others) and counted as contexts_without_questions."""
    squad = write_squad(tmp_path / "s.json", [{"context": "unused passage", "qas": []},
                                              {"context": "river bank", "qas": [
                                                  {"id": "q1", "question": "where?",
                                                   "answers": [{"text": "bank", "answer_start": 6}]}]},
                                              {"context": "another unused one", "qas": []}], version="1.1")
    mrqa = _write(tmp_path, "m.jsonl", "\n".join([
        '{"header": {}}', json.dumps({"context": "unused passage", "qas": []}),
        json.dumps({"context": "river bank", "qas": [{"qid": "q1", "question": "where?", "answers": ["bank"],
                                                      "detected_answers": [{"text": "bank", "char_spans": [[6, 9]]}]}]})]))
    tokenizer, dictionary = load_tokenizer_folder(wordpiece_data)
    for path, unused in ((squad, 2), (mrqa, 1)):
        qa = read_qa_file(path)
        assert qa.contexts == ["river bank"] and qa.contexts_without_questions == unused
        assert qa.questions[0]["context_index"] == 0 and (qa.answer_start.tolist(), qa.answer_end.tolist()) == ([6], [10])
        features = featurize(qa, tokenizer, dictionary.bos_index, dictionary.eos_index, CONFIG, training=True)
        assert (features.stats["contexts"], features.stats["contexts_without_questions"]) == (1, unused)
