"""Relation extraction: markers, truncation, labels, bad input, metrics, vocabulary growth, training and prediction."""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import bin_path, needs_shared_data, run_cli, run_gloo_ranks, shared_path, tiny_spanbert, training_batches
from spanbert_plugin.cli import predict_re, prepare_re
from spanbert_plugin.core.dictionary import SpanBertDictionary
from spanbert_plugin.relation.metrics import relation_counts, relation_scores
from spanbert_plugin.relation.markers import END_MARKERS, MARKER_TABLE, START_MARKERS, assign_marker_ids, normalise_type, start_marker
from spanbert_plugin.core.tokenization import WordPieceTokenizer
from test_pretrain import TINY

TACRED = shared_path("tacred_sample")
UNCASED_VOCAB = shared_path("bert_uncased_vocab", "vocab.txt")
needs_tacred = needs_shared_data("tacred_sample")
needs_uncased = needs_shared_data("bert_uncased_vocab/vocab.txt")

# a hand-written lower-case vocabulary with only three [unused] slots, so markers are both taken from
# [unusedN] and appended
TINY_VOCAB = ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
              "bill", "gates", "was", "born", "in", "seattle", ".", "@", "*", "#", "^", "person", "city",
              "company", "microsoft", "founded", "by", "(", ")", "x", "y"]

BORN = {"id": "born", "token": ["Bill", "Gates", "was", "born", "in", "Seattle", "."], "subj_start": 0, "subj_end": 1,
        "obj_start": 5, "obj_end": 5, "subj_type": "PERSON", "obj_type": "CITY", "relation": "per:city_of_birth"}
# object first, PTB brackets, a type alias (PER) and a type outside the table (COMPANY)
FOUNDED = {"id": "founded", "token": ["Microsoft", "-LRB-", "founded", "by", "Bill", "Gates", "-RRB-"],
           "subj_start": 4, "subj_end": 5, "obj_start": 0, "obj_end": 0, "subj_type": "PER", "obj_type": "COMPANY",
           "relation": "no_relation"}
# no types (SemEval style) and no id: its id is its position
UNTYPED = {"token": ["bill", "was", "in", "seattle"], "subj_start": 0, "subj_end": 0, "obj_start": 3, "obj_end": 3,
           "relation": "per:city_of_birth"}

EXPECTED = {  # mode -> the three examples token by token, and their (subject, object) start positions
    "ner": [("[CLS] [unused0] was born in [OBJ-CITY] . [SEP]", [1, 5]),
            ("[CLS] [OBJ-OTHER] ( founded by [unused0] ) [SEP]", [5, 1]),
            ("[CLS] [SUBJ] was in [OBJ] [SEP]", [1, 4])],
    "typed_marker": [
        ("[CLS] [unused0] bill gates [/SUBJ-PERSON] was born in [OBJ-CITY] seattle [/OBJ-CITY] . [SEP]", [1, 8]),
        ("[CLS] [OBJ-OTHER] microsoft [/OBJ-OTHER] ( founded by [unused0] bill gates [/SUBJ-PERSON] ) [SEP]", [7, 1]),
        ("[CLS] [SUBJ] bill [/SUBJ] was in [OBJ] seattle [/OBJ] [SEP]", [1, 6])],
    "typed_marker_punct": [
        ("[CLS] @ * person * bill gates @ was born in # ^ city ^ seattle # . [SEP]", [1, 11]),
        ("[CLS] # ^ company ^ microsoft # ( founded by @ * person * bill gates @ ) [SEP]", [10, 1]),
        ("[CLS] @ bill @ was in # seattle # [SEP]", [1, 6])],
}


def make_tokenizer_folder(folder, vocab, lowercase=True):
    """A spanbert-prepare-like tokenizer folder (vocab.txt, tokenizer meta, dict.txt) for a WordPiece vocabulary."""
    os.makedirs(folder, exist_ok=True)
    vocab_path = os.path.join(folder, "vocab.txt")
    with open(vocab_path, "w", encoding="utf-8") as f:
        f.write("".join(token + "\n" for token in vocab))
    tokenizer = WordPieceTokenizer(vocab_path, lowercase=lowercase)
    tokenizer.save(folder)
    SpanBertDictionary.from_tokenizer(tokenizer).save(os.path.join(folder, "dict.txt"))
    return folder


def write_examples(path, examples, jsonl=False):
    with open(path, "w", encoding="utf-8") as f:
        if jsonl:
            f.write("".join(json.dumps(ex) + "\n" for ex in examples))
        else:
            json.dump(examples, f)
    return str(path)


def read_split(dest, split):
    """(token strings per example, entity positions, label indices, examples.jsonl records)."""
    from fairseq.data import data_utils

    dictionary = SpanBertDictionary.load(os.path.join(dest, "dict.txt"))
    items = data_utils.load_indexed_dataset(os.path.join(dest, split), dictionary, "mmap")
    arrays = np.load(os.path.join(dest, split + ".npz"))
    with open(os.path.join(dest, split + ".examples.jsonl")) as f:
        records = [json.loads(line) for line in f]
    texts = [" ".join(dictionary.symbols[t] for t in items[i].tolist()) for i in range(len(items))]
    return texts, arrays["entity_positions"].tolist(), arrays["labels"].tolist(), records


def prepare(tmp_path, capsys, train, valid, *extra, test=None, dest="re"):
    """Run spanbert-prepare-re in-process; (exit status, stderr, destination)."""
    destdir = str(tmp_path / dest)
    args = ["--train", train, "--valid", valid, "--tokenizer-from", str(tmp_path / "tok"), "--destdir", destdir, *extra]
    if test:
        args += ["--test", test]
    status = prepare_re.main(args)
    return status, capsys.readouterr().err, destdir


@pytest.fixture
def tiny_tok(tmp_path):
    return make_tokenizer_folder(str(tmp_path / "tok"), TINY_VOCAB)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_markers_token_by_token(tmp_path, capsys, tiny_tok, mode):
    train = write_examples(tmp_path / "train.json", [BORN, FOUNDED, UNTYPED])
    valid = write_examples(tmp_path / "valid.jsonl", [BORN], jsonl=True)
    status, err, dest = prepare(tmp_path, capsys, train, valid, "--entity-marker", mode)
    assert status == 0, err
    texts, positions, labels, records = read_split(dest, "train")
    assert list(zip(texts, positions)) == [(text, pos) for text, pos in EXPECTED[mode]]
    assert labels == [1, 0, 1]  # no_relation first, then the others sorted
    assert [r["id"] for r in records] == ["born", "founded", 2]
    assert read_split(dest, "valid")[:2] == ([EXPECTED[mode][0][0]], [EXPECTED[mode][0][1]])
    with open(os.path.join(dest, "prepare_stats.json")) as f:
        stats = json.load(f)
    assert stats["train"]["untyped_mentions"] == 2 and stats["train"]["types_outside_table"] == {"COMPANY": 1}
    with open(os.path.join(dest, "re_meta.json")) as f:
        meta = json.load(f)
    assert meta["labels"] == ["no_relation", "per:city_of_birth"]
    dictionary = SpanBertDictionary.load(os.path.join(dest, "dict.txt"))
    if mode == "typed_marker_punct":  # no new vocabulary
        assert dictionary.symbols == TINY_VOCAB and meta["markers"] == {}
    else:  # three markers took [unused0..2]; the rest are appended in table order
        table = START_MARKERS if mode == "ner" else MARKER_TABLE
        assert dictionary.symbols == TINY_VOCAB + list(table[3:])
        assert meta["markers_from_unused"] == dict(zip(table[:3], ["[unused0]", "[unused1]", "[unused2]"]))


def test_lower_case_ptb_brackets_are_brackets(tmp_path, capsys, tiny_tok):
    """-lrb- as -LRB- (SpanBERT's convert_token compares the lower-cased word): it became '- l ##rb -'."""
    lower = dict(FOUNDED, id="lower", token=[w.lower() if w.startswith("-") else w for w in FOUNDED["token"]])
    assert "-lrb-" in lower["token"]
    train = write_examples(tmp_path / "train.json", [FOUNDED, lower, BORN])
    status, err, dest = prepare(tmp_path, capsys, train, train)
    assert status == 0, err
    texts, positions, _, _ = read_split(dest, "train")
    assert texts[1] == texts[0] and positions[1] == positions[0]


def test_marker_table_is_fixed_and_documented():
    """The order is part of the checkpoint format: [SUBJ-PERSON] is the first [unused] entry, always."""
    assert len(START_MARKERS) == len(END_MARKERS) == 46 and MARKER_TABLE == START_MARKERS + END_MARKERS
    assert START_MARKERS[:3] == ("[SUBJ-PERSON]", "[SUBJ-ORGANIZATION]", "[SUBJ-LOCATION]")
    assert START_MARKERS[21:26] == ("[SUBJ-OTHER]", "[SUBJ]", "[OBJ-PERSON]", "[OBJ-ORGANIZATION]", "[OBJ-LOCATION]")
    assert MARKER_TABLE[44:48] == ("[OBJ-OTHER]", "[OBJ]", "[/SUBJ-PERSON]", "[/SUBJ-ORGANIZATION]")
    assert MARKER_TABLE[-1] == "[/OBJ]"
    assert normalise_type("per") == "PERSON" and normalise_type("Weapon") == "OTHER" and normalise_type(" ") is None
    # [unusedN] entries are used in order of N, wherever they sit in the file (BERT uncased: [unused99] at id 104)
    symbols = ["[PAD]", "[unused10]", "[unused2]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]
    vocab = assign_marker_ids(symbols, "ner")
    assert [vocab.ids[m] for m in START_MARKERS[:4]] == [7, 2, 1, 8]
    assert vocab.appended == list(START_MARKERS[3:])
    # a vocabulary that already holds a marker symbol keeps its id
    assert assign_marker_ids(symbols + ["[SUBJ]"], "ner").ids["[SUBJ]"] == 8


@needs_uncased
def test_unused_order_on_bert_uncased():
    with open(UNCASED_VOCAB, encoding="utf-8") as f:
        symbols = [line.rstrip("\n") for line in f]
    vocab = assign_marker_ids(symbols, "typed_marker")
    assert not vocab.appended
    # [unused0..98] are ids 1..99, [unused99..] start at id 104
    assert [vocab.ids[m] for m in MARKER_TABLE[:3]] == [1, 2, 3]
    assert vocab.ids["[OBJ]"] == 46 and vocab.ids["[/OBJ]"] == 92
    assert vocab.from_unused == {m: f"[unused{i}]" for i, m in enumerate(MARKER_TABLE)}


def test_marker_ids_do_not_depend_on_data_order(tmp_path, capsys, tiny_tok):
    examples = [BORN, FOUNDED, UNTYPED, dict(BORN, id="b2", obj_type="DATE")]
    valid = write_examples(tmp_path / "valid.json", [BORN])
    metas = []
    for n, order in enumerate([examples, list(reversed(examples))]):
        status, err, dest = prepare(tmp_path, capsys, write_examples(tmp_path / f"train{n}.json", order), valid,
                                    "--entity-marker", "typed_marker", dest=f"re{n}")
        assert status == 0, err
        with open(os.path.join(dest, "re_meta.json")) as f:
            metas.append(json.load(f))
    assert metas[0]["markers"] == metas[1]["markers"] and metas[0]["labels"] == metas[1]["labels"]


def test_truncation_keeps_both_entities(tmp_path, capsys, tiny_tok):
    words = ["x"] * 60 + ["bill"] + ["y"] * 10 + ["seattle"] + ["x"] * 60
    long = {"id": "long", "token": words, "subj_start": 60, "subj_end": 60, "obj_start": 71, "obj_end": 71,
            "subj_type": "PERSON", "obj_type": "CITY", "relation": "per:city_of_birth"}
    train = write_examples(tmp_path / "train.json", [long, BORN, FOUNDED])  # FOUNDED: the negative label occurs
    status, err, dest = prepare(tmp_path, capsys, train, train, "--max-seq-length", "32", "--entity-marker", "typed_marker")
    assert status == 0, err
    texts, positions, _, _ = read_split(dest, "train")
    tokens = texts[0].split()
    assert len(tokens) == 32 and tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    # entities with markers take 16 tokens; the other 14 of the 30 are split evenly around them
    assert tokens[1:8] == ["x"] * 7 and tokens[-8:-1] == ["x"] * 7
    assert tokens[positions[0][0]] == "[unused0]" and tokens[positions[0][0] + 1] == "bill"
    assert tokens[positions[0][1]:positions[0][1] + 3] == ["[OBJ-CITY]", "seattle", "[/OBJ-CITY]"]
    with open(os.path.join(dest, "prepare_stats.json")) as f:
        stats = json.load(f)["train"]
    assert stats["truncated"] == 1 and stats["tokens_removed"] == (len(words) + 4 + 2) - 32
    assert stats["longest_before_truncation"] == len(words) + 6
    # entities further apart than the window: an error naming the example and the length that fits
    status, err, dest = prepare(tmp_path, capsys, train, train, "--max-seq-length", "12", "--entity-marker",
                                "typed_marker", dest="short")
    assert status == 1 and f"{train}: example long:" in err and "at least 18" in err and not os.path.exists(dest)


def _bad(example, **changes):
    bad = dict(example, **changes)
    return {k: v for k, v in bad.items() if v is not None}


@pytest.mark.parametrize("case, train, valid, message", [
    ("index out of range", [_bad(BORN, obj_end=7)], [BORN], "example born: obj_start=5, obj_end=7 is not an inclusive word span"),
    ("negative index", [_bad(BORN, subj_start=-1)], [BORN], "example born: subj_start=-1"),
    ("index not an integer", [_bad(BORN, subj_start="0")], [BORN], "example born: subj_start='0'"),
    ("overlap", [_bad(BORN, obj_start=1, obj_end=2)], [BORN], "example born: subject tokens 0-1 overlap object tokens 1-2"),
    ("missing key", [BORN, _bad(FOUNDED, relation=None)], [BORN], "example founded: missing key 'relation'"),
    ("no tokens", [_bad(BORN, token=[])], [BORN], "example born: 'token' must be a non-empty list of strings"),
    ("empty file", "", [BORN], "file is empty"),
    ("empty list", [], [BORN], "no examples"),
    ("not JSON", "{not json", [BORN], ":1: not valid JSON"),
    ("JSON list cut short", "[" + json.dumps(BORN) + ",\n{oops", [BORN],
     ":2: not valid JSON (Expecting property name enclosed in double quotes, column 2)"),
    ("example not an object", [BORN, ["Bill", "born"]], [BORN], "example at position 1: expected a JSON object, got list"),
    ("empty relation", [_bad(BORN, relation="")], [BORN], "example born: 'relation' must be a non-empty string"),
    ("type not a string", [_bad(BORN, obj_type=["CITY"])], [BORN], "example born: 'obj_type' must be a string"),
    ("unseen label", [BORN], [BORN, _bad(FOUNDED, relation="org:founded_by")],
     "example founded: relation 'org:founded_by' does not occur in the training file"),
    # an id-less example's id is its position: 1 here, which the first example names explicitly
    ("position id taken", [_bad(BORN, id=1), _bad(FOUNDED, id=None)], [BORN],
     "example 1: duplicate id (at positions 0 and 1; an example without an id takes its position"),
])
def test_bad_input_is_one_line_error(tmp_path, capsys, tiny_tok, case, train, valid, message):
    paths = []
    for name, content in (("train.json", train), ("valid.json", valid)):
        path = tmp_path / name
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        paths.append(str(path))
    status, err, dest = prepare(tmp_path, capsys, *paths)
    bad_file = paths[1] if case == "unseen label" else paths[0]
    assert status == 1 and message in err, err
    assert err.startswith(f"spanbert-prepare-re: error: {bad_file}") and err.count("\n") == 1
    assert not os.path.exists(dest) and not [p for p in os.listdir(tmp_path) if p.startswith(".spanbert-tmp")]


def test_labels_file_and_existing_destination(tmp_path, capsys, tiny_tok):
    train = write_examples(tmp_path / "train.json", [BORN])
    valid = write_examples(tmp_path / "valid.json", [FOUNDED, _bad(BORN, relation="org:founded_by")])
    labels = tmp_path / "labels.txt"
    labels.write_text("per:city_of_birth\norg:founded_by\nno_relation\n")
    status, err, dest = prepare(tmp_path, capsys, train, valid, "--labels", str(labels))
    assert status == 0, err
    assert read_split(dest, "valid")[2] == [0, 2]  # negative label first, then the file's order
    status, err, _ = prepare(tmp_path, capsys, train, valid, "--labels", str(labels))
    assert status == 1 and "exists" in err and "--force" in err


def test_relation_scores_hand_computed():
    gold = [1, 1, 1, 1, 0, 0, 0, 0]
    pred = [1, 1, 0, 0, 2, 0, 0, 0]
    counts = relation_counts(pred, gold, negative_index=0)
    assert counts == {"re_correct_positive": 2, "re_predicted_positive": 3, "re_gold_positive": 4,
                      "re_correct": 5, "re_examples": 8}
    scores = relation_scores(counts)
    assert scores["precision"] == pytest.approx(200 / 3) and scores["recall"] == pytest.approx(50)
    assert scores["f1"] == pytest.approx(400 / 7) and scores["accuracy"] == pytest.approx(62.5)
    # counts of batches add up to the counts of the whole split
    halves = [relation_counts(pred[a:b], gold[a:b]) for a, b in ((0, 3), (3, 8))]
    assert {k: halves[0][k] + halves[1][k] for k in counts} == counts
    # the negative label need not be index 0
    assert relation_counts([2, 2, 0], [2, 0, 0], negative_index=2)["re_correct_positive"] == 1
    # only the negative label predicted: F1 0 however high the accuracy (precision 100: the TACRED scorer's definition)
    only_negative = relation_scores(relation_counts([0] * 8, gold))
    assert only_negative == {"precision": 100.0, "recall": 0.0, "f1": 0.0, "accuracy": 50.0}
    assert relation_scores(relation_counts([0, 0], [0, 0]))["f1"] == 0.0


def test_checkpoint_with_a_larger_vocabulary_is_a_one_line_error(spm_data):
    """A checkpoint whose vocabulary has more symbols than the data's dict.txt: UsageError naming both sizes."""
    from spanbert_plugin.core.errors import UsageError

    full = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    smaller = SpanBertDictionary(full.symbols[:-10])
    model = tiny_spanbert(smaller, dim=128)
    with pytest.raises(UsageError, match=f"has {len(full)} symbols but the data's dict.txt has {len(full) - 10}"):
        model.load_state_dict(tiny_spanbert(full, dim=128).state_dict())


def test_vocabulary_growth_keeps_old_rows(spm_data, caplog):
    torch.manual_seed(0)
    old_dict = SpanBertDictionary.load(os.path.join(spm_data, "dict.txt"))
    markers = assign_marker_ids(old_dict.symbols, "typed_marker")
    assert len(markers.appended) == len(MARKER_TABLE)  # sentencepiece has no [unused] entries
    new_dict = SpanBertDictionary(old_dict.symbols + markers.appended)
    pretrained = tiny_spanbert(old_dict, dim=128)
    with torch.no_grad():
        pretrained.lm_head.bias.normal_()
        pretrained.sbo_head.bias.normal_()
    model = tiny_spanbert(new_dict, dim=128)
    model.register_relation_head("relation_head", 3, "entity_start")
    with caplog.at_level("INFO"):
        model.load_state_dict(pretrained.state_dict())
    n, grown = len(old_dict), len(new_dict)
    assert f"grown from {n} to {grown} symbols" in caplog.text
    embed = model.encoder.embeddings.word_embeddings.weight.detach()
    assert torch.equal(embed[:n], pretrained.encoder.embeddings.word_embeddings.weight)
    assert model.lm_head.weight is model.encoder.embeddings.word_embeddings.weight
    for head in ("lm_head", "sbo_head"):
        bias = getattr(model, head).bias.detach()
        assert torch.equal(bias[:n], getattr(pretrained, head).bias) and not bias[n:].any()
    # new rows ~ N(0, 0.02): mean and std within 5 standard errors of their estimates
    new_rows = embed[n:].double().flatten()
    count = new_rows.numel()
    assert abs(new_rows.mean().item()) < 5 * 0.02 / count ** 0.5
    assert abs(new_rows.std().item() - 0.02) < 5 * 0.02 / (2 * count) ** 0.5


def test_relation_head_poolings():
    torch.manual_seed(0)
    model = tiny_spanbert(SpanBertDictionary(TINY_VOCAB), dim=128)
    model.register_relation_head("cls", 3, "cls")
    model.register_relation_head("ent", 3, "entity_start")
    model.eval()
    tokens = torch.tensor([[5, 1, 8, 9, 10, 2, 13, 6], [5, 2, 22, 1, 8, 6, 0, 0]])
    positions = torch.tensor([[1, 5], [3, 1]])
    features, _ = model(tokens, features_only=True)
    head = model.relation_heads["ent"]
    pooled = torch.cat([features[[0, 1], positions[:, 0]], features[[0, 1], positions[:, 1]]], dim=-1)
    expected = head.out_proj(torch.tanh(head.dense(pooled)))
    assert torch.allclose(model(tokens, relation_head_name="ent", entity_positions=positions)[0], expected, atol=1e-6)
    cls = model.relation_heads["cls"]
    expected = cls.out_proj(torch.tanh(cls.dense(features[:, 0])))
    assert torch.allclose(model(tokens, relation_head_name="cls", entity_positions=positions)[0], expected, atol=1e-6)


def test_dataset_batches_every_example():
    from fairseq.data import ListDataset

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.relation.dataset import RelationDataset

    rng = np.random.default_rng(0)
    items = [torch.arange(int(n)) for n in rng.integers(3, 20, size=21)]
    tokens = ListDataset(items, sizes=np.array([len(t) for t in items]))
    dataset = RelationDataset(tokens, np.zeros(21, np.int64), np.ones((21, 2), np.int64), pad_index=0)
    batches = dataset.batch_by_size(dataset.ordered_indices(), max_sentences=8, required_batch_size_multiple=8)
    assert sorted(np.concatenate(batches).tolist()) == list(range(21))
    longest = int(max(dataset.sizes))
    batches = dataset.batch_by_size(dataset.ordered_indices(), max_tokens=longest)  # the least that fits
    assert sorted(np.concatenate(batches).tolist()) == list(range(21))
    # fewer tokens than the longest example: one line naming --max-tokens (fairseq asserts)
    with pytest.raises(UsageError, match=f"--max-tokens {longest - 1}: an example is longer"):
        dataset.batch_by_size(dataset.ordered_indices(), max_tokens=longest - 1)



def test_training_order_is_by_length_with_ties_shuffled_per_epoch():
    """A shuffled (training) split is ordered by length, as few pad tokens need; within a length the order is drawn
    anew each epoch from (seed, epoch), the same on every run."""
    from fairseq.data import ListDataset

    from spanbert_plugin.relation.dataset import RelationDataset

    sizes = np.array([5, 3, 5, 3, 4, 5, 3, 5])
    tokens = ListDataset([torch.arange(int(n)) for n in sizes], sizes=sizes)
    dataset = RelationDataset(tokens, np.zeros(8, np.int64), np.ones((8, 2), np.int64), pad_index=0, shuffle=True)
    orders = []
    for epoch in range(1, 6):
        dataset.set_epoch(epoch)
        order = dataset.ordered_indices()
        assert sorted(order.tolist()) == list(range(8))
        assert sizes[order].tolist() == sorted(sizes.tolist())
        orders.append(order.tolist())
    assert len({tuple(o) for o in orders}) > 1  # ties in another order in some epoch
    dataset.set_epoch(2)
    assert dataset.ordered_indices().tolist() == orders[1]

@needs_tacred
@needs_uncased
def test_tacred_sample_with_bert_uncased(tmp_path, capsys):
    make_tokenizer_folder(str(tmp_path / "tok"), open(UNCASED_VOCAB, encoding="utf-8").read().splitlines())
    splits = [os.path.join(TACRED, f"{s}.json") for s in ("train", "dev", "test")]
    # the sample's dev split holds relations its train split lacks
    status, err, _ = prepare(tmp_path, capsys, splits[0], splits[1], test=splits[2])
    assert status == 1 and "dev.json: example e7798eaebf3179c706bf: relation 'org:website'" in err
    raw = {s: json.load(open(p)) for s, p in zip(("train", "valid", "test"), splits)}
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(sorted({ex["relation"] for exs in raw.values() for ex in exs})) + "\n")
    status, err, dest = prepare(tmp_path, capsys, splits[0], splits[1], "--labels", str(labels), test=splits[2])
    assert status == 0, err
    assert SpanBertDictionary.load(os.path.join(dest, "dict.txt")).symbols == open(UNCASED_VOCAB).read().splitlines()
    for split, examples in raw.items():
        texts, positions, _, records = read_split(dest, split)
        assert [r["id"] for r in records] == [ex["id"] for ex in examples]
        for ex, text, (subj, obj) in zip(examples, texts, positions):
            tokens = text.split()
            assert tokens[subj] == f"[unused{START_MARKERS.index(start_marker('SUBJ', normalise_type(ex['subj_type'])))}]"
            assert tokens[obj] == f"[unused{START_MARKERS.index(start_marker('OBJ', normalise_type(ex['obj_type'])))}]"
            assert sum(t.startswith("[unused") for t in tokens) == 2 and len(tokens) <= 128
            if "-LRB-" in ex["token"]:
                assert "(" in tokens and "lr" not in text
    with open(os.path.join(dest, "prepare_stats.json")) as f:
        stats = json.load(f)
    assert stats["markers"] == {"mode": "ner", "from_vocabulary": 46, "from_unused": 46, "appended": 0}
    assert [stats[s]["examples"] for s in raw] == [20, 20, 20]
    assert stats["train"]["relations"] == {"no_relation": 18, "org:city_of_headquarters": 2}


def _last_valid(output):
    records = [json.loads(line.split("| valid | ", 1)[1]) for line in output.splitlines() if "| valid | " in line]
    assert records, output[-3000:]
    return records[-1]


@needs_tacred
def test_finetune_from_pretrained_checkpoint_and_predict(spm_data, tmp_path, capsys):
    """Pre-train a tiny checkpoint, prepare TACRED with appended markers, fine-tune from it, predict."""
    run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "2", "--save-dir", str(tmp_path / "pt")])
    splits = [os.path.join(TACRED, f"{s}.json") for s in ("train", "dev", "test")]
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(sorted({ex["relation"] for p in splits for ex in json.load(open(p))})) + "\n")
    dest = str(tmp_path / "re")
    assert prepare_re.main(["--train", splits[0], "--valid", splits[1], "--test", splits[2], "--tokenizer-from", spm_data,
                            "--destdir", dest, "--labels", str(labels), "--entity-marker", "typed_marker"]) == 0
    assert '"appended": 92' in capsys.readouterr().out
    proc = run_cli([bin_path("fairseq-train"), dest, "--user-dir", "user_dir", "--task", "relation_extraction",
                    "--criterion", "relation_extraction", "--arch", "spanbert_tiny", "--re-pooling", "entity_start",
                    "--finetune-from-model", str(tmp_path / "pt" / "checkpoint_last.pt"), "--batch-size", "8",
                    "--optimizer", "adam", "--lr", "1e-3", "--max-epoch", "1", "--cpu", "--num-workers", "0",
                    "--best-checkpoint-metric", "f1", "--maximize-best-checkpoint-metric", "--log-format", "json",
                    "--no-epoch-checkpoints", "--seed", "1", "--save-dir", str(tmp_path / "ft")])
    output = proc.stdout + proc.stderr
    assert "grown from 1001 to 1093 symbols" in output
    valid = _last_valid(output)
    # 20 examples in batches of 8 with --required-batch-size-multiple 8: the trailing 4 are evaluated too
    assert int(valid["valid_re_examples"]) == 20 and (tmp_path / "ft" / "checkpoint_best.pt").exists()
    out = str(tmp_path / "pred_valid")
    assert predict_re.main(["--checkpoint", str(tmp_path / "ft" / "checkpoint_last.pt"), "--split", "valid",
                            "--out", out]) == 0, capsys.readouterr().err
    with open(os.path.join(out, "eval.json")) as f:
        scores = json.load(f)
    # prediction scores equal what validation logged for the same checkpoint
    for key in ("f1", "precision", "recall", "accuracy"):
        assert scores[key] == pytest.approx(float(valid[f"valid_{key}"]), abs=1e-3)
    assert scores["counts"]["correct"] == int(valid["valid_re_correct"]) and scores["counts"]["gold_positive"] == 7
    out = str(tmp_path / "pred_test")
    assert predict_re.main(["--checkpoint", str(tmp_path / "ft" / "checkpoint_best.pt"), "--data", dest,
                            "--split", "test", "--out", out]) == 0
    with open(os.path.join(out, "predictions.jsonl")) as f:
        predictions = [json.loads(line) for line in f]
    with open(labels) as f:
        known = set(f.read().split())
    assert [p["id"] for p in predictions] == [ex["id"] for ex in json.load(open(splits[2]))]
    assert all(p["label"] in known and 0 < p["prob"] <= 1 for p in predictions)
    # bad options are one-line errors
    assert predict_re.main(["--checkpoint", str(tmp_path / "pt" / "checkpoint_last.pt"), "--out", str(tmp_path / "x")]) == 1
    assert "not a relation_extraction checkpoint" in capsys.readouterr().err

    # the checkpoint records its labels: data prepared with them in another order is refused for prediction once the
    # training folder is gone (it was read with the labels permuted), and fine-tuning maps the head's rows by name
    ft = str(tmp_path / "ft" / "checkpoint_last.pt")
    state = torch.load(ft, map_location="cpu", weights_only=True)
    trained_labels = state["task_state"]["labels"]
    assert trained_labels == [*json.load(open(os.path.join(dest, "re_meta.json")))["labels"]]
    reordered = tmp_path / "labels_reordered.txt"
    negative, *others = trained_labels
    reordered.write_text("\n".join([negative, *reversed(others)]) + "\n")
    other = str(tmp_path / "re_reordered")
    assert prepare_re.main(["--train", splits[0], "--valid", splits[1], "--tokenizer-from", spm_data, "--destdir", other,
                            "--labels", str(reordered), "--entity-marker", "typed_marker"]) == 0
    os.rename(dest, str(tmp_path / "re_moved"))
    assert predict_re.main(["--checkpoint", ft, "--data", other, "--split", "valid", "--out", str(tmp_path / "p2")]) == 1
    assert "its labels differ from those the checkpoint was trained with" in capsys.readouterr().err
    run_cli([bin_path("fairseq-train"), other, "--user-dir", "user_dir", "--task", "relation_extraction",
             "--criterion", "relation_extraction", "--arch", "spanbert_tiny", "--re-pooling", "entity_start",
             "--finetune-from-model", ft, "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-12",
             "--max-update", "1", "--cpu", "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints",
             "--save-dir", str(tmp_path / "ft2")])
    key = "relation_heads.relation_head.out_proj.weight"
    before, after = state["model"][key], torch.load(tmp_path / "ft2" / "checkpoint_last.pt", map_location="cpu",
                                                    weights_only=True)["model"][key]
    new_labels = [negative, *reversed(others)]
    for row, label in enumerate(new_labels):  # each relation's row is the trained row of its name
        assert (after[row] - before[trained_labels.index(label)]).abs().max() < 1e-6, label
    # another pooling (another input width): the saved head is left out with a warning (was a size-mismatch traceback)
    proc = run_cli([bin_path("fairseq-train"), other, "--user-dir", "user_dir", "--task", "relation_extraction",
                    "--criterion", "relation_extraction", "--arch", "spanbert_tiny", "--re-pooling", "cls",
                    "--finetune-from-model", ft, "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-12",
                    "--max-update", "1", "--cpu", "--num-workers", "0", "--disable-validation", "--no-save",
                    "--save-dir", str(tmp_path / "ft3")])
    assert "relation head 'relation_head': the checkpoint's has another shape" in proc.stdout + proc.stderr
    # the HuggingFace export says what inputs the head was trained on; its import records the labels, so fine-tuning
    # from the import maps the head's rows by name as from the checkpoint
    moved = str(tmp_path / "re_moved")
    run_cli([bin_path("spanbert-export-hf"), "--checkpoint", ft, "--data", moved, "--out", str(tmp_path / "hf")])
    config = json.load(open(tmp_path / "hf" / "relation_config.json"))
    meta = json.load(open(os.path.join(moved, "re_meta.json")))
    assert config["heads"]["relation_head"]["labels"] == trained_labels
    assert {key: config[key] for key in ("entity_marker", "markers", "negative_label", "max_seq_length")} == {
        key: meta[key] for key in ("entity_marker", "markers", "negative_label", "max_seq_length")}
    run_cli([bin_path("spanbert-import-hf"), "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "imported")])
    imported = torch.load(tmp_path / "imported" / "model.pt", map_location="cpu", weights_only=True)
    assert imported["task_state"]["labels"] == trained_labels
    # and an export of the import says it all again (it lost the labels and inputs: the import's task has neither)
    run_cli([bin_path("spanbert-export-hf"), "--checkpoint", str(tmp_path / "imported" / "model.pt"),
             "--out", str(tmp_path / "hf_again")])
    assert json.load(open(tmp_path / "hf_again" / "relation_config.json")) == config


def _generated_relations(words, n, seed):
    """Sentences of corpus words with a one-word subject and object; the relation follows the subject type
    (PERSON: per:employee_of, ORGANIZATION: org:founded_by, LOCATION: no_relation), learnable from its marker."""
    rng = np.random.default_rng(seed)
    relation = {"PERSON": "per:employee_of", "ORGANIZATION": "org:founded_by", "LOCATION": "no_relation"}
    examples = []
    for i in range(n):
        tokens = [str(w) for w in rng.choice(words, int(rng.integers(6, 12)))]
        subj, obj = (int(x) for x in rng.choice(len(tokens), 2, replace=False))
        subj_type = str(rng.choice(list(relation)))
        examples.append({"id": f"g{seed}_{i}", "token": tokens, "subj_start": subj, "subj_end": subj, "obj_start": obj,
                         "obj_end": obj, "subj_type": subj_type, "obj_type": "PERSON", "relation": relation[subj_type]})
    return examples


def test_cls_pooling_over_two_gloo_workers_equals_prediction(spm_data, corpus_files, tmp_path, capsys):
    """--re-pooling cls end to end, validated by two gloo workers: the summed counts (hence precision, recall,
    F1, accuracy) equal those of spanbert-predict-re over the whole split in one process."""
    words = [w for w in open(corpus_files[0], encoding="utf-8").read().split() if w.isalpha()][:2000]
    train = write_examples(tmp_path / "train.json", _generated_relations(words, 160, 1))
    valid = write_examples(tmp_path / "valid.jsonl", _generated_relations(words, 37, 2), jsonl=True)  # 37: uneven shards
    dest = str(tmp_path / "re")
    assert prepare_re.main(["--train", train, "--valid", valid, "--tokenizer-from", spm_data, "--destdir", dest]) == 0
    save = str(tmp_path / "ck")
    outputs = run_gloo_ranks(lambda rank: [
        bin_path("fairseq-train"), dest, "--user-dir", "user_dir", "--task", "relation_extraction",
        "--criterion", "relation_extraction", "--arch", "spanbert_tiny", "--re-pooling", "cls", "--batch-size", "8",
        "--batch-size-valid", "5", "--optimizer", "adam", "--lr", "2e-3", "--max-update", "40", "--cpu",
        "--num-workers", "0", "--log-format", "json", "--no-epoch-checkpoints", "--seed", "1", "--save-dir", save,
        "--dropout", "0", "--validate-interval-updates", "40"])
    valid_log = _last_valid(outputs[0])
    assert int(valid_log["valid_re_examples"]) == 37
    state = torch.load(os.path.join(save, "checkpoint_last.pt"), map_location="cpu", weights_only=True)
    assert state["cfg"]["task"]["re_pooling"] == "cls"
    hidden = 128  # spanbert_tiny
    dense = [v for k, v in state["model"].items() if k.startswith("relation_heads.") and k.endswith("dense.weight")]
    assert len(dense) == 1 and dense[0].shape == (hidden, hidden)  # [CLS] alone, not two entity starts
    out = str(tmp_path / "pred")
    assert predict_re.main(["--checkpoint", os.path.join(save, "checkpoint_last.pt"), "--split", "valid",
                            "--out", out]) == 0, capsys.readouterr().err
    with open(os.path.join(out, "eval.json")) as f:
        scores = json.load(f)
    from spanbert_plugin.relation.metrics import COUNT_KEYS

    for key in COUNT_KEYS:  # summed over both workers' shards
        assert scores["counts"][key[len("re_"):]] == int(valid_log[f"valid_{key}"]), key
    for key in ("f1", "precision", "recall", "accuracy"):
        assert scores[key] == pytest.approx(float(valid_log[f"valid_{key}"]), abs=1e-3), key
    assert scores["counts"]["predicted_positive"] > 0 and scores["counts"]["gold_positive"] > 0


def test_json_lines_may_hold_unicode_line_separators_in_strings(tmp_path, capsys, tiny_tok):
    """JSON lines end at \\n only: U+2028 and U+0085 written raw inside a token (ensure_ascii=False) are no line ends."""
    odd = dict(BORN, id="odd", token=["Bill", "Gates", "was", "born", "\u2028in\u0085", "Seattle", "."])
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(ex, ensure_ascii=False) + "\n" for ex in (odd, FOUNDED)), encoding="utf-8")
    as_list = write_examples(tmp_path / "list.json", [odd, FOUNDED])
    status, err, dest = prepare(tmp_path, capsys, str(train), str(train), dest="from_lines")
    assert status == 0, err
    status, err, again = prepare(tmp_path, capsys, as_list, as_list, dest="from_list")
    assert status == 0, err
    assert read_split(dest, "train") == read_split(again, "train")


def test_the_criterion_counts_against_the_tasks_negative_label():
    """The no-relation label need not be index 0: with it at 2, predictions 2 0 1 2 against gold 2 0 0 1 make two
    predicted positives, three gold ones and one right (the 0)."""
    from spanbert_plugin.relation.criterion import RelationExtractionCriterion

    task = SimpleNamespace(cfg=SimpleNamespace(relation_head_name="head"), negative_index=2)
    logits = torch.tensor([[0.0, 0.0, 5.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0]])
    _, _, log = RelationExtractionCriterion(task)(lambda **kwargs: (logits, None),
                                                  {"net_input": {}, "target": torch.tensor([2, 0, 0, 1]), "ntokens": 10})
    assert {key: int(log[key]) for key in ("re_correct_positive", "re_predicted_positive", "re_gold_positive")} == {
        "re_correct_positive": 1, "re_predicted_positive": 2, "re_gold_positive": 3}


def test_punctuation_markers_write_a_type_of_several_words_as_lower_case_words():
    from spanbert_plugin.relation.markers import punct_marker_words

    assert punct_marker_words("OBJ", "STATE_OR_PROVINCE") == (["#", "^", "state", "or", "province", "^"], ["#"])


@pytest.mark.parametrize("extra, message", [
    (["--labels", "{labels}"], "--labels {labels}: label 'org:founded_by' listed twice"),
    (["--max-seq-length", "3"], "--max-seq-length 3: must be at least 4 ([CLS], two markers, [SEP])"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, tiny_tok, extra, message):
    train = write_examples(tmp_path / "train.json", [BORN, FOUNDED])
    labels = tmp_path / "labels.txt"
    labels.write_text("per:city_of_birth\norg:founded_by\nno_relation\norg:founded_by\n")
    status, err, dest = prepare(tmp_path, capsys, train, train, *(a.replace("{labels}", str(labels)) for a in extra))
    assert status == 1 and err == f"spanbert-prepare-re: error: {message.replace('{labels}', str(labels))}\n", err
    assert not os.path.exists(dest) and not [p for p in os.listdir(tmp_path) if p.startswith(".spanbert-tmp")]


def _prepared(tmp_path, capsys, examples=(BORN, FOUNDED), *extra, dest="re"):
    train = write_examples(tmp_path / f"{dest}_train.json", list(examples))
    status, err, destdir = prepare(tmp_path, capsys, train, train, *extra, dest=dest)
    assert status == 0, err
    return destdir


def test_a_split_missing_or_damaged_in_the_prepared_folder_is_one_line(tmp_path, capsys, tiny_tok):
    """--valid-subset test on a folder prepared without --test names the .bin/.idx; a split whose .npz is missing, or
    holds the arrays of another number of examples (a file copied from another preparation), names the .npz; the
    latter was a ValueError traceback about dataset lengths."""
    import shutil

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.relation.dataset import RelationDataset

    data = _prepared(tmp_path, capsys)
    dictionary = SpanBertDictionary.load(os.path.join(data, "dict.txt"))
    with pytest.raises(UsageError, match=f"^{data}/test.bin/.idx: no such file \\(split 'test' was not prepared in {data}\\)$"):
        RelationDataset.load(data, "test", dictionary)
    for suffix in (".bin", ".idx"):
        shutil.copyfile(os.path.join(data, "valid" + suffix), os.path.join(data, "test" + suffix))
    with pytest.raises(UsageError, match=f"^{data}/test.npz: no such file \\(split 'test' was not prepared in {data}\\)$"):
        RelationDataset.load(data, "test", dictionary)
    other = _prepared(tmp_path, capsys, [BORN, FOUNDED, dict(BORN, id="again")], dest="three")
    shutil.copyfile(os.path.join(other, "train.npz"), os.path.join(data, "train.npz"))
    shutil.copyfile(os.path.join(other, "train.examples.jsonl"), os.path.join(data, "train.examples.jsonl"))
    with pytest.raises(UsageError, match=f"^{data}/train.npz: damaged or truncated \\(3 labels for the 2 examples of "
                                         "train.idx\\)"):
        RelationDataset.load(data, "train", dictionary)


@pytest.mark.parametrize("extra, message", [
    (["--arch", "roberta_base", "--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
      "--encoder-attention-heads", "2"],
     "relation_extraction needs a spanbert model (--arch spanbert_*), got RobertaModel"),
    (["--arch", "spanbert_tiny", "--max-positions", "64"],
     "{data}: examples of up to 128 tokens exceed the model's 64 positions; prepare the data again with a smaller "
     "--max-seq-length"),
])
def test_a_model_the_task_cannot_use_is_refused_when_built(tmp_path, capsys, tiny_tok, extra, message):
    from fairseq import tasks

    from spanbert_plugin.core.errors import UsageError

    data = _prepared(tmp_path, capsys)
    cfg = _training_config(data, *extra)
    task = tasks.setup_task(cfg.task)
    with pytest.raises(UsageError) as error:
        task.build_model(cfg.model)
    assert str(error.value) == message.replace("{data}", data)


def _training_config(data, *extra):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import spanbert_plugin.registry  # noqa: F401  (the plugin's tasks, for fairseq's parser)

    arch = [] if "--arch" in extra else ["--arch", "spanbert_tiny"]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), [
        data, "--task", "relation_extraction", "--criterion", "relation_extraction", *arch, "--cpu", *extra]))


def test_max_tokens_below_the_longest_example_names_max_tokens_in_training(tmp_path, capsys, tiny_tok):
    """fairseq-train filters the training split by the least of the task's, the model's and --max-tokens' limits: an
    example longer than --max-tokens was reported as longer than 'the model's 6 positions' (the model has 512), with
    the advice to prepare the data again. The option is named instead, as in batching."""
    from fairseq import tasks

    from spanbert_plugin.core.errors import UsageError

    data = _prepared(tmp_path, capsys)  # 8 tokens each
    cfg = _training_config(data, "--max-tokens", "6")
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    task.load_dataset("train")
    dataset = task.dataset("train")
    assert dataset.sizes.tolist() == [8, 8]


    with pytest.raises(UsageError, match=r"^--max-tokens 6: an example is longer, and a batch holds whole examples"):
        training_batches(task, model, dataset, 6)
    batches = training_batches(task, model, dataset, 8).next_epoch_itr(shuffle=False)
    assert sorted(i for batch in batches for i in batch["id"].tolist()) == [0, 1]


def test_dataset_sizes_and_the_filter_of_examples_longer_than_the_model():
    from fairseq.data import ListDataset

    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.relation.dataset import RelationDataset

    items = [torch.arange(n) for n in (4, 9, 6, 9)]
    dataset = RelationDataset(ListDataset(items, sizes=np.array([4, 9, 6, 9])), np.zeros(4, np.int64),
                              np.ones((4, 2), np.int64), pad_index=0)
    assert [dataset.num_tokens(i) for i in range(4)] == [dataset.size(i) for i in range(4)] == [4, 9, 6, 9]
    indices = np.arange(4)
    kept, ignored = dataset.filter_indices_by_size(indices, 9)
    assert kept.tolist() == [0, 1, 2, 3] and ignored == []
    with pytest.raises(UsageError, match=r"^2 examples are longer than the model's 8 positions; prepare the data again "
                                         "with a smaller --max-seq-length$"):
        dataset.filter_indices_by_size(indices, 8)


def test_prediction_data_prepared_with_other_labels_than_the_training_folder_is_refused(tmp_path, capsys, tiny_tok):
    """The check spanbert-predict-re makes while the training folder still exists, before any model is built."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.relation.predict import _check_same_labels

    trained_on = _prepared(tmp_path, capsys)
    labels = tmp_path / "labels.txt"
    labels.write_text("per:city_of_birth\norg:founded_by\n")
    data = _prepared(tmp_path, capsys, (BORN, FOUNDED), "--labels", str(labels), dest="other")
    _check_same_labels(_prepared(tmp_path, capsys, dest="same"), trained_on)  # prepared alike: accepted
    with pytest.raises(UsageError) as error:
        _check_same_labels(data, trained_on)
    assert str(error.value) == f"--data {data}: its labels differ from those of {trained_on}, which the checkpoint was " \
                               "trained on"


def test_a_relation_head_refuses_an_unknown_pooling_and_entity_pooling_without_positions():
    from spanbert_plugin.model.relation_head import RelationHead

    with pytest.raises(ValueError, match=r"^unknown relation pooling 'mean'; expected one of cls, entity_start$"):
        RelationHead(8, 3, "mean", dropout=0.0)
    head = RelationHead(8, 3, "entity_start", dropout=0.0)
    with pytest.raises(ValueError, match=r"^entity_start pooling needs entity_positions \(B x 2\)$"):
        head(torch.zeros(2, 5, 8))
