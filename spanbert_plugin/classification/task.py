"""The ``sentence_classification`` task: GLUE-style fine-tuning on a spanbert-prepare-classification folder.

The number of classes, the regression flag and the labels come from the
prepared folder (``classification.json``), not from flags. Inputs carry BERT
token types (0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``), which imported BERT
checkpoints rely on. fairseq's ``sentence_prediction`` task does not fit: its
layout (``input0``/``input1``/``label`` with fairseq dictionaries) has no token
types, and its ``build_model`` overwrites the model's position count.
"""
import logging
import os
from dataclasses import dataclass, field

from fairseq.tasks import FairseqTask, register_task
from omegaconf import II, MISSING

from .prepare import read_meta
from .dataset import ClassificationDataset
from ..core.dictionary import SpanBertDictionary
from .span_drop import ClassificationSpanDropDataset
from ..spandrop.finetune import FinetuneSpanDropConfig, span_dropper
from ..core.checkpoint_loading import starting_checkpoint, stored_checkpoint
from ..core.errors import UsageError
from ..core.run_config import run_section
from ..core.precision import SharedTrainingConfig
from ..core.tasks import OneDictionaryTask, prepared_data_folder
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
        dictionary = SpanBertDictionary.load(os.path.join(data, "dict.txt"))
        kind = "regression" if meta["regression"] else f"{meta['num_classes']} classes"
        logger.info(f"sentence_classification: {kind}, {'pairs' if meta['pair'] else 'single texts'}, "
                    f"dictionary of {len(dictionary)} symbols")
        return cls(cfg, dictionary, meta)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        folder = self.cfg.data
        dataset = ClassificationDataset.load(folder, split, self.dictionary, shuffle=split == "train", seed=self.cfg.seed)
        if dataset.regression != self.regression:
            raise UsageError(f"{self.cfg.data}: split {split!r} has {'numeric' if dataset.regression else 'class'} labels, "
                             f"but classification.json says regression={self.regression}")
        logger.info(f"sentence_classification {split}: {len(dataset)} examples")
        dropper = span_dropper(self.cfg, self.dictionary, folder, self.cfg.seed) if split == "train" else None
        if dropper is not None:  # SpanDrop on training data only
            dataset = ClassificationSpanDropDataset(dataset, dropper)
        self.datasets[split] = dataset
        return dataset

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if model.max_positions() < self.meta["max_seq_length"]:
            raise UsageError(f"{self.cfg.data}: prepared with --max-seq-length {self.meta['max_seq_length']}, "
                             f"but the model has {model.max_positions()} positions")
        model.register_classification_head(self.cfg.classification_head_name, num_classes=self.num_classes)
        checkpoint = run_section(cfg, "checkpoint")
        if not from_checkpoint and not self.regression and checkpoint is not None:
            self._match_saved_labels(model, starting_checkpoint(checkpoint))
        return model

    def _match_saved_labels(self, model, path):
        """A checkpoint whose head knows its class names (a fine-tuned or imported classifier) keeps its output rows
        only for these labels: reordered where the names are the same in another order (labels are stored sorted,
        transformers' id2label need not be), left out (fresh) where they differ. A head of another size fairseq's
        loading leaves out itself; names the checkpoint does not record cannot be compared (rows kept in order)."""
        state = stored_checkpoint(path) if path else {}
        task_state, weights = state.get("task_state"), state.get("model")
        saved = task_state.get("labels") if isinstance(task_state, dict) else None
        if not isinstance(saved, list) or saved == self.labels or len(saved) != self.num_classes:
            return
        head = self.cfg.classification_head_name
        if not isinstance(weights, dict) or f"classification_heads.{head}.out_proj.weight" not in weights:
            return  # the checkpoint has no head of this name: nothing of it is loaded
        if sorted(saved) == sorted(self.labels):
            model.map_saved_classification_head(head, [saved.index(label) for label in self.labels])
            logger.info(f"{path}: its classification head's classes {saved} reordered to this data's {self.labels}")
        else:
            model.map_saved_classification_head(head, None)
            logger.warning(f"{path}: its classification head predicts {saved}, this data's labels are {self.labels}: "
                           "the head's output layer starts from fresh weights (name the labels as the checkpoint does "
                           "to keep it)")

    def max_positions(self):
        return self.meta["max_seq_length"]
