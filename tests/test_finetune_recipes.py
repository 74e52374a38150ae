"""Fine-tuning recipes (configs/finetune) and the encoder shape taken from the checkpoint a run starts from.

Every recipe runs for two updates through ``fairseq-hydra-train`` from an imported HuggingFace BERT of a
non-default shape (1 layer, hidden 48, 3 heads, FFN 96, 128 positions), with no size option anywhere.
"""
import glob
import json
import os

import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, bin_path, run_cli
from test_coref_prepare import write_jsonl
from test_coref_train import synthetic_documents
from test_finetune_span_drop import VOCAB, synthetic_pairs, synthetic_qa, synthetic_re

RECIPES = sorted(glob.glob(os.path.join(ROOT, "configs", "finetune", "*.yaml")))
SHAPE = {"encoder_layers": 1, "encoder_embed_dim": 48, "encoder_ffn_embed_dim": 96, "encoder_attention_heads": 3,
         "max_positions": 128}


def recipe(path):
    """A recipe as hydra reads it (OmegaConf's YAML loader: '2e-05' is a number there, a string for plain PyYAML)."""
    return OmegaConf.to_container(OmegaConf.load(path))


def make_imported(tmp_path_factory):
    """spanbert-import-hf of a random BertModel of SHAPE over the test vocabulary (no MLM head, no pooler); the
    session fixture ``imported`` (conftest.py) shares it between the modules that use it."""
    import spanbert_plugin.registry  # noqa: F401 - registers the tasks the import builds its model with
    from transformers import BertConfig, BertModel

    from spanbert_plugin.hf.interop import import_hf

    d = tmp_path_factory.mktemp("recipes")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(VOCAB), num_hidden_layers=SHAPE["encoder_layers"],
                        hidden_size=SHAPE["encoder_embed_dim"], intermediate_size=SHAPE["encoder_ffn_embed_dim"],
                        num_attention_heads=SHAPE["encoder_attention_heads"], max_position_embeddings=SHAPE["max_positions"])
    BertModel(config, add_pooling_layer=False).save_pretrained(str(d / "hf"))
    (d / "hf" / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    import_hf(str(d / "hf"), str(d / "imported"))
    return str(d / "imported")


def make_family_data(imported, tmp_path_factory):
    """One small prepared folder per task family, all with the imported checkpoint's tokenizer (the session fixture
    ``family_data``)."""
    from spanbert_plugin.cli import prepare_classification, prepare_coref, prepare_re
    from spanbert_plugin.qa.prepare import QAConfig, prepare_qa

    d = tmp_path_factory.mktemp("recipe_data")
    synthetic_qa(d / "qa_train.json", 40, 1)
    synthetic_qa(d / "qa_valid.json", 16, 2)
    prepare_qa({"train": str(d / "qa_train.json"), "valid": str(d / "qa_valid.json")}, imported, str(d / "qa"),
               QAConfig(64, 16, 12))
    for split in ("train", "valid"):  # SQuAD 2.0: every third question unanswerable
        squad = json.loads((d / f"qa_{split}.json").read_text(encoding="utf-8"))
        squad["version"] = "v2.0"
        for i, paragraph in enumerate(squad["data"][0]["paragraphs"]):
            for qa in paragraph["qas"]:
                qa["is_impossible"] = i % 3 == 0
                qa["answers"] = [] if i % 3 == 0 else qa["answers"]
        (d / f"qa2_{split}.json").write_text(json.dumps(squad), encoding="utf-8")
    prepare_qa({"train": str(d / "qa2_train.json"), "valid": str(d / "qa2_valid.json")}, imported, str(d / "qa2"),
               QAConfig(64, 16, 12))
    synthetic_re(d / "re_train.json", 40, 3)
    synthetic_re(d / "re_valid.json", 16, 4)
    assert prepare_re.main(["--train", str(d / "re_train.json"), "--valid", str(d / "re_valid.json"), "--tokenizer-from",
                            imported, "--destdir", str(d / "re"), "--max-seq-length", "64"]) == 0
    synthetic_pairs(d / "cls_train.jsonl", 40, 5)
    synthetic_pairs(d / "cls_valid.jsonl", 16, 6)
    common = ["--tokenizer-from", imported, "--text-columns", "a,b", "--max-seq-length", "64"]
    assert prepare_classification.main(["--train", str(d / "cls_train.jsonl"), "--valid", str(d / "cls_valid.jsonl"),
                                        "--destdir", str(d / "cls"), "--label-column", "label", *common]) == 0
    for split in ("train", "valid"):  # a numeric target: the length of the second text, for the regression recipe
        with open(d / f"cls_{split}.jsonl", encoding="utf-8") as f, open(d / f"reg_{split}.jsonl", "w") as out:
            for line in f:
                out.write(line.replace('"label": "good"', '"score": 1.5').replace('"label": "bad"', '"score": 4.0'))
    assert prepare_classification.main(["--train", str(d / "reg_train.jsonl"), "--valid", str(d / "reg_valid.jsonl"),
                                        "--destdir", str(d / "reg"), "--label-column", "score", "--regression",
                                        *common]) == 0
    assert prepare_coref.main(["--train", write_jsonl(d / "coref_train.jsonl", synthetic_documents(6, 1)),
                               "--valid", write_jsonl(d / "coref_valid.jsonl", synthetic_documents(3, 2)),
                               "--tokenizer-from", imported, "--destdir", str(d / "coref"),
                               "--max-segment-length", "48"]) == 0
    return {name: str(d / name) for name in ("qa", "qa2", "re", "cls", "reg", "coref")}


def test_every_task_has_a_recipe():
    names = {os.path.basename(p)[:-len(".yaml")] for p in RECIPES}
    glue = {f"glue_{t}" for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")}
    assert names == {"squad1", "squad2", "mrqa", "tacred", "coref", "litbank"} | glue


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: os.path.basename(p))
def test_recipe_schedule_is_ten_percent_warm_up_and_names_no_size(path):
    """Warm-up is a tenth of the schedule, the schedule covers max_epoch; the shape is left to the checkpoint."""
    cfg = recipe(path)
    schedulers = ([g["lr_scheduler"] for g in cfg["optimizer"]["groups"].values()] if cfg["optimizer"]["_name"] in
                  ("composite", "composite_clip_per_group") else [cfg["lr_scheduler"]])
    assert schedulers[0]["warmup_updates"] == round(schedulers[0]["total_num_update"] / 10)
    assert schedulers[0]["total_num_update"] % cfg["optimization"]["max_epoch"] == 0  # whole epochs of updates
    assert not set(SHAPE) & set(cfg["model"]), cfg["model"]
    if cfg["task"]["_name"] != "coreference":
        assert (cfg["dataset"]["batch_size"], cfg["optimization"]["lr"]) == (32, [2e-05])


def _family(cfg, name):
    task = cfg["task"]["_name"]
    if task == "sentence_classification":
        return "reg" if name == "glue_stsb" else "cls"
    if task == "extractive_qa":
        return "qa2" if name == "squad2" else "qa"
    return {"relation_extraction": "re", "coreference": "coref"}[task]


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: os.path.basename(p))
def test_recipe_runs_two_updates_from_a_checkpoint_of_another_shape(path, imported, family_data, tmp_path):
    name = os.path.basename(path)[:-len(".yaml")]
    cfg = recipe(path)
    overrides = [f"task.data={family_data[_family(cfg, name)]}",
                 f"checkpoint.finetune_from_model={os.path.join(imported, 'model.pt')}",
                 f"checkpoint.save_dir={tmp_path / 'ck'}", "common.cpu=true", "optimization.max_update=2",
                 "dataset.num_workers=0", "common.log_interval=1"]
    if cfg["optimizer"]["_name"] in ("composite", "composite_clip_per_group"):
        overrides += ["task.coref_ffnn_size=32"] + [f"optimizer.groups.{g}.lr_scheduler.{k}={v}" for g in
                                                    cfg["optimizer"]["groups"] for k, v in
                                                    (("warmup_updates", 0), ("total_num_update", 2))]
    else:
        overrides += ["dataset.batch_size=8", "lr_scheduler.warmup_updates=1", "lr_scheduler.total_num_update=2"]
    proc = run_cli([bin_path("fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs", "finetune"),
                    "--config-name", name, *overrides])
    assert "model shape from" in proc.stdout + proc.stderr
    saved = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert saved["optimizer_history"][-1]["num_updates"] == 2
    assert {k: saved["cfg"]["model"][k] for k in SHAPE} == SHAPE
    assert saved["model"]["encoder.embeddings.word_embeddings.weight"].shape == (len(VOCAB), SHAPE["encoder_embed_dim"])
    metric = cfg["checkpoint"]["best_checkpoint_metric"]
    assert f"| {metric} " in proc.stdout + proc.stderr  # the recipe's model-selection metric is logged
    if name == "coref":  # c2f's OntoNotes convention, stated: the family data's one-mention chains would switch it
        assert json.load(open(os.path.join(family_data["coref"], "prepare_stats.json")))["train"]["singletons"] > 0
        assert (saved["cfg"]["task"]["mention_loss_weight"], saved["cfg"]["task"]["no_singletons"],
                saved["cfg"]["task"]["scoring_convention"]) == (0.0, True, "without_singletons")
    if cfg["optimizer"]["_name"] == "torch_adamw":  # biases and LayerNorm weights without weight decay, as BertAdam
        decays = sorted(g["weight_decay"] for g in saved["last_optimizer_state"]["param_groups"])
        assert decays == [0.0, cfg["optimizer"]["weight_decay"]] and cfg["common"]["fp16_no_flatten_grads"]


# ------------------------------------------------------------------ fairseq-train: --arch spanbert_base and sizes

def _train(data, checkpoint, save_dir, *extra, task="sentence_classification", criterion=None):
    return [bin_path("fairseq-train"), data, "--user-dir", "user_dir", "--task", task, "--criterion", criterion or task,
            "--arch", "spanbert_base", "--finetune-from-model", checkpoint, "--optimizer", "adam", "--lr", "1e-4",
            "--batch-size", "8", "--max-update", "2", "--cpu", "--num-workers", "0", "--save-dir", str(save_dir),
            "--no-epoch-checkpoints", *extra]


def test_arch_spanbert_base_takes_the_checkpoint_shape_and_resumes(imported, family_data, tmp_path):
    checkpoint = os.path.join(imported, "model.pt")
    run_cli(_train(family_data["cls"], checkpoint, tmp_path / "ck"))
    run_cli(_train(family_data["cls"], checkpoint, tmp_path / "ck", "--max-update", "4"))  # resumes checkpoint_last.pt
    saved = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert saved["optimizer_history"][-1]["num_updates"] == 4
    assert {k: saved["cfg"]["model"][k] for k in SHAPE} == SHAPE
    # another run going on from that one (--continue-once, no --finetune-from-model) takes the shape from it too
    # (it was built at spanbert_base's own size, and fairseq stopped: "please ensure that the architectures match")
    train = _train(family_data["cls"], checkpoint, tmp_path / "next", "--max-update", "6",
                   "--continue-once", str(tmp_path / "ck" / "checkpoint_last.pt"))
    i = train.index("--finetune-from-model")
    run_cli(train[:i] + train[i + 2:])
    saved = torch.load(tmp_path / "next" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert saved["optimizer_history"][-1]["num_updates"] == 6  # its optimizer state and updates go on
    assert {k: saved["cfg"]["model"][k] for k in SHAPE} == SHAPE


def test_continued_pretraining_takes_the_checkpoint_shape(imported, corpus_files, tmp_path):
    from spanbert_plugin.cli.prepare import main as prepare

    data = str(tmp_path / "corpus")
    assert prepare(["--train", corpus_files[0], "--valid", corpus_files[1], "--destdir", data, "--wordpiece-vocab",
                    os.path.join(imported, "vocab.txt"), "--lowercase"]) == 0
    run_cli(_train(data, os.path.join(imported, "model.pt"), tmp_path / "ck", "--tokens-per-sample", "64",
                   task="spanbert_pretraining", criterion="span_bert"))
    saved = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert {k: saved["cfg"]["model"][k] for k in SHAPE} == SHAPE and saved["cfg"]["task"]["_name"] == "spanbert_pretraining"


@pytest.mark.parametrize("flag,value", [("--encoder-layers", "3"), ("--max-positions", "64")])
def test_an_explicit_size_that_contradicts_the_checkpoint_is_one_line(flag, value, imported, family_data, tmp_path):
    proc = run_cli(_train(family_data["cls"], os.path.join(imported, "model.pt"), tmp_path / "ck", flag, value),
                   check=False)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    key = flag[2:].replace("-", "_")
    assert errors == [f"error: {flag} {value} (model.{key}) contradicts {os.path.join(imported, 'model.pt')}, whose "
                      f"model has {key} {SHAPE[key]}: leave {flag} out to take the checkpoint's value"], proc.stderr
    assert not os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


# ------------------------------------------------------------------ the rule itself

def _saved(tmp_path, **model):
    path = str(tmp_path / "c.pt")
    torch.save({"model": {}, "cfg": {"model": {"_name": "spanbert_base", **model}}}, path)
    return path


def test_sizes_at_the_architecture_defaults_take_the_checkpoint_values(tmp_path):
    import spanbert_plugin.registry  # noqa: F401 - the architectures' defaults
    from spanbert_plugin.core.checkpoint_loading import take_shape_from_checkpoint

    path = _saved(tmp_path, encoder_layers=6, encoder_embed_dim=384, encoder_ffn_embed_dim=1536, max_positions=512)
    cfg = {"_name": "spanbert_base", "encoder_layers": 12, "encoder_embed_dim": 768, "encoder_ffn_embed_dim": 3072,
           "max_positions": 512, "dropout": 0.3}
    assert take_shape_from_checkpoint(cfg, path) == {"encoder_layers": 6, "encoder_embed_dim": 384,
                                                     "encoder_ffn_embed_dim": 1536}
    assert cfg["encoder_layers"] == 6 and cfg["dropout"] == 0.3  # other options stay the command's
    # spanbert_tiny's defaults are 2 x 128: there 12 layers was given on purpose
    tiny = {"_name": "spanbert_tiny", "encoder_layers": 12, "encoder_embed_dim": 128}
    with pytest.raises(Exception, match=r"^--encoder-layers 12 \(model.encoder_layers\) contradicts .*encoder_layers 6"):
        take_shape_from_checkpoint(tiny, path)
    # hydra's model section (name 'spanbert'): the dataclass defaults count
    hydra = {"_name": "spanbert", "encoder_layers": 12, "encoder_embed_dim": 384}
    assert take_shape_from_checkpoint(hydra, path) == {"encoder_layers": 6}


def test_starting_checkpoint_follows_fairseq(tmp_path):
    from spanbert_plugin.core.checkpoint_loading import starting_checkpoint

    finetune = _saved(tmp_path)
    cfg = {"save_dir": str(tmp_path / "run"), "restore_file": "checkpoint_last.pt", "finetune_from_model": finetune}
    assert starting_checkpoint(cfg) == finetune
    os.makedirs(tmp_path / "run")
    (tmp_path / "run" / "checkpoint_last.pt").write_bytes(b"x")
    assert starting_checkpoint(cfg) == str(tmp_path / "run" / "checkpoint_last.pt")  # a resumed run
    assert starting_checkpoint({**cfg, "restore_file": finetune, "finetune_from_model": None}) == finetune
    assert starting_checkpoint({**cfg, "save_dir": str(tmp_path / "new"), "finetune_from_model": None}) is None


def run_recipe(name, data, imported, save_dir, *overrides, check=True):
    """fairseq-hydra-train of recipe ``name`` on ``data`` from the imported checkpoint, on the CPU, logging each update."""
    return run_cli([bin_path("fairseq-hydra-train"), "--config-dir", os.path.join(ROOT, "configs", "finetune"),
                    "--config-name", name, f"task.data={data}",
                    f"checkpoint.finetune_from_model={os.path.join(imported, 'model.pt')}",
                    f"checkpoint.save_dir={save_dir}", "common.cpu=true", "dataset.num_workers=0",
                    "common.log_interval=1", *overrides], check=check)


def test_a_best_checkpoint_metric_validation_does_not_log_is_one_line(imported, family_data, tmp_path):
    """fairseq reads stats[--best-checkpoint-metric] after the first validation: a KeyError traceback there."""
    proc = run_cli(_train(family_data["cls"], os.path.join(imported, "model.pt"), tmp_path / "ck",
                          "--best-checkpoint-metric", "acuracy", "--maximize-best-checkpoint-metric"), check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines[-1].startswith("error: --best-checkpoint-metric acuracy: the validation "
                                                         "logged no acuracy (it logged: "), proc.stderr[-2000:]
    assert " accuracy, " in lines[-1] and " mcc" in lines[-1]
    assert "Traceback" not in proc.stderr


def test_squad2_recipe_on_validation_without_unanswerable_questions_stops_before_training(imported, family_data,
                                                                                           tmp_path):
    proc = run_recipe("squad2", family_data["qa"], imported, tmp_path / "ck", "dataset.batch_size=8", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and ("error: --best-checkpoint-metric best_f1: validation split 'valid' of "
                                     f"{family_data['qa']} has no unanswerable question") in out, out[-2000:]
    assert "train_inner" not in out and "Traceback" not in out and not (tmp_path / "ck" / "checkpoint_last.pt").exists()


def test_a_recipe_with_the_decay_exemption_trains_under_fp16(imported, family_data, tmp_path):
    """torch_adamw's exemption needs per-parameter fp32 copies under fp16, which the recipes ask for."""
    proc = run_recipe("glue_sst2", family_data["cls"], imported, tmp_path / "ck", "common.fp16=true",
                      "optimization.max_update=2", "dataset.batch_size=8", "lr_scheduler.warmup_updates=1",
                      "lr_scheduler.total_num_update=2")
    assert "loss_scale=" in proc.stdout + proc.stderr
    saved = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert sorted(g["weight_decay"] for g in saved["last_optimizer_state"]["param_groups"]) == [0.0, 0.01]


def test_coreference_recipes_train_under_fp16(imported, family_data, tmp_path):
    """The recipes' note "on a GPU add common.fp16=true": fairseq's fp16 optimizer keeps the composite optimizer's
    parameter groups only with per-parameter fp32 copies, which the recipes ask for (fp16 runs on a CPU here)."""
    for name in ("litbank", "coref"):
        assert recipe(os.path.join(ROOT, "configs", "finetune", f"{name}.yaml"))["common"]["fp16_no_flatten_grads"]
    for name in ("litbank", "coref"):  # coref's optimizer clips each group alone, after fp16's unscaling
        proc = run_recipe(name, family_data["coref"], imported, tmp_path / name, "common.fp16=true",
                          "optimization.max_update=2", "task.coref_ffnn_size=32")
        assert "loss_scale=" in proc.stdout + proc.stderr and "lr_coref_head=" in proc.stdout + proc.stderr


@pytest.mark.parametrize("optimizer", ["composite", "composite_clip_per_group"])
def test_flat_fp16_copies_of_grouped_parameters_are_one_line(optimizer):
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.precision import refuse_flat_fp16_copies_of_grouped_parameters

    def run(**common):
        return OmegaConf.create({"common": {"fp16": True, **common}, "optimizer": {"_name": optimizer},
                                 "task": {"_name": "coreference"}}).task

    with pytest.raises(UsageError, match=r"^--fp16 with the composite optimizer needs --fp16-no-flatten-grads"):
        refuse_flat_fp16_copies_of_grouped_parameters(run())
    refuse_flat_fp16_copies_of_grouped_parameters(run(fp16_no_flatten_grads=True))
    with pytest.raises(UsageError, match=rf"^--amp does not work with the {optimizer} optimizer"):
        refuse_flat_fp16_copies_of_grouped_parameters(run(fp16=False, amp=True))
    refuse_flat_fp16_copies_of_grouped_parameters(run(memory_efficient_fp16=True))
    refuse_flat_fp16_copies_of_grouped_parameters(run(fp16=False))


def test_squad2_predicts_with_the_threshold_of_its_best_validation(imported, family_data, tmp_path):
    """The released code answers SQuAD 2.0's test set at the null threshold best on dev: the checkpoint keeps the
    threshold its validation found, and spanbert-predict-qa --null-threshold-from-validation uses it."""
    import re

    proc = run_recipe("squad2", family_data["qa2"], imported, tmp_path / "ck", "optimization.max_update=2",
                      "dataset.batch_size=8", "lr_scheduler.warmup_updates=1", "lr_scheduler.total_num_update=2",
                      "common.log_format=json")
    logged = [json.loads(m.group(1)) for m in re.finditer(r"\[valid\]\[INFO\] - (\{.*\})", proc.stdout + proc.stderr)]
    predicted = run_cli([bin_path("spanbert-predict-qa"), "--checkpoint", str(tmp_path / "ck" / "checkpoint_last.pt"),
                         "--out", str(tmp_path / "pred"), "--null-threshold-from-validation", "--cpu"])
    used = float(re.search(r"null threshold (\S+), the best of the validation", predicted.stderr).group(1))
    scores = json.loads((tmp_path / "pred" / "eval.json").read_text())
    # the same model on the same split: prediction's search finds the threshold validation found and logged
    assert used == scores["best_f1_thresh"] == pytest.approx(float(logged[-1]["valid_best_f1_thresh"]), abs=1e-3)
    assert scores["best_f1"] == pytest.approx(float(logged[-1]["valid_best_f1"]), abs=1e-3)
    # the stored value is the one used: a checkpoint holding another answers as --null-threshold with it
    state = torch.load(tmp_path / "ck" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    odds = json.loads((tmp_path / "pred" / "null_odds.json").read_text()).values()
    moved = max(odds) + 1 if max(odds) > used else min(odds) - 1  # every question answered, or none: not as before
    state["task_state"]["validated_null_threshold"] = moved
    torch.save(state, tmp_path / "ck" / "moved.pt")
    for out, option in (("pred_stored", ["--null-threshold-from-validation"]),
                        ("pred_given", [f"--null-threshold={moved!r}"])):
        run_cli([bin_path("spanbert-predict-qa"), "--checkpoint", str(tmp_path / "ck" / "moved.pt"), "--out",
                 str(tmp_path / out), "--cpu", *option])
    assert ((tmp_path / "pred_stored" / "predictions.json").read_text()
            == (tmp_path / "pred_given" / "predictions.json").read_text())
    assert (tmp_path / "pred_stored" / "predictions.json").read_text() != (tmp_path / "pred" / "predictions.json").read_text()
    # hub.answer's first answer is spanbert-predict-qa's at the threshold given, or at validation's when asked
    from spanbert_plugin.model.spanbert import SpanBertModel

    hub = SpanBertModel.from_pretrained(str(tmp_path / "ck"), "moved.pt")
    split = hub.task.qa_split("valid")
    for out, threshold in (("pred", {"null_threshold": used}), ("pred_stored", {"null_threshold": "validation"})):
        written = json.loads((tmp_path / out / "predictions.json").read_text())
        for question in split.questions[:6]:
            answers = hub.answer(question["question"], split.contexts[question["context_index"]], topk=2, **threshold)
            assert answers[0]["text"] == written[question["id"]], (out, question["id"])
    # a checkpoint validated without unanswerable questions holds none: one line
    run_recipe("squad1", family_data["qa"], imported, tmp_path / "ck1", "optimization.max_update=2",
               "dataset.batch_size=8", "lr_scheduler.warmup_updates=1", "lr_scheduler.total_num_update=2")
    refused = run_cli([bin_path("spanbert-predict-qa"), "--checkpoint", str(tmp_path / "ck1" / "checkpoint_last.pt"),
                       "--out", str(tmp_path / "pred1"), "--null-threshold-from-validation", "--cpu"], check=False)
    assert refused.returncode == 1 and "holds no validated threshold" in refused.stderr
    assert not (tmp_path / "pred1").exists()


def test_the_unlogged_metric_error_lists_every_logged_metric():
    from spanbert_plugin.core.errors import UsageError
    from spanbert_plugin.core.tasks import refuse_a_best_checkpoint_metric_not_logged

    task = OmegaConf.create({"checkpoint": {"best_checkpoint_metric": "best_F1"}, "task": {"_name": "extractive_qa"}}).task
    stats = {"loss": 1.0, "em": 1.0, "f1": 2.0, "best_f1": 3.0, "best_f1_thresh": 0.0, "num_updates": 4}
    with pytest.raises(UsageError, match=r"logged no best_F1 \(it logged: best_f1, best_f1_thresh, em, f1, loss\)$"):
        refuse_a_best_checkpoint_metric_not_logged(task, stats)


def test_resuming_with_another_optimizer_is_one_line(imported, family_data, tmp_path):
    """fairseq asserts that a resumed run's optimizer is the checkpoint's (a traceback): one line naming the fix."""
    train = _train(family_data["cls"], os.path.join(imported, "model.pt"), tmp_path / "ck")
    run_cli(train)
    other = ["torch_adamw" if option == "adam" else option for option in train] + ["--max-update", "3"]
    proc = run_cli(other, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines[-1].startswith(f"error: resuming from {tmp_path / 'ck'}: Optimizer does not "
                                                         "match; please reset the optimizer (--reset-optimizer)")
    assert "Traceback" not in proc.stderr


def test_a_size_without_an_architecture_default_must_match_the_checkpoint(tmp_path):
    """An option the model's architecture gives no default for cannot be told apart from one given on purpose: a
    value other than the checkpoint's is a UsageError, not silently replaced."""
    from spanbert_plugin.core.checkpoint_loading import take_shape_from_checkpoint
    from spanbert_plugin.core.errors import UsageError

    path = _saved(tmp_path, encoder_layers=6)
    with pytest.raises(UsageError, match=r"^--encoder-layers 4 \(model.encoder_layers\) contradicts .*encoder_layers 6"):
        take_shape_from_checkpoint({"_name": "not_an_architecture", "encoder_layers": 4}, path)
    assert take_shape_from_checkpoint({"_name": "not_an_architecture", "encoder_layers": 6}, path) == {}


def test_starting_checkpoint_is_none_when_the_named_file_is_not_there(tmp_path):
    from spanbert_plugin.core.checkpoint_loading import starting_checkpoint

    cfg = {"save_dir": str(tmp_path / "run"), "restore_file": str(tmp_path / "typo.pt"), "finetune_from_model": None}
    assert starting_checkpoint(cfg) is None
    missing = {"save_dir": str(tmp_path / "run"), "restore_file": None, "finetune_from_model": str(tmp_path / "no.pt")}
    assert starting_checkpoint(missing) is None
    os.makedirs(tmp_path / "run" / "checkpoint_last.pt")  # a folder of that name: no checkpoint either
    assert starting_checkpoint({**cfg, "restore_file": str(tmp_path / "run" / "checkpoint_last.pt")}) is None
