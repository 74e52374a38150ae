"""optimizer composite_clip_per_group: each parameter group's gradients clipped alone, as c2f-coref clips."""
import pytest
import torch
from omegaconf import OmegaConf

import spanbert_plugin.registry  # noqa: F401  (registers the optimizer)
from spanbert_plugin.core.composite_clip_per_group import CompositeClipPerGroup


def _sgd_group(lr=1.0):
    return {"lr_float": lr, "optimizer": {"_name": "sgd", "momentum": 0.0, "weight_decay": 0.0, "lr": [lr]},
            "lr_scheduler": {"_name": "fixed", "force_anneal": None, "lr_shrink": 0.1, "warmup_updates": 0, "lr": [lr]}}


def _optimizer(clip, params):
    from fairseq.optim import build_optimizer

    return build_optimizer(OmegaConf.create({"_name": "composite_clip_per_group", "clip_norm_per_group": clip,
                                             "dynamic_groups": False,
                                             "groups": {"default": _sgd_group(), "coref_head": _sgd_group()}}), params)


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_each_group_is_clipped_alone(clip):
    """Plain SGD at lr 1 moves each weight by its (clipped) gradient: a large head gradient clips the head alone,
    where fairseq's --clip-norm would have shrunk the encoder's small one too."""
    encoder, head = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    head.param_group = "coref_head"
    optimizer = _optimizer(clip, [encoder, head])
    assert isinstance(optimizer, CompositeClipPerGroup)
    encoder.grad, head.grad = torch.full((3,), 0.1), torch.full((4,), 5.0)
    optimizer.step()
    torch.testing.assert_close(encoder.detach(), torch.full((3,), -0.1))
    expected_head = torch.full((4,), -0.5 if clip else -5.0)  # norm 10 clipped to 1 (1e-6 of slack), or left
    torch.testing.assert_close(head.detach(), expected_head, rtol=1e-5, atol=1e-6)


def test_the_coref_recipe_clips_per_group_only():
    from conftest import ROOT

    recipe = OmegaConf.load(f"{ROOT}/configs/finetune/coref.yaml")
    assert recipe.optimizer._name == "composite_clip_per_group" and recipe.optimizer.clip_norm_per_group == 1.0
    assert recipe.optimization.clip_norm == 0


def test_sixteen_bit_gradients_are_clipped_by_their_fp32_norm():
    """--memory-efficient-fp16 hands the groups 16-bit gradients: a norm past 65,504 overflowed in fp16, and the
    clip factor 0 zeroed the group's gradients instead of clipping them."""
    from spanbert_plugin.core.composite_clip_per_group import clip_group

    weight = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
    weight.grad = torch.full((4,), 50000.0, dtype=torch.float16)  # norm 100,000
    clip_group([weight], 1.0)
    assert weight.grad.dtype == torch.float16
    torch.testing.assert_close(weight.grad.float().norm(), torch.tensor(1.0), rtol=1e-3, atol=0)


def test_a_scaled_step_clips_the_unscaled_gradients_and_only_the_groups_that_step():
    """fairseq hands the step the loss scale: the groups are clipped on the true gradients, divided once; with
    ``groups`` only those groups step, and the others' gradients are left as they are."""
    encoder, head = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    head.param_group = "coref_head"
    optimizer = _optimizer(1.0, [encoder, head])
    encoder.grad, head.grad = torch.full((3,), 0.2), torch.full((4,), 10.0)  # scale 2: true gradients 0.1 and 5
    optimizer.step(scale=2.0)
    torch.testing.assert_close(encoder.detach(), torch.full((3,), -0.1))
    torch.testing.assert_close(head.detach(), torch.full((4,), -0.5))
    encoder.grad, head.grad = torch.full((3,), 0.1), torch.full((4,), 5.0)
    optimizer.step(groups={"default"})
    torch.testing.assert_close(encoder.detach(), torch.full((3,), -0.2))
    torch.testing.assert_close(head.detach(), torch.full((4,), -0.5))  # did not step
    torch.testing.assert_close(head.grad, torch.full((4,), 5.0))  # nor was clipped
