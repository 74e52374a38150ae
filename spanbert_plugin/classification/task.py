"""The ``sentence_classification`` task: GLUE-style fine-tuning on a spanbert-prepare-classification folder.

The number of classes, the regression flag and the labels come from the
prepared folder (``classification.json``), not from flags. Inputs carry BERT
token types (0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``), which imported BERT
checkpoints rely on. fairseq's ``sentence_prediction`` task does not fit: its
layout (``input0``/``input1``/``label`` with fairseq dictionaries) has no token
types, and its ``build_model`` overwrites the model's position count.
"""
import logging
from dataclasses import dataclass, field

from fairseq.tasks import FairseqTask, register_task
from omegaconf import II, MISSING

from .prepare import read_meta
from .dataset import ClassificationDataset
from .span_drop import ClassificationSpanDropDataset
from ..spandrop.finetune import FinetuneSpanDropConfig, span_dropper
from ..core.checkpoint_loading import match_saved_head_labels, run_resumed_checkpoint
from ..core.errors import UsageError
from ..core.precision import SharedTrainingConfig
from ..core.tasks import OneDictionaryTask, prepared_data_folder, check_head_name, load_data_dictionary
from ..addrop.task_mixin import ADDropConfig, ADDropMixin

logger = logging.getLogger(__name__)


@dataclass
class SentenceClassificationConfig(SharedTrainingConfig, ADDropConfig, FinetuneSpanDropConfig):
    data: str = field(default=MISSING, metadata={"help": "spanbert-prepare-classification output folder"})
    classification_head_name: str = field(
        default="sentence_classification_head", metadata={"help": "name of the [CLS] classification head"}
    )
    seed: int = II("common.seed")


@register_task("sentence_classification", dataclass=SentenceClassificationConfig)
class SentenceClassificationTask(ADDropMixin, OneDictionaryTask, FairseqTask):
    """Single sentences or pairs to one of K labels (or one number with --regression at prepare time)."""

    criteria = ("sentence_classification",)

    cfg: SentenceClassificationConfig

    def __init__(self, cfg, dictionary, meta):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.meta = meta
        self.regression = bool(meta["regression"])
        self.num_classes = int(meta["num_classes"])
        self.labels = meta["labels"]
        # saved in checkpoints, so prediction can refuse data whose labels differ from training's
        self.state.merge_state_dict({"labels": self.labels})

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        data = prepared_data_folder(cfg, "sentence_classification", "spanbert-prepare-classification")
        meta = read_meta(data)
        dictionary = load_data_dictionary(data)
        kind = "regression" if meta["regression"] else f"{meta['num_classes']} classes"
        logger.info(f"sentence_classification: {kind}, {'pairs' if meta['pair'] else 'single texts'}, "
                    f"dictionary of {len(dictionary)} symbols")
        return cls(cfg, dictionary, meta)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        folder = self.cfg.data
        is_train = self.loads_training_form(split, kwargs)
        dataset = ClassificationDataset.load(folder, split, self.dictionary, shuffle=is_train, seed=self.cfg.seed)
        if dataset.regression != self.regression:
            raise UsageError(f"{self.cfg.data}: split {split!r} has {'numeric' if dataset.regression else 'class'} labels, "
                             f"but classification.json says regression={self.regression}")
        logger.info(f"sentence_classification {split}: {len(dataset)} examples")
        dropper = span_dropper(self.cfg, self.dictionary, folder, self.cfg.seed) if is_train else None
        if dropper is not None:  # SpanDrop on training data only
            dataset = ClassificationSpanDropDataset(dataset, dropper)
        self.keep_dataset(split, dataset, is_train)
        return dataset

    def build_model(self, cfg, from_checkpoint=False):
        check_head_name("--classification-head-name", self.cfg.classification_head_name)
        model = super().build_model(cfg, from_checkpoint)
        if model.max_positions() < self.meta["max_seq_length"]:
            raise UsageError(f"{self.cfg.data}: prepared with --max-seq-length {self.meta['max_seq_length']}, "
                             f"but the model has {model.max_positions()} positions")
        model.register_classification_head(self.cfg.classification_head_name, num_classes=self.num_classes)
        if not from_checkpoint and not self.regression:
            path, resumed = run_resumed_checkpoint(cfg)
            match_saved_head_labels(model, path, "classification_heads", self.cfg.classification_head_name, self.labels, resumed)
        return model

    def max_positions(self):
        return self.meta["max_seq_length"]
