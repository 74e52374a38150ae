"""AD-DROP: attribution, candidate/drop masks, the two-pass training step, cross-tuning, fine-tuning runs."""
import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import bin_path, run_cli, tiny_spanbert
from spanbert_plugin.core.errors import UsageError
from spanbert_plugin.addrop.attribution import (candidate_counts, candidate_mask, drop_mask, drop_masks, mask_generator,
                                                pseudo_label_logit_sum, pseudo_label_span_objective, row_candidates)
from spanbert_plugin.model.layers import additive_drop_mask
from spanbert_plugin.addrop.task_mixin import check_ad_drop_options, is_ad_drop_epoch, parse_layers
from test_pretrain import assert_resume_is_exact, deterministic, train_logs
from test_qa_task import QA_TRAIN, synthetic_squad


def tiny_model(layers=2, dim=32, heads=4, seed=0):
    """A spanbert encoder without dropout (so passes are deterministic) and its dictionary."""
    from spanbert_plugin.core.dictionary import SpanBertDictionary

    torch.manual_seed(seed)
    dictionary = SpanBertDictionary(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(40)])
    model = tiny_spanbert(dictionary, layers, dim, heads, dropout=0.0, attention_dropout=0.0, pooler_dropout=0.0)
    model.register_classification_head("cls", num_classes=3)
    model.register_qa_head()
    return model.train(), dictionary


def padded_tokens(lengths, seed=1, pad=0, width=None):
    gen = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    tokens = torch.full((len(lengths), width), pad, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n] = torch.randint(5, 45, (n,), generator=gen)
        tokens[row, 0] = 2
    return tokens


def hand_written_attribution(model, tokens, layers):
    """Gradient of the summed pseudo-label logits w.r.t. attention probabilities, by an explicit re-implementation."""
    enc = model.encoder
    padding = tokens.eq(enc.padding_idx)
    x = enc.embeddings(tokens)
    B, T, H = x.shape
    leaves = {}
    for index, layer in enumerate(enc.encoder.layer):
        sa = layer.attention.self
        h = layer.heads

        def heads_of(t):
            return t.view(B, T, h, H // h).permute(0, 2, 1, 3)

        q, k, v = heads_of(sa.query(x)), heads_of(sa.key(x)), heads_of(sa.value(x))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(H // h)
        scores = scores + padding[:, None, None, :].float() * -1e30
        probs = scores.exp() / scores.exp().sum(-1, keepdim=True)
        if index in layers:
            probs = leaves[index] = probs.detach().requires_grad_()
        ctx = torch.einsum("bhqk,bhkd->bhqd", probs, v).permute(0, 2, 1, 3).reshape(B, T, H)
        x = layer.attention.output.LayerNorm(x + layer.attention.output.dense(ctx))
        x = layer.output.LayerNorm(x + layer.output.dense(F.gelu(layer.intermediate.dense(x))))
    head = model.classification_heads["cls"]
    logits = head.out_proj(torch.tanh(head.dense(x[:, 0])))
    logits[torch.arange(B), logits.argmax(-1)].sum().backward()
    return {index: leaf.grad for index, leaf in leaves.items()}


def test_gradient_attribution_equals_hand_written_attention():
    model, _ = tiny_model()
    tokens = padded_tokens([9, 6, 12, 4])
    probs = {0: None, 1: None}
    logits, _ = model(tokens, classification_head_name="cls", attention_probs_out=probs)
    grads = torch.autograd.grad(pseudo_label_logit_sum(logits), [probs[0], probs[1]])
    assert all(p.grad is None for p in model.parameters())  # attribution accumulates no parameter gradient
    expected = hand_written_attribution(model, tokens, {0, 1})
    for layer, grad in zip((0, 1), grads):
        assert grad.shape == (4, 4, 12, 12)
        torch.testing.assert_close(grad, expected[layer], rtol=1e-4, atol=1e-6)
        assert grad.abs().max() > 0
    # the explicit-probabilities path computes the same outputs as the fused one
    torch.testing.assert_close(logits, model(tokens, classification_head_name="cls")[0], rtol=1e-5, atol=1e-6)


def test_span_objective_is_minus_pseudo_label_cross_entropy():
    gen = torch.Generator().manual_seed(4)
    start, end = torch.randn(5, 11, generator=gen), torch.randn(5, 11, generator=gen)
    expected = -(F.cross_entropy(start, start.argmax(-1), reduction="sum") + F.cross_entropy(end, end.argmax(-1), reduction="sum"))
    torch.testing.assert_close(pseudo_label_span_objective(start, end), expected)


def test_regression_objective_is_minus_the_loss():
    """The authors' STS-B code ranks attention entries by the negated gradient of the loss; the plain loss (before)
    picked the opposite entries as candidates."""
    from types import SimpleNamespace

    from spanbert_plugin.classification.criterion import SentenceClassificationCriterion

    task = SimpleNamespace(cfg=SimpleNamespace(classification_head_name="sentence_classification_head"),
                           regression=True, num_classes=1)
    criterion = SentenceClassificationCriterion(None, task)
    outputs = torch.tensor([[0.5], [2.0], [-1.0]])
    sample = {"net_input": {}, "target": torch.tensor([1.0, 1.5, 0.0]), "ntokens": 9}
    model = lambda **inputs: (outputs, None)  # noqa: E731 - the head's outputs, whatever the inputs
    loss = criterion(model, sample)[0]
    assert loss == pytest.approx(0.25 + 0.25 + 1.0) and criterion.ad_drop_objective(model, sample) == -loss


def test_candidates_are_top_p_of_real_keys_and_drops_about_p_times_q():
    lengths = [40, 33, 17, 5, 28, 40, 1, 12] * 4
    B, heads, T = len(lengths), 4, 40
    padding = padded_tokens(lengths).eq(0)
    gen = torch.Generator().manual_seed(7)
    attribution = torch.randn(B, heads, T, T, generator=gen)
    p, q = 0.3, 0.4
    candidates = candidate_mask(attribution, padding, p)
    real_keys = (~padding).sum(-1)
    counts = candidate_counts(real_keys, p)
    assert counts.tolist() == [math.ceil(p * n - 1e-9) for n in lengths]
    assert (candidates.sum(-1) == counts[:, None, None]).all()  # per row: ceil(p x real keys)
    assert not (candidates & padding[:, None, None, :]).any()
    # candidates are the highest-attribution real keys of their row
    lowest_candidate = attribution.masked_fill(~candidates, float("inf")).amin(-1)
    highest_other = attribution.masked_fill(candidates | padding[:, None, None, :], float("-inf")).amax(-1)
    assert (lowest_candidate > highest_other).all()

    dropped = drop_mask(candidates, q, mask_generator("cpu", 1, 2, 3))
    assert not (dropped & ~candidates).any()
    n_candidates = int(candidates.sum())
    share = int(dropped.sum()) / n_candidates
    standard_error = math.sqrt(q * (1 - q) / n_candidates)
    assert abs(share - q) < 5 * standard_error, (share, standard_error)
    # dropped share of a row's real keys: Binomial(ceil(p n), q) / n, mean q ceil(p n) / n (within q / n of p q)
    per_row = dropped.sum(-1).double() / real_keys[:, None, None]
    rows = B * heads * T
    expected = float((q * counts / real_keys).mean())
    row_se = math.sqrt(float((q * (1 - q) * counts / real_keys.double().pow(2)).sum()) * heads * T) / rows
    assert abs(float(per_row.mean()) - expected) < 5 * row_se, (float(per_row.mean()), expected, row_se)
    assert abs(expected - p * q) < q * float((1 / real_keys).mean())


def test_nothing_dropped_when_p_or_q_is_zero_and_everything_when_both_one():
    padding = padded_tokens([7, 3, 10]).eq(0)
    attribution = torch.randn(3, 2, 10, 10)
    gen = mask_generator("cpu", 1, 2, 3)
    assert not drop_masks({0: attribution}, padding, 0.0, 0.9, gen)[0].any()
    assert not drop_masks({0: attribution}, padding, 0.9, 0.0, gen)[0].any()
    everything = drop_masks({0: attribution, 1: None}, padding, 1.0, 1.0, gen, shape=attribution.shape)
    for mask in everything.values():
        assert torch.equal(mask, (~padding)[:, None, None, :].expand_as(mask))


def test_masks_reproducible_from_seed_epoch_update():
    padding = padded_tokens([9, 4]).eq(0)
    shape = (2, 2, 9, 9)

    def masks(*key):
        return drop_masks({0: None}, padding, 0.5, 0.5, mask_generator("cpu", *key), shape=shape)[0]

    assert torch.equal(masks(1, 2, 3), masks(1, 2, 3))
    assert not torch.equal(masks(1, 2, 3), masks(1, 2, 4))
    assert not torch.equal(masks(1, 2, 3), masks(1, 4, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fully_dropped_row_stays_finite_and_ignores_padding(dtype):
    model, _ = tiny_model()
    model = model.to(dtype)
    tokens = padded_tokens([12, 5, 8])
    real = tokens.ne(0)
    everything = (real[:, None, None, :]).expand(3, 4, 12, 12)
    for layer in model.encoder.encoder.layer:  # large activations: logits far from 0 in half precision
        layer.attention.self.query.weight.data.mul_(30)
    logits, _ = model(tokens, classification_head_name="cls", attention_drop_masks={0: everything, 1: everything})
    assert torch.isfinite(logits.float()).all()
    logits.float().sum().backward()
    assert all(torch.isfinite(p.grad.float()).all() for p in model.parameters() if p.grad is not None)
    # the additive mask: a fully dropped row spreads over its real keys, padding stays at zero weight
    scores = torch.randn(3, 4, 12, 12).to(dtype) * 50
    additive = additive_drop_mask(everything, real[:, None, None, :], dtype)
    probs = torch.softmax((scores + additive).float(), dim=-1)
    assert torch.isfinite(probs).all()
    assert (probs.masked_select(~real[:, None, None, :].expand_as(probs)) == 0).all()


class _Backward:
    """The part of a fairseq optimizer that FairseqTask.train_step uses."""

    def backward(self, loss):
        loss.backward()


def qa_task(**options):
    from spanbert_plugin.qa.criterion import ExtractiveQACriterion
    from spanbert_plugin.qa.task import ExtractiveQAConfig, ExtractiveQATask

    model, dictionary = tiny_model()
    cfg = ExtractiveQAConfig(seed=5, **options)
    task = ExtractiveQATask(cfg, dictionary, {})
    return task, ExtractiveQACriterion(task), model


def qa_sample(lengths):
    tokens = padded_tokens(lengths, seed=3)
    gen = torch.Generator().manual_seed(8)
    lengths_t = torch.tensor(lengths)
    start = (torch.rand(len(lengths), generator=gen) * lengths_t).long()
    return {"net_input": {"src_tokens": tokens, "src_lengths": lengths_t}, "start_positions": start,
            "end_positions": torch.minimum(start + 1, lengths_t - 1), "nsentences": len(lengths),
            "ntokens": int(lengths_t.sum()), "id": torch.arange(len(lengths))}


@pytest.mark.parametrize("attribution", ["gradient", "attention", "random"])
def test_only_the_masked_pass_reaches_the_gradients(attribution):
    task, criterion, model = qa_task(ad_drop_p=0.5, ad_drop_q=0.7, ad_drop_layers="all",
                                     ad_drop_attribution=attribution)
    twin, plain = copy.deepcopy(model), copy.deepcopy(model)
    sample = qa_sample([14, 9, 11, 6])
    task.begin_epoch(2, model)
    assert task.ad_drop_active()
    _, _, log = task.train_step(sample, model, criterion, _Backward(), update_num=7)
    assert 0 < log["ad_drop_dropped"] < log["ad_drop_entries"]
    # counts stay tensors on the device (an int() per layer was a host sync every update), read when logged
    assert torch.is_tensor(log["ad_drop_dropped"]) and torch.is_tensor(log["ad_drop_entries"])
    from fairseq.logging import metrics

    with metrics.aggregate(new_root=True) as agg:
        task.reduce_metrics([log, log], criterion)
        assert agg.get_smoothed_values()["ad_drop_rate"] == pytest.approx(
            round(float(log["ad_drop_dropped"]) / float(log["ad_drop_entries"]), 4))

    # the same masks, recomputed by a fresh task, then one masked forward/backward
    other, criterion2, _ = qa_task(ad_drop_p=0.5, ad_drop_q=0.7, ad_drop_layers="all", ad_drop_attribution=attribution)
    other.begin_epoch(2, twin)
    masks = other.ad_drop_masks(sample, twin, criterion2, update_num=7)
    assert set(masks) == {0, 1}
    assert all(p.grad is None for p in twin.parameters())
    masked = dict(sample, net_input=dict(sample["net_input"], attention_drop_masks=masks))
    criterion2(twin, masked)[0].backward()
    criterion2(plain, sample)[0].backward()
    differs = False
    for (name, a), b, c in zip(model.named_parameters(), twin.parameters(), plain.parameters()):
        if a.grad is None:
            assert b.grad is None, name
            continue
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)
        differs = differs or not torch.allclose(a.grad, c.grad, rtol=1e-3, atol=1e-6)
    assert differs  # the masks changed the gradients: the check above is not vacuous


def test_cross_tuning_parity_and_options():
    assert [is_ad_drop_epoch(e, False) for e in range(1, 6)] == [False, True, False, True, False]
    assert all(is_ad_drop_epoch(e, True) for e in range(1, 6))
    task, _, model = qa_task(ad_drop_p=0.3)
    task.begin_epoch(1, model)
    assert not task.ad_drop_active()
    task.begin_epoch(4, model)
    assert task.ad_drop_active()
    assert parse_layers("all", 3) == [0, 1, 2] and parse_layers("2,0", 3) == [0, 2]
    from spanbert_plugin.qa.task import ExtractiveQAConfig

    for options, message in (({"ad_drop_p": 1.5}, "--ad-drop-p 1.5"), ({"ad_drop_q": -0.1}, "--ad-drop-q -0.1"),
                             ({"ad_drop_layers": "0,x"}, "--ad-drop-layers")):
        with pytest.raises(UsageError, match=message):
            check_ad_drop_options(ExtractiveQAConfig(seed=1, **options))
    with pytest.raises(UsageError, match="no layer 2; the model has layers 0-1"):
        parse_layers("0,2", 2)


@pytest.mark.parametrize("task", ["spanbert_pretraining", "span_masked_lm"])
def test_ad_drop_on_pretraining_task_is_refused(task, capsys):
    from fairseq import options

    parser = options.get_training_parser()
    with pytest.raises(SystemExit) as done:  # pre-training tasks have no AD-DROP options: argparse names the flag
        options.parse_args_and_arch(parser, ["data", "--user-dir", "user_dir", "--task", task,
                                             "--arch", "spanbert_tiny", "--ad-drop-p", "0.3"])
    assert done.value.code == 2  # argparse's usage error
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("error: unrecognized arguments: --ad-drop-p 0.3")


@pytest.fixture(scope="module")
def small_qa_data(wordpiece_data, corpus_files, tmp_path_factory):
    """60 synthetic passages (test_qa_task's generator), prepared in this process."""
    from spanbert_plugin.cli import prepare_qa

    d = tmp_path_factory.mktemp("adqa")
    with open(corpus_files[0], encoding="utf-8") as f:
        words = [w for w in f.read().split() if w.isalpha() and w.islower()][:3000]
    for split, contexts, seed in (("train", 60, 1), ("valid", 12, 2)):
        synthetic_squad(d / f"{split}.json", contexts, seed, words)
    assert prepare_qa.main(["--train", str(d / "train.json"), "--valid", str(d / "valid.json"), "--tokenizer-from",
                            wordpiece_data, "--destdir", str(d / "prepared"), "--max-seq-length", "64",
                            "--doc-stride", "24", "--max-query-length", "16"]) == 0
    return str(d / "prepared")


AD_QA = [*QA_TRAIN, "--batch-size", "32", "--log-interval", "1", "--ad-drop-p", "0.3", "--ad-drop-q", "0.5"]


def _valid_records(output):
    return [json.loads(line[line.index("{"):]) for line in output.splitlines() if "valid_f1" in line and "{" in line]


def test_qa_cross_tuning_learns_and_alternates_after_resume(small_qa_data, tmp_path):
    save = str(tmp_path / "ck")
    stop = 7  # in the middle of epoch 2 (checked below)
    # (a resume after validations, compared exactly: test_qa_cross_tuning_resume_after_validation_is_exact)
    first = run_cli([bin_path("fairseq-train"), small_qa_data, *AD_QA, "--max-epoch", "4", "--disable-validation",
                     "--max-update", str(stop), "--save-dir", save])
    second = run_cli([bin_path("fairseq-train"), small_qa_data, *AD_QA, "--max-epoch", "4", "--save-dir", save])
    out = second.stdout + second.stderr
    assert f"@ {stop} updates" in out  # resumed, not restarted
    per_epoch = sum(int(r["epoch"]) == 1 for r in train_logs(first.stdout + first.stderr))
    assert per_epoch < stop < 2 * per_epoch
    records = train_logs(first.stdout + first.stderr) + train_logs(out)
    assert [int(r["num_updates"]) for r in records] == list(range(1, 4 * per_epoch + 1))
    p, q, shortest = 0.3, 0.5, 16  # windows hold at least the question and a few context tokens
    for r in records:
        rate = float(r["ad_drop_rate"])
        if int(r["epoch"]) in (2, 4):  # cross-tuning: even epochs drop, before and after the resume
            assert p * q - 0.01 < rate < (p + 1 / shortest) * q + 0.01, r
        else:
            assert rate == 0, r
    losses = [float(r["loss"]) for r in records]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 1.5  # bits per answer boundary: training learns
    valid = _valid_records(out)
    assert [int(v["epoch"]) for v in valid] == [2, 3, 4]
    assert {"valid_loss", "valid_em", "valid_f1"} <= set(valid[-1])
    assert float(valid[-1]["valid_loss"]) < float(valid[0]["valid_loss"]) - 0.5, valid


def test_qa_cross_tuning_resume_after_validation_is_exact(small_qa_data, tmp_path):
    """AD-DROP's masks are keyed by (seed, epoch, update): stopped in epoch 3 after two validations and resumed,
    the run logs the same records and ends bitwise equal to an uninterrupted one."""
    args = [small_qa_data, *AD_QA, "--max-epoch", "4"]
    full, first, second, records = assert_resume_is_exact(args, 11, tmp_path)
    per_epoch = [int(r["epoch"]) for r in records].count(1)
    assert 2 * per_epoch < 11 < 3 * per_epoch
    # validated at the end of epochs 1 and 2, and where it stopped (fairseq validates before saving at --max-update)
    assert [(int(v["epoch"]), int(v["valid_num_updates"])) for v in _valid_records(first)] == [
        (1, per_epoch), (2, 2 * per_epoch), (3, 11)]
    resumed, uninterrupted = deterministic(_valid_records(second)), deterministic(_valid_records(full))[2:]
    # best_f1 also counts the stopped run's extra validation at update 11, which the uninterrupted run never made
    stop_f1 = float(_valid_records(first)[-1]["valid_f1"])
    assert [float(r.pop("valid_best_f1")) for r in resumed] == [
        max(float(r.pop("valid_best_f1")), stop_f1) for r in uninterrupted]
    assert resumed == uninterrupted


def test_bad_layer_index_is_refused_when_the_model_is_built(small_qa_data):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [small_qa_data, *AD_QA, "--ad-drop-layers", "0,2"])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    with pytest.raises(UsageError, match="--ad-drop-layers '0,2': no layer 2; the model has layers 0-1"):
        task.build_model(cfg.model)


def _vocab_words(wordpiece_data, n):
    with open(f"{wordpiece_data}/dict.txt", encoding="utf-8") as f:
        symbols = [line.split()[0] for line in f]
    return [w for w in symbols if w.isalpha() and w.islower() and len(w) > 3][:n]


def _keyword_examples(words, n, seed):
    """Sentences of 6-10 random words; the label says whether the first word (the keyword) occurs."""
    import random

    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        tokens = rng.choices(words[1:], k=rng.randint(6, 10))
        positive = rng.random() < 0.5
        if positive:
            tokens[rng.randrange(len(tokens))] = words[0]
        examples.append((tokens, positive))
    return examples


def test_classification_and_relation_runs_with_ad_drop(wordpiece_data, tmp_path):
    from spanbert_plugin.cli import prepare_classification, prepare_re

    words = _vocab_words(wordpiece_data, 30)
    for split, n, seed in (("train", 480, 1), ("valid", 160, 2)):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            for tokens, positive in _keyword_examples(words, n, seed):
                f.write(json.dumps({"text": " ".join(tokens), "label": "yes" if positive else "no"}) + "\n")
        with open(tmp_path / f"{split}_re.jsonl", "w") as f:  # relation iff the keyword occurs
            for tokens, positive in _keyword_examples(words, n, seed + 10):
                f.write(json.dumps({"token": tokens, "subj_start": 1, "subj_end": 1, "obj_start": 4, "obj_end": 4,
                                    "subj_type": "PERSON", "obj_type": "CITY",
                                    "relation": "per:keyword" if positive else "no_relation"}) + "\n")
    assert prepare_classification.main(["--train", str(tmp_path / "train.jsonl"), "--valid", str(tmp_path / "valid.jsonl"),
                                        "--tokenizer-from", wordpiece_data, "--destdir", str(tmp_path / "cls"),
                                        "--text-columns", "text", "--label-column", "label", "--max-seq-length", "16"]) == 0
    assert prepare_re.main(["--train", str(tmp_path / "train_re.jsonl"), "--valid", str(tmp_path / "valid_re.jsonl"),
                            "--tokenizer-from", wordpiece_data, "--destdir", str(tmp_path / "re"),
                            "--max-seq-length", "16", "--entity-marker", "ner"]) == 0
    common = ["--user-dir", "user_dir", "--arch", "spanbert_tiny", "--optimizer", "adam", "--lr", "2e-3", "--cpu",
              "--num-workers", "0", "--log-format", "json", "--log-interval", "5", "--seed", "1", "--batch-size", "32",
              "--dropout", "0", "--attention-dropout", "0", "--no-save", "--max-epoch", "2",
              "--ad-drop-p", "0.3", "--ad-drop-q", "0.5"]
    # cross-tuning (epoch 2 drops) with SpanDrop on the same data; every epoch with fp16
    runs = {"sentence_classification": ("cls", ["--ad-drop-attribution", "attention", "--span-drop-p", "0.1"]),
            "relation_extraction": ("re", ["--ad-drop-attribution", "gradient", "--ad-drop-every-epoch",
                                           "--memory-efficient-fp16"])}
    for task, (folder, options) in runs.items():
        proc = run_cli([bin_path("fairseq-train"), str(tmp_path / folder), *common, "--save-dir", tmp_path / f"ck_{task}",
                        "--task", task, "--criterion", task,
                        *options])
        output = proc.stdout + proc.stderr
        records = train_logs(output)
        assert any(float(r["ad_drop_rate"]) > 0 for r in records), task
        assert all(math.isfinite(float(r["loss"])) for r in records), task
        valid = _valid_records_of(output)
        assert len(valid) == 2 and {"valid_accuracy", "valid_f1"} <= set(valid[-1]), (task, valid)
        # 160 about balanced examples: chance accuracy is near 50% (sd 4 points); a keyword detector is far above
        assert float(valid[-1]["valid_accuracy"]) > 75, (task, valid)


def _valid_records_of(output):
    return [json.loads(line.split("| valid | ", 1)[1]) for line in output.splitlines() if "| valid | " in line]


def test_the_masks_of_several_layers_read_the_host_once():
    """The candidates per row are the same in every layer: their largest is read on the host once per batch (one
    device sync per update on a GPU), not once per layer."""
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True
    attributions = {layer: torch.randn(2, 2, 6, 6, generator=torch.Generator().manual_seed(layer)) for layer in range(3)}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        masks = drop_masks(attributions, padding, 0.5, 0.5, mask_generator("cpu", 1, 1, 1))
    reads = sum(event.count for event in profile.key_averages() if event.key == "aten::_local_scalar_dense")
    assert reads == 1 and len(masks) == 3
    for layer, attribution in attributions.items():  # the same candidates as each layer computed alone
        assert torch.equal(candidate_mask(attribution, padding, 0.5),
                           candidate_mask(attribution, padding, 0.5, row_candidates(padding, 0.5)))


def test_ad_drop_probabilities_at_the_bounds_are_accepted():
    """p and q are probabilities in the closed interval [0, 1]: both ends are valid options."""
    from spanbert_plugin.qa.task import ExtractiveQAConfig

    for p, q in ((1.0, 1.0), (0.0, 0.0), (1.0, 0.0), (0.0, 1.0)):
        check_ad_drop_options(ExtractiveQAConfig(seed=1, ad_drop_p=p, ad_drop_q=q))


def test_q_zero_drops_nothing_and_trains_as_plain_fine_tuning():
    """With --ad-drop-q 0 no candidate is ever dropped: AD-DROP is off (no attribution pass), whatever p is."""
    task, criterion, model = qa_task(ad_drop_p=0.5, ad_drop_q=0.0)
    task.begin_epoch(2, model)  # an AD-DROP epoch under cross-tuning
    assert not task.ad_drop_enabled and not task.ad_drop_active()
    criterion.ad_drop_objective = None  # an attribution pass would fail here
    _, _, log = task.train_step(qa_sample([10, 6]), model, criterion, _Backward(), update_num=3)
    assert "ad_drop_entries" not in log and "ad_drop_dropped" not in log


def test_micro_batches_of_one_update_draw_distinct_masks():
    """Under --update-freq the k-th micro-batch of an update draws from (seed, epoch, update, k): the masks of two
    micro-batches of one update differ, and the count restarts at the next update."""
    task, criterion, model = qa_task(ad_drop_p=0.5, ad_drop_q=0.5, ad_drop_attribution="random")
    task.begin_epoch(2, model)
    sample = qa_sample([12, 9])
    padding = sample["net_input"]["src_tokens"].eq(model.encoder.padding_idx)
    shape = (2, model.encoder.encoder.layer[0].heads, 12, 12)

    def expected(update, micro_batch):
        return drop_masks({0: None}, padding, 0.5, 0.5, mask_generator("cpu", 5, 2, update, micro_batch), shape)[0]

    first, second = (task.ad_drop_masks(sample, model, criterion, update_num=4)[0] for _ in range(2))
    after = task.ad_drop_masks(sample, model, criterion, update_num=5)[0]
    assert torch.equal(first, expected(4, 0)) and torch.equal(second, expected(4, 1))
    assert not torch.equal(first, second)
    assert torch.equal(after, expected(5, 0))


def test_the_attribution_pass_runs_in_training_mode_after_a_validation():
    """The first (attribution) pass runs in training mode, dropout on, as in the authors' code, also on the first
    step after a validation left the model in eval mode."""
    task, criterion, model = qa_task(ad_drop_p=0.5, ad_drop_q=0.5)
    task.begin_epoch(2, model)
    modes, objective = [], criterion.ad_drop_objective

    def recording_objective(m, sample):
        modes.append(m.training)
        return objective(m, sample)

    criterion.ad_drop_objective = recording_objective
    model.eval()
    task.train_step(qa_sample([10, 6]), model, criterion, _Backward(), update_num=1)
    assert modes == [True]


def test_masks_differ_between_data_parallel_ranks():
    """The mask generator's seed includes the data-parallel rank: two workers at the same (seed, epoch, update,
    micro-batch) draw different masks."""
    padding = padded_tokens([9, 4]).eq(0)
    shape = (2, 2, 9, 9)

    def masks(rank):
        return drop_masks({0: None}, padding, 0.5, 0.5, mask_generator("cpu", 1, 2, 3, 0, rank), shape=shape)[0]

    assert torch.equal(masks(1), masks(1))
    assert torch.equal(masks(0), drop_masks({0: None}, padding, 0.5, 0.5, mask_generator("cpu", 1, 2, 3), shape)[0])
    assert not torch.equal(masks(0), masks(1))


def test_ad_drop_on_a_model_other_than_spanbert_is_one_line_when_the_model_is_built():
    """AD-DROP masks the attention of the plugin's encoder layers: fairseq's own roberta has none the task can reach, so
    --ad-drop-p with --arch roberta_base is one line naming the option, before any update."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import spanbert_plugin.registry  # noqa: F401  (the plugin's tasks, for fairseq's parser)

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused", "--task", "extractive_qa", "--criterion", "extractive_qa", "--arch", "roberta_base",
        "--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--ad-drop-p", "0.3", "--cpu"])
    task, _, _ = qa_task(ad_drop_p=0.3)
    with pytest.raises(UsageError, match=r"^AD-DROP \(--ad-drop-p\) needs a spanbert model, got RobertaModel$"):
        task.build_model(convert_namespace_to_omegaconf(args).model)


def test_the_mixin_refuses_an_attribution_its_criterion_cannot_compute():
    """A task of one's own built on ADDropMixin (the plugin's tasks accept only their own criterion): gradient
    attribution needs the criterion's ad_drop_objective, so another criterion is one line; random attribution needs
    none and builds it."""
    from fairseq.tasks import FairseqTask
    from omegaconf import OmegaConf

    from spanbert_plugin.addrop.task_mixin import ADDropConfig, ADDropMixin

    class OwnTask(ADDropMixin, FairseqTask):
        pass

    criterion = OmegaConf.create({"_name": "cross_entropy", "sentence_avg": False})
    task = OwnTask(ADDropConfig(ad_drop_p=0.3, ad_drop_attribution="gradient"))
    with pytest.raises(UsageError) as caught:
        task.build_criterion(criterion)
    assert str(caught.value) == ("--ad-drop-attribution gradient: criterion CrossEntropyCriterion has no "
                                 "ad_drop_objective; use the task's own criterion")
    built = OwnTask(ADDropConfig(ad_drop_p=0.3, ad_drop_attribution="random")).build_criterion(criterion)
    assert type(built).__name__ == "CrossEntropyCriterion"
