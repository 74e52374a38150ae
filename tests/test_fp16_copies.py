"""fairseq's ``--fp16`` optimizer with multi-tensor copies (``core.fp16_copies``): the same updates as fairseq's
per-tensor copies, with one operator for each of the two copies."""
import pytest
import torch
from fairseq.optim.fp16_optimizer import FP16Optimizer

import spanbert_plugin.registry  # noqa: F401  (registers torch_adamw)
from spanbert_plugin.core import fp16_copies
from spanbert_plugin.core.fp16_copies import use_multi_tensor_copies


def test_the_fairseq_code_replaced_is_the_code_it_was_written_against():
    """Fails when fairseq's two copy methods change: the replacements must then be checked against the new code."""
    assert fp16_copies.fairseq_source_sha256() == fp16_copies.FAIRSEQ_SOURCE_SHA256


def _model(unused_parameter):
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(40, 8), "hidden": torch.nn.Linear(8, 8),
                                 "norm": torch.nn.LayerNorm(8), "out": torch.nn.Linear(8, 5)})
    if unused_parameter:  # never in the forward pass: its gradient stays None
        model["unused"] = torch.nn.Linear(3, 3)
    return model.half()


def _forward(model, step):
    generator = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, 40, (16, 6), generator=generator)
    target = torch.randn(16, 6, 5, generator=generator)
    hidden = torch.tanh(model["hidden"](model["embed"](tokens)))
    return ((model["out"](model["norm"](hidden)).float() - target) ** 2).sum()


def _optimizer(model, flat, monkeypatch):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    if flat:  # fairseq puts the flat fp32 copy on torch.cuda.current_device(); on a CPU the parameters' index is None
        monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "unused_data", "--arch", "roberta_base", "--task", "masked_lm", "--cpu", "--fp16", "--fp16-init-scale", "128",
        "--fp16-scale-window", "5", "--optimizer", "torch_adamw", "--lr", "0.01", "--weight-decay", "0.01",
        *([] if flat else ["--fp16-no-flatten-grads"])])
    params = [p for p in model.parameters() if p.requires_grad]
    return FP16Optimizer.build_optimizer(convert_namespace_to_omegaconf(args), params)


def _train(fast, flat, unused_parameter, monkeypatch, updates=4):
    """What fairseq's trainer does per update: backward of the scaled loss, 1/sample size, clipping, the step."""
    model = _model(unused_parameter)
    optimizer = _optimizer(model, flat, monkeypatch)
    assert optimizer.has_flat_params == flat
    if fast:
        assert use_multi_tensor_copies(optimizer)
    norms = []
    for step in range(updates):
        optimizer.zero_grad()
        optimizer.backward(_forward(model, step))
        optimizer.multiply_grads(1 / 16)
        norms.append(optimizer.clip_grad_norm(0.5))
        optimizer.step()
    masters = optimizer.fp32_params.values() if flat else optimizer.fp32_params
    return [p.detach().clone() for p in model.parameters()], [p.detach().clone() for p in masters], norms


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-tensor"])
@pytest.mark.parametrize("unused_parameter", [False, True], ids=["all-used", "a-parameter-without-gradient"])
def test_updates_equal_fairseqs_copies_exactly(flat, unused_parameter, monkeypatch):
    """Four clipped fp16 updates (torch_adamw under FP16Optimizer): model weights, fp32 master weights and gradient
    norms equal those of fairseq's per-tensor copies bit for bit (a copy is a copy). A parameter that gets no
    gradient sends the update to fairseq's own code."""
    weights, masters, norms = _train(True, flat, unused_parameter, monkeypatch)
    expected_weights, expected_masters, expected_norms = _train(False, flat, unused_parameter, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(weights, expected_weights))
    assert all(torch.equal(a, b) for a, b in zip(masters, expected_masters))
    assert all(torch.equal(a, b) for a, b in zip(norms, expected_norms))
    assert not torch.equal(weights[0], _model(unused_parameter)["embed"].weight)  # the updates changed something


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-tensor"])
def test_each_copy_is_one_operator(flat, monkeypatch):
    """fairseq copies one tensor at a time (one copy_ per parameter tensor, six here); the replacement runs one
    multi-tensor copy for the gradients and one for the weights."""
    counts = {}
    for fast in (False, True):
        model = _model(False)
        optimizer = _optimizer(model, flat, monkeypatch)
        if fast:
            use_multi_tensor_copies(optimizer)
        optimizer.backward(_forward(model, 0))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            optimizer._sync_fp16_grads_to_fp32()
            optimizer._sync_fp32_params_to_fp16()
        names = [event.name for event in profile.events() if event.cpu_parent is None]
        counts[fast] = {name: names.count(name) for name in ("aten::copy_", "aten::_foreach_copy_")}
    tensors = len(list(_model(False).parameters()))
    assert counts[False] == {"aten::copy_": 2 * tensors, "aten::_foreach_copy_": 0}
    assert counts[True] == {"aten::copy_": 0, "aten::_foreach_copy_": 2}


def test_other_optimizers_are_left_alone():
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert not use_multi_tensor_copies(optimizer)
    assert not hasattr(optimizer, "_multi_tensor_copies")


def test_another_fairseq_keeps_its_copies(monkeypatch, caplog):
    monkeypatch.setattr(fp16_copies, "FAIRSEQ_SOURCE_SHA256", "0" * 64)
    model = _model(False)
    optimizer = _optimizer(model, False, monkeypatch)
    assert not use_multi_tensor_copies(optimizer)
    assert "_sync_fp16_grads_to_fp32" not in vars(optimizer)
    assert "stay one copy per parameter tensor" in caplog.text


def test_a_parameter_frozen_after_the_optimizer_was_built_stays_as_fairseqs_copies_leave_it(monkeypatch):
    """--freeze-encoder-updates freezes parameters of an optimizer already built (with --fp16-no-flatten-grads):
    fairseq's copies skip them both ways, so their fp16 weights stay where they were, although weight decay moves
    their fp32 copies."""
    runs = []
    for fast in (False, True):
        model = _model(False)
        optimizer = _optimizer(model, False, monkeypatch)
        if fast:
            assert use_multi_tensor_copies(optimizer)
        model["hidden"].requires_grad_(False)
        before = model["hidden"].weight.detach().clone()
        for step in range(3):
            optimizer.zero_grad()
            optimizer.backward(_forward(model, step))
            optimizer.multiply_grads(1 / 16)
            optimizer.clip_grad_norm(0.5)
            optimizer.step()
        assert torch.equal(model["hidden"].weight, before)
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
