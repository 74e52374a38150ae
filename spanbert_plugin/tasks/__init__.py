"""Registered tasks (see spanbert_plugin/__init__.py) and what they share."""
import os
import warnings

from omegaconf import OmegaConf

from ..errors import UsageError


class OneDictionaryTask:
    """Listed before ``FairseqTask``: source and target dictionary are the task's ``self.dictionary`` (encoder-only models)."""

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


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


def missing_split_error(folder: str, split: str, prepare_command: str) -> UsageError:
    """The one-line error for a split that was not prepared (fairseq-train validates on ``valid`` by default)."""
    hint = (f"; prepare the folder again with --valid FILE, or train with --disable-validation"
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


def quiet_fairseq_hydra_warnings() -> None:
    """Silence the hydra deprecation warnings fairseq-train's config conversion prints on every run.

    They are about fairseq's own use of hydra, say nothing a user can act on,
    and would bury the one-line errors the plugin prints on stderr.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"\s*(hydra\.experimental\.\w+\(\) is no longer experimental|The version_base parameter is not specified"
        r"|In '\w+': Usage of deprecated keyword in package header|'\w+' is validated against ConfigStore schema"
        r"|The strict flag in the compose API is deprecated)",
        category=UserWarning,
    )


quiet_fairseq_hydra_warnings()
