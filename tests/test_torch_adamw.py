"""``--optimizer torch_adamw``: torch's multi-tensor AdamW with fairseq's adam options."""
import pytest
import torch
from fairseq import utils as fairseq_utils
from omegaconf import OmegaConf

import spanbert_plugin.registry  # noqa: F401  (registers the optimizer)
from conftest import bin_path, run_cli
from spanbert_plugin.core.errors import UsageError
from spanbert_plugin.core.torch_adamw import TorchAdamW, TorchAdamWConfig

TINY_PRETRAIN = ["--user-dir", "user_dir", "--task", "spanbert_pretraining", "--criterion", "span_bert",
                 "--arch", "spanbert_tiny", "--tokens-per-sample", "128", "--batch-size", "8",
                 "--optimizer", "torch_adamw", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6",
                 "--weight-decay", "0.01", "--lr", "1e-3", "--lr-scheduler", "polynomial_decay",
                 "--warmup-updates", "2", "--total-num-update", "20", "--clip-norm", "1.0", "--cpu",
                 "--num-workers", "0", "--log-format", "json", "--log-interval", "1", "--seed", "3"]


def _toy_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _backward(model, step):
    generator = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(16, 6, generator=generator), torch.randn(16, 3, generator=generator)
    (3.0 * ((model(x) - y) ** 2).sum()).backward()  # large enough that clipping at 0.5 acts


def _config():
    return OmegaConf.structured(TorchAdamWConfig(lr=[0.01], adam_betas="(0.9,0.98)", adam_eps=1e-6, weight_decay=0.1))


def test_updates_equal_torch_adamw_with_torch_clipping():
    """Six updates (grads scaled, clipped to 0.5, stepped) give the parameters torch.optim.AdamW gives after
    torch.nn.utils.clip_grad_norm_: the same operations, so equal to float32 rounding."""
    ours_model, reference_model = _toy_model(0), _toy_model(0)
    ours = TorchAdamW(_config(), list(ours_model.parameters()))
    reference = torch.optim.AdamW(reference_model.parameters(), lr=0.01, betas=(0.9, 0.98), eps=1e-6,
                                  weight_decay=0.1, foreach=False)
    for step in range(6):
        _backward(ours_model, step)
        _backward(reference_model, step)
        ours.multiply_grads(0.5)
        for p in reference_model.parameters():
            p.grad.mul_(0.5)
        ours_norm = ours.clip_grad_norm(0.5)
        reference_norm = torch.nn.utils.clip_grad_norm_(reference_model.parameters(), 0.5)
        assert torch.allclose(ours_norm, reference_norm, rtol=1e-6)
        ours.step()
        reference.step()
        ours.zero_grad()
        reference.zero_grad()
    for p, q in zip(ours_model.parameters(), reference_model.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6)


def test_clip_grad_norm_equals_fairseqs():
    """The total norm and the clipped gradients equal fairseq's utils.clip_grad_norm_ (per-tensor norms)."""
    ours_model, fairseq_model = _toy_model(1), _toy_model(1)
    _backward(ours_model, 0)
    _backward(fairseq_model, 0)
    ours = TorchAdamW(_config(), list(ours_model.parameters()))
    assert torch.allclose(ours.clip_grad_norm(0.25), fairseq_utils.clip_grad_norm_(list(fairseq_model.parameters()), 0.25),
                          rtol=1e-6)
    for p, q in zip(ours_model.parameters(), fairseq_model.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=0)
    unclipped = ours.clip_grad_norm(0.0)  # 0: report the norm, change nothing
    assert abs(float(unclipped) - 0.25) < 1e-5


@pytest.mark.parametrize("factor", [None, 0.5])
def test_gradients_below_the_clip_norm_are_left_as_they_are(factor):
    """Clipping only ever scales down: a total norm under --clip-norm leaves the gradients (times multiply_grads'
    factor, folded into the clipping) as fairseq leaves them."""
    ours_model, fairseq_model = _toy_model(2), _toy_model(2)
    _backward(ours_model, 0)
    _backward(fairseq_model, 0)
    ours = TorchAdamW(_config(), list(ours_model.parameters()))
    if factor is not None:
        ours.multiply_grads(factor)
        for p in fairseq_model.parameters():
            p.grad.mul_(factor)
    expected = [p.grad.clone() for p in fairseq_model.parameters()]
    norm = fairseq_utils.clip_grad_norm_(list(fairseq_model.parameters()), 1e4)
    assert torch.allclose(ours.clip_grad_norm(1e4), norm, rtol=1e-6) and float(norm) < 1e4
    for p, q, e in zip(ours_model.parameters(), fairseq_model.parameters(), expected):
        assert torch.equal(q.grad, e)  # fairseq's own clipping left them
        assert torch.allclose(p.grad, e, rtol=1e-6, atol=0)


def test_options_as_fairseq_adam_and_state_round_trip():
    model = _toy_model(2)
    optimizer = TorchAdamW(_config(), list(model.parameters()))
    group = optimizer.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (0.01, (0.9, 0.98), 1e-6, 0.1)
    assert group["fused"] is True  # one fused kernel for all tensors (CPU here; CUDA alike)
    _backward(model, 0)
    optimizer.step()
    restored = TorchAdamW(_config(), list(model.parameters()))
    restored.load_state_dict(optimizer.state_dict())
    state = next(iter(restored.optimizer.state.values()))
    assert int(state["step"]) == 1 and torch.count_nonzero(state["exp_avg"]) > 0


def test_sixteen_bit_parameters_are_a_one_line_error():
    """--memory-efficient-fp16 hands the optimizer the model's fp16 parameters, which AdamW's fp32 semantics
    do not cover: a UsageError (one line in fairseq-train) naming the options that work."""
    import pytest

    from spanbert_plugin.core.errors import UsageError

    with pytest.raises(UsageError, match="--memory-efficient-fp16"):
        TorchAdamW(_config(), [torch.zeros(3, dtype=torch.float16, requires_grad=True)])


def test_fairseq_train_with_torch_adamw_saves_and_resumes(spm_data, tmp_path):
    """fairseq-train runs with --optimizer torch_adamw, and a second run resumes its optimizer state."""
    from fairseq import checkpoint_utils

    save = str(tmp_path / "ck")
    run_cli([bin_path("fairseq-train"), spm_data, *TINY_PRETRAIN, "--max-update", "3", "--save-dir", save])
    state = checkpoint_utils.load_checkpoint_to_cpu(f"{save}/checkpoint_last.pt")
    assert state["cfg"]["optimizer"]["_name"] == "torch_adamw"
    assert state["last_optimizer_state"]["state"] and state["optimizer_history"][-1]["num_updates"] == 3
    second = run_cli([bin_path("fairseq-train"), spm_data, *TINY_PRETRAIN, "--max-update", "5", "--save-dir", save])
    assert "loaded checkpoint" in (second.stdout + second.stderr).lower()
    resumed = checkpoint_utils.load_checkpoint_to_cpu(f"{save}/checkpoint_last.pt")
    assert resumed["optimizer_history"][-1]["num_updates"] == 5
    steps = {int(s["step"]) for s in resumed["last_optimizer_state"]["state"].values()}
    assert steps == {5}  # the moments went on from update 3, not from a fresh optimizer


def test_under_fairseqs_fp16_optimizer_it_steps_the_fp32_master_weights():
    """--fp16 (the pre-training recipes' precision): fairseq's FP16Optimizer builds torch_adamw over fp32 master
    copies and copies them back into the 16-bit weights. On a CPU with per-parameter copies (the flat copy
    needs CUDA): three updates move the weights as torch's AdamW moves fp32 weights, to fp16 rounding."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused_data", "--arch", "roberta_base", "--task", "masked_lm", "--cpu", "--fp16", "--fp16-no-flatten-grads",
        "--fp16-init-scale", "128", "--optimizer", "torch_adamw", "--adam-eps", "1e-6", "--weight-decay", "0.01",
        "--lr", "0.01"])
    torch.manual_seed(0)
    start = torch.randn(4, 3)
    half = torch.nn.Parameter(start.half())
    reference = torch.nn.Parameter(start.half().float())
    fp16 = FP16Optimizer.build_optimizer(convert_namespace_to_omegaconf(args), [half])
    assert isinstance(fp16.fp32_optimizer, TorchAdamW)
    adamw = torch.optim.AdamW([reference], lr=0.01, eps=1e-6, weight_decay=0.01)
    for step in range(3):
        grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(step))
        fp16.zero_grad()  # as fairseq's trainer does before each update: it also sets the unscaling factor
        fp16.backward((half.float() * grad).sum())  # leaves the loss-scaled gradient in 16 bits
        reference.grad = half.grad.float() / fp16.scaler.loss_scale
        fp16.step()
        adamw.step()
    # the fp32 master copy took torch's AdamW steps (a step without weight decay is 3 x lr x wd x |w|, about 6e-4,
    # away: inside the 16-bit weights' rounding, so those are compared with the master copy's rounding)
    master = fp16.fp32_params[0].view(4, 3)
    assert torch.allclose(master, reference.detach(), rtol=0, atol=1e-6)
    assert torch.equal(half.data, master.half())
    assert not torch.allclose(half.float(), start, atol=1e-3)  # it moved


def test_the_gradient_factor_is_applied_once_with_the_clipping_or_before_the_step():
    """fairseq multiplies the gradients by 1/sample_size right before clipping: one multi-tensor multiplication
    does both. Without clipping (--clip-norm 0), without a clip call, or with a tensor factor, the gradients are
    those of fairseq's multiply_grads; zero_grad forgets a factor not yet applied."""
    def gradients(model):
        return [p.grad.clone() for p in model.parameters()]

    for max_norm, factor, clip in ((0.5, 0.25, True), (0.0, 0.25, True), (0.5, 0.25, False), (0.5, torch.tensor(0.25), True)):
        ours_model, reference_model = _toy_model(2), _toy_model(2)
        _backward(ours_model, 0)
        _backward(reference_model, 0)
        ours = TorchAdamW(_config(), list(ours_model.parameters()))
        with torch.profiler.profile() as profile:
            ours.multiply_grads(factor)
            norm = ours.clip_grad_norm(max_norm) if clip else None
        ours._apply_grad_factor()  # what step() does first
        for p in reference_model.parameters():
            p.grad.mul_(factor)
        if clip:
            reference_norm = fairseq_utils.clip_grad_norm_(list(reference_model.parameters()), max_norm)
            assert torch.allclose(norm, reference_norm, rtol=1e-6)
            passes = [e for e in profile.events() if e.name == "aten::_foreach_mul_"]
            assert len(passes) == (2 if torch.is_tensor(factor) else 1)
        for ours_grad, reference_grad in zip(gradients(ours_model), gradients(reference_model)):
            assert torch.allclose(ours_grad, reference_grad, rtol=1e-6, atol=0)
    ours.multiply_grads(0.5)
    ours.zero_grad()
    assert ours._grad_factor is None


def test_biases_and_norms_can_be_left_out_of_weight_decay():
    """--no-weight-decay-on-biases-and-norms: transformers' Trainer's grouping (its decay names: every weight but
    the biases and LayerNorm weights), which for BERT layers is the parameters of one dimension."""
    from transformers import BertConfig, BertModel
    from transformers.trainer_pt_utils import get_parameter_names

    bert = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32))
    decayed_by_trainer = {n for n in get_parameter_names(bert, [torch.nn.LayerNorm]) if "bias" not in n}
    cfg = _config()
    cfg.no_weight_decay_on_biases_and_norms = True
    optimizer = TorchAdamW(cfg, list(bert.parameters()))
    names = {id(p): n for n, p in bert.named_parameters()}
    decayed = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    exempt = {names[id(p)] for g in optimizer.param_groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert decayed == decayed_by_trainer and exempt == set(names.values()) - decayed_by_trainer and exempt
    # one step: a vector with zero gradient stays, a matrix with zero gradient decays by lr x wd
    for p in bert.parameters():
        p.grad = torch.zeros_like(p)
    before = {n: p.detach().clone() for n, p in bert.named_parameters()}
    optimizer.step()
    for n, p in bert.named_parameters():
        expected = before[n] * (1 - 0.01 * 0.1) if n in decayed else before[n]
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-7)
    # a resumed optimizer keeps the exemption (fairseq sets every group's options from the command line)
    restored = TorchAdamW(cfg, list(bert.parameters()))
    restored.load_state_dict(optimizer.state_dict(), optimizer.optimizer_config)
    assert sorted(g["weight_decay"] for g in restored.param_groups) == [0.0, 0.1]
    # a state saved with one group cannot be resumed with two: one line naming the option
    single = TorchAdamW(_config(), list(bert.parameters()))
    with pytest.raises(UsageError, match="--no-weight-decay-on-biases-and-norms changed since it was saved"):
        restored.load_state_dict(single.state_dict(), single.optimizer_config)


def test_leaving_biases_and_norms_out_needs_per_parameter_fp16_copies():
    cfg = _config()
    cfg.no_weight_decay_on_biases_and_norms = True
    flat = torch.nn.Parameter(torch.zeros(100))  # what fairseq's --fp16 hands the optimizer: every weight in one
    with pytest.raises(UsageError, match="add --fp16-no-flatten-grads"):
        TorchAdamW(cfg, [flat])


def test_parameter_groups_given_as_iterators_keep_their_parameters():
    model = _toy_model(3)

    def groups():
        return [{"params": model[0].parameters()}, {"params": model[2].weight}, {"params": iter([model[2].bias])}]

    optimizer = TorchAdamW(_config(), groups())
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 4
    cfg = _config()
    cfg.no_weight_decay_on_biases_and_norms = True
    split = TorchAdamW(cfg, groups())
    assert sorted((len(g["params"]), g["weight_decay"]) for g in split.param_groups) == [(1, 0.0), (1, 0.0), (1, 0.1),
                                                                                          (1, 0.1)]


@pytest.mark.parametrize("factor", [0.25, 0.0, -0.5])
def test_a_norm_aggregated_across_workers_or_a_factor_not_above_zero_is_clipped_as_fairseq_does(factor):
    """With an ``aggregate_norm_fn`` (the norm summed over workers) or a factor of 0 or less the factor is applied to
    the gradients first, as fairseq's multiply_grads does: norm and clipped gradients are fairseq's."""
    def aggregate(norm):  # a second worker holding gradients of the same norm
        return norm * 2 ** 0.5

    for aggregate_norm_fn in (aggregate, None):
        ours_model, fairseq_model = _toy_model(4), _toy_model(4)
        _backward(ours_model, 0)
        _backward(fairseq_model, 0)
        ours = TorchAdamW(_config(), list(ours_model.parameters()))
        ours.multiply_grads(factor)
        for p in fairseq_model.parameters():
            p.grad.mul_(factor)
        reference = fairseq_utils.clip_grad_norm_(list(fairseq_model.parameters()), 0.5, aggregate_norm_fn)
        torch.testing.assert_close(ours.clip_grad_norm(0.5, aggregate_norm_fn), reference)  # float32's tolerances
        assert ours._grad_factor is None  # applied once, not again at the step
        for p, q in zip(ours_model.parameters(), fairseq_model.parameters()):
            torch.testing.assert_close(p.grad, q.grad)


def test_clipping_without_gradients_gives_a_zero_norm_and_forgets_the_factor():
    """No parameter has a gradient (every one frozen this update): a norm of 0, as fairseq's, and nothing to scale."""
    model = _toy_model(5)
    optimizer = TorchAdamW(_config(), list(model.parameters()))
    optimizer.multiply_grads(0.5)
    norm = optimizer.clip_grad_norm(1.0)
    assert norm.item() == 0.0 and norm.dtype == torch.float32
    assert optimizer._grad_factor is None
    assert all(p.grad is None for p in model.parameters())


def test_adam_betas_as_a_config_list_are_two_floats():
    """A yaml/hydra config gives --adam-betas as a list, not a string."""
    from spanbert_plugin.core.torch_adamw import parse_betas

    assert parse_betas(OmegaConf.create({"b": [0.9, 0.98]}).b) == (0.9, 0.98)
    with pytest.raises(UsageError, match=r"^--adam-betas \[0.9, 1.5\]: expected two numbers in \[0, 1\)"):
        parse_betas(OmegaConf.create({"b": [0.9, 1.5]}).b)
