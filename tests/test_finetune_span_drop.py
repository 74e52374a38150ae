"""SpanDrop inside fine-tuning: QA, relation extraction and classification (units, protection, labels, rates, runs)."""
import json
import math
import os
import random

import numpy as np
import pytest

from conftest import bin_path, needs_shared_data, require_shared_data, run_cli, shared_path
from spanbert_plugin.cli import prepare_re
from spanbert_plugin.cli.prepare_classification import main as prepare_classification
from spanbert_plugin.classification.span_drop import ClassificationSpanDropDataset
from spanbert_plugin.qa.span_drop import QASpanDropDataset, passage_sentence_ids, sentence_starts, token_sentence_ids
from spanbert_plugin.relation.span_drop import RelationSpanDrop
from spanbert_plugin.spandrop.finetune import SpanDropper, unit_ids
from spanbert_plugin.qa.dataset import ExtractiveQADataset
from spanbert_plugin.core.errors import UsageError
from spanbert_plugin.qa.prepare import QAConfig, prepare_qa
from spanbert_plugin.qa.task import ExtractiveQAConfig, ExtractiveQATask
from spanbert_plugin.relation.task import RelationExtractionConfig, RelationExtractionTask
from spanbert_plugin.classification.task import SentenceClassificationConfig, SentenceClassificationTask
from spanbert_plugin.core.tokenization import WordPieceTokenizer

SQUAD_DEV = shared_path("squad", "dev-v1.1.json")
UNCASED_VOCAB = shared_path("bert_uncased_vocab", "vocab.txt")
needs_squad = needs_shared_data("squad/dev-v1.1.json", "bert_uncased_vocab/vocab.txt")
UNITS = ("token", "chunk", "word", "sentence")
P = 0.3

NAMES = ["ada", "bruno", "chen", "dora", "emil", "farah", "goran", "hana"]
CITIES = ["oslo", "lima", "kyoto", "accra", "quito", "perth", "turin", "dakar"]
FILLER = ["river", "stone", "bright", "slow", "garden", "music", "winter", "paper", "green", "quiet", "table", "road"]
VOCAB = (["[PAD]"] + [f"[unused{i}]" for i in range(100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + NAMES + CITIES + FILLER
         + ["##s", "##ed", "##ing", "where", "does", "live", "lives", "in", "we", "flew", "over", "today", "founded",
            "visited", "saw", "good", "bad", "it", "was", ".", "?", "!", ",", "@", "*", "#", "^", "person", "city"])


def make_tokenizer_folder(folder, vocab):
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("".join(token + "\n" for token in vocab))
    tokenizer = WordPieceTokenizer(os.path.join(folder, "vocab.txt"), lowercase=True)
    tokenizer.save(folder)
    SpanBertDictionary.from_tokenizer(tokenizer).save(os.path.join(folder, "dict.txt"))
    return folder


def filler_sentence(rng):
    words = [rng.choice(FILLER) + rng.choice(["", "", "s", "ed", "ing"]) for _ in range(rng.randint(3, 7))]
    return " ".join(words).capitalize() + " ."


def synthetic_qa(path, n, seed):
    """Capitalised filler sentences, two 'We flew over CITY today .' distractors and the fact 'Name lives in CITY .'."""
    rng = random.Random(seed)
    paragraphs = []
    for c in range(n):
        name, city, *others = rng.choice(NAMES), *rng.sample(CITIES, 3)
        sentences = [filler_sentence(rng) for _ in range(3)] + [f"We flew over {o.capitalize()} today ." for o in others]
        rng.shuffle(sentences)
        sentences.insert(rng.randint(0, len(sentences)), f"{name.capitalize()} lives in {city.capitalize()} .")
        context = " ".join(sentences)
        start = context.index(" lives in ") + len(" lives in ")
        paragraphs.append({"context": context, "qas": [{"id": f"q{c}", "question": f"Where does {name.capitalize()} live ?",
                                                        "answers": [{"text": city.capitalize(), "answer_start": start}]}]})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": [{"title": "synthetic", "paragraphs": paragraphs}]}, f)


def synthetic_re(path, n, seed):
    """The relation is the verb between subject and object: founded / visited / saw (no_relation)."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        verb, relation = rng.choice([("founded", "org:founded"), ("visited", "per:visited"), ("saw", "no_relation")])
        before, after = filler_sentence(rng).split(), filler_sentence(rng).split()
        words = before + [rng.choice(NAMES), verb, rng.choice(CITIES), "."] + after
        s = len(before)
        examples.append({"id": f"r{i}", "token": words, "subj_start": s, "subj_end": s, "obj_start": s + 2,
                         "obj_end": s + 2, "subj_type": "PERSON", "obj_type": "CITY", "relation": relation})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(examples, f)


def synthetic_pairs(path, n, seed):
    """Sentence pairs; the label is the cue word (good / bad) hidden among fillers of the second text."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            label = rng.choice(["good", "bad"])
            b = [filler_sentence(rng) for _ in range(2)]
            words = b[1].split()
            words.insert(rng.randint(0, len(words) - 1), label)
            b[1] = " ".join(words)
            f.write(json.dumps({"a": filler_sentence(rng), "b": " ".join(b), "label": label}) + "\n")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Prepared synthetic QA, relation (three marker modes) and sentence-pair folders on one small vocabulary."""
    d = tmp_path_factory.mktemp("finetune_span_drop")
    tok = make_tokenizer_folder(str(d / "tok"), VOCAB)
    synthetic_qa(d / "qa_train.json", 300, 1)
    synthetic_qa(d / "qa_valid.json", 60, 2)
    prepare_qa({"train": str(d / "qa_train.json"), "valid": str(d / "qa_valid.json")}, tok, str(d / "qa"),
               QAConfig(48, 16, 12))
    synthetic_re(d / "re_train.json", 300, 3)
    synthetic_re(d / "re_valid.json", 60, 4)
    for mode in ("ner", "typed_marker", "typed_marker_punct"):
        assert prepare_re.main(["--train", str(d / "re_train.json"), "--valid", str(d / "re_valid.json"),
                                "--tokenizer-from", tok, "--destdir", str(d / f"re_{mode}"), "--entity-marker", mode]) == 0
    synthetic_pairs(d / "cls_train.jsonl", 300, 5)
    synthetic_pairs(d / "cls_valid.jsonl", 60, 6)
    assert prepare_classification(["--train", str(d / "cls_train.jsonl"), "--valid", str(d / "cls_valid.jsonl"),
                                   "--tokenizer-from", tok, "--destdir", str(d / "cls"), "--text-columns", "a,b",
                                   "--label-column", "label", "--max-seq-length", "64"]) == 0
    return {"qa": str(d / "qa"), "cls": str(d / "cls"), **{mode: str(d / f"re_{mode}") for mode in
                                                            ("ner", "typed_marker", "typed_marker_punct")}}


@pytest.fixture(scope="module")
def squad(tmp_path_factory):
    """The first two SQuAD 1.1 dev articles as a training split, BERT uncased WordPiece, 128-token windows."""
    require_shared_data("squad/dev-v1.1.json", "bert_uncased_vocab/vocab.txt")
    d = tmp_path_factory.mktemp("squad_span_drop")
    with open(UNCASED_VOCAB, encoding="utf-8") as f:
        tok = make_tokenizer_folder(str(d / "tok"), [line.rstrip("\n") for line in f])
    with open(SQUAD_DEV, encoding="utf-8") as f:
        dev = json.load(f)
    dev["data"] = dev["data"][:2]
    with open(d / "dev2.json", "w", encoding="utf-8") as f:
        json.dump(dev, f)
    prepare_qa({"train": str(d / "dev2.json"), "valid": str(d / "dev2.json")}, tok, str(d / "qa"), QAConfig(128, 64, 32))
    return str(d / "qa")


def task_of(kind, data, **options):
    """A fine-tuning task with ``--span-drop-*`` options, its train and valid splits loaded."""
    task_cls, cfg_cls = {"qa": (ExtractiveQATask, ExtractiveQAConfig),
                         "re": (RelationExtractionTask, RelationExtractionConfig),
                         "cls": (SentenceClassificationTask, SentenceClassificationConfig)}[kind]
    task = task_cls.setup_task(cfg_cls(data=data, seed=7, **options))
    for split in ("train", "valid"):
        task.load_dataset(split)
    return task


def symbols(task, ids):
    return [task.dictionary.symbols[i] for i in ids.tolist()]


# ----------------------------------------------------------------------------- segmentation


def test_sentence_starts_skip_abbreviations_and_initials(monkeypatch):
    text = 'Dr. Smith went to the U.S. Army. He slept! "Then?" J. R. R. Tolkien wrote it... 3 cats ran. end'
    starts = sentence_starts(text)
    assert [text[s:s + 6] for s in starts] == [text[:6], "He sle", '"Then?', "J. R. ", "3 cats"]
    contexts = [text, "One. Two. Three."]
    token_context = np.array([0, 0, 0, 1, 1, 1, 1])
    char_start = np.array([0, 33, 60, 0, 5, 10, 14])
    expected = [int(np.searchsorted(sentence_starts(contexts[c]), s, side="right")) - 1
                for c, s in zip(token_context, char_start)]
    assert token_sentence_ids(contexts, token_context, char_start).tolist() == expected == [0, 1, 3, 0, 1, 2, 2]
    from spanbert_plugin.qa import span_drop

    monkeypatch.setattr(span_drop, "_TOKENS_A_CHUNK", 2)  # chunks that cut a context's tokens: the same ids
    assert token_sentence_ids(contexts, token_context, char_start).tolist() == expected


def test_units_never_span_fixed_tokens():
    droppable = np.array([0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0], dtype=bool)
    word_starts = np.array([1, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1], dtype=bool)
    sentences = np.array([-1, 0, 0, 0, 1, 1, -1, 1, 1, 2, -1])
    assert unit_ids(droppable, "token").tolist() == [-1, 0, 1, 2, 3, 4, -1, 5, 6, 7, -1]
    assert unit_ids(droppable, "chunk", 2).tolist() == [-1, 0, 0, 1, 1, 2, -1, 3, 3, 4, -1]
    assert unit_ids(droppable, "word", word_starts=word_starts).tolist() == [-1, 0, 0, 1, 1, 1, -1, 2, 3, 3, -1]
    assert unit_ids(droppable, "sentence", sentence_ids=sentences).tolist() == [-1, 0, 0, 0, 1, 1, -1, 2, 2, 3, -1]



def test_question_bigrams_when_a_window_opens_inside_a_word():
    """Question words (5) (6); passage (9 ##) (5) (6) opening inside a word: the partial word is a word of its own,
    not in the bigram "5 6", so only the bigram's two tokens are protected."""
    from spanbert_plugin.qa.span_drop import bigram_overlap

    question, question_starts = np.array([5, 6]), np.array([True, True])
    passage, passage_starts = np.array([9, 5, 6]), np.array([False, True, True])
    assert bigram_overlap(question, question_starts, passage, passage_starts).tolist() == [False, True, True]
    # the partial word's own bigram with the next word counts too: question (9) (5)
    assert bigram_overlap(np.array([9, 5]), question_starts, passage, passage_starts).tolist() == [True, True, False]


def test_word_keys_tell_apart_words_that_differ_by_a_token_of_id_0():
    """A word's key hashes all its token ids in order, id 0 (a word piece in a vocab.txt of any order) included:
    words (5 ##0), (5), (0) and (0 ##5) have four different keys."""
    from spanbert_plugin.qa.span_drop import word_keys

    keys, word_of = word_keys(np.array([5, 0, 5, 0, 0, 5]), np.array([True, False, True, True, True, False]))
    assert word_of.tolist() == [0, 0, 1, 2, 3, 3]
    assert len(set(keys.tolist())) == 4


def test_question_bigrams_of_an_empty_passage_or_question_protect_nothing():
    """A window of an empty passage (a context the tokenizer reads as no token gets one empty window) protects
    nothing and fails on no empty array; an empty question shares no bigram with a passage."""
    from spanbert_plugin.qa.span_drop import bigram_overlap, word_keys

    keys, word_of = word_keys(np.zeros(0, np.int64), np.zeros(0, bool))
    assert keys.tolist() == [] and word_of.tolist() == []
    empty, no_starts = np.zeros(0, np.int64), np.zeros(0, bool)
    assert bigram_overlap(np.array([5, 6]), np.array([True, True]), empty, no_starts).tolist() == []
    assert bigram_overlap(empty, no_starts, np.array([5, 6]), np.array([True, True])).tolist() == [False, False]


def test_marker_region_ends_of_folders_without_stored_ends():
    """The entity region opened at ``start`` ends at its closing marker's last token: the first end marker after it
    (typed_marker), the last token of the first repeat of the opening word's tokens (typed_marker_punct, here '@' as
    the two tokens 7 8), the marker itself (ner); the last token when nothing closes it."""
    from types import SimpleNamespace

    from spanbert_plugin.relation.span_drop import marker_region_end

    typed = marker_region_end({"entity_marker": "typed_marker", "markers": {"[E1]": 20, "[/E1]": 21}}, None)
    assert typed(np.array([0, 20, 5, 6, 21, 8, 2]), 1, 0) == 4
    assert typed(np.array([0, 20, 5, 6, 2]), 1, 0) == 4
    ids = {"@": [7, 8], "#": [9]}
    tokenizer = SimpleNamespace(encode=lambda text: SimpleNamespace(ids=ids[text]))
    punct = marker_region_end({"entity_marker": "typed_marker_punct"}, tokenizer)
    assert punct(np.array([0, 7, 8, 5, 7, 8, 6, 2]), 1, 0) == 5
    assert punct(np.array([0, 9, 5, 6, 9, 8, 2]), 1, 1) == 4
    assert marker_region_end({"entity_marker": "ner"}, None)(np.array([0, 20, 2]), 1, 0) == 1

def test_bad_options_are_usage_errors(folders):
    for options, message in (({"span_drop_p": 1.0}, "--span-drop-p"), ({"span_drop_p": 0.1, "span_drop_gamma": 0.0},
                                                                         "--span-drop-gamma"),
                             ({"span_drop_p": 0.1, "span_drop_unit": "chunk", "span_drop_chunk_size": 0},
                              "--span-drop-chunk-size")):
        with pytest.raises(UsageError, match=message):
            task_of("qa", folders["qa"], **options)


@pytest.mark.parametrize("options, flag", [({"span_drop_unit": "word"}, "--span-drop-unit word"),
                                           ({"span_drop_protect_question_overlap": True},
                                            "--span-drop-protect-question-overlap")])
def test_word_options_without_readable_tokenizer_files_name_the_option_that_needs_them(folders, tmp_path, options, flag):
    """Both options read whole words from the folder's tokenizer; the error named --span-drop-unit word for both."""
    import shutil

    from spanbert_plugin.core.tokenization import META_FILE

    damaged = tmp_path / "qa"
    shutil.copytree(folders["qa"], damaged)
    (damaged / META_FILE).write_text("{not json")
    with pytest.raises(UsageError) as error:
        task_of("qa", str(damaged), span_drop_p=0.1, **options)
    assert str(error.value).startswith(f"{flag} needs the tokenizer files of {damaged}: ")


# ----------------------------------------------------------------------------- QA


def reference_units(pieces, droppable, unit, chunk_size, sentence_ids):
    """Unit of every token by a plain loop over token strings (-1: fixed), for comparison."""
    units, current, size = [], -1, 0
    count = -1
    for i, piece in enumerate(pieces):
        if not droppable[i]:
            units.append(-1)
            current = -1
            continue
        new = (current < 0 or unit == "token" or (unit == "chunk" and size == chunk_size)
               or (unit == "word" and not piece.startswith("##"))
               or (unit == "sentence" and sentence_ids[i] != sentence_ids[i - 1]))
        if new:
            count, size = count + 1, 0
        current, size = count, size + 1
        units.append(current)
    return np.array(units)


@needs_squad
@pytest.mark.parametrize("unit", UNITS)
def test_qa_drop_keeps_question_and_answer_and_draws_whole_units(squad, unit):
    options = {"span_drop_p": P, "span_drop_unit": unit, "span_drop_chunk_size": 3}
    task = task_of("qa", squad, **options)
    dropped, mask_task = task.datasets["train"], task_of("qa", squad, span_drop_mode="mask", **options)
    assert isinstance(dropped, QASpanDropDataset) and isinstance(task.datasets["valid"], ExtractiveQADataset)
    raw, masked = dropped.dataset, mask_task.datasets["train"]
    qa = raw.qa
    sentence_ids = passage_sentence_ids(qa)
    kept_units = total_units = 0
    for index in range(len(raw)):
        before, after, mask_item = raw[index], dropped[index], masked[index]
        tokens = before["source"].numpy()
        keep = mask_item["source"].numpy() != task.dictionary.mask_index
        # drop and mask draw the same units; drop removes exactly what mask masks
        assert after["source"].tolist() == tokens[keep].tolist()
        assert mask_item["segment"].tolist() == before["segment"].tolist()
        lo = int(qa.passage_offset[index])
        hi = lo + int(qa.token_offsets[index + 1] - qa.token_offsets[index])
        assert keep[:lo].all() and keep[hi:].all()  # [CLS] question [SEP] and the final [SEP]
        assert after["segment"].tolist() == [0] * lo + [1] * (len(after["source"]) - lo)
        start, end = before["start"], before["end"]
        if start == 0:
            assert after["start"] == after["end"] == 0
        else:
            assert after["source"][after["start"]: after["end"] + 1].tolist() == tokens[start: end + 1].tolist()
        droppable = np.zeros(len(tokens), bool)
        droppable[lo:hi] = True
        ids = np.full(len(tokens), -1)
        ids[lo:hi] = sentence_ids[qa.token_offsets[index]: qa.token_offsets[index + 1]]
        units = reference_units(symbols(task, tokens), droppable, unit, 3, ids)
        for u in range(units.max() + 1):
            assert len(set(keep[units == u])) == 1, (index, u)  # a unit goes or stays whole
        if start == 0:  # nothing protected: every unit an independent Bernoulli(1 - p) draw
            first = np.flatnonzero(units >= 0)
            kept_units += sum(keep[first[units[first] == u][0]] for u in range(units.max() + 1))
            total_units += units.max() + 1
    assert total_units > 300
    se = math.sqrt(P * (1 - P) / total_units)
    assert abs(kept_units / total_units - (1 - P)) < 4 * se, (kept_units, total_units)


@needs_squad
def test_qa_sentence_ids_stored_at_prepare_equal_those_found_from_the_text(squad):
    from spanbert_plugin.qa.windows import QASplit

    qa = QASplit.load(squad, "train")
    assert qa.sentence_ids is not None and len(qa.sentence_ids) == len(qa.char_start)
    stored = qa.sentence_ids
    qa.sentence_ids = None  # a folder prepared before sentence ids were stored
    assert np.array_equal(passage_sentence_ids(qa), stored)
    # every passage token's sentence begins at or before it and the next sentence after it
    context = np.array([q["context_index"] for q in qa.questions])[qa.question_index]
    token_context = np.repeat(context, qa.passage_lengths())
    for i in range(0, len(stored), 97):
        starts = sentence_starts(qa.contexts[token_context[i]])
        assert starts[stored[i]] <= qa.char_start[i] and (stored[i] + 1 == len(starts) or starts[stored[i] + 1] > qa.char_start[i])


@needs_squad
def test_qa_question_bigrams_protected_and_beta_rate(squad):
    task = task_of("qa", squad, span_drop_p=0.9, span_drop_protect_question_overlap=True)
    dropped = task.datasets["train"]
    masked = task_of("qa", squad, span_drop_p=0.9, span_drop_protect_question_overlap=True,
                     span_drop_mode="mask").datasets["train"]
    raw, qa = dropped.dataset, dropped.dataset.qa
    protected_seen = 0
    for index in range(len(raw)):
        tokens = raw[index]["source"].numpy()
        pieces = symbols(task, tokens)
        lo = int(qa.passage_offset[index])
        hi = lo + int(qa.token_offsets[index + 1] - qa.token_offsets[index])

        def words(span):  # (word text, its token positions), joining ## pieces
            out = []
            for i in span:
                if pieces[i].startswith("##") and out:
                    out[-1] = (out[-1][0] + pieces[i][2:], out[-1][1] + [i])
                else:
                    out.append((pieces[i], [i]))
            return out
        question, passage = words(range(1, lo - 1)), words(range(lo, hi))
        bigrams = {(a[0], b[0]) for a, b in zip(question, question[1:])}
        must_keep = [i for a, b in zip(passage, passage[1:]) if (a[0], b[0]) in bigrams for i in a[1] + b[1]]
        keep = masked[index]["source"].numpy() != task.dictionary.mask_index
        assert keep[must_keep].all()  # tokens of matched bigrams survive even at p = 0.9
        assert dropped[index]["source"].tolist() == tokens[keep].tolist()
        protected_seen += len(must_keep)
    assert protected_seen > 100
    # Beta-SpanDrop: mean drop rate p over windows; one pi ~ Beta(g, g (1-p)/p) per window
    p, gamma = 0.2, 1.0
    beta_task = task_of("qa", squad, span_drop_p=p, span_drop_gamma=gamma)
    shares = []
    for index in range(len(raw)):
        if raw[index]["start"] == 0:
            n = int(qa.token_offsets[index + 1] - qa.token_offsets[index])
            shares.append((len(raw[index]["source"]) - len(beta_task.datasets["train"][index]["source"])) / n)
    a, b = gamma, gamma * (1 - p) / p
    var_pi = a * b / ((a + b) ** 2 * (a + b + 1))
    se = math.sqrt((var_pi + 0.25 / 20) / len(shares))  # windows hold > 20 passage tokens
    assert abs(np.mean(shares) - p) < 4 * se, (np.mean(shares), se)


def test_qa_epochs_reproducible_p0_untouched_valid_untouched(folders):
    task = task_of("qa", folders["qa"], span_drop_p=0.3, span_drop_unit="sentence")
    dropped = task.datasets["train"]
    dropped.set_epoch(2)
    first = [dropped[i]["source"].tolist() for i in range(40)]
    again = task_of("qa", folders["qa"], span_drop_p=0.3, span_drop_unit="sentence").datasets["train"]
    again.set_epoch(2)
    assert [again[i]["source"].tolist() for i in range(40)] == first
    again.set_epoch(3)
    assert [again[i]["source"].tolist() for i in range(40)] != first
    plain = task_of("qa", folders["qa"], span_drop_p=0.0)
    assert isinstance(plain.datasets["train"], ExtractiveQADataset)
    zero = SpanDropper(plain.cfg, plain.dictionary, np.ones(len(plain.dictionary), bool), seed=1)
    same = QASpanDropDataset(plain.datasets["train"], zero)
    for i in range(len(same)):
        a, b = plain.datasets["train"][i], same[i]
        assert a["source"].tolist() == b["source"].tolist() and (a["start"], a["end"]) == (b["start"], b["end"])
    valid_a, valid_b = task.datasets["valid"], plain.datasets["valid"]
    assert isinstance(valid_a, ExtractiveQADataset)
    assert all(valid_a[i]["source"].tolist() == valid_b[i]["source"].tolist() for i in range(len(valid_a)))


# ----------------------------------------------------------------------------- relation extraction and classification


@pytest.mark.parametrize("mode, unit", [("ner", "token"), ("typed_marker", "word"), ("typed_marker_punct", "sentence"),
                                        ("typed_marker", "chunk")])
def test_relation_mentions_and_markers_survive(folders, mode, unit):
    task = task_of("re", folders[mode], span_drop_p=0.5, span_drop_unit=unit, span_drop_chunk_size=2)
    dataset = task.datasets["train"]
    tokens_view = dataset.dataset.defn["net_input.src_tokens"].dataset
    assert isinstance(tokens_view, RelationSpanDrop)
    raw = tokens_view.dataset
    original_positions = tokens_view.positions
    examples = json.load(open(os.path.join(os.path.dirname(folders[mode]), "re_train.json")))
    dropped_tokens = total = 0
    for index in range(len(raw)):
        before = symbols(task, raw[index])
        item = dataset[index]
        after = symbols(task, item["net_input.src_tokens"])
        ex = examples[index]
        for role, new in enumerate(item["net_input.entity_positions"]):
            old, mention = original_positions[index][role], ex["token"][ex[("subj_start", "obj_start")[role]]]
            length = {"ner": 1, "typed_marker": 3, "typed_marker_punct": 6}[mode]  # marker(s) and the one-word mention
            assert after[new: new + length] == before[old: old + length]
            assert mode == "ner" or mention in before[old: old + length]
        assert after[0] == "[CLS]" and after[-1] == "[SEP]"
        dropped_tokens += len(before) - len(after)
        total += len(before) - 2
    assert 0 < dropped_tokens < total
    # validation examples are untouched
    valid = task.datasets["valid"]
    assert not isinstance(valid.dataset.defn["net_input.src_tokens"].dataset, RelationSpanDrop)


@pytest.mark.parametrize("vocab_has_at", [True, False])
def test_relation_regions_whose_mention_holds_the_marker_word_survive(tmp_path, vocab_has_at):
    """A subject mention with an '@' in it ('ada @ oslo', an e-mail address's pieces), under ``typed_marker_punct``:
    the whole region '@ * person * ada @ oslo @' is kept, the closing '@' included. The region ends stored at
    prepare time say where it ends; a search for the next '@' stopped inside the mention, and a vocabulary
    without '@' made every marker and every unknown word [UNK]."""
    vocab = VOCAB if vocab_has_at else [token for token in VOCAB if token != "@"]
    tok = make_tokenizer_folder(str(tmp_path / "tok"), vocab)
    rng = random.Random(11)
    examples = []
    for i in range(80):
        before, after = filler_sentence(rng).split(), filler_sentence(rng).split()
        mention = [rng.choice(NAMES), "@", rng.choice(CITIES)]
        words = before + mention + ["visited", rng.choice(CITIES), "."] + after
        s = len(before)
        examples.append({"id": f"r{i}", "token": words, "subj_start": s, "subj_end": s + 2, "obj_start": s + 4,
                         "obj_end": s + 4, "subj_type": "PERSON", "obj_type": "CITY",
                         "relation": rng.choice(["per:visited", "no_relation"])})
    for split in ("train", "valid"):
        with open(tmp_path / f"{split}.json", "w", encoding="utf-8") as f:
            json.dump(examples, f)
    data = str(tmp_path / "re")
    assert prepare_re.main(["--train", str(tmp_path / "train.json"), "--valid", str(tmp_path / "valid.json"),
                            "--tokenizer-from", tok, "--destdir", data, "--entity-marker", "typed_marker_punct"]) == 0
    task = task_of("re", data, span_drop_p=0.9, span_drop_unit="token")
    dataset = task.datasets["train"]
    tokens_view = dataset.dataset.defn["net_input.src_tokens"].dataset
    with np.load(os.path.join(data, "train.npz")) as arrays:
        starts, ends = arrays["entity_positions"], arrays["entity_region_ends"]
    at = "@" if vocab_has_at else "[UNK]"
    for index, ex in enumerate(examples):
        before = symbols(task, tokens_view.dataset[index])
        subject = before[starts[index][0]: ends[index][0] + 1]
        assert subject == [at, "*", "person", "*", *(w if w != "@" else at for w in ex["token"][ex["subj_start"]:
                                                                                             ex["subj_end"] + 1]), at]
        assert before[starts[index][1]: ends[index][1] + 1] == ["#", "^", "city", "^", ex["token"][ex["obj_start"]], "#"]
        item = dataset[index]
        after = symbols(task, item["net_input.src_tokens"])
        for role, new in enumerate(item["net_input.entity_positions"]):
            length = ends[index][role] - starts[index][role] + 1
            assert after[new: new + length] == before[starts[index][role]: ends[index][role] + 1]


def test_span_drop_mask_mode_on_a_dictionary_without_mask_is_one_line(folders, tmp_path):
    """A dict.txt whose mask symbol was renamed (the ids unchanged): mask mode has no token to mask with, while drop
    mode and the splits without SpanDrop load as before."""
    import shutil

    folder = tmp_path / "cls"
    shutil.copytree(folders["cls"], folder)
    lines = (folder / "dict.txt").read_text(encoding="utf-8").splitlines()
    assert sum(line.startswith("[MASK] ") for line in lines) == 1
    (folder / "dict.txt").write_text("\n".join(line.replace("[MASK] ", "[MASKED] ") for line in lines) + "\n",
                                     encoding="utf-8")
    task = SentenceClassificationTask.setup_task(SentenceClassificationConfig(data=str(folder), span_drop_p=0.5,
                                                                              span_drop_mode="mask"))
    with pytest.raises(UsageError) as caught:
        task.load_dataset("train")
    assert str(caught.value) == "--span-drop-mode mask: the dictionary has no mask symbol"
    task.load_dataset("valid")  # no SpanDrop outside training
    assert isinstance(task_of("cls", str(folder), span_drop_p=0.5).datasets["train"], ClassificationSpanDropDataset)


@pytest.mark.parametrize("unit", UNITS)
def test_classification_segment_a_follows_and_rate(folders, unit):
    p = 0.25
    task = task_of("cls", folders["cls"], span_drop_p=p, span_drop_unit=unit, span_drop_chunk_size=3)
    dropped = task.datasets["train"]
    assert isinstance(dropped, ClassificationSpanDropDataset)
    masked = task_of("cls", folders["cls"], span_drop_p=p, span_drop_unit=unit, span_drop_chunk_size=3,
                     span_drop_mode="mask").datasets["train"]
    raw = dropped.dataset
    kept_units = total_units = 0
    for index in range(len(raw)):
        before, after, mask_item = raw[index], dropped[index], masked[index]
        tokens = before["source"].numpy()
        keep = mask_item["source"].numpy() != task.dictionary.mask_index
        assert after["source"].tolist() == tokens[keep].tolist() and after["target"] == before["target"]
        assert mask_item["segment_a"] == before["segment_a"]
        seg = before["segment_a"]
        assert after["segment_a"] == keep[:seg].sum()
        assert symbols(task, after["source"][after["segment_a"] - 1: after["segment_a"]]) == ["[SEP]"]
        pieces = symbols(task, tokens)
        droppable = np.array([t not in ("[CLS]", "[SEP]") for t in pieces])
        final = np.array([t in (".", "!", "?") for t in pieces])
        units = reference_units(pieces, droppable, unit, 3, np.cumsum(final) - final)
        for u in range(units.max() + 1):
            assert len(set(keep[units == u])) == 1
            kept_units += keep[units == u][0]
        total_units += units.max() + 1
    se = math.sqrt(p * (1 - p) / total_units)
    assert abs(kept_units / total_units - (1 - p)) < 4 * se
    assert isinstance(task.datasets["valid"], type(raw))


# ----------------------------------------------------------------------------- short runs learn


def _valid_records(output):
    return [json.loads(line[line.index("{"):]) for line in output.splitlines() if "| valid |" in line or
            ('"valid_' in line and "{" in line)]


SMALL = ["--user-dir", "user_dir", "--arch", "spanbert_tiny", "--encoder-layers", "1", "--encoder-embed-dim", "64",
         "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--optimizer", "adam", "--cpu",
         "--num-workers", "0", "--log-format", "json", "--log-interval", "50", "--seed", "1", "--no-save",
         "--dropout", "0", "--attention-dropout", "0"]


def test_short_runs_with_span_drop_learn(folders, tmp_path):
    """Each task trains with SpanDrop on (QA with Beta-SpanDrop over sentences, RE with AD-DROP as well) and beats chance.

    Chance: QA picks one of three cities (F1 about 33); RE three balanced classes (accuracy 33%, 60 examples:
    one standard error 6 points); pairs two balanced classes (50%, one standard error 6.5 points).
    """
    runs = {
        "qa": (["--task", "extractive_qa", "--criterion", "extractive_qa", "--max-positions", "64", "--lr", "3e-3",
                "--batch-size", "32", "--max-epoch", "12", "--span-drop-p", "0.1", "--span-drop-gamma", "1",
                "--span-drop-unit", "sentence"], "valid_f1", 60),
        "ner": (["--task", "relation_extraction", "--criterion", "relation_extraction", "--max-positions", "128",
                 "--lr", "3e-3", "--batch-size", "16", "--max-epoch", "4", "--span-drop-p", "0.2",
                 "--span-drop-unit", "word", "--ad-drop-p", "0.3", "--ad-drop-every-epoch"], "valid_accuracy", 70),
        "cls": (["--task", "sentence_classification", "--criterion", "sentence_classification", "--max-positions", "64",
                 "--lr", "1e-3", "--batch-size", "16", "--max-epoch", "5", "--span-drop-p", "0.2",
                 "--span-drop-unit", "chunk", "--span-drop-chunk-size", "2"], "valid_accuracy", 75),
    }
    for name, (args, metric, floor) in runs.items():
        proc = run_cli([bin_path("fairseq-train"), folders[name], *SMALL, "--save-dir", tmp_path / name, *args])
        output = proc.stdout + proc.stderr
        records = [r for r in _valid_records(output) if metric in r]
        assert records, output[-3000:]
        assert max(float(r[metric]) for r in records) > floor, (name, [r[metric] for r in records])


def test_sentencepiece_pieces_that_merge_a_final_mark_end_a_sentence():
    """sentencepiece merges punctuation into pieces ('▁).', '...'): the sentence unit ends there too, as it ends at
    WordPiece's lone '.'; control symbols and pieces without a final mark do not."""
    from spanbert_plugin.spandrop.finetune import ends_a_sentence

    assert all(map(ends_a_sentence, [".", "\\u2581.", ").", "\\u2581`).", "...", "?", "!", "\\u2581again!"]))
    assert not any(map(ends_a_sentence, ["\\u2581", "x", "\\u2581Mr", ".)", "<s>", "[SEP]", "\\u2581.x", ""]))


def test_a_punctuation_marker_too_near_the_end_to_be_closed_runs_to_the_last_token():
    """typed_marker_punct search (folders without stored region ends): an opening '@' (tokens 7 8) with fewer tokens
    after it than an opening and a closing word take has no closing word: its region runs to the last token."""
    from types import SimpleNamespace

    from spanbert_plugin.relation.span_drop import marker_region_end

    ids = {"@": [7, 8], "#": [9]}
    punct = marker_region_end({"entity_marker": "typed_marker_punct"},
                              SimpleNamespace(encode=lambda text: SimpleNamespace(ids=ids[text])))
    assert punct(np.array([0, 5, 7, 8, 2]), 2, 0) == 4  # 3 tokens from the '@' on, 4 needed
    assert punct(np.array([0, 5, 7, 8, 7, 8]), 2, 0) == 5  # 4: the closing '@' right after


@pytest.mark.parametrize("mode", ["typed_marker_punct", "typed_marker", "ner"])
def test_relation_span_drop_of_a_folder_without_stored_region_ends_finds_them_by_search(tmp_path, caplog, mode):
    """A folder prepared before the region ends were stored in the .npz: SpanDrop finds each region's end (the
    closing '@'/'#', with a warning, the end marker, or the ner marker itself, both exact and so without one), and,
    for mentions without such a word, draws exactly the items of the folder that stores them."""
    import shutil

    from spanbert_plugin.relation.prepare import load_region_ends

    tok = make_tokenizer_folder(str(tmp_path / "tok"), VOCAB)
    synthetic_re(tmp_path / "re.json", 40, 3)
    stored = str(tmp_path / "stored")
    assert prepare_re.main(["--train", str(tmp_path / "re.json"), "--valid", str(tmp_path / "re.json"), "--tokenizer-from",
                            tok, "--destdir", stored, "--entity-marker", mode]) == 0
    legacy = str(tmp_path / "legacy")
    shutil.copytree(stored, legacy)
    with np.load(os.path.join(stored, "train.npz")) as arrays:
        np.savez(os.path.join(legacy, "train.npz"), labels=arrays["labels"], entity_positions=arrays["entity_positions"])
    assert load_region_ends(legacy, "train") is None and load_region_ends(stored, "train") is not None
    options = {"span_drop_p": 0.5, "span_drop_unit": "token"}
    with caplog.at_level("WARNING", logger="spanbert_plugin.relation.span_drop"):
        searched = task_of("re", legacy, **options).datasets["train"]
    warned = f"{legacy}: prepared without the entities' region ends; SpanDrop finds each mention's closing '@'/'#' by " \
             "search" in caplog.text
    assert warned == (mode == "typed_marker_punct"), caplog.text
    expected = task_of("re", stored, **options).datasets["train"]
    dropped = 0
    for index in range(len(expected)):
        a, b = searched[index], expected[index]
        assert a["net_input.src_tokens"].tolist() == b["net_input.src_tokens"].tolist()
        assert list(a["net_input.entity_positions"]) == list(b["net_input.entity_positions"])
        dropped += int(searched.dataset.defn["net_input.src_tokens"].dataset.dataset[index].numel()
                       - a["net_input.src_tokens"].numel())
    assert dropped > 0  # SpanDrop did drop tokens: the comparison is not one of untouched items
