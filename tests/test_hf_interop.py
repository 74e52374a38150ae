"""HuggingFace export/import and the hub interface; offline, models built from configs."""
import contextlib
import dataclasses
import io
import json
import math
import os
import re
import shutil

import pytest
import torch
import transformers

from conftest import ROOT, bin_path, run_cli
from test_pretrain import TINY, train_logs


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
    lines = [line.strip() for line in open(corpus, encoding="utf-8") if line.strip()]
    return lines[:: max(1, len(lines) // n)][:n]


@pytest.mark.parametrize("which", ["spm", "wp"])
def test_export_round_trip(which, request, corpus_files, tmp_path):
    from transformers import AutoTokenizer, BertForMaskedLM, BertModel

    from spanbert_plugin.model.spanbert import SpanBertModel

    checkpoint = request.getfixturevalue(f"{which}_checkpoint")
    out = tmp_path / "hf"
    if which == "spm":  # the console script once; in-process otherwise (saves a start-up)
        stdout = run_cli([bin_path("spanbert-export-hf"), "--checkpoint", checkpoint, "--out", str(out)]).stdout
    else:
        stdout = _export(checkpoint, out)
    assert "max |diff|" in stdout
    for name in ("config.json", "model.safetensors", "sbo_head.safetensors", "sbo_config.json", "tokenizer_config.json"):
        assert (out / name).exists(), name
    hub = SpanBertModel.from_pretrained(os.path.dirname(checkpoint), os.path.basename(checkpoint))
    mlm = BertForMaskedLM.from_pretrained(str(out)).eval()
    bare = BertModel.from_pretrained(str(out)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.model_max_length == hub.model.max_positions()
    lines = _sample_lines(corpus_files[1])
    for text in lines + [lines[0] + " ", "  " + lines[1] + " \t ", lines[2].replace(" ", "   ") + "\n"]:
        ours = hub.encode(text)
        theirs = tokenizer(text, return_tensors="pt")["input_ids"][0]
        assert torch.equal(ours, theirs), text
    # a pair: the same ids, and the token types the fine-tuning tasks train with (0, then 1 after the first separator)
    pair = tokenizer(lines[0], lines[1], return_tensors="pt")
    assert pair["input_ids"][0].tolist() == hub.encode(lines[0], lines[1]).tolist()
    assert pair["token_type_ids"][0].tolist() == hub.segment_labels(hub.encode(lines[0], lines[1])).tolist()
    assert pair["token_type_ids"].sum() > 0
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
    # and back: import reads what export wrote (the sentencepiece model rebuilt from tokenizer.json's Unigram),
    # with the checkpoint's own ids on the corpus and the same features
    _import(str(out), str(tmp_path / "imported"))
    again = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    assert again.tokenizer.kind == hub.tokenizer.kind and again.tokenizer.vocab == hub.tokenizer.vocab
    from spanbert_plugin.model.spanbert import VocabularyRecord

    recorded = VocabularyRecord.tokenizer_of(again.model.state_dict(), "vocabulary.")  # named in vocabulary errors
    model_file = {"spm": "spm.model", "wp": "vocab.txt"}[which]  # a sentencepiece import was recorded as vocab.txt
    assert recorded == f"{again.tokenizer.kind} ({tmp_path / 'imported' / model_file})", recorded
    assert list(again.task.dictionary.symbols) == list(hub.task.dictionary.symbols)
    corpus = [line.strip() for line in open(corpus_files[1], encoding="utf-8") if line.strip()]
    assert hub.tokenizer.encode_ids(corpus) == again.tokenizer.encode_ids(corpus)
    with torch.no_grad():
        assert (again.extract_features(tokens) - features).abs().max() <= 1e-5


def test_hub_interface(spm_checkpoint):
    from spanbert_plugin.model.spanbert import SpanBertModel

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
    # a head added after loading is in the hub's eval mode: no dropout, the same output twice
    assert not hub.model.classification_heads["demo"].training
    assert torch.equal(hub.predict("demo", tokens), hub.predict("demo", tokens))
    # a regression head (one output) gives its value, not a log-softmax over one output (always 0)
    hub.register_classification_head("score", num_classes=1)
    value = hub.predict("score", tokens)
    assert value.shape == (1, 1) and torch.equal(value, hub.predict("score", tokens, return_logits=True))
    assert value.abs().item() > 0
    with pytest.raises(ValueError, match="exactly one"):
        hub.fill_mask("no mask here")
    with pytest.raises(ValueError, match="one sequence"):
        hub.decode(tokens[None])
    size = len(hub.dictionary)
    with pytest.raises(ValueError, match=f"topk={size + 1}: must be at most the vocabulary size {size}"):
        hub.fill_mask("Return the <mask> of the named attribute.", topk=len(hub.dictionary) + 1)
    with pytest.raises(ValueError, match=r"no classification head 'other' \(registered: demo, score\)"):
        hub.predict("other", tokens)
    # misuse is one message naming the method and the argument, not an error from deep inside
    with pytest.raises(TypeError, match="hub.encode: every text must be a string, got list; one text a call"):
        hub.encode(["a text", "another"])
    with pytest.raises(TypeError, match="hub.encode: every text must be a string, got int"):
        hub.encode("a text", 3)
    for topk in (2.5, 0, True):
        with pytest.raises(ValueError, match=f"hub.fill_mask: topk must be an integer of at least 1, got {topk!r}"):
            hub.fill_mask("Return the <mask> of the named attribute.", topk=topk)


def test_a_checkpoint_a_gpu_trained_in_half_precision_loads_on_a_cpu(spm_checkpoint, spm_data, tmp_path):
    """Its saved run config says --fp16 (or --amp), which a CPU cannot train with; loading it to validate, predict or
    export trains nothing. The refusal stopped every load (hub, fairseq-validate, predict, export) on a CPU host."""
    import torch

    from spanbert_plugin.model.spanbert import SpanBertModel

    state = torch.load(spm_checkpoint, map_location="cpu", weights_only=True)
    for precision in ("fp16", "amp"):
        state["cfg"]["common"].update(cpu=False, **{precision: True})
        folder = tmp_path / precision
        folder.mkdir()
        torch.save(state, folder / "checkpoint_last.pt")
        hub = SpanBertModel.from_pretrained(str(folder), "checkpoint_last.pt",
                                            data_name_or_path=spm_data)
        assert hub.extract_features(hub.encode("a short text")).dim() == 3
        state["cfg"]["common"][precision] = False


def test_sentencepiece_tokenizer_json_matches_sentencepiece(spm_data):
    """Same ids as sentencepiece, including leading, trailing and repeated white space of every kind."""
    import random

    import sentencepiece

    from spanbert_plugin.hf.tokenizer_files import unigram_tokenizer_from_spm

    model_file = os.path.join(spm_data, "spm.model")
    reference = sentencepiece.SentencePieceProcessor(model_file=model_file)
    exported = unigram_tokenizer_from_spm(model_file)
    texts = ["value ", " value", "the  value   of", "  both ends  ", "tab\t", "line\n", "end \t\n ", " ", "   ", "",
             "no-break\u00a0space ", "ideographic\u3000space\u3000", "em\u2003space "]
    rng = random.Random(0)
    alphabet = list("abcdefgh XYZ.,(é") + [" ", "  ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u2003", "\ufb01"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(3000)]
    for text in texts:
        assert exported.encode(text).ids == reference.encode(text), repr(text)


def test_export_tokenizer_length_follows_model(imported_tiny, tmp_path):
    """A 64-position model exports a tokenizer with model_max_length 64, so truncation keeps transformers working."""
    from transformers import AutoTokenizer, BertModel

    from spanbert_plugin.cli.export_hf import main

    assert call(main, ["--checkpoint", imported_tiny / "model.pt", "--out", tmp_path / "hf"])[0] == 0
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tokenizer.model_max_length == 64
    batch = tokenizer("word " * 200, truncation=True, return_tensors="pt")
    assert batch["input_ids"].shape[1] == 64
    assert BertModel.from_pretrained(str(tmp_path / "hf"))(**batch).last_hidden_state.shape == (1, 64, 64)


def random_hf_bert(directory, vocab_file, model_class="BertForPreTraining", **overrides):
    """A tiny random HF BERT (64 hidden, 2 layers) saved with its vocab.txt; returns the model."""
    from transformers import BertConfig

    vocab = open(vocab_file, encoding="utf-8").read().splitlines()
    settings = dict(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=128, pad_token_id=vocab.index("[PAD]"))
    config = BertConfig(**{**settings, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(str(directory))
    shutil.copy(vocab_file, os.path.join(str(directory), "vocab.txt"))
    return model


def call(main, args):
    """Run a console entry point in-process: (exit status, stdout, stderr)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in args])
    return status, out.getvalue(), err.getvalue()


def snapshot(folder):
    """Every file under folder with its bytes and modification time: to show a command touched nothing."""
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = (open(path, "rb").read(), os.stat(path).st_mtime_ns)
    return found


def test_import_matches_hf_and_exports_back(wordpiece_vocab, corpus_files, tmp_path):
    from safetensors.torch import load_file
    from transformers import BertTokenizerFast

    from spanbert_plugin.model.spanbert import SpanBertModel

    hf_dir = tmp_path / "hf"
    hf_model = random_hf_bert(hf_dir, wordpiece_vocab)
    stdout = _import(hf_dir, tmp_path / "imported")
    assert "freshly initialised" in stdout and "sbo_head" in stdout  # reported
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
    _export(tmp_path / "imported" / "model.pt", tmp_path / "back")
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
    random_hf_bert(hf_dir, wordpiece_vocab)
    run_cli([bin_path("spanbert-import-hf"), "--hf", str(hf_dir), "--out", str(tmp_path / "imported")])
    args = [a for a in TINY]
    args[args.index("spanbert_tiny")] = "spanbert_base"
    proc = run_cli([bin_path("fairseq-train"), wordpiece_data, *args, "--encoder-layers", "2", "--encoder-embed-dim", "64",
                    "--encoder-attention-heads", "4", "--encoder-ffn-embed-dim", "128", "--max-positions", "128",
                    "--finetune-from-model", str(tmp_path / "imported" / "model.pt"), "--max-update", "3",
                    "--save-dir", str(tmp_path / "ck")])
    records = train_logs(proc.stdout + proc.stderr)
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3]
    assert all(math.isfinite(float(r["loss"])) for r in records)
    # training started from the imported weights: 3 Adam steps (lr warming up to 6e-4, no weight decay) move each
    # weight by well under 3e-3, while a fresh N(0, 0.02) initialisation would differ by about 0.1 somewhere
    imported = torch.load(tmp_path / "imported" / "model.pt", weights_only=True)["model"]
    trained = torch.load(tmp_path / "ck" / "checkpoint_last.pt", weights_only=True)["model"]
    encoder = [k for k in imported if k.startswith("encoder.")]
    assert len(encoder) >= 30
    moved = {k: (trained[k].float() - imported[k].float()).abs().max().item() for k in encoder}
    assert max(moved.values()) <= 3e-3, max(moved.items(), key=lambda kv: kv[1])
    assert moved["encoder.embeddings.word_embeddings.weight"] > 0  # and it did train


def _import_error(hf_dir, out, expect):
    from spanbert_plugin.cli.import_hf import main

    status, _, err = call(main, ["--hf", hf_dir, "--out", out])
    assert status == 1 and expect in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("spanbert-import-hf: error: ")
    assert not out.exists()


def test_import_bad_inputs(wordpiece_vocab, tmp_path):
    out = tmp_path / "out"
    hf_dir = tmp_path / "hf"
    random_hf_bert(hf_dir, wordpiece_vocab)
    config = json.loads((hf_dir / "config.json").read_text())

    def variant(name, remove=None, **files):
        bad = tmp_path / name
        shutil.copytree(hf_dir, bad)
        if remove:
            (bad / remove).unlink()
        for file_name, content in files.items():
            (bad / file_name.replace("__", ".")).write_bytes(content if isinstance(content, bytes) else content.encode())
        return bad

    _import_error(variant("noconfig", remove="config.json"), out, "config.json: no such file")
    _import_error(variant("noweights", remove="model.safetensors"), out, "no model.safetensors or pytorch_model.bin")
    _import_error(hf_dir / "config.json", out, "config.json: a file; give the HuggingFace model folder")
    for name, change, expect in (
        ("roberta", {"model_type": "roberta"}, "is not a BERT model"),
        ("preln", {"pre_layer_norm": True}, "pre-LayerNorm"),
        ("shape", {"intermediate_size": 256}, "has shape"),
        ("vocab", {"vocab_size": config["vocab_size"] + 5}, "vocab_size"),
        ("nolayers", {"num_hidden_layers": None}, "num_hidden_layers must be a positive integer"),
        # more layers than the weights hold: layers 2-3 would start random, silently
        ("morelayers", {"num_hidden_layers": 4}, "encoder weights that config.json implies are not in the "
                                                 "checkpoint, the first encoder.encoder.layer.2."),
        ("heads", {"num_attention_heads": 5}, "hidden_size 64 is not a multiple of num_attention_heads 5"),
    ):
        _import_error(variant(name, config__json=json.dumps({**config, **change})), out, expect)
    # malformed JSON, a JSON list, truncated or empty weights: one line naming the file
    text = json.dumps(config)
    _import_error(variant("badjson", config__json=text[: len(text) // 2]), out, "config.json:1: not valid JSON (Unterminated string")
    _import_error(variant("listjson", config__json="[1, 2]"), out, "config.json: expected a JSON object")
    weights = (hf_dir / "model.safetensors").read_bytes()
    for name, content in (("truncated", weights[: len(weights) // 2]), ("emptyweights", b""), ("textweights", b"not weights\n")):
        _import_error(variant(name, model__safetensors=content), out, "model.safetensors: damaged or truncated weights file")
    bin_dir = variant("truncatedbin", remove="model.safetensors")
    torch.save(random_hf_bert(tmp_path / "again", wordpiece_vocab).state_dict(), bin_dir / "pytorch_model.bin")
    (bin_dir / "pytorch_model.bin").write_bytes((bin_dir / "pytorch_model.bin").read_bytes()[:5000])
    _import_error(bin_dir, out, "pytorch_model.bin: damaged or truncated weights file")

    lines = (hf_dir / "vocab.txt").read_text().splitlines()
    short_vocab = variant("shortvocab", vocab__txt="\n".join(lines[:-3]) + "\n",
                          config__json=json.dumps({**config, "vocab_size": len(lines) - 3}))
    _import_error(short_vocab, out, "word embeddings have")


def test_export_bad_inputs(tmp_path, imported_tiny):
    from spanbert_plugin.cli.export_hf import main

    def export_error(checkpoint, expect):
        status, _, err = call(main, ["--checkpoint", checkpoint, "--out", tmp_path / "o"])
        assert status == 1 and expect in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "o").exists()

    export_error(tmp_path / "none.pt", "no such checkpoint")
    (tmp_path / "notes.txt").write_text("these are notes, not a model\n")
    export_error(tmp_path / "notes.txt", "notes.txt: a text file, not a PyTorch checkpoint")
    (tmp_path / "empty.pt").write_bytes(b"")
    export_error(tmp_path / "empty.pt", "empty.pt: empty file (0 bytes)")
    data = (imported_tiny / "model.pt").read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    export_error(tmp_path / "truncated.pt", "truncated.pt: truncated or damaged checkpoint")
    state = torch.load(imported_tiny / "model.pt", weights_only=True)
    state["cfg"]["model"]["_name"] = "roberta"
    torch.save(state, tmp_path / "roberta.pt")
    export_error(tmp_path / "roberta.pt", "roberta.pt: not a spanbert checkpoint: its model is roberta")
    torch.save(state["model"], tmp_path / "weights_only.pt")
    export_error(tmp_path / "weights_only.pt", "a PyTorch file but not a fairseq checkpoint")
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "mine.txt").write_text("a user's file")
    status, _, err = call(main, ["--checkpoint", imported_tiny / "model.pt", "--out", tmp_path / "exists"])
    assert status == 1 and "exists" in err and (tmp_path / "exists" / "mine.txt").read_text() == "a user's file"


@pytest.fixture(scope="module")
def imported_tiny(wordpiece_vocab, tmp_path_factory):
    """spanbert-import-hf of a tiny random BERT with 64 positions: a folder with model.pt and dict.txt."""
    from spanbert_plugin.hf.interop import import_hf

    root = tmp_path_factory.mktemp("imported_tiny")
    random_hf_bert(root / "hf", wordpiece_vocab, max_position_embeddings=64)
    import_hf(str(root / "hf"), str(root / "out"))
    return root / "out"


def test_outputs_never_overwrite_inputs(imported_tiny, tmp_path, monkeypatch):
    """--out naming the checkpoint's folder, the HF folder or the working directory is refused, even with --force."""
    from spanbert_plugin.cli.export_hf import main as export_main
    from spanbert_plugin.cli.import_hf import main as import_main

    ck = tmp_path / "ck"
    shutil.copytree(imported_tiny, ck)
    shutil.move(str(ck / "model.pt"), str(ck / "checkpoint_last.pt"))
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    for args in (["--checkpoint", "ck/checkpoint_last.pt", "--out", "ck", "--force"],
                 ["--checkpoint", "ck/checkpoint_last.pt", "--out", ".", "--force"]):
        status, out, err = call(export_main, args)
        assert status == 1 and err.startswith("spanbert-export-hf: error: --out"), err
    assert snapshot(tmp_path) == before
    exported = tmp_path / "hf_export"
    assert call(export_main, ["--checkpoint", "ck/checkpoint_last.pt", "--out", "hf_export"])[0] == 0
    before = snapshot(tmp_path)
    for args in (["--hf", "hf_export", "--out", "hf_export", "--force"], ["--hf", "hf_export", "--out", ".", "--force"]):
        status, out, err = call(import_main, args)
        assert status == 1 and err.startswith("spanbert-import-hf: error: --out"), err
    assert snapshot(tmp_path) == before
    # --force replaces an earlier export (and only that)
    first = snapshot(exported)
    status, out, _ = call(export_main, ["--checkpoint", "ck/checkpoint_last.pt", "--out", "hf_export", "--force"])
    assert status == 0 and "max |diff|" in out
    again = snapshot(exported)
    assert sorted(again) == sorted(first) and again["model.safetensors"][0] == first["model.safetensors"][0]
    status, _, _ = call(import_main, ["--hf", "hf_export", "--out", "imported"])
    assert status == 0 and call(import_main, ["--hf", "hf_export", "--out", "imported", "--force"])[0] == 0


def _import(hf_dir, out):
    from spanbert_plugin.cli.import_hf import main

    status, stdout, err = call(main, ["--hf", hf_dir, "--out", out])
    assert status == 0, err
    return stdout


def _export(checkpoint, out, *extra):
    from spanbert_plugin.cli.export_hf import main

    status, stdout, err = call(main, ["--checkpoint", checkpoint, "--out", out, *extra])
    assert status == 0, err
    return stdout


def _qa_inputs(hub, corpus):
    """Question + passage pairs of real text, padded into one batch (HF's mask and ours agree on padding)."""
    lines = _sample_lines(corpus, 6)
    rows = [hub.encode(lines[i], lines[i + 1])[:128] for i in range(0, 6, 2)]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=hub.dictionary.pad())


def test_qa_head_round_trip(wordpiece_vocab, corpus_files, tmp_path):
    """BertForQuestionAnswering -> import -> same start/end logits here -> export -> same logits in transformers."""
    from transformers import BertForQuestionAnswering

    from spanbert_plugin.model.spanbert import SpanBertModel

    hf_model = random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertForQuestionAnswering", initializer_range=0.2)
    assert "task head kept: qa_outputs" in _import(tmp_path / "hf", tmp_path / "imported")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    tokens = _qa_inputs(hub, corpus_files[1])
    mask = tokens.ne(hub.dictionary.pad())
    with torch.no_grad():
        (start, end), _ = hub.model(tokens, qa=True)
        reference = hf_model(input_ids=tokens, attention_mask=mask.long())
    assert start.abs().max() > 0.1  # logits of real size, so 1e-4 is a real bound
    assert (start - reference.start_logits)[mask].abs().max() <= 1e-4
    assert (end - reference.end_logits)[mask].abs().max() <= 1e-4

    stdout = _export(tmp_path / "imported" / "model.pt", tmp_path / "back")
    assert "qa_start_logits" in stdout and "qa_end_logits" in stdout
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert "BertForQuestionAnswering" in config["architectures"] and "BertForMaskedLM" in config["architectures"]
    back = BertForQuestionAnswering.from_pretrained(str(tmp_path / "back")).eval()
    assert torch.equal(back.qa_outputs.weight, hf_model.qa_outputs.weight)
    with torch.no_grad():
        again = back(input_ids=tokens, attention_mask=mask.long())
    assert (again.start_logits - reference.start_logits)[mask].abs().max() <= 1e-4
    assert (again.end_logits - reference.end_logits)[mask].abs().max() <= 1e-4

    # the documented recipe for running an exported QA model with transformers, as written there
    readme = open(os.path.join(ROOT, "docs", "checkpoints-and-hf.md"), encoding="utf-8").read()
    snippet = re.search(r"```python\n(  import torch\n  from transformers import AutoTokenizer, BertForQuestionAnswering\n.*?)```",
                        readme, re.S).group(1)
    code = "\n".join(line[2:] for line in snippet.splitlines()).replace("hf/spanbert-qa", str(tmp_path / "back"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/checkpoints-and-hf.md", "exec"), {})
    # random weights pick any span, but it must come from the context: no question or special tokens
    answer = printed.getvalue().strip().replace("##", "").replace(" ", "").lower()
    assert answer and answer in "adalivesinoslo.", printed.getvalue()


def _classifier_dir(directory, vocab_file):
    labels = ["negative", "neutral", "positive"]
    return random_hf_bert(directory, vocab_file, "BertForSequenceClassification", initializer_range=0.2,
                          id2label=dict(enumerate(labels)), label2id={x: i for i, x in enumerate(labels)})


def test_classification_head_round_trip(wordpiece_vocab, corpus_files, tmp_path):
    """BertForSequenceClassification -> import -> same logits and labels here -> export -> same in transformers."""
    from transformers import BertForSequenceClassification

    from spanbert_plugin.hf.interop import IMPORTED_HEAD
    from spanbert_plugin.model.spanbert import SpanBertModel

    hf_model = _classifier_dir(tmp_path / "hf", wordpiece_vocab)
    stdout = _import(tmp_path / "hf", tmp_path / "imported")
    assert f"classification head {IMPORTED_HEAD}" in stdout and "3 classes: negative, neutral, positive" in stdout
    assert "no spanbert counterpart" not in stdout  # the pooler is kept, not ignored
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    for text in _sample_lines(corpus_files[1], 8):
        tokens = hub.encode(text)[:128]
        with torch.no_grad():
            ours = hub.predict(IMPORTED_HEAD, tokens, return_logits=True)
            reference = hf_model(input_ids=tokens[None]).logits
        assert ours.abs().max() > 0.1 and (ours - reference).abs().max() <= 1e-4, text

    stdout = _export(tmp_path / "imported" / "model.pt", tmp_path / "back")
    assert "class_logits" in stdout
    back = BertForSequenceClassification.from_pretrained(str(tmp_path / "back")).eval()
    assert back.config.num_labels == 3 and back.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert "BertForSequenceClassification" in back.config.architectures
    tokens = hub.encode(_sample_lines(corpus_files[1], 1)[0])[None, :128]
    with torch.no_grad():
        assert (back(input_ids=tokens).logits - hf_model(input_ids=tokens).logits).abs().max() <= 1e-4


def test_export_head_choice(wordpiece_vocab, tmp_path):
    """Several heads: --head picks one; a QA head and a 3-class head cannot share transformers' num_labels."""
    from transformers import BertForQuestionAnswering, BertForSequenceClassification

    from spanbert_plugin.cli.export_hf import main
    from spanbert_plugin.hf.interop import IMPORTED_HEAD

    _classifier_dir(tmp_path / "hf", wordpiece_vocab)
    _import(tmp_path / "hf", tmp_path / "ck")
    state = torch.load(tmp_path / "ck" / "model.pt", weights_only=True)
    weights = state["model"]
    torch.manual_seed(1)
    weights["qa_outputs.weight"], weights["qa_outputs.bias"] = torch.randn(2, 64), torch.randn(2)
    torch.save(state, tmp_path / "ck" / "qa_and_3_classes.pt")
    for name in ("dense.weight", "dense.bias", "out_proj.weight", "out_proj.bias"):
        weights[f"classification_heads.other.{name}"] = weights[f"classification_heads.{IMPORTED_HEAD}.{name}"][:2].clone() \
            if name.startswith("out_proj") else weights[f"classification_heads.{IMPORTED_HEAD}.{name}"].clone()
    torch.save(state, tmp_path / "ck" / "three_heads.pt")

    for checkpoint, extra, expect in (
        ("three_heads.pt", [], f"2 classification heads ({IMPORTED_HEAD}, other); choose one with --head"),
        ("three_heads.pt", ["--head", "missing"], "--head missing: the checkpoint has no such head (--head chooses among "
                                                  f"its QA and classification heads: qa, {IMPORTED_HEAD}, other)"),
        ("qa_and_3_classes.pt", [], f"the QA head and the 3-class head {IMPORTED_HEAD} cannot share one transformers config"),
    ):
        status, _, err = call(main, ["--checkpoint", tmp_path / "ck" / checkpoint, "--out", tmp_path / "o", *extra])
        assert status == 1 and expect in err and not (tmp_path / "o").exists(), err
    _export(tmp_path / "ck" / "three_heads.pt", tmp_path / "other", "--head", "other")
    other = BertForSequenceClassification.from_pretrained(str(tmp_path / "other"))
    assert other.config.num_labels == 2 and other.config.architectures == ["BertForMaskedLM", "BertForSequenceClassification"]
    assert torch.equal(other.classifier.weight, weights["classification_heads.other.out_proj.weight"])
    stdout = _export(tmp_path / "ck" / "three_heads.pt", tmp_path / "qa", "--head", "qa")
    assert "qa_start_logits" in stdout and "class_logits" not in stdout
    qa = BertForQuestionAnswering.from_pretrained(str(tmp_path / "qa"))
    assert torch.equal(qa.qa_outputs.weight, weights["qa_outputs.weight"])


def test_label_names_from_tasks():
    """id2label comes from a task's labels, its saved state, or a fairseq label dictionary; else none."""
    from types import SimpleNamespace

    from fairseq.data import Dictionary
    from fairseq.tasks.fairseq_task import StatefulContainer

    from spanbert_plugin.hf.interop import label_names

    assert label_names(SimpleNamespace(labels=["a", "b"]), 2) == ["a", "b"]
    assert label_names(SimpleNamespace(labels=["a", "b"]), 3) is None  # does not fit the head
    state = StatefulContainer()
    state.merge_state_dict({"labels": ["x", "y", "z"]})
    assert label_names(SimpleNamespace(state=state), 3) == ["x", "y", "z"]
    dictionary = Dictionary()
    for label in ("entailment", "not_entailment"):
        dictionary.add_symbol(label)
    assert label_names(SimpleNamespace(label_dictionary=dictionary), 2) == ["entailment", "not_entailment"]
    assert label_names(SimpleNamespace(), 2) is None


def test_import_from_pytorch_model_bin(wordpiece_vocab, corpus_files, tmp_path):
    """A folder with pytorch_model.bin only (older transformers) imports to the same model as its safetensors twin."""
    from spanbert_plugin.model.spanbert import SpanBertModel

    hf_model = random_hf_bert(tmp_path / "hf", wordpiece_vocab)
    (tmp_path / "hf" / "model.safetensors").unlink()
    torch.save(hf_model.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
    _import(tmp_path / "hf", tmp_path / "imported")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    tokens = hub.encode(_sample_lines(corpus_files[1], 1)[0])[:128]
    with torch.no_grad():
        ours = hub.extract_features(tokens)
        theirs = hf_model.bert(input_ids=tokens[None]).last_hidden_state
    assert ours.abs().max() > 0.1 and (ours - theirs).abs().max() <= 1e-4


def test_export_loads_as_bert_for_pretraining_and_sbo_head_reads_back(wp_checkpoint, corpus_files, tmp_path):
    """BertForPreTraining loads an export (MLM head = BertForMaskedLM's; pooler and NSP fresh), and importing the
    export reads sbo_head.safetensors back: the trained SBO head returns, nothing freshly initialised but the pooler."""
    from transformers import BertForMaskedLM, BertForPreTraining

    from spanbert_plugin.model.spanbert import SpanBertModel

    _export(wp_checkpoint, tmp_path / "hf")  # import needs a WordPiece vocab.txt
    pretraining = BertForPreTraining.from_pretrained(str(tmp_path / "hf")).eval()
    mlm = BertForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
    hub = SpanBertModel.from_pretrained(os.path.dirname(wp_checkpoint), os.path.basename(wp_checkpoint))
    tokens = hub.encode(" ".join(_sample_lines(corpus_files[1], 3)))[None, :100]
    with torch.no_grad():
        assert torch.equal(pretraining(input_ids=tokens).prediction_logits, mlm(input_ids=tokens).logits)
        assert (pretraining(input_ids=tokens).prediction_logits - hub.model.lm_head(hub.extract_features(tokens))
                ).abs().max() <= 1e-4

    stdout = _import(tmp_path / "hf", tmp_path / "imported")
    assert "sbo_head" not in stdout.split("freshly initialised")[-1]  # only the export's missing parts, if any
    original = torch.load(wp_checkpoint, weights_only=True)["model"]
    imported = torch.load(tmp_path / "imported" / "model.pt", weights_only=True)["model"]
    sbo = [k for k in original if k.startswith("sbo_head.") and k != "sbo_head.weight"]
    assert len(sbo) >= 8
    for key in sbo:
        assert torch.equal(imported[key], original[key]), key


def test_export_self_check_catches_a_wrong_weight(imported_tiny, tmp_path, monkeypatch):
    """A conversion that alters one weight makes the export's own reload check fail: one line, nothing written."""
    import spanbert_plugin.hf.interop as hf_interop
    from spanbert_plugin.cli.export_hf import main

    convert = hf_interop.to_hf_state_dict

    def perturbed(state, *args, **kwargs):
        weights = dict(convert(state, *args, **kwargs))
        key = "bert.encoder.layer.1.output.dense.weight"  # noise, not a constant: LayerNorm would cancel a shift
        weights[key] = weights[key] + 0.01 * torch.randn(weights[key].shape, generator=torch.Generator().manual_seed(0))
        return weights

    monkeypatch.setattr(hf_interop, "to_hf_state_dict", perturbed)
    status, _, err = call(main, ["--checkpoint", imported_tiny / "model.pt", "--out", tmp_path / "hf"])
    lines = err.strip().splitlines()
    assert status == 1 and len(lines) == 1, err
    assert lines[0].startswith("spanbert-export-hf: error: export check failed: transformers and fairseq differ by")
    assert "(tolerance 0.0001)" in lines[0]
    assert not (tmp_path / "hf").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".spanbert-tmp")]


def test_export_self_check_compares_the_sbo_head(imported_tiny, tmp_path, monkeypatch):
    """The check rebuilds the SBO head from its exported file and compares its logits: an export that altered one of
    its weights fails (the check compared nothing of it before)."""
    from safetensors.torch import load_file, save_file

    import spanbert_plugin.hf.heads as heads
    import spanbert_plugin.hf.interop as hf_interop
    from spanbert_plugin.cli.export_hf import main

    status, out, _ = call(main, ["--checkpoint", imported_tiny / "model.pt", "--out", tmp_path / "hf"])
    assert status == 0 and "sbo_logits" in out, out
    write = heads.SBO.write

    def perturbed(hub, directory):
        write(hub, directory)
        path = os.path.join(directory, heads.SBO.weights_file)
        weights = load_file(path)
        weights["dense2.weight"] = weights["dense2.weight"] + 0.01 * torch.randn(
            weights["dense2.weight"].shape, generator=torch.Generator().manual_seed(0))
        save_file(weights, path)

    monkeypatch.setattr(heads, "SBO", dataclasses.replace(heads.SBO, write=perturbed))
    monkeypatch.setattr(hf_interop, "SIDE_HEADS", (heads.SBO, *heads.SIDE_HEADS[1:]))
    status, _, err = call(main, ["--checkpoint", imported_tiny / "model.pt", "--out", tmp_path / "hf2"])
    assert status == 1 and "export check failed" in err and "sbo_logits" in err, err


def test_fine_tuned_regression_head_exports_problem_type(spm_data, corpus_files, tmp_path):
    """A regression head fine-tuned here exports as BertForSequenceClassification with problem_type regression."""
    from transformers import BertForSequenceClassification

    from spanbert_plugin.cli.prepare_classification import main as prepare_classification
    from spanbert_plugin.model.spanbert import SpanBertModel
    from test_classification import TINY_CLS, _corpus_examples, _write_jsonl

    _write_jsonl(tmp_path / "train.jsonl", _corpus_examples(corpus_files[0], 16), regression=True)
    _write_jsonl(tmp_path / "valid.jsonl", _corpus_examples(corpus_files[1], 8), regression=True)
    assert prepare_classification(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "valid.jsonl"),
                                   "--tokenizer-from", spm_data, "--destdir", str(tmp_path / "cls"), "--text-columns",
                                   "text", "--label-column", "label", "--regression", "--max-seq-length", "48"]) == 0
    run_cli([bin_path("fairseq-train"), str(tmp_path / "cls"), *TINY_CLS, "--batch-size", "8", "--lr", "1e-3",
             "--max-update", "1", "--save-dir", str(tmp_path / "ck"), "--no-epoch-checkpoints"])
    _export(tmp_path / "ck" / "checkpoint_last.pt", tmp_path / "hf")
    back = BertForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
    assert back.config.problem_type == "regression" and back.config.num_labels == 1
    hub = SpanBertModel.from_pretrained(str(tmp_path / "ck"), "checkpoint_last.pt")
    tokens = hub.encode(_sample_lines(corpus_files[1], 1)[0])[:48]
    head = next(iter(hub.model.classification_heads))
    with torch.no_grad():
        ours = hub.predict(head, tokens, return_logits=True)
        assert ours.shape == (1, 1) and (back(input_ids=tokens[None]).logits - ours).abs().max() <= 1e-4


def test_regression_head_survives_import_and_export(wordpiece_vocab, corpus_files, tmp_path):
    """A BertForSequenceClassification regression model (1 output, problem_type regression) survives import and export."""
    from transformers import BertForSequenceClassification

    hf_model = random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertForSequenceClassification", num_labels=1,
                              problem_type="regression", initializer_range=0.2)
    assert "regression" in _import(tmp_path / "hf", tmp_path / "imported")
    _export(tmp_path / "imported" / "model.pt", tmp_path / "back")
    back = BertForSequenceClassification.from_pretrained(str(tmp_path / "back")).eval()
    assert back.config.problem_type == "regression" and back.config.num_labels == 1
    tokens = torch.tensor([[2] + list(range(10, 40)) + [3]])
    with torch.no_grad():
        assert (back(input_ids=tokens).logits - hf_model(input_ids=tokens).logits).abs().max() <= 1e-4


@pytest.mark.parametrize("tokenizer", ["wordpiece", "sentencepiece"])
def test_lowercase_exports_lower_case_in_transformers(tokenizer, corpus_files, wordpiece_vocab, tmp_path):
    """Uncased WordPiece and --lowercase sentencepiece: the exported tokenizer lower-cases as ours does."""
    from transformers import AutoTokenizer

    from spanbert_plugin.model.spanbert import SpanBertModel
    from spanbert_plugin.cli.prepare import main as cli_main

    data = str(tmp_path / "data")
    extra = ["--wordpiece-vocab", wordpiece_vocab] if tokenizer == "wordpiece" else ["--vocab-size", "800"]
    assert cli_main(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", data, "--lowercase",
                     *extra]) == 0
    checkpoint = _train(data, str(tmp_path / "ck"), updates=1)
    _export(checkpoint, tmp_path / "hf")
    hf_tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    hub = SpanBertModel.from_pretrained(str(tmp_path / "ck"), "checkpoint_last.pt")
    lines = _sample_lines(corpus_files[1], 20)
    assert any(line != line.lower() for line in lines)
    for text in lines + ["Return The VALUE of the Named Attribute."]:
        ours = hub.encode(text)
        assert torch.equal(ours, hub.encode(text.lower())), text  # the checkpoint's tokenizer lower-cases
        assert hf_tokenizer(text, return_tensors="pt")["input_ids"][0].tolist() == ours.tolist(), text
    _import(str(tmp_path / "hf"), str(tmp_path / "imported"))  # and import keeps the lower-casing
    again = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    assert again.tokenizer.kind == tokenizer and again.tokenizer.lowercase
    assert all(torch.equal(again.encode(text), hub.encode(text)) for text in lines)


TOKENIZER_TEXTS = ["Where does Ada live?", "Return The VALUE of the Named Attribute.", "Café über CAFÉ naïve"]


def _tokenizer_folder(tmp_path, name, vocab_lines, tokenizer_config=None, tokenizer_json=None, vocab_txt=True):
    """A tiny BertModel folder with the tokenizer files given: vocab.txt, tokenizer_config.json, tokenizer.json."""
    from transformers import BertTokenizerFast

    folder = tmp_path / name
    vocab_file = tmp_path / f"{name}_vocab.txt"
    vocab_file.write_text("\n".join(vocab_lines) + "\n", encoding="utf-8")
    random_hf_bert(folder, str(vocab_file), "BertModel")
    if not vocab_txt:
        (folder / "vocab.txt").unlink()
    if tokenizer_config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if tokenizer_json is not None:  # (lowercase, strip_accents) of its BertNormalizer
        fast = BertTokenizerFast(vocab={piece: i for i, piece in enumerate(vocab_lines)},
                                 do_lower_case=tokenizer_json[0], strip_accents=tokenizer_json[1])
        fast.backend_tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.mark.parametrize("layout", ["uncased_vocab_only", "config_keeps_accents", "tokenizer_json_keeps_accents",
                                    "tokenizer_json_and_vocab_no_config"])
def test_import_and_export_tokenize_as_transformers(layout, wordpiece_vocab, tmp_path):
    """Lower-casing and accent stripping as transformers reads the folder, and written back by the export."""
    from transformers import AutoTokenizer

    from spanbert_plugin.model.spanbert import SpanBertModel

    cased = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    uncased = list(dict.fromkeys(p if p.startswith("[") else p.lower() for p in cased))
    keep_accents = {"do_lower_case": True, "strip_accents": False}
    folder = {
        "uncased_vocab_only": lambda: _tokenizer_folder(tmp_path, layout, uncased),
        "config_keeps_accents": lambda: _tokenizer_folder(tmp_path, layout, uncased, tokenizer_config=keep_accents),
        "tokenizer_json_keeps_accents": lambda: _tokenizer_folder(tmp_path, layout, uncased, keep_accents,
                                                                  (True, False), vocab_txt=False),
        "tokenizer_json_and_vocab_no_config": lambda: _tokenizer_folder(tmp_path, layout, uncased,
                                                                        tokenizer_json=(True, None)),
    }[layout]()
    _import(folder, tmp_path / "imported")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    theirs, exported = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
    for text in TOKENIZER_TEXTS:
        ours = hub.encode(text).tolist()
        assert ours == theirs(text)["input_ids"] == exported(text)["input_ids"], text
    # the texts tell the settings apart: the folder's tokenizer differs from one that keeps case, and accents matter
    assert hub.encode(TOKENIZER_TEXTS[0]).tolist() != AutoTokenizer.from_pretrained(
        str(folder), do_lower_case=False)(TOKENIZER_TEXTS[0])["input_ids"]
    stripped = AutoTokenizer.from_pretrained(str(folder), do_lower_case=True, strip_accents=True)
    assert (hub.encode(TOKENIZER_TEXTS[2]).tolist() == stripped(TOKENIZER_TEXTS[2])["input_ids"]) == (
        layout in ("uncased_vocab_only", "tokenizer_json_and_vocab_no_config"))


def test_import_keeps_case_of_cased_vocabulary_without_setting(wordpiece_vocab, tmp_path):
    """A cased vocab.txt and no do_lower_case (SpanBERT's own folders): case kept, with a warning; the export says so."""
    from spanbert_plugin.cli.import_hf import main
    from spanbert_plugin.model.spanbert import SpanBertModel

    cased = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    assert any(p != p.lower() for p in cased)
    folder = _tokenizer_folder(tmp_path, "cased", cased)
    status, _, err = call(main, ["--hf", folder, "--out", tmp_path / "imported"])
    assert status == 0 and "no do_lower_case in a tokenizer_config.json and vocab.txt is cased" in err, err
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    assert not hub.tokenizer.lowercase
    _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    assert json.loads((tmp_path / "exported" / "tokenizer_config.json").read_text())["do_lower_case"] is False


def test_import_of_untied_decoder_dropout_and_multi_label(wordpiece_vocab, tmp_path):
    """An MLM decoder of its own starts fresh with a warning; classifier_dropout 0 is kept; multi-label is warned."""
    from spanbert_plugin.cli.import_hf import main
    from spanbert_plugin.model.spanbert import SpanBertModel

    hf_model = random_hf_bert(tmp_path / "untied", wordpiece_vocab, "BertForMaskedLM", tie_word_embeddings=False)
    assert not torch.equal(hf_model.cls.predictions.decoder.weight, hf_model.bert.embeddings.word_embeddings.weight)
    status, _, err = call(main, ["--hf", tmp_path / "untied", "--out", tmp_path / "imported_untied"])
    assert status == 0 and "is not tied to the word embeddings" in err and "has no MLM head" not in err, err
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported_untied"), "model.pt")
    assert not torch.equal(hub.model.lm_head.dense.weight, hf_model.cls.predictions.transform.dense.weight)

    random_hf_bert(tmp_path / "multi", wordpiece_vocab, "BertForSequenceClassification", num_labels=3,
                   classifier_dropout=0.0, hidden_dropout_prob=0.2, problem_type="multi_label_classification")
    status, _, err = call(main, ["--hf", tmp_path / "multi", "--out", tmp_path / "imported_multi"])
    assert status == 0 and "problem_type multi_label_classification" in err, err
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported_multi"), "model.pt")
    assert hub.cfg.model.pooler_dropout == 0.0 and hub.cfg.model.dropout == 0.2


def test_hub_predicts_sentence_pairs_with_bert_token_types(wordpiece_vocab, corpus_files, tmp_path):
    """hub.predict / extract_features on encode(a, b) give transformers' outputs for the pair (token types 0, then 1)."""
    from transformers import BertTokenizerFast

    from spanbert_plugin.hf.interop import IMPORTED_HEAD
    from spanbert_plugin.model.spanbert import SpanBertModel

    hf_model = _classifier_dir(tmp_path / "hf", wordpiece_vocab)
    _import(tmp_path / "hf", tmp_path / "imported")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    vocab = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    hf_tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=False)
    first, second = _sample_lines(corpus_files[1], 2)
    tokens = hub.encode(first, second)[:128]
    reference = hf_tok(first, second, return_tensors="pt", truncation=True, max_length=128)
    assert tokens.tolist() == reference["input_ids"][0].tolist()
    assert hub.segment_labels(tokens).tolist() == reference["token_type_ids"][0].tolist()
    assert reference["token_type_ids"].sum() > 0
    with torch.no_grad():
        ours = hub.predict(IMPORTED_HEAD, tokens, return_logits=True)
        theirs = hf_model(**reference)
        assert (ours - theirs.logits).abs().max() <= 1e-4
        as_one_segment = hub.predict(IMPORTED_HEAD, tokens, return_logits=True, segment_labels=torch.zeros_like(tokens))
        assert (as_one_segment - theirs.logits).abs().max() > 1e-3  # the token types matter here
        hidden = hf_model.bert(**reference).last_hidden_state
        assert (hub.extract_features(tokens) - hidden).abs().max() <= 1e-4
    # WordPiece reads a literal [MASK] as the mask token: fill_mask refuses it beside <mask> (it read the logits
    # at the first masked position and wrote that word into both)
    assert hub.dictionary.mask_index in hub.tokenizer.encode("a [MASK] b").ids.tolist()
    with pytest.raises(ValueError, match=r"\[MASK\]\) beside <mask>; only <mask> marks the word to fill"):
        hub.fill_mask("The [MASK] of the <mask> attribute.")


@pytest.mark.parametrize("data_labels", [["positive", "negative", "neutral"], ["a", "b", "c"]])
def test_finetuning_an_imported_classifier_keeps_each_class_row(data_labels, wordpiece_vocab, corpus_files, tmp_path):
    """id2label in another order than the data's (sorted) labels: the rows follow the names; other names: fresh rows."""
    from spanbert_plugin.cli.prepare_classification import main as prepare_main

    from test_classification import TINY_CLS

    labels = ["positive", "negative", "neutral"]  # transformers' id order, not sorted
    hf_model = random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertForSequenceClassification", initializer_range=0.2,
                              id2label=dict(enumerate(labels)), label2id={x: i for i, x in enumerate(labels)})
    _import(tmp_path / "hf", tmp_path / "imported")
    lines = _sample_lines(corpus_files[0], 30)
    for split, chunk in (("train", lines[:24]), ("valid", lines[24:])):
        with open(tmp_path / f"{split}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": text, "label": data_labels[i % 3]}) + "\n" for i, text in enumerate(chunk))
    data = str(tmp_path / "cls")
    assert prepare_main(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "valid.jsonl"),
                         "--tokenizer-from", str(tmp_path / "imported"), "--destdir", data, "--text-columns", "text",
                         "--label-column", "label", "--max-seq-length", "64"]) == 0
    proc = run_cli([bin_path("fairseq-train"), data, *TINY_CLS, "--finetune-from-model",
                    str(tmp_path / "imported" / "model.pt"), "--batch-size", "8", "--lr", "1e-12", "--max-update", "1",
                    "--save-dir", str(tmp_path / "ft"), "--no-epoch-checkpoints", "--no-save-optimizer-state"])
    state = torch.load(tmp_path / "ft" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    stored = state["task_state"]["labels"]
    assert stored == sorted(data_labels)
    rows = state["model"]["classification_heads.sentence_classification_head.out_proj.weight"]
    imported = hf_model.classifier.weight.detach()
    if data_labels == labels:  # same names: each class's row is the imported row of that name
        for index, name in enumerate(stored):
            assert (rows[index] - imported[labels.index(name)]).abs().max() < 1e-6, name
        assert "reordered to this data's" in proc.stdout + proc.stderr
    else:
        assert "the head's output layer starts from fresh weights" in proc.stdout + proc.stderr
        assert all((rows[i] - imported[j]).abs().max() > 1e-3 for i in range(3) for j in range(3))


def test_hub_pairs_of_a_model_with_one_token_type(wordpiece_vocab, corpus_files, tmp_path):
    """type_vocab_size 1 (an imported BERT without segments): a pair's tokens all get that one type."""
    from spanbert_plugin.model.spanbert import SpanBertModel

    random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertModel", type_vocab_size=1)
    _import(tmp_path / "hf", tmp_path / "imported")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    first, second = _sample_lines(corpus_files[1], 2)
    tokens = hub.encode(first, second)[:128]
    assert hub.segment_labels(tokens).sum() == 0
    with torch.no_grad():
        assert torch.equal(hub.extract_features(tokens), hub.extract_features(tokens, torch.zeros_like(tokens)[None]))


TINY_BERT = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)


def test_import_keeps_the_pooler_for_the_export(wordpiece_vocab, tmp_path):
    """A BertModel's pooler survives import -> export (pooler_output equal); a model built without it loads it."""
    from transformers import BertModel

    from spanbert_plugin.model.spanbert import SpanBertModel

    original = random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertModel", **TINY_BERT)
    assert "pooler (bert.pooler.dense) kept" in _import(tmp_path / "hf", tmp_path / "imported")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")  # built without it, loads it
    assert torch.equal(hub.model.pooler.weight, original.pooler.dense.weight)
    assert "pooler_output" in _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    exported = BertModel.from_pretrained(str(tmp_path / "exported")).eval()
    tokens = torch.tensor([[2, 10, 11, 12, 3]])
    with torch.no_grad():
        theirs, ours = exported(input_ids=tokens).pooler_output, original(input_ids=tokens).pooler_output
    assert (theirs - ours).abs().max() < 1e-6  # the same weights (an ulp apart: another matrix layout)
    for key in ("weight", "bias"):
        assert torch.equal(getattr(exported.pooler.dense, key), getattr(original.pooler.dense, key))


@pytest.mark.parametrize("layout", ["tokenizer_config_4x", "tokenizer_json_only"])
def test_extra_special_tokens_stay_whole_through_import_and_export(layout, wordpiece_vocab, tmp_path):
    """Entity markers declared special inside the vocabulary: one token each in the import and in the export."""
    from transformers import AutoTokenizer

    from spanbert_plugin.model.spanbert import SpanBertModel

    markers = ["[E1]", "[/E1]"]
    vocab = open(wordpiece_vocab, encoding="utf-8").read().splitlines() + markers
    if layout == "tokenizer_config_4x":  # vocab.txt and transformers 4.x's tokenizer_config.json
        folder = _tokenizer_folder(tmp_path, layout, vocab, {"do_lower_case": False,
                                                             "additional_special_tokens": markers})
    else:  # tokenizer.json alone: its special added tokens
        folder = _tokenizer_folder(tmp_path, layout, vocab, {"do_lower_case": False}, (False, False), vocab_txt=False)
        spec = json.loads((folder / "tokenizer.json").read_text())
        spec["added_tokens"] += [{"id": vocab.index(m), "content": m, "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True} for m in markers]
        (folder / "tokenizer.json").write_text(json.dumps(spec))
    assert "2 special tokens kept whole (transformers' additional_special_tokens): [E1], [/E1]" in \
        _import(folder, tmp_path / "imported")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")  # read back from the tokenizer files
    _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    theirs, exported = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
    text = "[E1] Ada [/E1] lives in Oslo."
    ours = hub.encode(text).tolist()
    assert ours == theirs(text)["input_ids"] == exported(text)["input_ids"]
    assert ours.count(vocab.index("[E1]")) == ours.count(vocab.index("[/E1]")) == 1


def test_special_tokens_beyond_the_vocabulary_are_refused(wordpiece_vocab, tmp_path):
    """A special token the vocabulary lacks, or a token added after it, is one line naming the file."""
    vocab = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    folder = _tokenizer_folder(tmp_path, "declared", vocab, {"extra_special_tokens": ["[ENT]"]})
    _import_error(folder, tmp_path / "out", f"{folder / 'tokenizer_config.json'}: special token '[ENT]' is not in")
    folder = _tokenizer_folder(tmp_path, "added", vocab, tokenizer_json=(False, False), vocab_txt=False)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"].append({"id": len(vocab), "content": "<e1>", "special": False})
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    _import_error(folder, tmp_path / "out", f"added token '<e1>' (id {len(vocab)}) lies beyond the {len(vocab)} WordPiece")


@pytest.mark.parametrize("layout", ["config_strip_accents_only", "config_no_chinese_split", "tokenizer_json_no_chinese_split"])
def test_each_tokenizer_setting_read_as_transformers_reads_it(layout, wordpiece_vocab, tmp_path):
    """strip_accents without do_lower_case, tokenize_chinese_chars false: the import and the export as transformers."""
    from transformers import AutoTokenizer

    from spanbert_plugin.cli.import_hf import main as import_main
    from spanbert_plugin.model.spanbert import SpanBertModel

    cased = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    vocab = list(dict.fromkeys([p if p.startswith("[") else p.lower() for p in cased] + ["東", "京", "##京", "naïve", "naive"]))
    settings = {"config_strip_accents_only": {"strip_accents": False},
                "config_no_chinese_split": {"do_lower_case": True, "tokenize_chinese_chars": False},
                "tokenizer_json_no_chinese_split": {"do_lower_case": True}}[layout]
    folder = _tokenizer_folder(tmp_path, layout, vocab, settings, (True, None) if "json" in layout else None,
                               vocab_txt="json" not in layout)
    if "json" in layout:  # the file's normaliser says it, tokenizer_config.json does not
        spec = json.loads((folder / "tokenizer.json").read_text())
        spec["normalizer"]["handle_chinese_chars"] = False
        (folder / "tokenizer.json").write_text(json.dumps(spec))
    status, _, err = call(import_main, ["--hf", folder, "--out", tmp_path / "imported"])
    assert status == 0 and ("tokenizer_config.json does not set tokenize_chinese_chars" in err) == ("json" in layout), err
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    theirs, exported = AutoTokenizer.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
    text = "東京 Naïve café"
    assert hub.encode(text).tolist() == exported(text)["input_ids"]
    if layout != "tokenizer_json_no_chinese_split":  # there transformers puts its default over the file (warned)
        assert hub.encode(text).tolist() == theirs(text)["input_ids"]
    split = [hub.dictionary[i] for i in hub.encode(text).tolist()]
    assert ("##京" in split) == (layout != "config_strip_accents_only") and ("naïve" in split) == (layout == "config_strip_accents_only")


def test_import_keeps_the_tokenizers_model_max_length(wordpiece_vocab, tmp_path):
    """A tokenizer's model_max_length below the model's positions comes back with the export; the positions cap it."""
    from transformers import AutoTokenizer

    vocab = open(wordpiece_vocab, encoding="utf-8").read().splitlines()
    folder = _tokenizer_folder(tmp_path, "short", vocab, {"do_lower_case": False, "model_max_length": 32})
    _import(folder, tmp_path / "imported")
    assert json.loads((tmp_path / "imported" / "spanbert_tokenizer.json").read_text())["model_max_length"] == 32
    _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    assert AutoTokenizer.from_pretrained(str(tmp_path / "exported")).model_max_length == 32
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "model_max_length": "long"}))
    _import_error(folder, tmp_path / "out", "tokenizer_config.json: model_max_length must be a positive integer, found 'long'")


def test_import_of_a_token_classifier_keeps_the_encoder(wordpiece_vocab, tmp_path):
    """A BertForTokenClassification folder: its encoder is imported and its per-token classifier noted as ignored."""
    from safetensors.torch import load_file

    random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertForTokenClassification", num_labels=5, **TINY_BERT)
    stdout = _import(tmp_path / "hf", tmp_path / "imported")
    assert "token classifier ignored (classifier.bias, classifier.weight)" in stdout
    assert "sentence_classification_head" not in stdout
    _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    original = load_file(str(tmp_path / "hf" / "model.safetensors"))
    exported = load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert all(torch.equal(exported[k], v) for k, v in original.items() if k.startswith("bert.encoder."))


def test_export_of_a_model_with_one_token_type_types_pairs_0(wordpiece_vocab, tmp_path):
    """type_vocab_size 1: the exported tokenizer gives a pair's second text type 0 (1 would be out of range)."""
    from transformers import AutoTokenizer, BertModel

    from spanbert_plugin.cli.import_hf import main as import_main
    from spanbert_plugin.model.spanbert import SpanBertModel

    random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertModel", type_vocab_size=1, **TINY_BERT)
    _import(tmp_path / "hf", tmp_path / "imported")
    _export(tmp_path / "imported" / "model.pt", tmp_path / "exported")
    config = json.loads((tmp_path / "exported" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # what transformers 4.x and 5.x both load
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "exported"))
    pair = tokenizer("Where does Ada live?", "Ada lives in Oslo.", return_tensors="pt")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    assert pair["input_ids"][0].tolist() == hub.encode("Where does Ada live?", "Ada lives in Oslo.").tolist()
    assert pair["token_type_ids"].sum() == 0
    with torch.no_grad():
        BertModel.from_pretrained(str(tmp_path / "exported"))(**pair)
    # and back, without a warning: the generic class reads tokenizer.json as it is
    status, _, err = call(import_main, ["--hf", tmp_path / "exported", "--out", tmp_path / "again"])
    assert status == 0 and "warning" not in err, err


def test_import_from_a_folder_holding_another_runs_checkpoint(wordpiece_vocab, tmp_path, monkeypatch):
    """A working folder with checkpoints/checkpoint_last.pt (fairseq's default --save-dir, which most documented
    commands write) of another shape: the import builds the shape config.json gives, not that run's."""
    random_hf_bert(tmp_path / "other", wordpiece_vocab, "BertModel", num_hidden_layers=1, **TINY_BERT)
    _import(tmp_path / "other", tmp_path / "other_imported")
    (tmp_path / "checkpoints").mkdir()
    shutil.copy(tmp_path / "other_imported" / "model.pt", tmp_path / "checkpoints" / "checkpoint_last.pt")
    monkeypatch.chdir(tmp_path)
    random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertModel", num_hidden_layers=2, **TINY_BERT)
    _import(tmp_path / "hf", tmp_path / "imported")
    state = torch.load(tmp_path / "imported" / "model.pt", weights_only=True)
    assert state["cfg"]["model"]["encoder_layers"] == 2
    assert "encoder.encoder.layer.1.output.dense.weight" in state["model"]


def _untrained_relation_checkpoint(data, path):
    """A tiny relation_extraction checkpoint on the prepared folder ``data``, saved as training saves one (no update)."""
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from spanbert_plugin.core.user_dir import register_plugin

    register_plugin()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), [
        data, "--task", "relation_extraction", "--criterion", "relation_extraction", "--arch", "spanbert_tiny",
        "--encoder-layers", "1", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--max-positions", "64", "--re-pooling", "entity_start", "--cpu"]))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(0)
    model = task.build_model(cfg.model)
    with torch.no_grad():
        for p in model.relation_heads.parameters():
            p.normal_(0, 0.3)  # logits of real size, so that equal predictions mean something
    checkpoint_utils.torch_persistent_save(
        {"args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "model": model.state_dict(),
         "criterion": None, "task_state": task.state_dict(),
         "optimizer_history": [{"criterion_name": "RelationExtractionCriterion", "optimizer_name": "none",
                                "lr_scheduler_state": {"best": None}, "num_updates": 0}],
         "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}}}, str(path))


def test_wordpiece_export_carries_markers_appended_after_the_vocabulary(tmp_path, capsys):
    """A WordPiece vocabulary without [unusedN] slots: the markers appended to the dictionary are in the export's
    vocab.txt at their ids, kept whole by transformers, and the import gives back the dictionary and the head."""
    import numpy as np
    from fairseq.data import data_utils
    from transformers import AutoTokenizer

    from spanbert_plugin.cli import prepare_re
    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.model.spanbert import SpanBertModel
    from test_relation_extraction import BORN, FOUNDED, UNTYPED, make_tokenizer_folder, write_examples

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "bill", "gates", "was", "born", "in", "seattle", ".",
             "microsoft", "founded", "by", "(", ")"]
    examples = write_examples(tmp_path / "train.json", [BORN, FOUNDED, UNTYPED])

    def prepare(tokenizer_folder, dest):
        assert prepare_re.main(["--train", examples, "--valid", examples, "--tokenizer-from", tokenizer_folder,
                                "--destdir", str(dest), "--entity-marker", "ner", "--max-seq-length", "32"]) == 0
        meta = json.loads((dest / "re_meta.json").read_text())
        dictionary = SpanBertDictionary.load(str(dest / "dict.txt"))
        items = data_utils.load_indexed_dataset(str(dest / "train"), dictionary, "mmap")
        positions = torch.tensor(np.load(dest / "train.npz")["entity_positions"])
        return meta, [items[i] for i in range(len(items))], positions

    meta, items, positions = prepare(make_tokenizer_folder(str(tmp_path / "tok"), vocab), tmp_path / "re")
    assert len(meta["appended_symbols"]) == 46  # every ner marker, after the 17 tokens
    _untrained_relation_checkpoint(str(tmp_path / "re"), tmp_path / "re" / "checkpoint_last.pt")
    hub = SpanBertModel.from_pretrained(str(tmp_path / "re"), "checkpoint_last.pt")
    symbols = list(hub.task.dictionary.symbols)
    assert len(symbols) == len(vocab) + 46

    _export(tmp_path / "re" / "checkpoint_last.pt", tmp_path / "hf")
    assert (tmp_path / "hf" / "vocab.txt").read_text(encoding="utf-8").splitlines() == symbols
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == len(symbols)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    subject = meta["markers"]["[SUBJ-PERSON]"]
    assert theirs("[SUBJ-PERSON] bill gates")["input_ids"] == [2, subject, 5, 6, 3]

    note = [line for line in _import(tmp_path / "hf", tmp_path / "imported").splitlines() if "special tokens" in line]
    assert len(note) == 1 and "46 special tokens kept whole" in note[0] and note[0].endswith("and 40 more"), note
    again = SpanBertModel.from_pretrained(str(tmp_path / "imported"), "model.pt")
    assert list(again.task.dictionary.symbols) == symbols
    for key, value in hub.model.state_dict().items():
        if not key.startswith("vocabulary."):
            assert torch.equal(again.model.state_dict()[key], value), key
    # preparing the data with the import's tokenizer gives the same inputs, and its head the same predictions
    capsys.readouterr()
    meta_again, items_again, positions_again = prepare(str(tmp_path / "imported"), tmp_path / "re_again")
    assert meta_again["markers"] == meta["markers"] and not meta_again["appended_symbols"]
    assert [t.tolist() for t in items_again] == [t.tolist() for t in items] and torch.equal(positions_again, positions)
    tokens = torch.nn.utils.rnn.pad_sequence(items, batch_first=True, padding_value=hub.dictionary.pad())
    with torch.no_grad():
        before, _ = hub.model.eval()(tokens, relation_head_name="relation_head", entity_positions=positions)
        after, _ = again.model.eval()(tokens, relation_head_name="relation_head", entity_positions=positions)
    assert before.abs().max() > 0.1 and (before - after).abs().max() <= 1e-5


def test_only_entity_markers_appended_after_the_vocabulary_become_special(tmp_path):
    """Symbols after the WordPiece vocabulary are written at their ids; only relation markers are special tokens."""
    from spanbert_plugin.core.tokenization import WordPieceTokenizer
    from spanbert_plugin.relation.markers import MARKER_TABLE

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "bill", "gates"]) + "\n",
                                        encoding="utf-8")
    tokenizer = WordPieceTokenizer(str(tmp_path / "vocab.txt"), lowercase=True)
    extended = tokenizer.with_appended_tokens(["[SUBJ-PERSON]", "madeupword0000"], special=MARKER_TABLE)
    assert extended.vocab[-2:] == ["[SUBJ-PERSON]", "madeupword0000"]
    assert extended.extra_special_tokens == ["[SUBJ-PERSON]"]
    assert extended.tok.encode("[SUBJ-PERSON] bill", add_special_tokens=False).ids == [7, 5]


def test_appended_tokens_are_those_from_the_first_id_on_without_gaps(tmp_path):
    """The added tokens of a tokenizer.json from id 3 on, in id order, up to the first missing id."""
    from spanbert_plugin.hf.tokenizer_files import _appended_tokens

    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"added_tokens": [{"id": 1, "content": "<pad>"}, {"id": 4, "content": "[E1]"},
                                                 {"id": 3, "content": "<mask>"}, {"id": 6, "content": "[E3]"}]}))
    assert _appended_tokens(str(path), 3) == ["<mask>", "[E1]"]
    assert _appended_tokens(str(path), 6) == ["[E3]"] and _appended_tokens(str(path), 5) == []


def test_only_special_added_tokens_of_a_tokenizer_json_are_declared(tmp_path):
    """A tokenizer.json's added tokens marked special (beyond BERT's five) are kept whole, a plain added token is
    not; a tokenizer_config.json's additional_special_tokens are, naming the file that declares them."""
    from spanbert_plugin.hf.tokenizer_files import _declared_special_tokens

    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": 5, "content": "[E2]", "special": True}, {"id": 6, "content": "hello", "special": False},
        {"id": 2, "content": "[CLS]", "special": True}]}))
    config = {"additional_special_tokens": ["[E1]"]}
    assert _declared_special_tokens(str(tmp_path), config) == {
        "[E1]": str(tmp_path / "tokenizer_config.json"), "[E2]": str(tmp_path / "tokenizer.json")}


def test_a_side_head_with_one_of_its_two_files_is_refused(tmp_path):
    """Either of a side head's files without the other is an error naming both (the head would be dropped silently);
    neither: no such head."""
    from spanbert_plugin.hf.files import InteropError
    from spanbert_plugin.hf.heads import RELATION

    assert RELATION.load_config(str(tmp_path)) is None
    (tmp_path / RELATION.weights_file).write_bytes(b"")
    with pytest.raises(InteropError, match=f"{RELATION.weights_file}: .* needs {RELATION.config_file}"):
        RELATION.load_config(str(tmp_path))
    (tmp_path / RELATION.weights_file).unlink()
    (tmp_path / RELATION.config_file).write_text("{}")
    with pytest.raises(InteropError, match=f"{RELATION.config_file}: .* needs {RELATION.weights_file}"):
        RELATION.load_config(str(tmp_path))


def test_hf_names_map_onto_ours_and_back():
    """cls.predictions.decoder.bias (the MLM bias as some checkpoints name it) is lm_head.bias; a classification
    head's dense is BERT's pooler, and takes its place in the export over a pooler an import kept."""
    from spanbert_plugin.hf.interop import from_hf_state_dict, to_hf_state_dict

    bias = torch.arange(3.0)
    ours, ignored = from_hf_state_dict({"cls.predictions.decoder.bias": bias})
    assert list(ours) == ["lm_head.bias"] and ours["lm_head.bias"] is bias and ignored == []
    dense, pooler, out = torch.ones(2, 2), torch.zeros(2, 2), torch.full((3, 2), 2.0)
    state = {"classification_heads.h.dense.weight": dense, "classification_heads.h.out_proj.weight": out,
             "pooler.weight": pooler}
    theirs = to_hf_state_dict(state, "h")
    assert sorted(theirs) == ["bert.pooler.dense.weight", "classifier.weight"]
    assert theirs["bert.pooler.dense.weight"] is dense and theirs["classifier.weight"] is out
    assert to_hf_state_dict({"pooler.weight": pooler})["bert.pooler.dense.weight"] is pooler


def test_sequence_classifier_is_told_by_the_pooler_or_the_architecture():
    from spanbert_plugin.hf.interop import is_sequence_classifier

    classifier, pooler = {"classifier.weight": 0}, {"classifier.weight": 0, "bert.pooler.dense.weight": 0}
    assert is_sequence_classifier(pooler) and is_sequence_classifier(classifier, ["BertForSequenceClassification"])
    assert not is_sequence_classifier(classifier) and not is_sequence_classifier(pooler, ["BertForTokenClassification"])
    assert not is_sequence_classifier({"bert.pooler.dense.weight": 0}, ["BertForSequenceClassification"])


def test_bert_config_carries_each_setting_of_the_model():
    """Every transformers setting from its own fairseq option: the dropouts (hidden, attention, classifier), the
    initialiser's standard deviation, the LayerNorm epsilon."""
    from types import SimpleNamespace

    from spanbert_plugin.hf.interop import bert_config_of

    class Dictionary(list):
        def pad(self):
            return 1

    cfg = SimpleNamespace(encoder_embed_dim=8, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_embed_dim=16,
                          dropout=0.1, attention_dropout=0.2, pooler_dropout=0.3, max_positions=32, type_vocab_size=2,
                          init_std=0.05, layer_norm_eps=1e-7)
    config = bert_config_of(cfg, Dictionary(["a"] * 10))
    assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob, config.classifier_dropout) == (0.1, 0.2, 0.3)
    assert (config.initializer_range, config.layer_norm_eps, config.vocab_size, config.pad_token_id) == (0.05, 1e-7, 10, 1)


def test_import_command_line_takes_the_pooler_dropout_from_classifier_dropout_else_hidden_dropout():
    from spanbert_plugin.hf.interop import _training_command_line

    config = {"num_hidden_layers": 1, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
              "max_position_embeddings": 1024, "hidden_dropout_prob": 0.2, "attention_probs_dropout_prob": 0.3}

    def option(cli, name):
        return cli[cli.index(name) + 1]

    cli = _training_command_line("work", config, {}, "hf")
    assert option(cli, "--pooler-dropout") == "0.2" and option(cli, "--attention-dropout") == "0.3"
    assert option(cli, "--tokens-per-sample") == "512"
    assert option(_training_command_line("work", {**config, "classifier_dropout": 0.0}, {}, "hf"), "--pooler-dropout") == "0.0"


def test_qa_settings_windows_may_fill_every_position(tmp_path):
    """qa_settings.json windows of exactly max_position_embeddings tokens fit the model; one more does not."""
    from types import SimpleNamespace

    from spanbert_plugin.hf.files import InteropError
    from spanbert_plugin.hf.interop import _register_task_heads

    settings = {"max_seq_length": 64, "doc_stride": 16, "max_query_length": 16, "n_best": 20, "max_answer_length": 30,
                "with_negative": False, "null_threshold": 0.0, "validated_null_threshold": None}
    (tmp_path / "qa_settings.json").write_text(json.dumps(settings))
    model = SimpleNamespace(register_qa_head=lambda: None)
    heads, state = _register_task_heads(model, {"qa_outputs.weight": torch.zeros(2, 8)},
                                        {"max_position_embeddings": 64}, str(tmp_path))
    assert len(heads) == 1 and state["qa_settings"]["max_seq_length"] == 64
    with pytest.raises(InteropError, match="max_seq_length 64 exceeds the model's 63 positions"):
        _register_task_heads(model, {"qa_outputs.weight": torch.zeros(2, 8)}, {"max_position_embeddings": 63},
                             str(tmp_path))


def test_a_generic_tokenizer_class_folder_is_read_from_its_tokenizer_json_alone(tmp_path):
    """tokenizer_class PreTrainedTokenizerFast: transformers reads the folder from tokenizer.json as it is (its
    BertNormalizer lower-cases), whatever tokenizer_config.json's do_lower_case says; the import reads it so."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import AutoTokenizer

    from spanbert_plugin.hf.tokenizer_files import _wordpiece_tokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "Hello", "world"]
    BertWordPieceTokenizer({p: i for i, p in enumerate(vocab)}, lowercase=True).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                "do_lower_case": False}))
    ours, note = _wordpiece_tokenizer(str(tmp_path), str(tmp_path / "tokenizer.json"))
    text = "Hello WORLD"
    theirs = AutoTokenizer.from_pretrained(str(tmp_path))(text, add_special_tokens=False)["input_ids"]
    assert ours.lowercase and note is None
    assert ours.encode(text).ids.tolist() == theirs == [5, 7]


def test_sentencepiece_model_rebuilt_on_import_keeps_the_special_ids(spm_data, tmp_path):
    """Export then import of a sentencepiece tokenizer: the model rebuilt from tokenizer.json names the same pieces
    bos, eos, pad and unk as the model exported, so sentencepiece's own add_bos/add_eos add the same ids."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    from spanbert_plugin.core.dictionary import SpanBertDictionary
    from spanbert_plugin.core.tokenization import load_tokenizer
    from spanbert_plugin.hf.tokenizer_files import read_hf_tokenizer, save_hf_tokenizer

    tokenizer = load_tokenizer(spm_data)
    (tmp_path / "hf").mkdir()
    (tmp_path / "scratch").mkdir()
    save_hf_tokenizer(tokenizer, SpanBertDictionary.from_tokenizer(tokenizer), str(tmp_path / "hf"), 64)
    back, _, _ = read_hf_tokenizer(str(tmp_path / "hf"), str(tmp_path / "hf" / "tokenizer.json"), str(tmp_path / "scratch"))
    specs = []
    for path in (tokenizer.model_file, back.model_file):
        proto = sentencepiece_model_pb2.ModelProto()
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
        specs.append(tuple(getattr(proto.trainer_spec, f"{role}_id") for role in ("bos", "eos", "pad", "unk")))
    assert specs[0] == specs[1] == (0, 2, 1, 3)
    text = "the value of a list"
    assert spm.SentencePieceProcessor(model_file=back.model_file).encode(text, add_bos=True, add_eos=True) == \
        spm.SentencePieceProcessor(model_file=tokenizer.model_file).encode(text, add_bos=True, add_eos=True)


def test_relation_export_names_the_classes_only_of_a_head_of_as_many_classes(tmp_path):
    """relation_config.json gives a head the task's labels only where they are as many as its classes (else an
    import would map the head's rows onto the wrong names)."""
    from types import SimpleNamespace

    from spanbert_plugin.hf.heads import RELATION, _write_relation
    from spanbert_plugin.model.relation_head import RelationHead

    heads = {"two": RelationHead(8, 2, "cls", 0.0), "three": RelationHead(8, 3, "cls", 0.0)}
    hub = SimpleNamespace(model=SimpleNamespace(relation_heads=heads), task=SimpleNamespace(labels=["no", "yes"]))
    _write_relation(hub, str(tmp_path))
    written = json.loads((tmp_path / RELATION.config_file).read_text())["heads"]
    assert written["two"] == {"pooling": "cls", "num_classes": 2, "labels": ["no", "yes"]}
    assert written["three"] == {"pooling": "cls", "num_classes": 3}


def test_a_decoder_differing_from_the_embeddings_in_one_weight_is_untied(wordpiece_vocab, tmp_path):
    """The MLM decoder is tied only when it equals the word embeddings in every weight: one weight apart, it is a
    decoder of its own (warned about; the MLM head starts fresh)."""
    from spanbert_plugin.cli.import_hf import main

    hf_model = random_hf_bert(tmp_path / "hf", wordpiece_vocab, "BertForMaskedLM", tie_word_embeddings=False)
    with torch.no_grad():
        hf_model.cls.predictions.decoder.weight.copy_(hf_model.bert.embeddings.word_embeddings.weight)
        hf_model.cls.predictions.decoder.weight[5, 3] += 1.0
    hf_model.save_pretrained(str(tmp_path / "hf"))
    status, _, err = call(main, ["--hf", tmp_path / "hf", "--out", tmp_path / "out"])
    assert status == 0 and "is not tied to the word embeddings" in err, err


def _hub_stub(type_vocab_size=2):
    """What the hub's token-type and decoding methods read: the dictionary, the token-type table, a tokenizer."""
    import types

    from spanbert_plugin.core.dictionary import SpanBertDictionary

    dictionary = SpanBertDictionary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(10)])
    embeddings = types.SimpleNamespace(token_type_embeddings=torch.nn.Embedding(type_vocab_size, 4))
    return types.SimpleNamespace(dictionary=dictionary,
                                 model=types.SimpleNamespace(encoder=types.SimpleNamespace(embeddings=embeddings)),
                                 tokenizer=types.SimpleNamespace(decode=lambda ids: " ".join(map(str, ids))))


def test_hub_token_types_of_padded_pairs_and_decoding_without_padding():
    from spanbert_plugin.model.hub_interface import SpanBertHubInterface

    hub = _hub_stub()
    tokens = torch.tensor([[2, 7, 8, 3, 9, 3, 0, 0],  # [CLS] a a [SEP] b [SEP] [PAD] [PAD]
                           [2, 7, 3, 8, 9, 10, 3, 0]])
    assert SpanBertHubInterface.segment_labels(hub, tokens).tolist() == [[0, 0, 0, 0, 1, 1, 0, 0],
                                                                          [0, 0, 0, 1, 1, 1, 1, 0]]
    one_type = _hub_stub(type_vocab_size=1)
    assert SpanBertHubInterface.segment_labels(one_type, tokens).tolist() == [[0] * 8, [0] * 8]
    assert SpanBertHubInterface.decode(hub, tokens[0]) == "7 8 9"


def test_hub_counts_of_one_and_the_first_of_several_data_folders():
    from spanbert_plugin.model.hub_interface import _stored_data, check_count

    assert check_count("answer", "topk", 1) == 1
    with pytest.raises(ValueError, match="topk must be an integer of at least 1, got 0"):
        check_count("answer", "topk", 0)
    assert _stored_data({"cfg": {"task": {"data": "/data/a:/data/b:/data/c"}}}) == "/data/a"


def test_import_refuses_what_spanbert_cannot_hold_in_one_line(wordpiece_vocab, tmp_path):
    """Settings, weights and folders an import cannot map onto spanbert: one line naming the file, nothing written."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / "out"
    hf_dir = tmp_path / "hf"
    random_hf_bert(hf_dir, wordpiece_vocab)
    config = json.loads((hf_dir / "config.json").read_text())
    weights = load_file(str(hf_dir / "model.safetensors"))

    def variant(name, config_changes=None, weights_changed=None, remove=()):
        bad = tmp_path / name
        shutil.copytree(hf_dir, bad)
        (bad / "config.json").write_text(json.dumps({**config, **(config_changes or {})}))
        if weights_changed is not None:
            save_file(weights_changed, str(bad / "model.safetensors"))
        for file_name in remove:
            (bad / file_name).unlink()
        return bad

    _import_error(variant("relative", {"position_embedding_type": "relative_key"}), out,
                  "config.json: position_embedding_type 'relative_key'; only absolute positions map onto spanbert")
    _import_error(variant("relu", {"hidden_act": "relu"}), out, "config.json: hidden_act 'relu'; spanbert uses exact (erf) gelu")
    _import_error(variant("novocab", remove=["vocab.txt"]), out,
                  "novocab: no vocab.txt or tokenizer.json (a WordPiece or sentencepiece tokenizer is required)")
    _import_error(variant("noembeddings", weights_changed={k: v for k, v in weights.items()
                                                             if "word_embeddings" not in k and "decoder" not in k}),
                  out, "noembeddings: no embeddings.word_embeddings.weight in the weights")
    # weights of two layers, a config of one: the second layer's weights would have nowhere to go
    _import_error(variant("fewerlayers", {"num_hidden_layers": 1}), out,
                  "fewerlayers: weight encoder.encoder.layer.1.attention.output.LayerNorm.bias has no counterpart in spanbert")
    bin_dir = variant("checkpointbin", remove=["model.safetensors"])
    torch.save({"state_dict": weights, "epoch": 3}, bin_dir / "pytorch_model.bin")  # a training script's checkpoint
    _import_error(bin_dir, out, "pytorch_model.bin: expected a dictionary of tensors (a state dict)")


def test_import_refuses_task_heads_it_cannot_rebuild(wordpiece_vocab, tmp_path):
    """A QA head of another number of outputs, QA settings without the QA head, a sequence classifier without its
    pooler: one line each."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / "out"
    random_hf_bert(tmp_path / "qa3", wordpiece_vocab, "BertForQuestionAnswering", num_labels=3)
    _import_error(tmp_path / "qa3", out, "qa3: qa_outputs has 3 outputs; extractive QA needs 2 (start, end)")
    random_hf_bert(tmp_path / "settings", wordpiece_vocab)
    (tmp_path / "settings" / "qa_settings.json").write_text(json.dumps({"max_seq_length": 64}))
    _import_error(tmp_path / "settings", out, f"{tmp_path / 'settings' / 'qa_settings.json'}: the folder has no "
                                              "qa_outputs weights for these settings")
    classifier = tmp_path / "classifier"
    random_hf_bert(classifier, wordpiece_vocab, "BertForSequenceClassification", num_labels=2)
    weights = load_file(str(classifier / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if not k.startswith("bert.pooler.")}, str(classifier / "model.safetensors"))
    _import_error(classifier, out, "classifier: a classifier without bert.pooler.dense weights; "
                                   "BertForSequenceClassification has both")


@pytest.mark.parametrize("heads, weights_of, expected", [
    ({}, None, "{config}: expected a non-empty 'heads' object"),
    ({"re": {"pooling": "mean", "num_classes": 3}}, None,
     "{config}: head 're' needs a pooling (cls, entity_start) and num_classes"),
    ({"re": {"pooling": "cls"}}, None, "{config}: head 're' needs a pooling (cls, entity_start) and num_classes"),
    ({"re": {"pooling": "entity_start", "num_classes": 3}}, ("cls", 3),
     "{weights}: head 're' does not match {config} (entity_start pooling, 3 classes, hidden 8)"),
    ({"re": {"pooling": "cls", "num_classes": 4}}, ("cls", 3),
     "{weights}: head 're' does not match {config} (cls pooling, 4 classes, hidden 8)"),
], ids=["no heads", "unknown pooling", "no class count", "other pooling", "other class count"])
def test_relation_head_files_that_disagree_are_one_line(tmp_path, heads, weights_of, expected):
    from safetensors.torch import save_file

    from spanbert_plugin.hf.files import InteropError
    from spanbert_plugin.hf.heads import RELATION, read_relation_heads
    from spanbert_plugin.model.relation_head import RelationHead

    config, weights = tmp_path / RELATION.config_file, tmp_path / RELATION.weights_file
    config.write_text(json.dumps({"heads": heads}))
    pooling, classes = weights_of or ("cls", 3)
    save_file({f"re.{k}": v.contiguous() for k, v in RelationHead(8, classes, pooling, 0.0).state_dict().items()},
              str(weights))
    with pytest.raises(InteropError) as raised:
        read_relation_heads(str(tmp_path), 8)
    assert str(raised.value) == expected.format(config=config, weights=weights)
    config.write_text(json.dumps({"heads": {"re": {"pooling": pooling, "num_classes": classes}}}))
    assert read_relation_heads(str(tmp_path), 8)["re"].out_proj.out_features == classes  # the files agreeing: read


@pytest.mark.parametrize("config, expected", [
    ({"position_slots": 0, "position_dim": 16}, "position_slots must be a positive integer, found 0"),
    ({"position_slots": 15}, "position_dim must be a positive integer, found None"),
    ({"position_slots": 15, "position_dim": "16"}, "position_dim must be a positive integer, found '16'"),
])
def test_an_sbo_config_without_its_shape_is_one_line(tmp_path, config, expected):
    from spanbert_plugin.hf.files import InteropError
    from spanbert_plugin.hf.heads import SBO

    with pytest.raises(InteropError) as raised:
        SBO.model_arguments(config, str(tmp_path))
    assert str(raised.value) == f"{tmp_path / SBO.config_file}: {expected}"
    assert SBO.model_arguments({"position_slots": 15, "position_dim": 16}, str(tmp_path)) == [
        "--sbo-position-slots", "15", "--sbo-position-dim", "16"]


def _unigram_tokenizer_json(path, **changes):
    """A sentencepiece-shaped Unigram tokenizer.json (byte fallback on, two byte pieces), then edited by ``changes``
    (top-level keys, or ``model`` keys as ``model__key``)."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("▁a", -1.0), ("b", -2.0), ("<0x41>", -9.0), ("<0x42>", -9.0)]
    tok = Tokenizer(Unigram(pieces, unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex("^ "), "")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.save(str(path))
    spec = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        node, key = (spec["model"], key[len("model__"):]) if key.startswith("model__") else (spec, key)
        node[key] = value
    path.write_text(json.dumps(spec), encoding="utf-8")
    return str(path)


def test_a_unigram_tokenizer_json_rebuilds_byte_pieces_as_bytes(tmp_path):
    from sentencepiece import sentencepiece_model_pb2

    from spanbert_plugin.hf.tokenizer_files import spm_model_from_unigram_json

    spm_model_from_unigram_json(_unigram_tokenizer_json(tmp_path / "tokenizer.json"), str(tmp_path / "spm.model"))
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((tmp_path / "spm.model").read_bytes())
    Piece = sentencepiece_model_pb2.ModelProto.SentencePiece
    assert [(p.piece, p.type) for p in proto.pieces] == [
        ("<unk>", Piece.UNKNOWN), ("<s>", Piece.NORMAL), ("</s>", Piece.NORMAL), ("▁a", Piece.NORMAL),
        ("b", Piece.NORMAL), ("<0x41>", Piece.BYTE), ("<0x42>", Piece.BYTE)]
    assert proto.trainer_spec.byte_fallback


@pytest.mark.parametrize("changes, expected", [
    ({"model__vocab": {"<unk>": 0}}, "a Unigram model without its [piece, score] list"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "a Unigram tokenizer that is not a sentencepiece model's (normaliser "),
    ({"added_tokens": [{"id": 8, "content": "<mask>", "special": True}]},
     "added tokens outside the unigram vocabulary (<mask>); only tokens appended after it without gaps"),
], ids=["no piece list", "another pre-tokenizer", "a gap before an added token"])
def test_a_unigram_tokenizer_json_sentencepiece_cannot_reproduce_is_one_line(tmp_path, changes, expected):
    from spanbert_plugin.hf.files import InteropError
    from spanbert_plugin.hf.tokenizer_files import spm_model_from_unigram_json

    path = _unigram_tokenizer_json(tmp_path / "tokenizer.json", **changes)
    with pytest.raises(InteropError) as raised:
        spm_model_from_unigram_json(path, str(tmp_path / "spm.model"))
    assert str(raised.value).startswith(f"{path}: {expected}") and "\n" not in str(raised.value)
    assert not (tmp_path / "spm.model").exists()


def test_only_a_unigram_sentencepiece_model_is_exported(tmp_path):
    from sentencepiece import sentencepiece_model_pb2

    from spanbert_plugin.hf.files import InteropError
    from spanbert_plugin.hf.tokenizer_files import unigram_tokenizer_from_spm

    proto = sentencepiece_model_pb2.ModelProto()
    proto.trainer_spec.model_type = 2  # BPE
    proto.pieces.add(piece="<unk>", score=0.0, type=sentencepiece_model_pb2.ModelProto.SentencePiece.UNKNOWN)
    (tmp_path / "spm.model").write_bytes(proto.SerializeToString())
    with pytest.raises(InteropError) as raised:
        unigram_tokenizer_from_spm(str(tmp_path / "spm.model"))
    assert str(raised.value) == f"{tmp_path / 'spm.model'}: only sentencepiece unigram models can be exported"


@pytest.mark.parametrize("config, expected", [
    ({"extra_special_tokens": {"entity_start": "[E1]", "entity_end": {"content": "[/E1]"}}}, None),
    ({"additional_special_tokens": "[E1]"}, "additional_special_tokens must be a list of tokens, found '[E1]'"),
    ({"additional_special_tokens": ["[E1]", 7]}, "additional_special_tokens holds 7, not a token"),
    ({"extra_special_tokens": [{"id": 5}]}, "extra_special_tokens holds {'id': 5}, not a token"),
], ids=["named tokens", "not a list", "a number", "no content"])
def test_declared_special_tokens_are_a_list_or_a_mapping_of_tokens(tmp_path, config, expected):
    """transformers 4.x may name its extra tokens ({name: token}); anything but tokens is one line naming the file."""
    from spanbert_plugin.hf.files import InteropError
    from spanbert_plugin.hf.tokenizer_files import _declared_special_tokens

    if expected is None:
        assert _declared_special_tokens(str(tmp_path), config) == {"[E1]": str(tmp_path / "tokenizer_config.json"),
                                                                  "[/E1]": str(tmp_path / "tokenizer_config.json")}
        return
    with pytest.raises(InteropError) as raised:
        _declared_special_tokens(str(tmp_path), config)
    assert str(raised.value) == f"{tmp_path / 'tokenizer_config.json'}: {expected}"


def test_a_tokenizer_json_alone_without_berts_normaliser_is_refused(tmp_path):
    """A folder whose only tokenizer file is a WordPiece tokenizer.json with another normaliser: transformers'
    settings are taken as given, and reading the file names the normaliser it cannot reproduce."""
    from tokenizers import BertWordPieceTokenizer

    from spanbert_plugin.core.tokenization import TokenizerError
    from spanbert_plugin.hf.tokenizer_files import _wordpiece_tokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]
    path = tmp_path / "tokenizer.json"
    BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}).save(str(path))
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "NFKC"}
    path.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(TokenizerError) as raised:
        _wordpiece_tokenizer(str(tmp_path), str(path))
    assert str(raised.value).startswith(f'{path}: normalizer {{"type": "NFKC"}}; expected BERT\'s (BertNormalizer')


def test_a_classification_head_of_another_inner_size_is_refused_by_the_export(wordpiece_vocab, tmp_path):
    """transformers' classifier reads the pooler's output, of the hidden size: a head whose dense layer has another
    size (registered with inner_dim) has no transformers counterpart. One line naming the checkpoint and the head;
    nothing written."""
    from spanbert_plugin.cli.export_hf import main
    from spanbert_plugin.hf.interop import IMPORTED_HEAD

    _classifier_dir(tmp_path / "hf", wordpiece_vocab)
    _import(tmp_path / "hf", tmp_path / "ck")
    state = torch.load(tmp_path / "ck" / "model.pt", weights_only=True)
    weights, head = state["model"], f"classification_heads.{IMPORTED_HEAD}."
    classes = weights[head + "out_proj.weight"].size(0)
    torch.manual_seed(2)
    weights[head + "dense.weight"], weights[head + "dense.bias"] = torch.randn(16, 64), torch.randn(16)
    weights[head + "out_proj.weight"] = torch.randn(classes, 16)
    torch.save(state, tmp_path / "ck" / "inner16.pt")
    checkpoint = tmp_path / "ck" / "inner16.pt"
    status, _, err = call(main, ["--checkpoint", checkpoint, "--out", tmp_path / "o"])
    assert status == 1 and not (tmp_path / "o").exists(), err
    assert len(err.strip().splitlines()) == 1 and err.strip().endswith(
        f"{checkpoint}: classification head {IMPORTED_HEAD} has inner size 16; transformers' pooler needs the hidden "
        "size 64"), err


def test_a_unigram_tokenizer_that_keeps_runs_of_spaces_exports_as_sentencepiece_encodes(tmp_path):
    """A tokenizer.json without sentencepiece's whitespace clean-up (no Replace steps) imports as a model with
    remove_extra_whitespaces off; exported again, its tokenizer encodes as that sentencepiece model does, spaces kept."""
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Tokenizer

    from spanbert_plugin.hf.tokenizer_files import spm_model_from_unigram_json, unigram_tokenizer_from_spm

    # "▁" a piece of its own, as in every trained sentencepiece vocabulary (without it, a lone "▁" of a run of spaces
    # is an unknown piece that sentencepiece fuses with the next one and tokenizers' pre-split words do not);
    # sentencepiece loads byte fallback only with all 256 byte pieces
    vocab = [["<unk>", 0.0], ["<s>", 0.0], ["</s>", 0.0], ["▁a", -1.0], ["b", -2.0], ["▁", -3.0]]
    source = _unigram_tokenizer_json(tmp_path / "tokenizer.json", normalizer={"type": "Sequence", "normalizers": []},
                                     model__vocab=vocab, model__byte_fallback=False)
    spm_model_from_unigram_json(source, str(tmp_path / "spm.model"))
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((tmp_path / "spm.model").read_bytes())
    assert not proto.normalizer_spec.remove_extra_whitespaces
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spm.model"))
    exported, original = unigram_tokenizer_from_spm(str(tmp_path / "spm.model")), Tokenizer.from_file(source)
    # (a text that starts with a space differs: sentencepiece prefixes its "▁" always, tokenizers' Metaspace only
    # where the text does not already start with one; the plugin's own models remove extra white space)
    for text in ("ab", "a  b", "a b ", "a   ab  "):
        ids = processor.encode(text)
        assert exported.encode(text).ids == ids == original.encode(text).ids, text
    assert processor.encode("a  b") != processor.encode("a b")  # the run of spaces is kept


def test_a_folder_json_file_is_read_by_the_one_json_reader(tmp_path):
    """The HuggingFace files are read as every input is: a byte-order mark (a Windows editor's) is no error, a
    malformed file names its line, and JSON that is not an object is refused with its type."""
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.hf.files import InteropError, read_json

    path = tmp_path / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"hidden_size": 8}).encode())
    assert read_json(str(path)) == {"hidden_size": 8}
    path.write_text('{\n"hidden_size": 8,\n}')
    with pytest.raises(UsageError, match=re.escape(f"{path}:3: not valid JSON")):
        read_json(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(InteropError, match=re.escape(f"{path}: expected a JSON object, found list")):
        read_json(str(path))


def test_an_import_is_repeated_bit_for_bit_and_its_seed_draws_only_the_missing_weights(wordpiece_vocab, tmp_path):
    """A BertModel folder (no MLM head) imports with fresh MLM-head layers and a fresh SBO: drawn from --seed, so two
    imports are equal (a run started from them is repeatable), another seed changes only those weights, and the
    caller's random state is left as it was."""
    from spanbert_plugin.cli.import_hf import main as import_main

    random_hf_bert(tmp_path / "hf", wordpiece_vocab, model_class="BertModel")
    torch.manual_seed(123)
    state_before = torch.random.get_rng_state()
    for name, extra in (("a", []), ("b", []), ("seed2", ["--seed", "2"])):
        status, out, err = call(import_main, ["--hf", tmp_path / "hf", "--out", tmp_path / name, *extra])
        assert status == 0, err
    assert torch.equal(torch.random.get_rng_state(), state_before)
    a, b, other = (torch.load(tmp_path / name / "model.pt", weights_only=True)["model"] for name in ("a", "b", "seed2"))
    fresh = [k for k in a if k.startswith(("lm_head.dense", "sbo_head.")) and a[k].is_floating_point()]
    assert "lm_head.dense.weight" in fresh and "sbo_head.dense1.weight" in fresh
    tensors = [k for k in a if not k.startswith("vocabulary.")]  # the vocabulary record names its folder
    assert all(torch.equal(a[k], b[k]) for k in tensors)
    assert all(torch.equal(a[k], other[k]) for k in tensors if k not in fresh)
    # the randomly drawn ones (biases and layer norms start at constants, the SBO's output is the tied embeddings)
    assert {k for k in fresh if not torch.equal(a[k], other[k])} == {
        "lm_head.dense.weight", "sbo_head.position_embeddings.weight", "sbo_head.dense1.weight", "sbo_head.dense2.weight"}
