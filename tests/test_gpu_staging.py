"""benchmarks/gpu/stage_continued_pretraining.py: the model that travels to the GPU machine comes back as a float32
checkpoint with every weight rounded to float16 once, the tied weights still tied, and the rest of the checkpoint
unchanged."""
import os
import sys

import torch

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
import stage_continued_pretraining as stage  # noqa: E402


def test_packed_model_unpacks_to_its_float16_rounding_with_ties_kept(tmp_path):
    generator = torch.Generator().manual_seed(0)
    embeddings = torch.randn(50, 8, generator=generator) * 0.05
    model = {"encoder.embed.weight": embeddings, "lm_head.weight": embeddings,  # tied, as the import writes them
             "encoder.layer.0.weight": torch.randn(8, 8, generator=generator),
             "encoder.layer.0.bias": torch.tensor([1e-5, -3.0, 35000.0, 0.0, 1.0, 2.0, 3.0, 4.0]),
             "scalar": torch.tensor(0.125), "positions": torch.arange(6)}
    torch.save({"model": model, "cfg": {"model": {"encoder_layers": 1}}, "extra_state": {"epoch": 3}},
               tmp_path / "model.pt")
    stage.pack_model(str(tmp_path / "model.pt"), str(tmp_path / "imported.xz"))
    stage.unpack_model(str(tmp_path / "imported.xz"), str(tmp_path / "unpacked.pt"))
    back = torch.load(tmp_path / "unpacked.pt", weights_only=True)
    assert back["cfg"] == {"model": {"encoder_layers": 1}} and back["extra_state"] == {"epoch": 3}
    assert list(back["model"]) == list(model)
    for key, value in model.items():
        expected = value.half().float() if value.is_floating_point() else value
        assert back["model"][key].dtype == (torch.float32 if value.is_floating_point() else value.dtype), key
        assert torch.equal(back["model"][key], expected), key
    assert back["model"]["lm_head.weight"].data_ptr() == back["model"]["encoder.embed.weight"].data_ptr()
