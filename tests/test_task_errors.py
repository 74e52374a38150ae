"""Bad input to the pre-training and find_animals tasks: one-line UsageErrors, never silent wrong results."""
import logging
import os
import shutil

import numpy as np
import pytest
from fairseq import options, tasks
from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

import spanbert_plugin.registry  # noqa: F401  (the plugin's tasks, registered as --user-dir would; not left to test order)
from conftest import bin_path, run_cli
from spanbert_plugin.core.errors import UsageError
from test_pretrain import TINY


def _config(args):
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args))


def pretraining(data, *extra, task="spanbert_pretraining"):
    """The run config and the task fairseq-train would build from these arguments."""
    cfg = _config([data, "--task", task, "--criterion", "span_bert", "--arch", "spanbert_tiny",
                   "--tokens-per-sample", "128", "--cpu", *extra])
    return cfg, tasks.setup_task(cfg.task)


def test_fairseq_train_prints_one_line_and_exits_1(spm_data, tmp_path):
    proc = run_cli([bin_path("fairseq-train"), spm_data, *TINY, "--max-update", "1", "--save-dir", str(tmp_path / "ck"),
                    "--mask-ratio", "1.5"], check=False)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == ["error: --mask-ratio (the masking budget) must be in (0, 1), got 1.5"]
    assert not (tmp_path / "ck").exists() or not os.listdir(tmp_path / "ck")


@pytest.mark.parametrize("extra, message", [
    (["--mask-ratio", "0"], "--mask-ratio"),
    (["--mask-prob", "0.5"], "--mask-prob/--random-prob/--leave-prob"),
    (["--geometric-p", "1.5"], "--geometric-p"),
    (["--max-span-len", "0"], "--max-span-len"),
    (["--tokens-per-sample", "2"], "--tokens-per-sample"),
])
def test_bad_task_options(spm_data, extra, message):
    with pytest.raises(UsageError, match=message):
        pretraining(spm_data, *extra)


@pytest.mark.parametrize("extra, message", [
    (["--max-span-len", "20"], "--max-span-len 20 words exceeds the model's 15 SBO position slots"),
    (["--mask-scheme", "word", "--sbo-position-slots", "0"], "--sbo-position-slots 0 gives no token an SBO loss"),
    (["--encoder-attention-heads", "3"], "--encoder-embed-dim 128 must be divisible by --encoder-attention-heads 3"),
    (["--tokens-per-sample", "600"], "--tokens-per-sample 600 exceeds the model's 512 positions"),
    (["--sbo-weight", "-1"], "--sbo-weight"),
])
def test_options_that_conflict_with_model_or_criterion(spm_data, extra, message):
    cfg, task = pretraining(spm_data, *extra)
    with pytest.raises(UsageError, match=message):
        task.build_model(cfg.model)
        task.build_criterion(cfg.criterion)


def test_fairseq_preprocess_folder_is_refused(corpus_files, tmp_path):
    from fairseq_cli import preprocess

    dest = str(tmp_path / "fairseq-bin")
    args = options.get_preprocessing_parser().parse_args(
        ["--only-source", "--trainpref", corpus_files[0], "--destdir", dest, "--workers", "1"])
    preprocess.main(args)
    assert os.path.isfile(os.path.join(dest, "dict.txt"))
    with pytest.raises(UsageError, match=f"{dest}: not a spanbert-prepare folder .*run spanbert-prepare"):
        pretraining(dest)


def test_missing_folder_and_split(spm_data, tmp_path):
    with pytest.raises(UsageError, match=f"{tmp_path / 'nothing'}: no such data folder"):
        pretraining(str(tmp_path / "nothing"))
    _, task = pretraining(spm_data)
    with pytest.raises(UsageError, match=f"{os.path.join(spm_data, 'test')}.bin/.idx: no such split"):
        task.load_dataset("test")


def test_shards_from_different_tokenizers_are_refused(spm_data, wordpiece_data):
    with pytest.raises(UsageError, match=f"data shards {spm_data} and {wordpiece_data} were prepared with different tokenizers"):
        pretraining(f"{spm_data}:{wordpiece_data}")


def test_shards_with_different_dictionaries_are_refused(spm_data, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(spm_data, other)
    lines = (other / "dict.txt").read_text(encoding="utf-8").splitlines()
    lines[10], lines[11] = lines[11], lines[10]  # same symbols, two ids swapped
    (other / "dict.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UsageError, match=f"data shards {spm_data} and {other} have different dictionaries .*id 10 is"):
        pretraining(f"{spm_data}:{other}")


def test_without_the_sbo_its_slots_do_not_limit_the_spans(spm_data):
    cfg, task = pretraining(spm_data, "--max-span-len", "20", "--sbo-weight", "0")
    model = task.build_model(cfg.model)
    assert not any(p.requires_grad for name, p in model.sbo_head.named_parameters() if name != "weight")
    assert model.sbo_head.weight.requires_grad  # the word embeddings it shares still train


def test_a_shard_without_the_schemes_annotations_is_refused_at_start(spm_data, tmp_path):
    """named_entity masking over shards a:b where only a was annotated: refused when training builds the model, not
    when b's epoch comes."""
    annotated, plain = tmp_path / "a", tmp_path / "b"
    shutil.copytree(spm_data, annotated)
    shutil.copytree(spm_data, plain)
    for split in ("train", "valid"):  # the check at start-up looks for the files; their contents are read later
        for suffix in (".bin", ".idx"):
            (annotated / f"{split}.entities{suffix}").write_bytes(b"")
    cfg, task = pretraining(str(annotated), "--mask-scheme", "named_entity")
    task.build_model(cfg.model)
    cfg, task = pretraining(f"{annotated}:{plain}", "--mask-scheme", "named_entity")
    task.build_model(cfg.model, from_checkpoint=True)  # loading a checkpoint (hub, export) reads no annotations
    with pytest.raises(UsageError, match=f"{plain}/train.entities.bin: no entities annotations"):
        task.build_model(cfg.model)  # training: refused when the model is built, before any epoch


def test_shards_with_the_same_vocabulary_alternate(spm_data, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(spm_data, copy)
    (copy / "dict.txt").write_text(  # counts differ between corpora; only symbols matter
        "".join(f"{line.rsplit(' ', 1)[0]} 7\n" for line in (copy / "dict.txt").read_text(encoding="utf-8").splitlines()),
        encoding="utf-8")
    for name in ("valid.bin", "valid.idx"):  # the second shard's valid split holds other documents
        shutil.copyfile(os.path.join(spm_data, name.replace("valid", "train")), copy / name)

    def block_sizes(data, epoch):
        _, task = pretraining(data)
        task.load_dataset("valid", epoch=epoch)
        return np.sort(task.datasets["valid"].sizes)

    first, second = block_sizes(spm_data, 1), block_sizes(str(copy), 1)
    assert not np.array_equal(first, second)
    # epoch e reads shard (e - 1) mod 2, each exactly as that folder alone
    for epoch, expected in [(1, first), (2, second), (3, first), (4, second)]:
        assert np.array_equal(block_sizes(f"{spm_data}:{copy}", epoch), expected), epoch

    # a shard read again is shuffled again: epoch 3 does not repeat epoch 1's order of the same blocks (one folder
    # keeps epoch 1's order, which a resumed run then also gets)
    def order(data, epoch):
        _, task = pretraining(data)
        task.load_dataset("train", epoch=epoch)
        return task.datasets["train"].ordered_indices()

    assert not np.array_equal(order(f"{spm_data}:{copy}", 1), order(f"{spm_data}:{copy}", 3))
    assert np.array_equal(order(spm_data, 1), order(spm_data, 3))


def test_relative_data_is_stored_absolute(spm_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(spm_data, tmp_path)
    cfg, task = pretraining(relative)
    assert task.cfg.data == os.path.abspath(spm_data)
    assert cfg.task.data == os.path.abspath(spm_data)  # the run config, which fairseq saves in checkpoints


def test_validation_split_without_maskable_tokens_is_refused(spm_data, tmp_path):
    data = tmp_path / "specials"
    shutil.copytree(spm_data, data)
    _, task = pretraining(str(data))
    d = task.dictionary
    builder = MMapIndexedDatasetBuilder(str(data / "valid.bin"), dtype=np.uint16)
    import torch

    builder.add_item(torch.tensor([d.bos(), d.eos(), d.pad()]))
    builder.finalize(str(data / "valid.idx"))
    with pytest.raises(UsageError, match="valid: no token that can be masked"):
        task.load_dataset("valid")
    task.load_dataset("train")  # the other split is fine


def test_legacy_task_name_still_works_with_fairseq_train_arguments(spm_data, caplog):
    with caplog.at_level(logging.WARNING):
        _, task = pretraining(spm_data, "--mask-scheme", "word", task="span_masked_lm")
    assert task.masker.scheme == "word"
    assert "deprecated alias of spanbert_pretraining" in caplog.text


def test_find_animals_items_longer_than_max_positions():
    cfg = _config(["--task", "find_animals", "--criterion", "sentence_prediction", "--arch", "spanbert_tiny", "--cpu",
                   "--seq-len", "80", "--max-positions", "64", "--train-size", "8", "--test-size", "8"])
    task = tasks.setup_task(cfg.task)
    with pytest.raises(UsageError, match=r"items are up to 86 tokens .* the model has 64 positions: raise --max-positions"):
        task.build_model(cfg.model)


def test_find_animals_bad_animals():
    cfg = _config(["--task", "find_animals", "--criterion", "sentence_prediction", "--arch", "spanbert_tiny", "--cpu",
                   "--animals", "cat,Dog"])
    with pytest.raises(UsageError, match="--animals 'cat,Dog'"):
        tasks.setup_task(cfg.task)


def test_an_empty_split_file_is_one_line(spm_data, tmp_path):
    """A split of no token (an empty .bin, which fairseq cannot map) is named in one line, not a traceback."""
    from spanbert_plugin.core.finetune_io import write_token_items

    data = tmp_path / "emptied"
    shutil.copytree(spm_data, data)
    write_token_items([[]], str(data / "valid"), vocab_size=1000)  # one document of no token
    _, task = pretraining(str(data))
    with pytest.raises(UsageError, match=r"valid\.bin: empty, split 'valid' holds no tokens"):
        task.load_dataset("valid")


BERT_CONTROLS = ["[PAD] 0", "[UNK] 0", "[CLS] 0", "[SEP] 0", "[MASK] 0"]


@pytest.mark.parametrize("meta, symbols, expected", [
    ('{"type": "wordpiece"}', [*BERT_CONTROLS, "a 1", "a 2"],
     "{folder}: unreadable spanbert-prepare folder: {folder}/dict.txt: duplicate symbol 'a'"),
    ('{"type": "wordpiece"}', ["[PAD] 0", "[UNK] 0", "[CLS] 0", "[MASK] 0", "a 1"],
     "{folder}: unreadable spanbert-prepare folder: {folder}/dict.txt: missing control symbols [SEP]"),
    ('{"type": "bpe"}', [*BERT_CONTROLS, "a 1"],
     "{folder}/spanbert_tokenizer.json: unknown tokenizer type 'bpe'; expected sentencepiece or wordpiece"),
    ('["wordpiece"]', [*BERT_CONTROLS, "a 1"],
     "{folder}/spanbert_tokenizer.json: expected a JSON object with the tokenizer's type"),
], ids=["duplicate symbol", "no end symbol", "unknown tokenizer", "not an object"])
def test_a_damaged_prepared_folder_is_one_line_naming_the_file(tmp_path, meta, symbols, expected):
    from spanbert_plugin.pretraining.task import load_prepared_folder

    (tmp_path / "spanbert_tokenizer.json").write_text(meta, encoding="utf-8")
    (tmp_path / "dict.txt").write_text("\n".join(symbols) + "\n", encoding="utf-8")
    with pytest.raises(UsageError) as raised:
        load_prepared_folder(str(tmp_path))
    assert str(raised.value) == expected.format(folder=tmp_path)


@pytest.mark.parametrize("data", ["", ":"])
def test_a_data_value_naming_no_folder_is_refused(data):
    from spanbert_plugin.pretraining.task import data_folders

    with pytest.raises(UsageError, match=r"^spanbert_pretraining needs a data folder \(spanbert-prepare --destdir\): "
                                         r"give DATA or task\.data=DATA$"):
        data_folders(data)


def test_a_combined_split_has_a_maskable_token_when_any_of_its_parts_has_one(tmp_path):
    """train, train1, ... of one folder load as one concatenated split (fairseq's combine): each part is read."""
    from fairseq.data import ConcatDataset
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from spanbert_plugin.core.finetune_io import write_token_items
    from spanbert_plugin.pretraining.task import has_maskable_token

    never_mask = np.array([True, True, True, False, False])  # ids 3 and 4 are text
    write_token_items([[0, 1], [2]], str(tmp_path / "train"), vocab_size=5)
    write_token_items([[1, 2, 0]], str(tmp_path / "train1"), vocab_size=5)
    write_token_items([[0, 4, 1]], str(tmp_path / "train2"), vocab_size=5)
    parts = [MMapIndexedDataset(str(tmp_path / name)) for name in ("train", "train1", "train2")]
    assert not has_maskable_token(ConcatDataset(parts[:2]), never_mask)
    assert has_maskable_token(ConcatDataset(parts), never_mask)


def _annotated_copy(spm_data, tmp_path, documents_annotated):
    """A copy of ``spm_data`` whose valid split has entity annotations for ``documents_annotated`` documents
    (None: none at all) and whose other splits have none."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from spanbert_plugin.core.finetune_io import write_token_items

    data = tmp_path / "annotated"
    shutil.copytree(spm_data, data)
    if documents_annotated is not None:
        write_token_items([[0, 1]] * documents_annotated, str(data / "valid.entities"), vocab_size=1000)
    return data, len(MMapIndexedDataset(str(data / "valid")))


@pytest.mark.parametrize("documents_annotated", [None, 1])
def test_annotations_missing_or_of_another_number_of_documents_are_one_line_when_loaded(spm_data, tmp_path,
                                                                                       documents_annotated):
    """fairseq-validate builds the model from a checkpoint (no start-up check of the annotations), then loads the
    split: a missing annotations file, or one of another number of documents, is named there."""
    data, documents = _annotated_copy(spm_data, tmp_path, documents_annotated)
    assert documents > 1
    cfg, task = pretraining(str(data), "--mask-scheme", "named_entity")
    task.build_model(cfg.model, from_checkpoint=True)
    with pytest.raises(UsageError) as raised:
        task.load_dataset("valid")
    assert str(raised.value) == f"{data / 'valid.entities'}.bin: " + (
        "no entities annotations; --mask-scheme named_entity needs a folder prepared with spanbert-prepare "
        "--annotate spacy" if documents_annotated is None else
        f"1 annotated documents for {documents} documents; prepare the folder again")


CONTROLS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


@pytest.mark.parametrize("edit, extra, expected", [
    (lambda symbol, count: f"{symbol} 0", ["--random-token-source", "unigram"],
     "no text symbol has a count above 0; --random-token-source unigram draws random replacements by these counts "
     "(uniform does not need them)"),
    (lambda symbol, count: f"{symbol} {count}" if symbol in CONTROLS else None, [],
     "no text symbol, only control symbols"),
], ids=["unigram without counts", "only control symbols"])
def test_a_dictionary_with_nothing_to_draw_random_replacements_from_is_one_line(spm_data, tmp_path, edit, extra,
                                                                                expected):
    """Random replacements are drawn from the text symbols of dict.txt (by its counts with unigram): a dict.txt
    that leaves no mass to draw from is named in one line (it was a ValueError traceback from the masker)."""
    data = tmp_path / "edited"
    shutil.copytree(spm_data, data)
    lines = [edit(*line.rsplit(" ", 1)) for line in (data / "dict.txt").read_text(encoding="utf-8").splitlines()]
    (data / "dict.txt").write_text("".join(f"{line}\n" for line in lines if line is not None), encoding="utf-8")
    with pytest.raises(UsageError) as raised:
        pretraining(str(data), *extra)
    assert str(raised.value) == f"{data}/dict.txt: {expected}"


def test_a_negative_count_in_dict_txt_draws_that_symbol_never_under_unigram(spm_data, tmp_path):
    """dict.txt's counts weigh unigram replacements; a negative count (the format reads it) weighs nothing: as a
    weight it made the cumulative distribution fall, and draws landed on the wrong symbols."""
    import numpy as np

    data = tmp_path / "edited"
    shutil.copytree(spm_data, data)
    lines = (data / "dict.txt").read_text(encoding="utf-8").splitlines()
    text = [i for i, line in enumerate(lines) if line.rsplit(" ", 1)[0] not in CONTROLS and int(line.rsplit(" ", 1)[1])]
    negative = text[len(text) // 2]
    lines[negative] = f"{lines[negative].rsplit(' ', 1)[0]} -1000000"
    (data / "dict.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    _, task = pretraining(str(data), "--random-token-source", "unigram")
    steps = np.diff(np.concatenate(([0.0], task.masker.replacement_cdf)))
    assert (steps >= 0).all() and steps[negative] == 0 and steps[text[0]] > 0
