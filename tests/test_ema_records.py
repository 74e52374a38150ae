"""fairseq's --store-ema over the plugin's models, whose vocabulary record is integer buffers."""
import pytest
import torch

from conftest import bin_path, run_cli
from test_pretrain import TINY


def test_the_fairseq_code_under_the_shim_is_the_code_it_was_written_against():
    from spanbert_plugin.core import ema_records

    assert ema_records.fairseq_source_sha256() == ema_records.FAIRSEQ_SOURCE_SHA256


@pytest.mark.parametrize("fp32", [False, True])
def test_store_ema_trains_resumes_and_copies_the_records(spm_data, tmp_path, fp32):
    """fairseq's EMA decayed every state entry: the int64 symbol hashes stopped the first update with a dtype
    error. They are copied now, and the weights are averaged as fairseq averages them."""
    train = [bin_path("fairseq-train"), spm_data, *TINY, "--store-ema", "--ema-decay", "0.5",
             *(["--ema-fp32"] if fp32 else []), "--disable-validation", "--save-dir", str(tmp_path / "ck")]
    run_cli([*train, "--max-update", "2"])
    state = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    ema, model = state["extra_state"]["ema"], state["model"]
    for key in ("vocabulary.symbol_hashes", "vocabulary.tokenizer"):
        assert ema[key].dtype == model[key].dtype and torch.equal(ema[key], model[key])
    moved = [k for k in model if model[k].is_floating_point() and not torch.equal(ema[k].to(model[k].dtype), model[k])]
    assert moved  # an average of the updates' weights, not a copy of the last
    resumed = run_cli([*train, "--max-update", "3"])
    assert "loaded checkpoint" in (resumed.stdout + resumed.stderr).lower()
