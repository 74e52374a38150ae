"""What the registered tasks share (registration: ``spanbert_plugin/registry.py``): ``OneDictionaryTask`` and its helpers."""
import dataclasses
import logging
import os
import warnings

import torch
from fairseq import metrics
from omegaconf import OmegaConf

from . import clean_exit
from .cpu_paths import keep_freed_memory
from .datasets import check_max_tokens, check_validation_max_tokens
from .errors import UsageError
from .run_config import run_section
from .fp16_copies import use_multi_tensor_copies
from .model_flops import FlopsLog, encoder_training_flops
from .precision import (amp_autocast, check_bf16_autocast, enable_tf32, forward_precision,
                        refuse_flat_fp16_copies_of_grouped_parameters, refuse_half_precision_a_cpu_cannot_run,
                        run_precision)


class OneDictionaryTask:
    """Listed before ``FairseqTask``: source and target dictionary are the task's ``self.dictionary`` (encoder-only models).

    It also runs the forward passes of training and validation under ``--bf16-autocast`` (``core.precision``),
    turns on ``--tf32``, and logs the achieved model FLOP/s of training (``tflops``, and ``mfu`` where the
    device's peak is known: ``core.model_flops``).
    """

    # Fine-tuning tasks never run the model's MLM and SBO heads; the pre-training task trains them.
    trains_pretraining_heads = False
    # The --criterion names the task's batches and model outputs work with (empty: not checked). Another criterion,
    # fairseq's default cross_entropy included, would fail mid-step with a traceback about tuples or missing keys.
    criteria = ()

    def __init__(self, cfg, **kwargs):
        peak = getattr(cfg, "peak_tflops", 0.0) or 0.0
        if not 0.0 <= peak < float("inf"):
            raise UsageError(f"--peak-tflops {peak}: expected the device's peak TFLOP/s, a number above 0 (0: the "
                             "table of known GPUs)")
        check_bf16_autocast(cfg)
        enable_tf32(cfg)
        super().__init__(cfg, **kwargs)
        self.flops_log = FlopsLog(peak)
        self._dataset_forms = {}  # split -> {training: dataset}: see keep_dataset

    def forward_precision(self, model):
        """The context of a training or validation forward pass: bfloat16 autocast with ``--bf16-autocast``."""
        return forward_precision(self.cfg, model)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        """FairseqTask.train_step with the forward pass under ``forward_precision``; backward outside it. fairseq's
        ``--fp16`` optimizer copies gradients and weights by multi-tensor operators (``core.fp16_copies``)."""
        use_multi_tensor_copies(optimizer)
        model.train()
        model.set_num_updates(update_num)
        with torch.autograd.profiler.record_function("forward"), amp_autocast(optimizer), self.forward_precision(model):
            loss, sample_size, logging_output = criterion(model, sample)
        if ignore_grad:
            loss *= 0
        with torch.autograd.profiler.record_function("backward"):
            optimizer.backward(loss)
        keep_freed_memory(loss)  # once per process, on a CPU
        if not self.flops_log.prepared_for(model):
            self.flops_log.prepare(model, run_precision(self.cfg), _world_size(self.cfg))
        if self.flops_log.layer_parameters is not None and not ignore_grad:
            logging_output["model_flops"] = self.training_flops(model, sample, logging_output)
        return loss, sample_size, logging_output

    def training_flops(self, model, sample, logging_output):
        """Model FLOPs of this training pass (``core.model_flops``): the encoder's; tasks that predict over the
        vocabulary add their heads'."""
        return encoder_training_flops(model, sample, self.flops_log.layer_parameters)

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        flops = [log["model_flops"] for log in logging_outputs if "model_flops" in log]
        if flops:
            metrics.log_speed("tflops", sum(flops) / 1e12, priority=95, round=4)
            if self.flops_log.peak:
                metrics.log_derived("mfu", self.flops_log.mfu)

    def valid_step(self, sample, model, criterion):
        model.eval()
        with torch.no_grad(), self.forward_precision(model):
            return criterion(model, sample)

    def loads_training_form(self, split: str, kwargs) -> bool:
        """Whether ``load_dataset(split, **kwargs)`` reads the split as training data: shuffled, with the training-only
        transformations (SpanDrop, coreference's training window, QA windows not grouped by question).

        fairseq loads its training subset through its ``Trainer`` alone, which alone passes ``data_selector``
        (``tests/test_split_forms.py`` checks that fairseq's code still does): that load is training, whatever the
        split is called. Every other load inside a run is evaluation: fairseq-train's validation subsets (the
        training subset too, with ``--valid-subset train``), fairseq-validate's, prediction's. A task built outside
        a run (a script's, a test's) reads ``train`` as training. A caller may say which it wants: ``training=``.
        """
        if "training" in kwargs:
            return bool(kwargs["training"])
        if "data_selector" in kwargs:
            return True
        return run_section(self.cfg, "dataset") is None and split == "train"

    def keep_dataset(self, split: str, dataset, training: bool) -> None:
        """``self.datasets[split] = dataset``, for a split fairseq both trains and validates on too.

        fairseq keeps one dataset per split name: with ``--valid-subset train`` it loads the split for validation,
        then for training, and its validation would read the training form. A training form keeps the evaluation
        form of its split as its twin, which ``get_batch_iterator`` gives every iterator but the training one.
        """
        self._dataset_forms.setdefault(split, {})[training] = dataset
        self.datasets[split] = dataset

    def _evaluation_form(self, dataset):
        """The evaluation form of the split whose training form ``dataset`` is, else ``dataset`` itself."""
        for forms in self._dataset_forms.values():
            if forms.get(True) is dataset:
                return forms.get(False, dataset)
        return dataset

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """FairseqTask's, with persistent DataLoader workers only for an iterator fairseq keeps for reuse.

        Only fairseq's training iterator passes ``update_epoch_batch_itr``: every other iterator over a split's
        training form reads its evaluation form (``keep_dataset``).

        An iterator built anew (each training epoch of a dataset drawn anew every epoch) would keep its idle workers
        until the garbage collector frees it; freed inside a collection, its queues are finalised before it can tell
        the workers to stop, so the run waits 5 s per worker, kills them, and each leaves a pymp-* folder behind.
        Non-persistent workers stop when their epoch ends. The plugin's exit handler is registered again here, so it
        runs before handlers registered since the plugin was imported (atexit runs the last registered first):
        ``torch._dynamo``, imported by ``--compile``, frees what the workers need before they are stopped.

        An example longer than ``--max-tokens`` is that option's error (``check_max_tokens``); when fairseq-train
        asks for its training batches, the validation splits it has loaded are checked against ``--max-tokens-valid``
        too (``check_validation_max_tokens``).
        """
        if "update_epoch_batch_itr" not in kwargs:
            dataset = self._evaluation_form(dataset)
        else:
            self._check_validation_batches()
        check_max_tokens(getattr(dataset, "sizes", ()), kwargs.get("max_tokens", args[0] if args else None))
        clean_exit.install()
        iterator = super().get_batch_iterator(dataset, *args, **kwargs)
        if self.dataset_to_epoch_iter.get(dataset) is not iterator:
            iterator.persistent_workers = False
        return iterator

    def _check_validation_batches(self) -> None:
        """The validation splits of the run (``--valid-subset``, loaded before its training batches are made)
        against ``--max-tokens-valid``."""
        dataset = run_section(self.cfg, "dataset")
        if dataset is None or dataset.get("disable_validation"):
            return
        splits = [split for split in str(dataset.get("valid_subset") or "").split(",") if split in self.datasets]
        check_validation_max_tokens({split: self._evaluation_form(self.datasets[split]) for split in splits},
                                    dataset.get("max_tokens_valid"))

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def build_model(self, cfg, from_checkpoint=False):
        """A training run takes the encoder's shape from the checkpoint it starts from (``take_shape_from_checkpoint``).

        Loading a checkpoint (``from_checkpoint``) builds the shape that checkpoint stored.
        """
        starts_anew = False
        if not from_checkpoint:
            # a training run only: loading a checkpoint a GPU trained under --fp16 or --amp, to validate, predict or
            # export on a CPU, trains nothing (the saved run config still says fp16)
            refuse_half_precision_a_cpu_cannot_run(self.cfg)
            refuse_flat_fp16_copies_of_grouped_parameters(self.cfg)
            from .checkpoint_loading import (refuse_a_named_checkpoint_that_is_missing, run_starting_checkpoint,
                                             starts_anew_from, take_shape_from_checkpoint)

            checkpoint_section = run_section(cfg, "checkpoint")
            if checkpoint_section is not None:
                refuse_a_named_checkpoint_that_is_missing(checkpoint_section, run_section(cfg, "distributed_training"))
            path = run_starting_checkpoint(cfg)
            starts_anew = path is not None and starts_anew_from(checkpoint_section, path)
            changes = take_shape_from_checkpoint(cfg, path) if path else {}
            if changes:
                logging.getLogger(__name__).info(
                    f"model shape from {path}: " + ", ".join(f"{k}={v}" for k, v in changes.items()))
        model = super().build_model(cfg, from_checkpoint)
        if starts_anew and hasattr(model, "only_heads_of_this_run"):
            model.only_heads_of_this_run = True  # another run's task heads stay behind (SpanBertModel)
        if not self.trains_pretraining_heads and hasattr(model, "leave_pretraining_heads_out_of_training"):
            model.leave_pretraining_heads_out_of_training()
        if getattr(self.cfg, "compile", False) and not from_checkpoint:
            run = cfg._get_parent() if OmegaConf.is_config(cfg) else None
            compile_for_training(model, self.cfg, run)
        return model

    def build_criterion(self, cfg, from_checkpoint=False):
        """The task's own criterion (``criteria``): any other is one line before anything is built."""
        name = cfg.get("_name") if hasattr(cfg, "get") else getattr(cfg, "_name", None)
        if self.criteria and name not in self.criteria:
            task = getattr(self.cfg, "_name", None) or type(self).__name__
            raise UsageError(f"--criterion {name} does not work with --task {task}; use --criterion "
                             + " or ".join(self.criteria))
        return super().build_criterion(cfg, from_checkpoint)

    def begin_epoch(self, epoch, model):
        """Training only (fairseq-train calls it; loading a checkpoint does not): check the run's save settings, and
        (before the first epoch) warn about the options that do nothing as set."""
        warn_if_validating_between_saves(self.cfg)
        if not getattr(self, "_options_without_effect_checked", False):
            self._options_without_effect_checked = True
            warn_options_without_effect(self.cfg)
        super().begin_epoch(epoch, model)

    def post_validate(self, model, stats, agg):
        """fairseq-train calls it after each validation, then reads ``stats[--best-checkpoint-metric]``: a metric the
        validation did not log is one line here, not a KeyError traceback (on the first validation: later ones
        read the metric before this call)."""
        refuse_a_best_checkpoint_metric_not_logged(self.cfg, stats)


def compile_for_training(model, task_cfg, run) -> None:
    """``--compile``: the model compiles its transformer layers (``SpanBertModel.compile_layers``), padding batches
    to ``--required-seq-len-multiple``. Before fairseq wraps the model in DDP, so DDP wraps the compiled layers."""
    if not hasattr(model, "compile_layers"):
        raise UsageError(f"--compile: {type(model).__name__} has no compiled training path; use a spanbert architecture")
    dataset = run.get("dataset") if OmegaConf.is_dict(run) else None
    multiple = int(dataset.get("required_seq_len_multiple") or 1) if OmegaConf.is_dict(dataset) else 1
    logging.getLogger(__name__).info(
        f"--compile: the encoder's layers compile on their first batches; sequences padded to a multiple of {multiple} "
        "(--required-seq-len-multiple)")
    try:
        model.compile_layers(length_multiple=multiple, backend=task_cfg.compile_backend)
    except Exception as err:  # noqa: BLE001 - torch's InvalidBackend; anything else propagates unchanged
        if type(err).__name__ != "InvalidBackend":
            raise
        import torch._dynamo

        raise UsageError(f"--compile-backend {task_cfg.compile_backend}: not a torch.compile backend; expected one of "
                         f"{', '.join(torch._dynamo.list_backends())}") from None


def _world_size(cfg) -> int:
    distributed = run_section(cfg, "distributed_training")
    return int(distributed.get("distributed_world_size") or 1) if distributed is not None else 1


_warned_about_unsaved_validations = False


def validations_between_saves(dataset, checkpoint) -> str:
    """How validations fall between checkpoint saves in a run's ``dataset``/``checkpoint`` config ('' when none).

    fairseq updates ``checkpoint_best.pt`` only when it saves; a validation with no save
    beside it is measured and then lost for model selection.
    """
    if dataset.get("disable_validation") or checkpoint.get("no_save"):
        return ""
    validate_updates = int(dataset.get("validate_interval_updates") or 0)
    save_updates = int(checkpoint.get("save_interval_updates") or 0)
    if validate_updates > 0 and (save_updates == 0 or validate_updates % save_updates):
        return (f"--validate-interval-updates {validate_updates} with --save-interval-updates {save_updates}: "
                f"set --save-interval-updates {validate_updates}")
    validate_epochs, save_epochs = int(dataset.get("validate_interval") or 1), int(checkpoint.get("save_interval") or 1)
    if validate_epochs % save_epochs:
        return f"--validate-interval {validate_epochs} with --save-interval {save_epochs}: set --save-interval {validate_epochs}"
    return ""


def warn_if_validating_between_saves(cfg) -> None:
    """Warn once per process when the run (the parent of the task's config) validates where it does not save."""
    global _warned_about_unsaved_validations
    if _warned_about_unsaved_validations:
        return
    dataset, metric = run_section(cfg, "dataset"), best_checkpoint_metric(cfg)
    if not metric or dataset is None:
        return
    problem = validations_between_saves(dataset, run_section(cfg, "checkpoint"))
    if problem:
        _warned_about_unsaved_validations = True
        logging.getLogger(__name__).warning(
            f"{problem}: checkpoint_best.pt (--best-checkpoint-metric {metric}) is chosen only among the validations "
            "that coincide with a save, so it may not be the best validated model"
        )


def best_checkpoint_metric(cfg):
    """The run's --best-checkpoint-metric (None for a config built outside a run)."""
    checkpoint = run_section(cfg, "checkpoint")
    return checkpoint.get("best_checkpoint_metric") if checkpoint is not None else None


def refuse_a_best_checkpoint_metric_not_logged(cfg, stats) -> None:
    metric = best_checkpoint_metric(cfg)
    if metric and metric not in stats:
        logged = ", ".join(sorted(k for k in stats if k not in ("num_updates", f"best_{metric}")))
        raise UsageError(f"--best-checkpoint-metric {metric}: the validation logged no {metric} (it logged: {logged})")


def prepared_data_folder(cfg, task_name: str, prepare_command: str, required_files=("dict.txt",)) -> str:
    """``cfg.data`` made absolute and recorded in the run's config; UsageError when missing or lacking a required file."""
    if not cfg.data:
        raise UsageError(f"{task_name} needs a data folder ({prepare_command} --destdir)")
    cfg.data = os.path.abspath(cfg.data)  # checkpoints then work from any directory
    record_in_run_config(cfg)
    for name in required_files:
        path = os.path.join(cfg.data, name)
        if not os.path.isfile(path):
            raise UsageError(f"{path}: no such file; {cfg.data} is not a {prepare_command} folder")
    return cfg.data


def task_state_of(task) -> dict:
    """What a task's state holds (fairseq's ``task.state``, saved as a checkpoint's ``task_state``: labels, an
    imported head's records), or {} for a task without one."""
    return getattr(getattr(task, "state", None), "state_dict", None) or {}


# Checks of options that do nothing as set, such as a feature's secondary options while the feature is off: each
# feature registers one, ``(the task's options as a dict) -> [(option names, why they do nothing)]``; training runs
# them once.
OPTIONS_WITHOUT_EFFECT = []


def register_options_check(check):
    OPTIONS_WITHOUT_EFFECT.append(check)
    return check


def _options_and_defaults(cfg):
    """({option: value}, {option: its dataclass default}) of a task config (fairseq's DictConfig, or the dataclass)."""
    from fairseq.tasks import TASK_DATACLASS_REGISTRY

    if dataclasses.is_dataclass(cfg):
        config_class, names = type(cfg), [f.name for f in dataclasses.fields(cfg)]
    else:
        config_class, names = TASK_DATACLASS_REGISTRY.get(cfg.get("_name")), list(cfg.keys())
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)} if config_class else {}
    return {name: getattr(cfg, name) for name in names}, defaults


@register_options_check
def compile_backend_while_off(options):
    if "compile" in options and not options["compile"]:
        return [(("compile_backend",), "since --compile is off")]
    return []


def warn_options_without_effect(cfg) -> None:
    """One warning per feature whose options were set but do nothing (an option silently ignored reads as applied)."""
    options, defaults = _options_and_defaults(cfg)
    for check in OPTIONS_WITHOUT_EFFECT:
        for names, reason in check(options):
            given = [f"--{name.replace('_', '-')} {options[name]}" for name in names
                     if name in options and name in defaults and options[name] != defaults[name]]
            if given:
                logging.getLogger(__name__).warning(f"{', '.join(given)}: no effect, {reason}")


def check_head_name(flag: str, name: str) -> str:
    """A head name the model can register (torch's module names: not empty, no '.'); UsageError naming the flag."""
    if not name or "." in name:
        raise UsageError(f"{flag} {name!r}: expected a head name, not empty and without '.'")
    return name


def load_data_dictionary(folder: str):
    """The ``dict.txt`` of a prepared fine-tuning folder; a malformed or empty one is a UsageError naming it (a bad
    line was a ValueError traceback, an empty file a TypeError in the first batch: no padding symbol)."""
    from .dictionary import SpanBertDictionary

    path = os.path.join(folder, "dict.txt")
    try:
        dictionary = SpanBertDictionary.load(path)
    except (OSError, ValueError) as err:  # UnicodeDecodeError too
        raise UsageError(f"{path}: unreadable ({err}); copy it again or prepare the folder again") from None
    if len(dictionary) == 0:
        raise UsageError(f"{path}: empty, no symbol; copy it again or prepare the folder again")
    return dictionary


def missing_split_error(folder: str, split: str, prepare_command: str) -> UsageError:
    """The one-line error for a split that was not prepared (fairseq-train validates on ``valid`` by default)."""
    hint = ("; prepare the folder again with --valid FILE, or train with --disable-validation"
            if split == "valid" else f"; give a split that {prepare_command} wrote")
    return UsageError(f"{folder}: no split {split!r} ({prepare_command} wrote none){hint}")


def record_in_run_config(cfg) -> None:
    """Copy a task's resolved config (e.g. absolute ``data``) into the run's config, which fairseq saves in checkpoints.

    fairseq hands ``setup_task`` a merged copy of the run's ``task`` section, so
    changes to it would not reach ``checkpoint*.pt``; the copy's parent is the
    run's config. Configs built outside a run (no parent) are left as they are.
    """
    if not OmegaConf.is_config(cfg):
        return
    run = cfg._get_parent()
    if OmegaConf.is_dict(run) and OmegaConf.is_dict(run.get("task")) and run.task.get("_name") == cfg.get("_name"):
        run.task = cfg


# (message regex, category) of each warning quieted by quiet_known_harmless_warnings; the test suite's
# configuration reuses them (tests/conftest.py)
KNOWN_HARMLESS_WARNINGS = (
    (r"\s*(hydra\.experimental\.\w+\(\) is no longer experimental|The version_base parameter is not specified"
     r"|In '\w+': Usage of deprecated keyword in package header|'\w+' is validated against ConfigStore schema"
     r"|The strict flag in the compose API is deprecated)", UserWarning),
    (r"`torch\.cuda\.amp\.(autocast|GradScaler)\(args\.\.\.\)` is deprecated", FutureWarning),
    ("'pin_memory' argument is set as true but no accelerator", UserWarning),
)


def quiet_known_harmless_warnings() -> None:
    """Silence, by message, the warnings every training run would print that say nothing a user can act on.

    They would bury the one-line errors the plugin prints on stderr: hydra's deprecation notes about fairseq's
    own use of hydra (those hydra prints before ``--user-dir`` loads the plugin remain), torch's deprecation of
    the ``torch.cuda.amp`` spellings fairseq uses (``--amp``), and the DataLoader's note that pinned memory
    needs an accelerator (fairseq always asks for it; on a CPU-only host torch says so on every epoch).
    """
    for message, category in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


quiet_known_harmless_warnings()
