"""HuggingFace export/import and the hub interface; offline, models built from configs."""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import bin_path, run_cli
from test_pretrain import TINY

transformers = pytest.importorskip("transformers")


def _train(data, save_dir, updates=20):
    run_cli([bin_path("fairseq-train"), data, *TINY, "--max-update", str(updates), "--save-dir", save_dir])
    return os.path.join(save_dir, "checkpoint_last.pt")


@pytest.fixture(scope="module")
def spm_checkpoint(spm_data, tmp_path_factory):
    return _train(spm_data, str(tmp_path_factory.mktemp("ck_spm")))


@pytest.fixture(scope="module")
def wp_checkpoint(wordpiece_data, tmp_path_factory):
    return _train(wordpiece_data, str(tmp_path_factory.mktemp("ck_wp")), updates=8)


def _sample_lines(corpus, n=40):
    lines = [l.strip() for l in open(corpus, encoding="utf-8") if l.strip()]
    return lines[:: max(1, len(lines) // n)][:n]


@pytest.mark.parametrize("which", ["spm", "wp"])
def test_export_round_trip(which, request, corpus_files, tmp_path):
    from transformers import AutoTokenizer, BertForMaskedLM, BertModel

    from spanbert_plugin.models.spanbert import SpanBertModel

    checkpoint = request.getfixturevalue(f"{which}_checkpoint")
    out = tmp_path / "hf"
    proc = run_cli([bin_path("spanbert-export-hf"), "--checkpoint", checkpoint, "--out", str(out)])
    assert "max |diff|" in proc.stdout
    for name in ("config.json", "model.safetensors", "sbo_head.safetensors", "sbo_config.json", "tokenizer_config.json"):
        assert (out / name).exists(), name
    hub = SpanBertModel.from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint))
    mlm = BertForMaskedLM.from_pretrained(str(out)).eval()
    bare = BertModel.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    for text in _sample_lines(corpus_files[1]):
        ours = hub.encode(text)
        theirs = tokenizer(text, return_tensors="pt")["input_ids"][0]
        assert torch.equal(ours, theirs), text
    tokens = hub.encode(" ".join(_sample_lines(corpus_files[1], 4))[:400])[None, :120]
    with torch.no_grad():
        features = hub.extract_features(tokens)
        logits = hub.model.lm_head(features)
        hf = mlm(input_ids=tokens, output_hidden_states=True)
        assert (features - hf.hidden_states[-1]).abs().max() <= 1e-4
        assert (logits - hf.logits).abs().max() <= 1e-4
        assert (features - bare(input_ids=tokens).last_hidden_state).abs().max() <= 1e-4
    # the SBO head is saved beside the model, nothing trained is lost
    from safetensors.torch import load_file

    sbo = load_file(str(out / "sbo_head.safetensors"))
    for key, value in hub.model.sbo_head.state_dict().items():
        if key != "weight":
            assert torch.equal(sbo[key], value), key


def test_hub_interface(spm_checkpoint):
    from spanbert_plugin.models.spanbert import SpanBertModel

    hub = SpanBertModel.from_pretrained(os.path.dirname(spm_checkpoint), "checkpoint_last.pt")
    text = "Return the value of the named attribute of an object."
    tokens = hub.encode(text)
    assert tokens[0] == hub.dictionary.bos() and tokens[-1] == hub.dictionary.eos()
    assert hub.decode(tokens) == text
    assert hub.extract_features(tokens).shape == (1, len(tokens), 128)
    filled = hub.fill_mask("Return the <mask> of the named attribute.", topk=3)
    assert len(filled) == 3 and all(0 <= p <= 1 for _, p, _ in filled)
    assert filled[0][1] >= filled[1][1] >= filled[2][1]
    hub.register_classification_head("demo", num_classes=3)
    assert hub.predict("demo", tokens).shape == (1, 3)
    with pytest.raises(ValueError, match="exactly one"):
        hub.fill_mask("no mask here")


def _random_hf_bert(directory, vocab_file, **overrides):
    from transformers import BertConfig, BertForPreTraining

    vocab = open(vocab_file, encoding="utf-8").read().splitlines()
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128, pad_token_id=vocab.index("[PAD]"),
                        **overrides)
    torch.manual_seed(0)
    model = BertForPreTraining(config).eval()
    model.save_pretrained(str(directory))
    shutil.copy(vocab_file, directory / "vocab.txt")
    return model


def test_import_matches_hf_and_exports_back(wordpiece_vocab, corpus_files, tmp_path):
    from safetensors.torch import load_file
    from transformers import BertTokenizerFast

    from spanbert_plugin.models.spanbert import SpanBertModel

    hf_dir = tmp_path / "hf"
    hf_model = _random_hf_bert(hf_dir, wordpiece_vocab)
    proc = run_cli([bin_path("spanbert-import-hf"), "--hf", str(hf_dir), "--out", str(tmp_path / "imported")])
    assert "freshly initialised" in proc.stdout and "sbo_head" in proc.stdout  # reported
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    vocab = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    hf_tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=False)
    for text in _sample_lines(corpus_files[1], 10):
        tokens = hub.encode(text)[:128]
        assert torch.equal(tokens, hf_tok(text, return_tensors="pt")["input_ids"][0][:128])
        with torch.no_grad():
            ours = hub.extract_features(tokens)
            theirs = hf_model.bert(input_ids=tokens[None]).last_hidden_state
        assert (ours - theirs).abs().max() <= 1e-4
    # export of the import gives back the same tensors
    run_cli([bin_path("spanbert-export-hf"), "--checkpoint", str(tmp_path / "imported" / "model.pt"), "--out", str(tmp_path / "back")])
    exported = load_file(str(tmp_path / "back" / "model.safetensors"))
    original = hf_model.state_dict()
    compared = 0
    for key, value in exported.items():
        if key in original and "position_ids" not in key:
            assert torch.equal(value, original[key]), key
            compared += 1
    assert compared >= 30


def test_import_usable_for_continued_pretraining(wordpiece_vocab, wordpiece_data, tmp_path):
    hf_dir = tmp_path / "hf"
    _random_hf_bert(hf_dir, wordpiece_vocab)
    run_cli([bin_path("spanbert-import-hf"), "--hf", str(hf_dir), "--out", str(tmp_path / "imported")])
    args = [a for a in TINY]
    args[args.index("spanbert_tiny")] = "spanbert_base"
    proc = run_cli([bin_path("fairseq-train"), wordpiece_data, *args, "--encoder-layers", "2", "--encoder-embed-dim", "64",
                    "--encoder-attention-heads", "4", "--encoder-ffn-embed-dim", "128", "--max-positions", "128",
                    "--finetune-from-model", str(tmp_path / "imported" / "model.pt"), "--max-update", "3",
                    "--save-dir", str(tmp_path / "ck")])
    assert "num_updates" in proc.stdout + proc.stderr


def _import_error(hf_dir, out, expect):
    proc = run_cli([bin_path("spanbert-import-hf"), "--hf", str(hf_dir), "--out", str(out)], check=False)
    assert proc.returncode == 1 and expect in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()


def test_import_bad_inputs(wordpiece_vocab, tmp_path):
    out = tmp_path / "out"
    hf_dir = tmp_path / "hf"
    _random_hf_bert(hf_dir, wordpiece_vocab)
    config = json.loads((hf_dir / "config.json").read_text())

    missing_config = tmp_path / "noconfig"
    shutil.copytree(hf_dir, missing_config)
    (missing_config / "config.json").unlink()
    _import_error(missing_config, out, "config.json: no such file")

    no_weights = tmp_path / "noweights"
    shutil.copytree(hf_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    _import_error(no_weights, out, "no model.safetensors or pytorch_model.bin")

    for name, change, expect in (
        ("roberta", {"model_type": "roberta"}, "is not a BERT model"),
        ("preln", {"pre_layer_norm": True}, "pre-LayerNorm"),
        ("shape", {"intermediate_size": 256}, "has shape"),
        ("vocab", {"vocab_size": config["vocab_size"] + 5}, "vocab_size"),
    ):
        bad = tmp_path / name
        shutil.copytree(hf_dir, bad)
        (bad / "config.json").write_text(json.dumps({**config, **change}))
        _import_error(bad, out, expect)

    short_vocab = tmp_path / "shortvocab"
    shutil.copytree(hf_dir, short_vocab)
    lines = (short_vocab / "vocab.txt").read_text().splitlines()
    (short_vocab / "vocab.txt").write_text("\n".join(lines[:-3]) + "\n")
    (short_vocab / "config.json").write_text(json.dumps({**config, "vocab_size": len(lines) - 3}))
    _import_error(short_vocab, out, "word embeddings have")


def test_export_bad_inputs(tmp_path, spm_checkpoint):
    proc = run_cli([bin_path("spanbert-export-hf"), "--checkpoint", str(tmp_path / "none.pt"), "--out", str(tmp_path / "o")], check=False)
    assert proc.returncode == 1 and "no such checkpoint" in proc.stderr and not (tmp_path / "o").exists()
    (tmp_path / "exists").mkdir()
    proc = run_cli([bin_path("spanbert-export-hf"), "--checkpoint", spm_checkpoint, "--out", str(tmp_path / "exists")], check=False)
    assert proc.returncode == 1 and "--force" in proc.stderr
