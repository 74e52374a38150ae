"""The spanbert model, its heads and the span_bert criterion (SPEC §1.2)."""
import argparse

import pytest
import torch
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf

from conftest import tiny_spanbert
import spanbert_plugin.registry  # noqa: F401  (registers the plugin, safe-loading allowlist)


def build(data_dir, *extra, arch="spanbert_tiny"):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [data_dir, "--task", "span_masked_lm", "--criterion", "span_bert", "--arch", arch,
                 "--tokens-per-sample", "128", "--cpu", *extra]
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return task, model, criterion


@pytest.fixture(scope="module")
def built(spm_data):
    torch.manual_seed(0)
    task, model, criterion = build(spm_data)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(4)])
    return task, model, criterion, sample


def test_architectures_follow_bert_sizes(spm_data):
    for arch, (layers, dim, heads, ffn) in {
        "spanbert_base": (12, 768, 12, 3072), "spanbert_large": (24, 1024, 16, 4096)
    }.items():
        ns = argparse.Namespace()
        from fairseq.models import ARCH_CONFIG_REGISTRY

        ARCH_CONFIG_REGISTRY[arch](ns)
        assert (ns.encoder_layers, ns.encoder_embed_dim, ns.encoder_attention_heads, ns.encoder_ffn_embed_dim) == (layers, dim, heads, ffn)
        assert ns.layer_norm_eps == 1e-12 and ns.dropout == 0.1 and ns.sbo_position_dim == 200
    _, model, _ = build(spm_data, "--encoder-layers", "3", "--encoder-embed-dim", "64")
    assert len(model.encoder.encoder.layer) == 3 and model.encoder.embeddings.word_embeddings.embedding_dim == 64


def test_weight_tying_and_shapes(built):
    task, model, criterion, sample = built
    embed = model.encoder.embeddings.word_embeddings.weight
    assert model.lm_head.weight is embed and model.sbo_head.weight is embed
    model.eval()
    masked = sample["target"].ne(task.dictionary.pad())
    out, _ = model(**sample["net_input"], masked_tokens=masked, span_left=sample["span_left"],
                   span_right=sample["span_right"], span_offset=sample["span_offset"])
    n_masked = int(masked.sum())
    assert out["mlm_logits"].shape == (n_masked, len(task.dictionary))  # masked positions only
    assert out["sbo_logits"].shape == (len(out["sbo_index"]), len(task.dictionary))
    features, _ = model(**sample["net_input"], features_only=True)
    assert features.shape == (*sample["net_input"]["src_tokens"].shape, 128)
    loss, sample_size, log = criterion(model, sample)
    loss.backward()
    assert sample_size == n_masked == log["num_masked"]
    assert embed.grad is not None and model.sbo_head.dense1.weight.grad is not None


def test_sbo_reads_only_boundary_states(built):
    task, model, _, _ = built
    model.eval()
    torch.manual_seed(1)
    x = torch.randn(1, 12, 128)
    masked = torch.zeros(1, 12, dtype=torch.bool)
    masked[0, 4:7] = True  # one span 4..6, boundaries 3 and 7
    left = torch.full((1, 12), 3)
    right = torch.full((1, 12), 7)
    offset = torch.arange(12).unsqueeze(0) - 3
    base = model.pretraining_heads(x, masked, left, right, offset)["sbo_logits"]
    inside = x.clone()
    inside[0, 4:7] += torch.randn(3, 128)
    assert torch.allclose(model.pretraining_heads(inside, masked, left, right, offset)["sbo_logits"], base)
    for boundary in (3, 7):
        moved = x.clone()
        moved[0, boundary] += 1.0
        assert not torch.allclose(model.pretraining_heads(moved, masked, left, right, offset)["sbo_logits"], base)
    # the MLM logits of a token read that token's own state
    assert not torch.allclose(model.pretraining_heads(inside, masked)["mlm_logits"],
                              model.pretraining_heads(x, masked)["mlm_logits"])


def test_sbo_logits_are_the_spec_formula(built):
    """SPEC §1.2 written out: h0 = [x_left; x_right; p_offset], h1 = LN1(GeLU(W1 h0)), y = LN2(GeLU(W2 h1)), logits
    from the tied embedding and the head's bias; every weight random, so that no two LayerNorms or layers agree."""
    _, model, _, _ = built
    head = model.sbo_head
    torch.manual_seed(2)
    saved = {k: v.clone() for k, v in head.state_dict().items()}
    try:
        with torch.no_grad():
            for name, parameter in head.named_parameters():
                if name != "weight":  # the embedding shared with the encoder stays
                    parameter.normal_()
        left, right = torch.randn(5, 128), torch.randn(5, 128)
        offset = torch.tensor([1, 2, 3, head.position_slots, 7])
        h0 = torch.cat([left, right, head.position_embeddings.weight[offset - 1]], dim=-1)
        h1 = torch.nn.functional.layer_norm(torch.nn.functional.gelu(h0 @ head.dense1.weight.T + head.dense1.bias),
                                            (128,), head.LayerNorm1.weight, head.LayerNorm1.bias, eps=1e-12)
        y = torch.nn.functional.layer_norm(torch.nn.functional.gelu(h1 @ head.dense2.weight.T + head.dense2.bias),
                                           (128,), head.LayerNorm2.weight, head.LayerNorm2.bias, eps=1e-12)
        expected = y @ model.encoder.embeddings.word_embeddings.weight.T + head.bias
        torch.testing.assert_close(head(left, right, offset), expected)  # float32 defaults: the same operations
    finally:
        head.load_state_dict(saved)


def test_the_loss_adds_sbo_times_its_weight(spm_data):
    task, model, criterion = build(spm_data, "--sbo-weight", "0.25")
    task.load_dataset("valid")
    ds = task.dataset("valid")
    loss, _, log = criterion(model, ds.collater([ds[0], ds[1]]))
    assert log["sbo_loss"] > 0
    assert loss.item() == pytest.approx(log["mlm_loss"].item() + 0.25 * log["sbo_loss"].item(), rel=1e-6)


def test_tokens_past_the_position_table_get_mlm_only(built):
    _, model, _, _ = built
    slots = model.sbo_head.position_slots
    x = torch.randn(1, slots + 6, 128)
    masked = torch.zeros(1, slots + 6, dtype=torch.bool)
    masked[0, 1 : slots + 4] = True  # a span of slots + 3 tokens
    left = torch.zeros(1, slots + 6, dtype=torch.long)
    right = torch.full((1, slots + 6), slots + 4)
    offset = torch.arange(slots + 6).unsqueeze(0)
    out = model.pretraining_heads(x, masked, left, right, offset)
    assert out["mlm_logits"].shape[0] == slots + 3 and out["sbo_logits"].shape[0] == slots


def test_sbo_off_when_weight_zero(spm_data):
    task, model, criterion = build(spm_data, "--sbo-weight", "0")
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[0], ds[1]])
    loss, _, log = criterion(model, sample)
    loss.backward()
    assert "sbo_loss" not in log and log["mlm_loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert model.sbo_head.dense1.weight.grad is None


def test_fp16_logits_give_finite_fp32_loss(built):
    task, model, criterion, sample = built
    half = type(model)(model.cfg, model.encoder).half()
    half.load_state_dict(model.state_dict())
    loss, _, log = criterion(half, sample)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max-span-len", "20"], "exceeds the model's 15 SBO position slots"),
        (["--tokens-per-sample", "600"], "exceeds the model's 512 positions"),
        (["--geometric-p", "0"], "geometric p"),
        (["--mask-prob", "0.5"], "sum to 1"),
    ],
)
def test_misconfiguration_errors(spm_data, extra, message):
    with pytest.raises(ValueError, match=message):
        build(spm_data, *extra)


def test_unknown_mask_scheme_is_argparse_usage_error(spm_data, capsys):
    """A value outside the choices stops at parsing: argparse's status 2 and one error line naming the flag."""
    with pytest.raises(SystemExit) as err:
        build(spm_data, "--mask-scheme", "noun_phrases")
    assert err.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == [errors[0]] and errors[0].endswith(
        "error: argument --mask-scheme: invalid choice: 'noun_phrases' (choose from 'span', 'word', 'subword', "
        "'named_entity', 'noun_phrase')")


def test_dictionary_without_mask_symbol(spm_data, tmp_path):
    import shutil

    data = tmp_path / "nomask"
    shutil.copytree(spm_data, data)
    lines = (data / "dict.txt").read_text().splitlines()
    (data / "dict.txt").write_text("\n".join(line for line in lines if not line.startswith("<mask> ")) + "\n")
    with pytest.raises(ValueError, match="no mask symbol"):
        build(str(data))


def test_has_padding_from_the_collater_says_what_the_tokens_say_and_false_runs_unmasked(built, monkeypatch):
    """The collaters tell the model whether a batch holds padding (known on the host, so a GPU need not be asked);
    False runs attention without a mask, which on a batch without padding is the masked result."""
    from spanbert_plugin.core import cpu_paths

    task, model, _, sample = built
    dataset = task.dataset("valid")
    for indices in ([0, 1, 2, 3], [0], [1, 1]):
        batch = dataset.collater([dataset[i] for i in indices])
        assert batch["net_input"]["has_padding"] == bool(batch["net_input"]["src_tokens"].eq(task.dictionary.pad()).any())
    model.eval()
    monkeypatch.setattr(cpu_paths, "CPU_PATHS", False)  # the GPU's path: without has_padding the mask is applied
    tokens = sample["net_input"]["src_tokens"][:, :16]
    assert not tokens.eq(task.dictionary.pad()).any()
    with torch.no_grad():
        masked = model(tokens, features_only=True)[0]
        unmasked = model(tokens, features_only=True, has_padding=False)[0]
        padded = torch.cat([tokens, tokens.new_full((len(tokens), 3), task.dictionary.pad())], dim=1)
        with_padding = model(padded, features_only=True, has_padding=True)[0][:, :16]
    assert torch.allclose(masked, unmasked, atol=1e-6, rtol=0)
    assert torch.allclose(with_padding, masked, atol=1e-5, rtol=0)


class _OwnTrain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.modes = []

    def train(self, mode=True):
        self.modes.append(mode)
        return super().train(mode)


class _CountsUpdates(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.numbers = []

    def set_num_updates(self, num_updates):
        self.numbers.append(num_updates)


def test_train_and_eval_set_every_module_in_one_pass_and_modules_with_their_own_train_get_it(spm_data, monkeypatch):
    _, model, _ = build(spm_data)
    model.register_classification_head("head", num_classes=3)
    model.encoder.encoder.layer[0].eval()  # mixed modes before
    calls = []
    original = torch.nn.Module.train
    monkeypatch.setattr(torch.nn.Module, "train", lambda self, mode=True: calls.append(mode) or original(self, mode))
    assert model.train() is model
    assert all(m.training for m in model.modules()) and calls == []  # no recursive call per module
    model.eval()
    assert not any(m.training for m in model.modules()) and calls == []
    with pytest.raises(ValueError, match="boolean"):
        model.train("yes")
    model.encoder.encoder.layer[1].own = _OwnTrain()
    model.train()
    assert model.encoder.encoder.layer[1].own.modes == [True] and all(m.training for m in model.modules())


def test_set_num_updates_reaches_each_module_with_its_own_method_once(spm_data):
    from fairseq.models import BaseFairseqModel, FairseqEncoder

    from spanbert_plugin.core.source_hash import source_sha256
    from spanbert_plugin.model.spanbert import FAIRSEQ_NUMBER_PASSERS_SHA256

    _, model, _ = build(spm_data)
    model.encoder.encoder.layer[1].counter = _CountsUpdates()
    model.counter = _CountsUpdates()
    model.set_num_updates(7)
    assert model.encoder.encoder.layer[1].counter.numbers == [7] and model.counter.numbers == [7]
    BaseFairseqModel.set_num_updates(model, 8)  # fairseq's: the same number, twice under the encoder
    assert model.encoder.encoder.layer[1].counter.numbers == [7, 8, 8] and model.counter.numbers == [7, 8]
    # the methods the walk skips only pass the number on (fairseq-fixed 0.12.3.1); another fairseq fails here
    assert source_sha256(BaseFairseqModel.set_num_updates, FairseqEncoder.set_num_updates) == FAIRSEQ_NUMBER_PASSERS_SHA256


def _small_model(max_positions=16):
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    torch.manual_seed(0)
    dictionary = SpanBertDictionary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(20)])
    model = tiny_spanbert(dictionary, max_positions=max_positions, dropout=0.0, attention_dropout=0.0,
                          sbo_position_dim=8)
    return model.eval(), dictionary


def test_sbo_of_every_row_reads_its_own_rows_boundaries():
    """Two rows, a span in each: the SBO logits of a token are the head on x[row, left], x[row, right] of its row."""
    model, _ = _small_model()
    x = torch.randn(2, 10, 32)
    masked = torch.zeros(2, 10, dtype=torch.bool)
    masked[0, 2:4] = True  # boundaries 1 and 4
    masked[1, 5:8] = True  # boundaries 4 and 8
    left = torch.tensor([[1] * 10, [4] * 10])
    right = torch.tensor([[4] * 10, [8] * 10])
    offset = torch.arange(10).expand(2, 10) - left
    with torch.no_grad():
        out = model.pretraining_heads(x, masked, left, right, offset)
        rows, columns = masked.nonzero(as_tuple=True)
        expected = model.sbo_head(x[rows, left[rows, columns]], x[rows, right[rows, columns]], offset[rows, columns])
    assert torch.equal(out["sbo_index"], torch.arange(5))
    torch.testing.assert_close(out["sbo_logits"], expected)


def test_inputs_as_long_as_the_position_table_are_taken():
    model, _ = _small_model(max_positions=16)
    tokens = torch.randint(5, 25, (2, 16))
    with torch.no_grad():
        assert model(tokens, features_only=True)[0].shape == (2, 16, 32)
        with pytest.raises(ValueError, match="input of 17 tokens exceeds the model's 16 positions"):
            model(torch.randint(5, 25, (2, 17)), features_only=True)


def test_padding_to_a_length_multiple_pads_only_lengths_between_multiples():
    model, dictionary = _small_model(max_positions=16)
    model.encoder.length_multiple = 8
    tokens = torch.randint(5, 25, (2, 8))
    assert model.encoder._pad_to_length_multiple(tokens, None)[0] is tokens
    padded, segments = model.encoder._pad_to_length_multiple(tokens[:, :5], torch.zeros(2, 5, dtype=torch.long))
    assert padded.shape == segments.shape == (2, 8) and padded[:, 5:].eq(dictionary.pad()).all()
    assert model.encoder._pad_to_length_multiple(torch.randint(5, 25, (2, 13)), None)[0].shape == (2, 16)


def test_the_padding_embedding_starts_at_zero():
    model, dictionary = _small_model()
    embedding = model.encoder.embeddings.word_embeddings.weight
    assert embedding[dictionary.pad()].eq(0).all() and embedding[dictionary.pad() + 1].ne(0).all()


def test_without_token_types_every_token_has_type_0():
    model, _ = _small_model()
    embeddings = model.encoder.embeddings
    tokens = torch.randint(5, 25, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(embeddings(tokens), embeddings(tokens, torch.zeros_like(tokens)))
        assert not torch.allclose(embeddings(tokens), embeddings(tokens, torch.ones_like(tokens)))


def test_attention_divides_the_scores_by_the_square_root_of_the_head_dimension_on_both_paths():
    """softmax(q k^T / sqrt(hidden / heads)) on the explicit path (AD-DROP's probabilities) and the fused one, with
    weights large enough that the scale matters (BERT's N(0, 0.02) initialisation makes attention nearly uniform)."""
    import math

    from spanbert_plugin.model.layers import BertLayer

    torch.manual_seed(3)
    layer = BertLayer(hidden=32, heads=4, ffn=64, eps=1e-12, dropout=0.0, attention_dropout=0.0).eval()
    x = torch.randn(2, 6, 32) * 3
    with torch.no_grad():
        out, probs = layer(x, return_probs=True)
        sa = layer.attention.self
        q, k = (t.view(2, 6, 4, 8).transpose(1, 2) for t in (sa.query(x), sa.key(x)))
        torch.testing.assert_close(probs, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), dim=-1))
        torch.testing.assert_close(out, layer(x))  # float32 rounding apart (measured 4.8e-7 at outputs up to 2.9)


def test_padding_is_masked_out_of_attention_where_the_caller_does_not_say_whether_there_is_any():
    """On a CPU the encoder looks for padding itself (has_padding unset): a padded row's real tokens get the states
    they get alone, beside a row without padding."""
    model, dictionary = _small_model()
    tokens = torch.randint(5, 25, (1, 6))
    padded = torch.cat([tokens, torch.full((1, 3), dictionary.pad())], dim=1)
    with torch.no_grad():
        alone = model(tokens, features_only=True)[0]
        batch = model(torch.cat([padded, torch.randint(5, 25, (1, 9))]), features_only=True)[0]
    torch.testing.assert_close(batch[0, :6], alone[0])  # float32 defaults: the padded keys count exactly 0


def test_without_masked_positions_the_mlm_head_predicts_every_position():
    """model(tokens) as fairseq's RoBERTa answers it: MLM logits for every token, row-major."""
    model, _ = _small_model()
    tokens = torch.randint(5, 25, (2, 7))
    with torch.no_grad():
        out, _ = model(tokens)
        features, _ = model(tokens, features_only=True)
        assert out["mlm_logits"].shape == (14, model.lm_head.bias.numel())
        torch.testing.assert_close(out["mlm_logits"], model.lm_head(features.reshape(14, -1)), rtol=0, atol=0)


def test_a_coreference_head_in_a_checkpoint_of_another_task_is_left_out():
    """A coreference model fine-tuned further for another task (--finetune-from-model): its head's weights have no
    module here and are dropped, so the strict load of the rest goes through."""
    model, _ = _small_model()
    assert model.coref_head is None
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["coref_head.mention_scorer.weight"] = torch.ones(1, 96)
    state["coref_head.coarse_scores_once"] = torch.tensor(True)
    model.upgrade_state_dict_named(state, "")
    assert not [k for k in state if k.startswith("coref_head.")]
    model.load_state_dict(state, strict=True)


def test_padding_to_a_length_multiple_leaves_the_features_as_they_are():
    """Padded up to the multiple (then masked and cut off) or already a multiple (run as it is, unmasked where the
    host says there is no padding): the features are those of the model without a length multiple."""
    model, _ = _small_model(max_positions=16)
    model.eval()
    tokens = torch.randint(5, 25, (2, 16))
    with torch.no_grad():
        expected = {n: model.encoder(tokens[:, :n], has_padding=False) for n in (5, 8, 16)}
        model.encoder.length_multiple = 8
        for n, features in expected.items():
            torch.testing.assert_close(model.encoder(tokens[:, :n], has_padding=False), features)


def test_a_checkpoint_without_an_sbo_head_grows_the_rows_it_has():
    """Symbols appended since the checkpoint (entity markers): the embedding and MLM rows it has keep their values,
    the new ones are the model's fresh rows and zero biases; a head the checkpoint lacks is not made up."""
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    old_model, dictionary = _small_model()
    grown = tiny_spanbert(SpanBertDictionary(dictionary.symbols + ["<e1>", "<e2>"]), max_positions=16,
                          dropout=0.0, attention_dropout=0.0, sbo_position_dim=8)
    state = {k: v.clone() for k, v in old_model.state_dict().items() if not k.startswith("sbo_head.")}
    grown.upgrade_state_dict_named(state, "")
    assert not [k for k in state if k.startswith("sbo_head.")]
    embed, fresh = "encoder.embeddings.word_embeddings.weight", grown.state_dict()
    for key in (embed, "lm_head.weight"):
        assert state[key].shape == (27, 32)
        assert torch.equal(state[key][:25], old_model.state_dict()[key]) and torch.equal(state[key][25:], fresh[key][25:])
    assert torch.equal(state["lm_head.bias"], torch.cat([old_model.lm_head.bias, torch.zeros(2)]))
    assert torch.equal(state["vocabulary.symbol_hashes"], fresh["vocabulary.symbol_hashes"])


def test_a_dictionary_read_from_a_stream_names_it_and_marks_its_control_symbols():
    """dict.txt from an open file (fairseq's loaders hand one over) reads as from a path; errors name the stream
    (<stream> where it has no file name); a dictionary without a mask symbol marks the other four controls only."""
    import io

    from spanbert_plugin.core.dictionary import SpanBertDictionary

    stream = io.StringIO("[PAD] 0\n[UNK] 0\n[CLS] 0\n[SEP] 0\nw 7\n")
    d = SpanBertDictionary.load(stream)
    assert d.symbols == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "w"] and d.count[-1] == 7 and d.mask_index is None
    assert d.special_mask().tolist() == [True, True, True, True, False]
    with pytest.raises(ValueError, match=r"^<stream>:2: expected '<symbol> <count>', got 'w'$"):
        SpanBertDictionary.load(io.StringIO("[PAD] 0\nw\n"))
