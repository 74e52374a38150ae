"""The ``extractive_qa`` task: SQuAD 1.1 / 2.0 and MRQA fine-tuning on ``spanbert-prepare-qa`` data.

The model gets a QA head (one linear layer to start and end logits, HF's
``qa_outputs``) on top of the encoder; a checkpoint pre-trained here or
imported with ``spanbert-import-hf`` is loaded with ``--finetune-from-model``.
Training windows are shuffled each epoch; evaluation batches hold whole
questions so that validation EM/F1 are computed over whole questions, exactly
as ``spanbert-predict-qa`` computes them.
"""
import logging
import os
from dataclasses import dataclass, field

from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..core.datasets import load_token_items
from ..core.dictionary import SpanBertDictionary
from .span_drop import QASpanDropConfig, QASpanDropDataset
from ..spandrop.finetune import span_dropper
from .dataset import ExtractiveQADataset
from ..core.errors import UsageError
from ..core.file_utils import read_json
from ..core.finetune_io import register_finetuning_folder
from ..core.precision import SharedTrainingConfig
from ..core.run_config import run_section
from ..core.tasks import OneDictionaryTask, best_checkpoint_metric, missing_split_error, prepared_data_folder, load_data_dictionary
from .windows import QASplit
from .criterion import UNANSWERABLE_METRICS
from ..addrop.task_mixin import ADDropConfig, ADDropMixin

logger = logging.getLogger(__name__)

# the task state's key (saved in checkpoints) for the last validation's best null threshold
VALIDATED_NULL_THRESHOLD = "validated_null_threshold"
QA_CONFIG = register_finetuning_folder("qa_config.json", "spanbert-prepare-qa", "extractive_qa")


@dataclass
class ExtractiveQAConfig(SharedTrainingConfig, ADDropConfig, QASpanDropConfig):
    data: str = field(default="", metadata={"help": "spanbert-prepare-qa output folder"})
    seed: int = II("common.seed")


@register_task("extractive_qa", dataclass=ExtractiveQAConfig)
class ExtractiveQATask(ADDropMixin, OneDictionaryTask, FairseqTask):
    """Extractive QA fine-tuning (SPEC §1.4): start/end classifiers over the encoder output."""

    criteria = ("extractive_qa",)
    cfg: ExtractiveQAConfig

    def __init__(self, cfg: ExtractiveQAConfig, dictionary: SpanBertDictionary, qa_config: dict):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.qa_config = qa_config
        self._splits = {}

    @classmethod
    def setup_task(cls, cfg: ExtractiveQAConfig, **kwargs):
        data = prepared_data_folder(cfg, "extractive_qa", "spanbert-prepare-qa", (QA_CONFIG, "dict.txt"))
        qa_config = read_json(os.path.join(data, QA_CONFIG))
        return cls(cfg, load_data_dictionary(data), qa_config)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "register_qa_head"):
            raise UsageError(f"extractive_qa needs a spanbert model (--arch spanbert_*), got {type(model).__name__}")
        model.register_qa_head()
        longest = int(self.qa_config.get("max_seq_length", 0))
        if longest > model.max_positions():
            raise UsageError(
                f"{self.cfg.data}: windows of up to {longest} tokens exceed the model's {model.max_positions()} positions; "
                "prepare the data again with a smaller --max-seq-length"
            )
        return model

    def qa_split(self, split: str) -> QASplit:
        """The metadata of a prepared split (windows, offsets, questions, contexts), loaded once."""
        if split not in self._splits:
            self._splits[split] = QASplit.load(self.cfg.data, split)
        return self._splits[split]

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        prefix = os.path.join(self.cfg.data, split)
        if not os.path.isfile(prefix + ".windows.npz"):
            raise missing_split_error(self.cfg.data, split, "spanbert-prepare-qa")
        windows = load_token_items(prefix, self.dictionary, split, check_ids=True)
        if windows is None:
            raise UsageError(f"{prefix}.bin/.idx: no such file (split {split!r} has its windows.npz); copy the split's "
                             ".bin and .idx too, or prepare the folder again")
        qa = self.qa_split(split)
        if len(windows) != qa.num_windows:
            raise UsageError(f"{prefix}.bin/.idx: {len(windows)} windows, but {prefix}.windows.npz describes "
                             f"{qa.num_windows}: the files come from different preparations; prepare the folder again")
        is_train = self.loads_training_form(split, kwargs)  # training shuffles windows; evaluation keeps questions whole
        dataset = ExtractiveQADataset(
            windows, qa, split, self.dictionary.pad(), group_questions=not is_train, shuffle=is_train, seed=self.cfg.seed
        )
        dropper = span_dropper(self.cfg, self.dictionary, self.cfg.data, self.cfg.seed) if is_train else None
        if dropper is not None:  # SpanDrop on training windows only
            dataset = QASpanDropDataset(dataset, dropper, self.cfg.span_drop_protect_question_overlap)
        self.keep_dataset(split, dataset, is_train)
        logger.info(f"{prefix}: {qa.num_questions} questions, {qa.num_windows} windows ({qa.format})")

    def begin_epoch(self, epoch, model):
        """Training only: SQuAD 2.0's metrics as --best-checkpoint-metric need unanswerable questions to validate on
        (refused now, not after the first epoch of training)."""
        super().begin_epoch(epoch, model)
        self._refuse_unanswerable_metric_without_unanswerable_questions()

    def _refuse_unanswerable_metric_without_unanswerable_questions(self) -> None:
        dataset, metric = run_section(self.cfg, "dataset"), best_checkpoint_metric(self.cfg)
        if metric not in UNANSWERABLE_METRICS or dataset is None or dataset.get("disable_validation"):
            return
        for split in str(dataset.get("valid_subset") or "valid").split(","):
            if os.path.isfile(os.path.join(self.cfg.data, split + ".windows.npz")) and not self.qa_split(split).with_negative:
                raise UsageError(
                    f"--best-checkpoint-metric {metric}: validation split {split!r} of {self.cfg.data} has no "
                    "unanswerable question, so it logs em and f1 only (SQuAD 1.1 rules); choose f1, or a SQuAD 2.0 "
                    "validation split")

    def begin_valid_epoch(self, epoch, model):
        super().begin_valid_epoch(epoch, model)
        self._subsets_validated = 0

    def post_validate(self, model, stats, agg):
        """After each validation subset; the first is the one fairseq selects checkpoints on: its best null threshold
        (SQuAD 2.0) is kept in the task's state, which every checkpoint saved after it holds
        (``spanbert-predict-qa --null-threshold-from-validation``)."""
        super().post_validate(model, stats, agg)
        self._subsets_validated = getattr(self, "_subsets_validated", 0) + 1
        if self._subsets_validated == 1 and "best_f1_thresh" in stats:
            self.state.merge_state_dict({VALIDATED_NULL_THRESHOLD: float(stats["best_f1_thresh"])})

    def validated_null_threshold(self):
        """The best null threshold of the validation before the loaded checkpoint was saved, or None."""
        return self.state.state_dict.get(VALIDATED_NULL_THRESHOLD)

    def max_positions(self):
        return int(self.qa_config.get("max_seq_length", 512))
