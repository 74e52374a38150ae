"""``span_masked_lm``: the deprecated first name of ``spanbert_pretraining``.

fairseq registers its own T5-style task under this name; ``fairseq-hydra-train``
checks a YAML's ``task`` section against fairseq's registry before the plugin is
imported, so there the name means fairseq's task and the plugin's options are
refused. Where the plugin is imported first (``fairseq-train --user-dir``,
loading a checkpoint saved under the old name) the name keeps meaning
SpanBERT's task, with a warning.
"""
import argparse
import logging
from dataclasses import dataclass, field
from typing import Optional

from fairseq import tasks as fairseq_tasks
from fairseq.tasks import register_task

from .task import TASK_NAME, SpanBertPretrainingConfig, SpanBertPretrainingTask

logger = logging.getLogger(__name__)
LEGACY_TASK_NAME = "span_masked_lm"
_IGNORED = {"help": argparse.SUPPRESS}


@dataclass
class LegacySpanMaskedLMConfig(SpanBertPretrainingConfig):
    """The task's config under its old name, plus the keys of fairseq's T5 ``span_masked_lm`` (accepted, ignored).

    A hydra YAML naming ``span_masked_lm`` arrives filled from fairseq's T5
    schema (hydra fills it before the plugin is imported); accepting those keys
    keeps such configs and old checkpoints loading.
    """

    shuffle: bool = field(default=False, metadata=_IGNORED)
    noise_density: float = field(default=0.15, metadata=_IGNORED)
    mean_noise_span_length: float = field(default=3.0, metadata=_IGNORED)
    sample_break_mode: Optional[str] = field(default=None, metadata=_IGNORED)
    shorten_method: Optional[str] = field(default=None, metadata=_IGNORED)
    shorten_data_split_list: str = field(default="", metadata=_IGNORED)
    dataset_impl: Optional[str] = field(default=None, metadata=_IGNORED)
    max_source_positions: int = field(default=0, metadata=_IGNORED)
    max_target_positions: int = field(default=0, metadata=_IGNORED)
    include_target_tokens: bool = field(default=False, metadata=_IGNORED)


def _release_fairseq_task_name(name):
    """Free a task name that fairseq registered itself, so the plugin can own it."""
    if name in fairseq_tasks.TASK_REGISTRY and not fairseq_tasks.TASK_REGISTRY[name].__module__.startswith(__package__.split(".")[0]):
        fairseq_tasks.TASK_REGISTRY.pop(name)
        fairseq_tasks.TASK_DATACLASS_REGISTRY.pop(name, None)


_release_fairseq_task_name(LEGACY_TASK_NAME)


@register_task(LEGACY_TASK_NAME, dataclass=LegacySpanMaskedLMConfig)
class LegacySpanMaskedLMTask(SpanBertPretrainingTask):
    """Deprecated alias of ``spanbert_pretraining`` (``fairseq-train --user-dir`` and old checkpoints only)."""

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        logger.warning(f"task {LEGACY_TASK_NAME} is a deprecated alias of {TASK_NAME} (fairseq-hydra-train needs {TASK_NAME})")
        return super().setup_task(cfg, **kwargs)


# the names before the rename, kept for scripts written against them
SpanMaskedLMConfig = SpanBertPretrainingConfig
SpanBertMaskedLMTask = SpanBertPretrainingTask
