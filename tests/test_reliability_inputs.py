"""What the commands read and replace: --force across commands, inputs named by a checkpoint, one-line
errors for malformed inputs, the byte-order mark, and --help without torch.

Most cases call a command's ``main(argv)`` in this process (fast: torch is imported once); the ones about
start-up and signals run the console command in a subprocess.
"""
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from spanbert_plugin.cli import export_hf, predict_classification, predict_coref, predict_qa, predict_re
from spanbert_plugin.cli import prepare_classification, prepare_coref, prepare_qa, prepare_re
from spanbert_plugin.core.errors import UsageError
from spanbert_plugin.core.file_utils import MANIFEST, OutputError, check_destination, checkpoint_inputs, parse_json, read_text


def fake_output(folder, command, files=("dict.txt", "train.bin")):
    """A folder shaped like an output of ``command``: its files and a manifest naming it."""
    os.makedirs(folder)
    for name in files:
        with open(os.path.join(folder, name), "w") as f:
            f.write(name)
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump({"command": command, "files": list(files)}, f)
    return str(folder)


def contents(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


def one_line_error(capsys, prog, expected):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: error:") and expected in err[0], err


# ----------------------------------------------------------------------------- --force across commands


@pytest.mark.parametrize("writer, main, prog, argv", [
    ("spanbert-prepare", predict_qa.main, "spanbert-predict-qa", ["--checkpoint", "missing.pt", "--out"]),
    ("spanbert-prepare-re", prepare_qa.main, "spanbert-prepare-qa", ["--train", "t.json", "--tokenizer-from", "tok", "--destdir"]),
    ("spanbert-prepare", predict_classification.main, "spanbert-predict-classification", ["--checkpoint", "missing.pt", "--out"]),
    ("spanbert-prepare-qa", prepare_re.main, "spanbert-prepare-re",
     ["--train", "t.json", "--valid", "v.json", "--tokenizer-from", "tok", "--destdir"]),
    ("spanbert-predict-qa", export_hf.main, "spanbert-export-hf", ["--checkpoint", "missing.pt", "--out"]),
])
def test_force_never_replaces_another_commands_output(tmp_path, monkeypatch, capsys, writer, main, prog, argv):
    folder = fake_output(tmp_path / "out", writer)
    before = contents(folder)
    monkeypatch.chdir(tmp_path)
    assert main(argv + ["out", "--force"]) == 1
    one_line_error(capsys, prog, f"is an output of {writer}, not of {prog}")
    assert contents(folder) == before


def test_force_replaces_only_the_same_commands_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_output(tmp_path / "mine", "spanbert-predict-qa")
    check_destination("mine", "spanbert-predict-qa", [], True, "--out")
    with pytest.raises(OutputError, match="pass --force"):
        check_destination("mine", "spanbert-predict-qa", [], False, "--out")
    # a manifest that names no command is not this command's either
    fake_output(tmp_path / "anonymous", "")
    with pytest.raises(OutputError, match="is an output of a spanbert command, not of spanbert-predict-qa"):
        check_destination("anonymous", "spanbert-predict-qa", [], True, "--out")


def test_every_command_records_its_own_name():
    """The name each command gives check_destination/atomic_directory is its console name (a stable contract)."""
    from spanbert_plugin.pretraining import prepare as pretraining_prepare
    from spanbert_plugin.classification import predict as classification_predict, prepare as classification_prepare
    from spanbert_plugin.qa import predict as qa_predict, prepare as qa_prepare
    from spanbert_plugin.relation import predict as re_predict, prepare as re_prepare

    named = {module.COMMAND for module in (pretraining_prepare, classification_predict, classification_prepare,
                                           qa_predict, qa_prepare, re_predict, re_prepare)}
    assert named == {"spanbert-prepare", "spanbert-predict-classification", "spanbert-prepare-classification",
                     "spanbert-predict-qa", "spanbert-prepare-qa", "spanbert-predict-re", "spanbert-prepare-re"}


# ----------------------------------------------------------------------------- inputs named by a checkpoint


def fake_checkpoint(path, data):
    """A file with a fairseq checkpoint's shape as far as its stored task.data goes (no weights)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"cfg": {"task": {"_name": "extractive_qa", "data": data}}, "model": {}}, path)
    return str(path)


def test_checkpoint_inputs_include_the_data_it_was_trained_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ck = fake_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", f"data{os.pathsep}more")
    assert checkpoint_inputs(ck) == [ck, "data", os.path.join(str(tmp_path / "ck"), "data"),
                                     "more", os.path.join(str(tmp_path / "ck"), "more")]
    assert checkpoint_inputs(ck, "given") == [ck, "given"]
    assert checkpoint_inputs("missing.pt") == ["missing.pt"]
    (tmp_path / "damaged.pt").write_bytes(b"PK\x03\x04 not a zip")
    assert checkpoint_inputs(str(tmp_path / "damaged.pt")) == [str(tmp_path / "damaged.pt")]


def test_checkpoint_inputs_of_a_legacy_format_file_and_empty_parts_of_its_data(tmp_path, monkeypatch):
    """A checkpoint in torch's legacy (pre-zip) format, which torch cannot memory-map, still names its data folder
    as an input; an empty part of a stored ``a:`` names no folder."""
    monkeypatch.chdir(tmp_path)
    os.makedirs(tmp_path / "ck")
    ck = str(tmp_path / "ck" / "legacy.pt")
    torch.save({"cfg": {"task": {"data": f"data{os.pathsep}"}}, "model": {}}, ck, _use_new_zipfile_serialization=False)
    assert checkpoint_inputs(ck) == [ck, "data", os.path.join(str(tmp_path / "ck"), "data")]


@pytest.mark.parametrize("main, prog, out", [
    (export_hf.main, "spanbert-export-hf", "data"),
    (predict_qa.main, "spanbert-predict-qa", "data/squad"),
    (predict_qa.main, "spanbert-predict-qa", "data"),
    (predict_re.main, "spanbert-predict-re", "data/squad"),
    (predict_classification.main, "spanbert-predict-classification", "data/squad"),
    (predict_coref.main, "spanbert-predict-coref", "data/squad"),
])
def test_default_data_folder_is_an_input(tmp_path, monkeypatch, capsys, main, prog, out):
    """--out may not be or hold the folder the checkpoint was trained on, though --data was not given.

    The checkpoint holds no weights: a refusal proves the check came before any model was built.
    """
    monkeypatch.chdir(tmp_path)
    fake_output(tmp_path / "data" / "squad", "spanbert-prepare-qa")
    ck = fake_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", "data/squad")
    before = contents(tmp_path / "data" / "squad")
    assert main(["--checkpoint", ck, "--out", out, "--force"]) == 1
    one_line_error(capsys, prog, "is or holds the input data/squad")
    assert contents(tmp_path / "data" / "squad") == before



def test_coref_text_prediction_counts_the_default_data_folder_as_an_input(tmp_path, monkeypatch, capsys):
    """predict-coref --text reads its tokenizer from the checkpoint's data folder: --out may not be that folder."""
    monkeypatch.chdir(tmp_path)
    fake_output(tmp_path / "data" / "coref", "spanbert-prepare-coref")
    ck = fake_checkpoint(tmp_path / "ck" / "checkpoint_last.pt", "data/coref")
    text = write_text(tmp_path / "story.txt", "Ada met Bo . She smiled .\n")
    before = contents(tmp_path / "data" / "coref")
    assert predict_coref.main(["--checkpoint", ck, "--text", text, "--out", "data/coref", "--force"]) == 1
    one_line_error(capsys, "spanbert-predict-coref", "is or holds the input data/coref")
    assert contents(tmp_path / "data" / "coref") == before


@pytest.mark.parametrize("main, prog, task", [
    (predict_qa.main, "spanbert-predict-qa", "extractive_qa"),
    (predict_re.main, "spanbert-predict-re", "relation_extraction"),
    (predict_classification.main, "spanbert-predict-classification", "sentence_classification"),
])
def test_a_recorded_data_folder_that_is_gone_asks_for_data(tmp_path, monkeypatch, capsys, main, prog, task):
    """The folder a checkpoint was trained on, moved or removed since, is named as gone (not as "not a prepared
    folder"), with the fix: --data. The checkpoint has no weights: the refusal comes before any model is built."""
    monkeypatch.chdir(tmp_path)
    gone = str(tmp_path / "data" / "removed")
    ck = str(tmp_path / "checkpoint_best.pt")
    torch.save({"cfg": {"task": {"_name": task, "data": gone}}, "model": {}, "extra_state": {"train_iterator": {}},
                "optimizer_history": [{"criterion_name": task, "optimizer_name": "adam", "num_updates": 0,
                                       "lr_scheduler_state": {"best": None}}]}, ck)
    assert main(["--checkpoint", ck, "--out", "predictions"]) == 1
    one_line_error(capsys, prog, f"--checkpoint {ck}: the data folder it was trained on, {gone}, no longer exists; "
                                 "pass --data FOLDER")
    assert not (tmp_path / "predictions").exists()

# ----------------------------------------------------------------------------- malformed inputs: one line each


def squad(qas, context="Ada lives in Oslo ."):
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}


def question(qid="q1", text="Where does Ada live ?", **extra):
    return {"id": qid, "question": text, "answers": [{"text": "Oslo", "answer_start": 13}], **extra}


def write_text(path, text, bom=False):
    with open(path, "w", encoding="utf-8-sig" if bom else "utf-8") as f:
        f.write(text)
    return str(path)


DEEP = "[" * 50_000 + "]" * 50_000
LONE = "Ada \\ud800 lives"  # as JSON source: a lone high surrogate escape


@pytest.mark.parametrize("text, expected", [
    (json.dumps(squad([question()])).replace("Ada lives", LONE, 1), "lone UTF-16 surrogate escape"),
    (json.dumps(squad([question(text="Where \\udc00 ?")])).replace("\\\\udc00", "\\udc00"), "lone UTF-16 surrogate"),
    ('{"version": "v2.0", "data": ' + DEEP + "}", "nested too deeply"),
    (json.dumps(squad([question(text="  ")])), "question id q1: empty question"),
    (json.dumps(squad([question(qid=7)])), "'id' must be a string, got 7"),
    (json.dumps(squad([question(is_impossible="yes")])), "question id q1: 'is_impossible' must be true or false, got \"yes\""),
    (json.dumps(squad([question(is_impossible=1)])), "'is_impossible' must be true or false, got 1"),
])
def test_qa_file_errors_are_one_line(tmp_path, text, expected):
    from spanbert_plugin.qa.prepare import read_qa_file

    with pytest.raises(UsageError, match=None) as err:
        read_qa_file(write_text(tmp_path / "train.json", text))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_qa_mrqa_lines_name_the_line_of_a_lone_surrogate(tmp_path):
    from spanbert_plugin.qa.prepare import read_qa_file

    header = json.dumps({"header": {"dataset": "x"}})
    record = {"context": "Ada lives in Oslo .", "qas": [{"qid": "q", "question": "Where ?", "answers": ["Oslo"],
                                                          "detected_answers": [{"text": "Oslo", "char_spans": [[13, 16]]}]}]}
    bad = json.dumps(record).replace("Where", "Where \\udfff")
    path = write_text(tmp_path / "train.jsonl", "\n".join([header, json.dumps(record), bad]) + "\n")
    with pytest.raises(UsageError, match=r"train.jsonl:3: \\udfff is a lone UTF-16 surrogate"):
        read_qa_file(path)


def test_valid_surrogate_pairs_and_escaped_backslashes_are_text(tmp_path):
    assert parse_json('["\\ud83d\\ude00", "\\\\ud800"]', "x") == ["\U0001F600", "\\ud800"]
    with pytest.raises(UsageError, match="x: JSON nested too deeply"):
        parse_json(DEEP, "x")


def re_example(ex_id, relation="no_relation"):
    record = {"token": ["Ada", "met", "Bo", "."], "subj_start": 0, "subj_end": 0, "obj_start": 2, "obj_end": 2,
              "relation": relation}
    return record if ex_id is None else {"id": ex_id, **record}


@pytest.mark.parametrize("text, expected", [
    (json.dumps([re_example("a")]).replace("met", "met \\ud800"), "lone UTF-16 surrogate escape"),
    (DEEP, "nested too deeply"),
    (json.dumps(re_example("a")) + "\n" + DEEP + "\n", "examples.json:2: JSON nested too deeply"),
    (json.dumps([re_example("a"), re_example("b"), re_example("a")]), "example a: duplicate id (at positions 0 and 2)"),
    (json.dumps([re_example(7), re_example("7")]), "example 7: duplicate id"),
])
def test_relation_file_errors_are_one_line(tmp_path, text, expected):
    from spanbert_plugin.relation.prepare import read_examples

    with pytest.raises(UsageError) as err:
        read_examples(write_text(tmp_path / "examples.json", text))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_relation_examples_without_ids_are_not_duplicates(tmp_path):
    from spanbert_plugin.relation.prepare import read_examples

    assert [ex.id for ex in read_examples(write_text(tmp_path / "e.json", json.dumps([re_example(None)] * 3)))] == [0, 1, 2]


def classification_options(text_columns=("text",), label="label", file_format="auto"):
    from spanbert_plugin.classification.prepare import ReadOptions

    return ReadOptions(list(text_columns), label, file_format=file_format)


@pytest.mark.parametrize("text, expected", [
    ('{"text": "good \\udbff film", "label": "pos"}\n', "rows.jsonl:1: \\udbff is a lone UTF-16 surrogate"),
    ('{"text": "ok", "label": "pos"}\n{"text": ' + DEEP + ', "label": "neg"}\n', "rows.jsonl:2: JSON nested too deeply"),
])
def test_classification_jsonl_errors_are_one_line(tmp_path, text, expected):
    from spanbert_plugin.classification.prepare import read_table

    with pytest.raises(UsageError) as err:
        read_table(write_text(tmp_path / "rows.jsonl", text), classification_options())
    assert expected in str(err.value) and "\n" not in str(err.value)



@pytest.mark.parametrize("text, expected", [
    ('{"text": "a"}\n{"text": "b", "label": "pos"}\n', "rows.jsonl:2: has the label key 'label', but line 1 has none"),
    ('{"text": "a", "label": "pos"}\n\n{"text": "b"}\n', "rows.jsonl:3: no label key 'label', but line 1 has one"),
])
def test_a_test_file_labelled_in_some_records_only_is_one_line(tmp_path, text, expected):
    """A test file's labels are optional: whether it has them is read from every record, not from the first alone
    (a first record without one dropped every other label silently)."""
    from spanbert_plugin.classification.prepare import read_table

    with pytest.raises(UsageError, match=re.escape(expected) + "; give every record a label, or none"):
        read_table(write_text(tmp_path / "rows.jsonl", text), classification_options(), label_required=False)
    unlabelled = read_table(write_text(tmp_path / "none.jsonl", '{"text": "a"}\n{"text": "b"}\n'),
                            classification_options(), label_required=False)
    labelled = read_table(write_text(tmp_path / "all.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n'),
                          classification_options(), label_required=False)
    assert (unlabelled.labels, labelled.labels) == (None, ["x", "y"])

def test_label_column_may_not_be_a_text_column(tmp_path):
    from spanbert_plugin.classification.prepare import read_table

    with pytest.raises(UsageError, match="--label-column label: also given in --text-columns"):
        classification_options(("text", "label"), "label")
    # the same column, once by name and once by index
    path = write_text(tmp_path / "rows.tsv", "sentence\tlabel\ngood film\t1\n")
    with pytest.raises(UsageError, match="--label-column 1 is the column 1 that --text-columns also reads"):
        read_table(path, classification_options(("sentence", "label")[1:], 1))


# ----------------------------------------------------------------------------- the byte-order mark, everywhere


def test_byte_order_mark_is_dropped_by_every_reader(tmp_path):
    from spanbert_plugin.classification.prepare import read_table
    from spanbert_plugin.qa.prepare import read_qa_file
    from spanbert_plugin.relation.prepare import build_label_list, read_examples
    from spanbert_plugin.core.tokenization import read_wordpiece_vocab

    assert read_text(write_text(tmp_path / "plain.txt", "a\n", bom=True)) == "a\n"
    qa = read_qa_file(write_text(tmp_path / "qa.json", json.dumps(squad([question()])), bom=True))
    assert [q["id"] for q in qa.questions] == ["q1"]
    examples = read_examples(write_text(tmp_path / "re.json", json.dumps([re_example("a", "per:x")]), bom=True))
    assert [ex.relation for ex in examples] == ["per:x"]
    examples = read_examples(write_text(tmp_path / "re.jsonl", json.dumps(re_example("a")) + "\n", bom=True))
    assert [ex.id for ex in examples] == ["a"]
    labels_file = write_text(tmp_path / "labels.txt", "no_relation\nper:x\n", bom=True)
    assert build_label_list(examples, "no_relation", labels_file) == ["no_relation", "per:x"]
    table = read_table(write_text(tmp_path / "rows.jsonl", '{"text": "ok", "label": "pos"}\n', bom=True),
                       classification_options())
    assert table.labels == ["pos"]
    table = read_table(write_text(tmp_path / "rows.csv", "text,label\nok,pos\n", bom=True), classification_options())
    assert table.texts == [["ok"]] and table.labels == ["pos"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]
    assert read_wordpiece_vocab(write_text(tmp_path / "vocab.txt", "\n".join(vocab) + "\n", bom=True)) == vocab


# ----------------------------------------------------------------------------- tokenizer folder, missing split


def test_damaged_tokenizer_meta_is_one_line(tmp_path, wordpiece_data, capsys, monkeypatch):
    import shutil

    tokenizer = tmp_path / "tok"
    shutil.copytree(wordpiece_data, tokenizer)
    (tokenizer / "spanbert_tokenizer.json").write_text('{"type": "wordpi')
    squad_file = write_text(tmp_path / "train.json", json.dumps(squad([question()])))
    monkeypatch.chdir(tmp_path)
    assert prepare_qa.main(["--train", squad_file, "--tokenizer-from", str(tokenizer), "--destdir", "out"]) == 1
    one_line_error(capsys, "spanbert-prepare-qa", "spanbert_tokenizer.json:1: not valid JSON")
    assert not (tmp_path / "out").exists()



def prepare_argv(command, tmp_path):
    """The arguments of a prepare command over one small valid input file."""
    if command is prepare_qa:
        return ["--train", write_text(tmp_path / "train.json", json.dumps(squad([question()])))]
    if command is prepare_re:
        path = write_text(tmp_path / "train.json", json.dumps([re_example("a")]))
        return ["--train", path, "--valid", path]
    if command is prepare_classification:
        path = write_text(tmp_path / "train.tsv", "text\tlabel\nok\tpos\n")
        return ["--train", path, "--valid", path, "--text-columns", "text", "--label-column", "label"]
    document = {"doc_key": "nw/x_0", "sentences": [["Ada", "met", "Bo", "."]], "clusters": [[[0, 0], [2, 2]]]}
    return ["--train", write_text(tmp_path / "train.jsonl", json.dumps(document) + "\n")]


@pytest.mark.parametrize("command", [prepare_qa, prepare_re, prepare_classification, prepare_coref],
                         ids=lambda command: command.__name__.rsplit(".", 1)[-1])
@pytest.mark.parametrize("model_bytes, expected", [
    (None, "spm.model: no such file, though spanbert_tokenizer.json beside it names a sentencepiece tokenizer"),
    (b"\x0a\x05<unk", "spm.model: cannot load the sentencepiece model (INTERNAL: could not parse ModelProto"),
], ids=["missing", "truncated"])
def test_a_missing_or_truncated_sentencepiece_model_is_one_line(tmp_path, capsys, monkeypatch, command, model_bytes,
                                                               expected):
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "spanbert_tokenizer.json").write_text('{"type": "sentencepiece"}', encoding="utf-8")
    (tokenizer / "dict.txt").write_text("", encoding="utf-8")
    if model_bytes is not None:
        (tokenizer / "spm.model").write_bytes(model_bytes)
    monkeypatch.chdir(tmp_path)
    assert command.main(prepare_argv(command, tmp_path) + ["--tokenizer-from", str(tokenizer), "--destdir", "out"]) == 1
    one_line_error(capsys, "spanbert-" + command.__name__.rsplit(".", 1)[-1].replace("_", "-"), expected)
    assert not (tmp_path / "out").exists()

def test_qa_folder_without_valid_split_names_the_fix(tmp_path, wordpiece_data):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import spanbert_plugin.registry  # noqa: F401  (the extractive_qa task)

    qas = [question(f"q{i}") for i in range(4)]
    squad_file = write_text(tmp_path / "train.json", json.dumps(squad(qas)))
    assert prepare_qa.main(["--train", squad_file, "--tokenizer-from", wordpiece_data, "--destdir", str(tmp_path / "qa"),
                            "--max-seq-length", "64", "--doc-stride", "16", "--max-query-length", "16"]) == 0
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(tmp_path / "qa"), "--user-dir", os.path.join(ROOT, "spanbert_plugin"), "--task", "extractive_qa",
        "--criterion", "extractive_qa", "--arch", "spanbert_tiny", "--cpu"])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("train")
    with pytest.raises(UsageError, match="no split 'valid' .* --valid FILE, or train with --disable-validation"):
        task.load_dataset("valid")



# ----------------------------------------------------------------------------- a damaged prepared folder


def cut_in_half(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def damaged_arrays(tmp_path, name):
    import numpy as np

    if name.endswith(".npz"):
        np.savez(tmp_path / name, labels=np.arange(50), entity_positions=np.zeros((50, 2), dtype=np.int64))
    else:
        np.save(tmp_path / name, np.arange(50))
    cut_in_half(tmp_path / name)
    from spanbert_plugin.core.file_utils import load_arrays

    return lambda: load_arrays(str(tmp_path / name))


def damaged_token_items(tmp_path, name):
    from spanbert_plugin.core.datasets import load_token_items
    from spanbert_plugin.core.finetune_io import write_token_items

    write_token_items([[5, 6, 7], [8, 9], [10]], str(tmp_path / "valid"), vocab_size=100)
    assert len(load_token_items(str(tmp_path / "valid"), None, "valid")) == 3  # intact, it loads
    cut_in_half(tmp_path / name)
    return lambda: load_token_items(str(tmp_path / "valid"), None, "valid")


def _token_items_with_index(tmp_path, change):
    from spanbert_plugin.core.datasets import load_token_items
    from spanbert_plugin.core.finetune_io import write_token_items

    write_token_items([[5, 6, 7], [8, 9], [10]], str(tmp_path / "valid"), vocab_size=100)
    change(tmp_path / "valid.idx")
    return lambda: load_token_items(str(tmp_path / "valid"), None, "valid")


def index_cut_in_its_header(tmp_path, name):
    return _token_items_with_index(tmp_path, lambda index: index.write_bytes(index.read_bytes()[:10]))


def index_of_another_format(tmp_path, name):
    return _token_items_with_index(tmp_path, lambda index: index.write_bytes(b"NOTFAIRSQ" + index.read_bytes()[9:]))


def index_replaced_by_a_folder(tmp_path, name):
    return _token_items_with_index(tmp_path, lambda index: (index.unlink(), index.mkdir()))


def damaged_prepared_json(tmp_path, name):
    from spanbert_plugin.core.finetune_io import read_prepared_json

    (tmp_path / name).write_text('{"labels": ["a", "b"], "regre', encoding="utf-8")
    return lambda: read_prepared_json(str(tmp_path), name, "spanbert-prepare-classification")


def damaged_qa_config(tmp_path, name):
    import spanbert_plugin.registry  # noqa: F401  (the extractive_qa task)
    from spanbert_plugin.qa.task import ExtractiveQAConfig, ExtractiveQATask

    (tmp_path / "dict.txt").write_text("", encoding="utf-8")
    (tmp_path / name).write_text('{"max_seq_length": 3', encoding="utf-8")
    return lambda: ExtractiveQATask.setup_task(ExtractiveQAConfig(data=str(tmp_path)))


def flipped_byte_array(tmp_path, name):
    import numpy as np

    np.save(tmp_path / name, np.arange(50))
    data = bytearray((tmp_path / name).read_bytes())
    data[10] ^= 0xFF  # inside the header numpy parses as a Python literal: tokenize's TokenError
    (tmp_path / name).write_bytes(bytes(data))
    from spanbert_plugin.core.file_utils import load_arrays

    return lambda: load_arrays(str(tmp_path / name))


def damaged_jsonl(tmp_path, name):
    from spanbert_plugin.coref.prepare import load_documents

    (tmp_path / name).write_text('{"doc_key": "a"}\n{"doc_key": "b"}\n{"doc_k', encoding="utf-8")
    return lambda: load_documents(str(tmp_path), "valid")


def bad_byte_in_jsonl(tmp_path, name):
    from spanbert_plugin.coref.prepare import load_documents

    lines = [f'{{"doc_key": "{i}", "words": ["{"w" * 400}"]}}\n'.encode() for i in range(2000)]
    lines[1499] = lines[1499].replace(b"w", b"\xff", 1)  # line 1500: a text stream would have decoded it early
    (tmp_path / name).write_bytes(b"".join(lines))
    return lambda: load_documents(str(tmp_path), "valid")


def relation_examples_cut_at_a_line_end(tmp_path, name):
    import numpy as np

    from spanbert_plugin.relation.prepare import load_split_arrays

    np.savez(tmp_path / "valid.npz", labels=np.arange(3), entity_positions=np.zeros((3, 2), dtype=np.int64))
    (tmp_path / name).write_text('{"id": "a", "relation": "r"}\n{"id": "b", "relation": "r"}\n', encoding="utf-8")
    return lambda: load_split_arrays(str(tmp_path), "valid")


@pytest.mark.parametrize("make, name, expected", [
    (damaged_arrays, "valid.labels.npy", "damaged or truncated"),
    (flipped_byte_array, "valid.labels.npy", "damaged or truncated"),
    (damaged_jsonl, "valid.docs.jsonl", r":3: damaged or truncated \(Unterminated string"),
    (bad_byte_in_jsonl, "valid.docs.jsonl", r":1500: damaged or truncated \('utf-8' codec"),
    (relation_examples_cut_at_a_line_end, "valid.examples.jsonl", r"damaged or truncated \(2 records where the split has 3\)"),
    (damaged_arrays, "valid.npz", r"damaged or truncated \(File is not a zip file\)"),
    (damaged_token_items, "valid.idx", r"damaged or truncated \(\d+ bytes where its header gives \d+\)"),
    (damaged_token_items, "valid.bin", r"damaged or truncated \(\d+ bytes where valid.idx gives \d+\)"),
    (index_cut_in_its_header, "valid.idx", r"damaged or truncated \(10 bytes, shorter than a fairseq index's header\)"),
    (index_of_another_format, "valid.idx", r"damaged or truncated \(not a fairseq memory-mapped index\)"),
    (index_replaced_by_a_folder, "valid.idx", r"damaged or truncated \(Is a directory\)"),
    (damaged_prepared_json, "classification.json", ":1: not valid JSON"),
    (damaged_qa_config, "qa_config.json", ":1: not valid JSON"),
])
def test_a_damaged_file_of_a_prepared_folder_is_one_line(tmp_path, make, name, expected):
    """A prepared folder copied in part (a full disk, a cut transfer) names the damaged file, not a traceback."""
    load = make(tmp_path, name)
    with pytest.raises(UsageError, match=re.escape(str(tmp_path / name)) + ".*" + expected):
        load()

# ----------------------------------------------------------------------------- signals: the whole command, children too

# spanbert-findanimals with each fairseq-train run replaced by a child that writes its pid, then waits forever
FINDANIMALS_DRIVER = """
import os, sys
from spanbert_plugin.spandrop import find_animals_experiment as findanimals_experiment
from spanbert_plugin.cli import findanimals

markers = sys.argv[1]

def child_command(method, size, seed, options, save_dir):
    script = "import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); " \\
             "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(3600)"
    return [sys.executable, "-c", script, os.path.join(markers, method)]

findanimals_experiment.train_command = child_command
sys.exit(findanimals.main(["--out", os.path.join(markers, "out"), "--methods", "baseline,spandrop", "--sizes", "10",
                           "--seeds", "1", "--jobs", "2", "--test-size", "10"]))
"""


def wait_for(predicate, proc, what, timeout=120):
    """Poll for a marker the command writes (not a fixed sleep); fail if the command ends first."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, f"{what} never appeared"
        time.sleep(0.05)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie nobody reaped is gone too
        return f.read().split(") ")[-1][0] != "Z"


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_findanimals_stops_its_training_runs_on_a_signal(tmp_path, signum):
    import signal

    signum = getattr(signal, signum)
    markers = [tmp_path / "baseline", tmp_path / "spandrop"]
    proc = subprocess.Popen([sys.executable, "-c", FINDANIMALS_DRIVER, str(tmp_path)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    children = []
    try:
        wait_for(lambda: all(m.exists() for m in markers), proc, "both child runs")
        children = [int(m.read_text()) for m in markers]
        assert all(alive(pid) for pid in children)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:  # a driver that failed the test must not leave itself or its hour-long children behind
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum or (signum == signal.SIGINT and proc.returncode == 130), (proc.returncode, err)
    assert err.strip().splitlines()[-1] == ("spanbert-findanimals: interrupted; no output written, "
                                            "an earlier one left as it was"), err
    assert not any(alive(pid) for pid in children)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_command_turns_a_signal_before_the_output_phase_into_its_line(capsys, signame):
    """The handlers are in place from the start of main (here: the command signals itself while 'importing')."""
    import signal

    from spanbert_plugin.cli import command

    signum = getattr(signal, signame)
    before = signal.getsignal(signum)

    @command("demo-cmd")
    def main(argv=None):
        os.kill(os.getpid(), signum)  # delivered at once, to this (main) thread
        raise AssertionError("not reached: the signal stops the command")

    assert main() == 128 + signum
    assert capsys.readouterr().err.strip() == "demo-cmd: interrupted; no output written, an earlier one left as it was"
    assert signal.getsignal(signum) is before


@pytest.mark.parametrize("main, argv, expected", [
    (predict_qa.main, ["--batch-size", "0"], "--batch-size 0: must be at least 1"),
    (predict_qa.main, ["--max-tokens", "-5"], "--max-tokens -5: must be at least 1"),
    (predict_qa.main, ["--null-threshold", "nan"], "--null-threshold nan: must be a number"),
    (predict_re.main, ["--batch-size", "-1"], "--batch-size -1: must be at least 1"),
    (predict_classification.main, ["--max-tokens", "0"], "--max-tokens 0: must be at least 1"),
])
def test_predict_batching_options_are_checked(tmp_path, capsys, main, argv, expected):
    assert main(["--checkpoint", "missing.pt", "--out", str(tmp_path / "out"), *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


def console_modules():
    """The cli module of every console command that setup.py declares."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        return sorted(re.findall(r'"spanbert-[a-z-]+=spanbert_plugin\.cli\.(\w+):main"', f.read()))


CONSOLE_MODULES = console_modules()


def test_every_console_command_answers_help_without_importing_torch():
    """--help parses only: no fairseq, no torch (it took 2-3 s when the package imported them)."""
    assert len(CONSOLE_MODULES) >= 12
    script = ("import sys\nfrom importlib import import_module\n"
              f"for name in {CONSOLE_MODULES!r}:\n"
              "    try:\n        import_module('spanbert_plugin.cli.' + name).main(['--help'])\n"
              "    except SystemExit as done:\n        assert done.code == 0, (name, done.code)\n"
              "heavy = sorted(m for m in ('torch', 'fairseq', 'transformers') if m in sys.modules)\n"
              "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("module", CONSOLE_MODULES)
def test_help_exits_0_and_shows_defaults(module, capsys):
    import importlib

    cli = importlib.import_module(f"spanbert_plugin.cli.{module}")
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: spanbert-") and "span_masked_lm" not in text
    parser = cli.get_parser()
    for action in parser._actions:  # every option with a real default says what it is
        if action.default not in (None, False, argparse.SUPPRESS) and action.help:
            assert "default" in parser.formatter_class("x")._get_help_string(action), (module, action.dest)


def test_qa_module_names_agree():
    from spanbert_plugin.cli import prepare_qa as cli
    from spanbert_plugin.qa import prepare as library

    assert cli.COMMAND == library.COMMAND


def test_a_prepared_jsonl_with_more_records_than_the_split_is_refused(tmp_path):
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.file_utils import read_jsonl

    path = tmp_path / "valid.examples.jsonl"
    path.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c"}\n', encoding="utf-8")
    assert read_jsonl(str(path), expected=3) == [{"id": "a"}, {"id": "b"}, {"id": "c"}]
    with pytest.raises(UsageError, match=r"3 records where the split has 2"):
        read_jsonl(str(path), expected=2)


def test_token_items_of_a_vocabulary_past_16_bits_are_checked_with_their_own_width(tmp_path):
    """A vocabulary past 65,535 symbols stores int32 ids: the .bin's expected size is 4 bytes a token, not 2."""
    from spanbert_plugin.core.datasets import check_token_item_files, load_token_items
    from spanbert_plugin.core.finetune_io import write_token_items

    write_token_items([[5, 6, 70000], [8, 9]], str(tmp_path / "valid"), vocab_size=70001)
    assert check_token_item_files(str(tmp_path / "valid")).itemsize == 4
    assert load_token_items(str(tmp_path / "valid"), None, "valid")[0].tolist() == [5, 6, 70000]


def test_an_empty_fine_tuning_split_is_one_line_when_its_token_ids_are_checked(tmp_path):
    """An empty .bin cannot be memory-mapped: the token-id check skips it, and the split is named as empty."""
    from spanbert_plugin.core.datasets import load_token_items
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.finetune_io import write_token_items

    write_token_items([], str(tmp_path / "valid"), vocab_size=100)
    assert os.path.getsize(tmp_path / "valid.bin") == 0
    dictionary = SpanBertDictionary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"])
    with pytest.raises(UsageError) as raised:
        load_token_items(str(tmp_path / "valid"), dictionary, "valid", check_ids=True)
    assert str(raised.value) == f"{tmp_path / 'valid'}.bin: empty, split 'valid' holds no tokens; prepare it again from examples"


def test_input_files_that_cannot_be_read_are_one_line(tmp_path, monkeypatch):
    import gzip

    from spanbert_plugin.core import file_utils
    from spanbert_plugin.core.file_utils import load_arrays, read_jsonl

    with pytest.raises(UsageError, match=f"^--train {re.escape(str(tmp_path))}: not a regular file$"):
        read_text(str(tmp_path), "--train")
    damaged = tmp_path / "corpus.txt.gz"
    damaged.write_bytes(gzip.compress("some text\n".encode() * 100)[:-20])  # a valid header, its end cut off
    with pytest.raises(UsageError, match=f"^--train {re.escape(str(damaged))}: damaged gzip file \\("):
        read_text(str(damaged), "--train", allow_gzip=True)
    assert read_text(write_text(tmp_path / "whole.txt.gz", "x"), "--train", allow_gzip=True) == "x"  # not gzip: as is
    for load, name in ((load_arrays, "valid.labels.npy"), (read_jsonl, "valid.examples.jsonl")):
        with pytest.raises(UsageError, match=f"^{re.escape(str(tmp_path / name))}: no such file$"):
            load(str(tmp_path / name))

    def refused(path, mode="r", *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(file_utils, "open", refused, raising=False)  # (the tests may run as root)
    with pytest.raises(UsageError, match=f"^--train {re.escape(str(tmp_path / 'whole.txt.gz'))}: cannot be read "
                                         r"\(Permission denied\)$"):
        read_text(str(tmp_path / "whole.txt.gz"), "--train")


def test_a_checkpoint_file_that_holds_no_dictionary_names_no_data_folder(tmp_path):
    torch.save([1, 2, 3], tmp_path / "list.pt")
    assert checkpoint_inputs(str(tmp_path / "list.pt")) == [str(tmp_path / "list.pt")]


def tokenizer_folder(folder, meta=True, dict_lines=None):
    """A hand-made WordPiece tokenizer folder (spanbert_tokenizer.json, vocab.txt, dict.txt)."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ada", "met", "bo"]
    os.makedirs(folder)
    write_text(os.path.join(folder, "vocab.txt"), "\n".join(vocab) + "\n")
    if meta:
        write_text(os.path.join(folder, "spanbert_tokenizer.json"), '{"type": "wordpiece", "lowercase": true}')
    lines = [f"{symbol} 0" for symbol in vocab] if dict_lines is None else dict_lines
    write_text(os.path.join(folder, "dict.txt"), "\n".join(lines) + "\n")
    return str(folder)


@pytest.mark.parametrize("make, expected", [
    (lambda folder: str(folder), "--tokenizer-from {folder}: no such folder"),
    (lambda folder: tokenizer_folder(folder, meta=False),
     "--tokenizer-from {folder}: no spanbert_tokenizer.json (expected a spanbert-prepare or spanbert-import-hf output)"),
    (lambda folder: tokenizer_folder(folder, dict_lines=["[PAD] 0", "[UNK] 0", "[CLS] 0", "[SEP] 0", "[MASK] 0",
                                                         "ada 0", "met 0", "bo 0", "ada 3"]),
     "{folder}/dict.txt: duplicate symbol 'ada'"),
], ids=["no folder", "no tokenizer record", "duplicate symbol"])
def test_a_tokenizer_folder_that_cannot_be_used_is_one_line(tmp_path, capsys, monkeypatch, make, expected):
    folder = make(tmp_path / "tok")
    squad_file = write_text(tmp_path / "train.json", json.dumps(squad([question()])))
    monkeypatch.chdir(tmp_path)
    assert prepare_qa.main(["--train", squad_file, "--tokenizer-from", folder, "--destdir", "out"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"spanbert-prepare-qa: error: {expected.format(folder=tmp_path / 'tok')}"]
    assert not (tmp_path / "out").exists()


def test_a_folder_without_its_commands_record_is_named_as_not_its_output(tmp_path):
    from spanbert_plugin.core.finetune_io import read_prepared_json

    with pytest.raises(UsageError) as raised:
        read_prepared_json(str(tmp_path), "relation.json", "spanbert-prepare-re")
    assert str(raised.value) == f"{tmp_path / 'relation.json'}: no such file; {tmp_path} is not a spanbert-prepare-re folder"


@pytest.mark.parametrize("meta, expected", [
    (None, "spanbert_tokenizer.json: no such file (not a spanbert-prepare directory?)"),
    ('["wordpiece"]', "spanbert_tokenizer.json: expected a JSON object with the tokenizer's type"),
    ('{"type": "wordpiece", "model_max_length": 0}',
     "spanbert_tokenizer.json: model_max_length must be a positive integer, found 0"),
    ('{"type": "wordpiece", "model_max_length": "512"}',
     "spanbert_tokenizer.json: model_max_length must be a positive integer, found '512'"),
    ('{"type": "wordpiece", "extra_special_tokens": "<e1>"}',
     "spanbert_tokenizer.json: extra_special_tokens must be a list of vocabulary tokens, found '<e1>'"),
    ('{"type": "wordpiece", "extra_special_tokens": ["<e1>"]}', "vocab.txt: has no token '<e1>', declared a special token"),
    ('{"type": "bpe"}', "spanbert_tokenizer.json: unknown tokenizer type 'bpe'"),
], ids=["missing", "not an object", "length 0", "length a string", "extra tokens not a list", "extra token not in the "
        "vocabulary", "unknown type"])
def test_a_tokenizer_record_that_cannot_be_used_is_one_line_naming_the_file(tmp_path, meta, expected):
    from spanbert_plugin.core.tokenization import TokenizerError, load_tokenizer

    folder = tokenizer_folder(tmp_path / "tok", meta=False)
    if meta is not None:
        write_text(os.path.join(folder, "spanbert_tokenizer.json"), meta)
    with pytest.raises(TokenizerError) as raised:
        load_tokenizer(folder)
    assert str(raised.value) == os.path.join(folder, expected)


def test_a_vocab_txt_may_end_in_a_blank_line_but_holds_each_token_once(tmp_path):
    from spanbert_plugin.core.tokenization import TokenizerError, read_wordpiece_vocab

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ada", "##s"]
    path = write_text(tmp_path / "vocab.txt", "\n".join(vocab) + "\n\n")  # an editor's trailing blank line
    assert read_wordpiece_vocab(path) == vocab
    write_text(tmp_path / "vocab.txt", "\n".join([*vocab, "bo", "ada"]) + "\n")
    with pytest.raises(TokenizerError) as raised:
        read_wordpiece_vocab(path)
    assert str(raised.value) == f"{path}:9: duplicate token 'ada' (first on line 6)"
