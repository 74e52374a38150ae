"""The model's CPU dropout (mask from numpy's PCG64, seeded by torch): torch's dropout in distribution."""
import math

import torch
import torch.nn.functional as F

from spanbert_plugin.model.dropout import Dropout, dropout


def test_drop_rate_and_scale_match_the_asked_probability():
    torch.manual_seed(0)
    n = 1_000_000
    y = dropout(torch.ones(n), 0.1)
    dropped = (y == 0).float().mean().item()
    # binomial sd of the dropped fraction: sqrt(p (1 - p) / n) = 0.0003; 5 sd
    assert abs(dropped - 0.1) < 5 * math.sqrt(0.1 * 0.9 / n)
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 65536 / (65536 - round(0.1 * 65536))))
    assert abs(y.mean().item() - 1.0) < 5 * math.sqrt(0.1 / 0.9 / n)  # the expectation is kept


def test_seeded_by_torch_and_new_each_call():
    torch.manual_seed(3)
    first, second = dropout(torch.ones(1000), 0.5), dropout(torch.ones(1000), 0.5)
    torch.manual_seed(3)
    assert torch.equal(dropout(torch.ones(1000), 0.5), first)
    assert not torch.equal(first, second)


def test_gradient_is_the_mask_times_the_scale_in_the_inputs_dtype():
    torch.manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(64, 33).to(dtype).requires_grad_()
        y = dropout(x, 0.25)
        y.backward(torch.ones_like(y))
        keep = y != 0
        scale = 65536 / (65536 - 16384)
        assert y.dtype == x.grad.dtype == dtype
        torch.testing.assert_close(y, torch.where(keep, x.detach() * scale, 0).to(dtype))
        torch.testing.assert_close(x.grad, (keep * scale).to(dtype))


def test_evaluation_zero_and_one_probabilities_behave_as_torch():
    x = torch.randn(10, 10)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), F.dropout(x, 1.0, True))
    # probabilities that round to 0 or 1 in 1/65,536 steps go to torch's dropout rather than to no or every drop
    torch.manual_seed(0)
    assert torch.equal(dropout(torch.ones(100), 1 - 1e-6), torch.zeros(100))
    torch.manual_seed(0)
    tiny = dropout(torch.ones(1000), 1e-6)
    torch.manual_seed(0)
    assert torch.equal(tiny, F.dropout(torch.ones(1000), 1e-6, True)) and tiny.max().item() > 1.0  # scaled: not skipped
    module = Dropout(0.3).eval()
    assert module(x) is x and isinstance(module, torch.nn.Dropout) and module.state_dict() == {}


def test_every_16_bit_field_drops_exactly_the_rounded_share(monkeypatch):
    """Fed each of the 65,536 16-bit fields once, the mask drops exactly round(p * 65,536) of them: the drop
    probability is that count over 65,536, not one level more or less."""
    import numpy as np

    from spanbert_plugin.model import dropout as dropout_module

    class EveryField:
        def __init__(self, seed):
            pass

        def random_raw(self, size):
            return np.arange(1 << 16, dtype=np.uint16).view(np.uint64)[:size]

    monkeypatch.setattr(dropout_module.np.random, "PCG64", EveryField)
    for p in (0.1, 0.25, 0.5):
        y = dropout(torch.ones(1 << 16), p)
        assert int((y == 0).sum()) == round(p * 65536)


def test_sizes_that_are_not_a_multiple_of_four_are_masked_whole():
    """Four 16-bit fields come from each 64-bit draw: a tensor of 4k + 1..3 elements still gets a field each."""
    torch.manual_seed(4)
    for shape in ((7,), (3, 5), (2, 3, 3)):
        x = torch.ones(shape, requires_grad=True)
        y = dropout(x, 0.5)
        y.sum().backward()
        assert y.shape == shape and set(y.unique().tolist()) <= {0.0, 2.0}
        torch.testing.assert_close(x.grad, y.detach())  # the gradient is the mask times the scale
