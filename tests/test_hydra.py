"""fairseq-hydra-train reaches every option of the plugin's pre-training task, criterion and model."""
import dataclasses
import json
import os
import re

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, bin_path, run_cli
import spanbert_plugin.registry  # noqa: F401  (the plugin's optimizer: recipes name torch_adamw)
from spanbert_plugin.pretraining.criterion import SpanBertCriterionConfig
from spanbert_plugin.model.spanbert import SpanBertConfig
from spanbert_plugin.pretraining.task import SpanBertPretrainingConfig

RECIPES = ["tiny_cpu", "base", "large"]
MASKING_LOG = re.compile(
    r"span masking: scheme (\w+), ratio ([\d.]+), geometric p ([\d.]+), max span (\d+) words, "
    r"mask/random/unchanged ([\d.]+)/([\d.]+)/([\d.]+), random tokens (\w+)"
)
MASKING_KEYS = ["mask_scheme", "mask_ratio", "geometric_p", "max_span_len", "mask_prob", "random_prob", "leave_prob",
                "random_token_source"]


def _fields(config_class):
    return {f.name for f in dataclasses.fields(config_class)} - {"_name", "seed"}


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipes_list_every_option(recipe):
    """Every option is in the YAML, so plain `task.X=...` overrides work for all of them (hydra needs `+` otherwise)."""
    cfg = OmegaConf.load(os.path.join(ROOT, "configs", "pretrain", f"{recipe}.yaml"))
    assert cfg.task._name == "spanbert_pretraining"
    assert set(cfg.task) - {"_name"} == _fields(SpanBertPretrainingConfig)
    assert set(cfg.criterion) - {"_name"} == _fields(SpanBertCriterionConfig)
    assert set(cfg.model) - {"_name"} == _fields(SpanBertConfig)


def _masking_settings(output):
    """The masking settings the task logged when it built its masker."""
    found = MASKING_LOG.findall(output)
    assert len(found) == 1, output[-3000:]
    scheme, ratio, p, span, mask, rand, leave, source = found[0]
    return dict(zip(MASKING_KEYS, [scheme, float(ratio), float(p), int(span), float(mask), float(rand), float(leave), source]))


def _hydra_train(config_dir, config_name, save_dir, *overrides):
    proc = run_cli([bin_path("fairseq-hydra-train"), "--config-dir", config_dir, "--config-name", config_name,
                    "optimization.max_update=1", "dataset.disable_validation=true", "dataset.batch_size=4",
                    "common.log_format=json",
                    f"checkpoint.save_dir={save_dir}", *overrides])
    state = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), map_location="cpu", weights_only=True)
    return proc.stdout + proc.stderr, state


def test_command_line_overrides_reach_task_criterion_and_model(spm_data, tmp_path):
    wanted = {"mask_scheme": "word", "mask_ratio": 0.2, "geometric_p": 0.3, "max_span_len": 8, "mask_prob": 0.7,
              "random_prob": 0.2, "leave_prob": 0.1, "random_token_source": "unigram"}
    relative_data = os.path.relpath(spm_data, ROOT)  # run_cli runs in ROOT
    output, state = _hydra_train(
        "configs/pretrain", "tiny_cpu", tmp_path / "ck", f"task.data={relative_data}", "task.tokens_per_sample=96",
        *(f"task.{k}={v}" for k, v in wanted.items()),
        "criterion.sbo_weight=0.5", "model.sbo_position_slots=12", "model.sbo_position_dim=48",
    )
    assert _masking_settings(output) == wanted
    saved = state["cfg"]
    assert saved["task"]["data"] == os.path.abspath(spm_data)  # relative path stored absolute
    assert {k: saved["task"][k] for k in wanted} == wanted and saved["task"]["tokens_per_sample"] == 96
    assert saved["criterion"]["sbo_weight"] == 0.5
    assert tuple(state["model"]["sbo_head.position_embeddings.weight"].shape) == (12, 48)
    # the criterion applied the weight: loss = (mlm + w sbo) / masked tokens, sbo_loss per SBO token
    train = json.loads(re.search(r"\[train\]\[INFO\] - (\{.*\})", output).group(1))
    loss, mlm, sbo = (float(train[f"train_{k}"]) for k in ("loss", "mlm_loss", "sbo_loss"))
    masked, with_sbo = int(train["train_num_masked"]), int(train["train_num_sbo"])
    assert (loss - mlm) * masked / (sbo * with_sbo) == pytest.approx(0.5, abs=0.01)


def test_yaml_settings_reach_the_task(spm_data, tmp_path):
    wanted = {"mask_scheme": "subword", "mask_ratio": 0.25, "geometric_p": 0.5, "max_span_len": 5, "mask_prob": 0.6,
              "random_prob": 0.3, "leave_prob": 0.1, "random_token_source": "unigram"}
    recipe = OmegaConf.load(os.path.join(ROOT, "configs", "pretrain", "tiny_cpu.yaml"))
    recipe.task.data = spm_data
    for key, value in wanted.items():
        recipe.task[key] = value
    recipe.common.user_dir = os.path.join(ROOT, "user_dir")
    OmegaConf.save(recipe, tmp_path / "mine.yaml")
    output, state = _hydra_train(str(tmp_path), "mine", tmp_path / "ck")
    assert _masking_settings(output) == wanted
    assert {k: state["cfg"]["task"][k] for k in wanted} == wanted


def _compose(recipe, *overrides):
    """The recipe composed as fairseq-hydra-train composes it, checked against fairseq's FairseqConfig schema
    (unknown keys and wrong types raise) and the plugin's task, criterion and model dataclasses; nothing runs."""
    from fairseq.dataclass.configs import FairseqConfig
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from hydra import compose, initialize_config_dir

    hydra_init("config")
    # version_base 1.1, as fairseq-hydra-train runs: a newer base is process-global and breaks fairseq's own
    # hydra.experimental calls in every later test
    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs", "pretrain"), version_base="1.1"):
        cfg = compose(recipe, overrides=["task.data=/corpus", *overrides])
    add_defaults(cfg)  # fills the optimizer / lr_scheduler sections from fairseq's registered dataclasses
    cfg = OmegaConf.merge(OmegaConf.structured(FairseqConfig), cfg)
    for section, config_class in (("task", SpanBertPretrainingConfig), ("criterion", SpanBertCriterionConfig),
                                  ("model", SpanBertConfig)):
        OmegaConf.merge(OmegaConf.structured(config_class), OmegaConf.masked_copy(cfg, [section])[section])
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("recipe", ["base", "large"])
def test_full_size_recipes_compose_against_fairseq_schema(recipe):
    cfg = _compose(recipe)
    assert cfg["task"]["_name"] == "spanbert_pretraining" and cfg["criterion"]["_name"] == "span_bert"
    layers, dim, heads, ffn = {"base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}[recipe]  # docs/pretraining.md's sizes
    model = cfg["model"]
    assert model["_name"] == "spanbert" and (model["encoder_layers"], model["encoder_embed_dim"],
                                             model["encoder_attention_heads"], model["encoder_ffn_embed_dim"]) == (
        layers, dim, heads, ffn)
    # the optimizer section resolved through the plugin's torch_adamw config (its defaults filled in)
    assert cfg["optimizer"]["_name"] == "torch_adamw" and cfg["optimizer"]["lr"] == cfg["optimization"]["lr"]
    assert cfg["common"]["fp16"] is True and cfg["optimization"]["clip_norm"] == 1.0
    # SPEC 1.3: 256 sequences per update for large; base uses about 8x that batch
    sequences = cfg["dataset"]["batch_size"] * cfg["optimization"]["update_freq"][0]
    assert sequences == (256 if recipe == "large" else 2048) and cfg["task"]["tokens_per_sample"] == 512


def test_schema_check_has_teeth():
    """What the recipe test relies on: a key fairseq does not know, or a wrong type, is refused."""
    from omegaconf.errors import ConfigKeyError, ValidationError

    with pytest.raises(ConfigKeyError):
        _compose("base", "+common.no_such_option=1")
    with pytest.raises(ValidationError):
        _compose("base", "optimization.clip_norm=lots")
    with pytest.raises(ConfigKeyError):
        _compose("base", "+task.no_such_masking=1")


def test_recipes_run_from_any_folder_and_a_plugin_error_is_the_last_line(tmp_path):
    """Run from outside the repository root, a recipe's user_dir: user_dir is still found (make install puts it
    beside fairseq): the plugin loads and answers. hydra would print a trimmed traceback ending in "Set the
    environment variable HYDRA_FULL_ERROR=1 ..."; the plugin's one-line error is what a user reads last instead."""
    import subprocess

    missing = tmp_path / "no_such_data"
    proc = subprocess.run([bin_path("fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs", "pretrain"),
                           "--config-name", "tiny_cpu", f"task.data={missing}", f"checkpoint.save_dir={tmp_path / 'ck'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == f"error: {missing}: no such data folder", proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr


def test_hydra_keeps_its_own_report_of_errors_that_are_not_the_plugins():
    """Only a plugin error makes hydra re-raise (to the one-line hook); any other exception, and any other
    variable hydra asks about, get hydra's own answer."""
    from spanbert_plugin.core.errors import UsageError, _hydra_reraises_usage_errors

    asked = []
    is_env_set = _hydra_reraises_usage_errors(lambda name: asked.append(name) or False)
    try:
        raise KeyError("a bug")
    except KeyError:
        assert is_env_set("HYDRA_FULL_ERROR") is False
    try:
        raise UsageError("--flag: bad")
    except UsageError:
        assert is_env_set("HYDRA_FULL_ERROR") is True
        assert is_env_set("HYDRA_OTHER") is False
    assert asked == ["HYDRA_FULL_ERROR", "HYDRA_OTHER"]


@pytest.mark.parametrize("value", [
    "/home/u/My Projects/data", "/data/a,b", "/data/(old)", "/data/[1]", "/data/{x}", "/data/a=b", "/data/it's",
    "/data/${x}", "/data/\\${x}", "a\\'b", "a\\\\'b", "trailing\\", "\\\\", "$", "${", "null", "true", "1e-4", "",
    " leading", "trailing ", "\\${'\\"])
def test_hydra_override_reads_back_as_the_value_it_was_given(value):
    """Paths the plugin's scripts pass to fairseq-hydra-train: unquoted, a comma made a list and a bracket, brace, quote
    or '=' a parse error; '${' is an interpolation unless escaped, and a backslash escapes only what follows it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from spanbert_plugin.core.run_config import hydra_override

    [override] = OverridesParser.create().parse_overrides([hydra_override("task.data", value)])
    assert override.key_or_group == "task.data"
    assert OmegaConf.create({"data": override.value()}).data == value  # as the task reads it, interpolations resolved
