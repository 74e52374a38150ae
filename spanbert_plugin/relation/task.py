"""The ``relation_extraction`` task: TACRED-style fine-tuning on ``spanbert-prepare-re`` data.

The model gets a relation head over [CLS] (``--re-pooling cls``, SpanBERT's
setting) or over the subject and object start markers (``entity_start``). A
checkpoint pre-trained here or imported with ``spanbert-import-hf`` is loaded
with ``--finetune-from-model``; marker symbols appended to the dictionary grow
its embeddings on load. Validation reports micro precision/recall/F1 over all
relations but the negative label, from counts summed over the whole split.
"""
import logging
import os
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..core.dictionary import SpanBertDictionary
from ..spandrop.finetune import FinetuneSpanDropConfig, span_dropper
from .span_drop import relation_span_drop
from .dataset import RelationDataset
from ..core.errors import UsageError
from ..core.precision import SharedTrainingConfig
from ..core.tasks import OneDictionaryTask, prepared_data_folder, check_head_name, load_data_dictionary
from ..core.checkpoint_loading import match_saved_head_labels, run_resumed_checkpoint
from ..model.relation_head import RE_POOLINGS
from .prepare import load_re_meta
from ..addrop.task_mixin import ADDropConfig, ADDropMixin

logger = logging.getLogger(__name__)
# what a relation checkpoint records of the folder it was trained on (re_meta.json's keys)
TRAINED_ON = ("labels", "negative_label", "entity_marker", "markers")


@dataclass
class RelationExtractionConfig(SharedTrainingConfig, ADDropConfig, FinetuneSpanDropConfig):
    data: str = field(default="", metadata={"help": "spanbert-prepare-re output folder"})
    re_pooling: ChoiceEnum(RE_POOLINGS) = field(
        default="cls",
        metadata={"help": "cls: classify from [CLS] (SpanBERT); entity_start: from the subject and object start "
                  "markers' outputs, concatenated"},
    )
    relation_head_name: str = field(default="relation_head", metadata={"help": "name of the relation head"})
    seed: int = II("common.seed")


@register_task("relation_extraction", dataclass=RelationExtractionConfig)
class RelationExtractionTask(ADDropMixin, OneDictionaryTask, FairseqTask):
    """Relation classification of a marked subject/object pair (SPEC §1.4)."""

    criteria = ("relation_extraction",)

    cfg: RelationExtractionConfig

    def __init__(self, cfg: RelationExtractionConfig, dictionary: SpanBertDictionary, meta: dict):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.meta = meta
        self.labels = list(meta["labels"])
        self.negative_index = self.labels.index(meta["negative_label"])
        # saved in checkpoints: prediction refuses data prepared otherwise, fine-tuning maps the head's rows by name
        self.state.merge_state_dict({key: meta[key] for key in TRAINED_ON})

    @classmethod
    def setup_task(cls, cfg: RelationExtractionConfig, **kwargs):
        data = prepared_data_folder(cfg, "relation_extraction", "spanbert-prepare-re")
        meta = load_re_meta(data)
        dictionary = load_data_dictionary(data)
        logger.info(f"{cfg.data}: {len(meta['labels'])} labels, {meta['entity_marker']} markers, "
                    f"{len(dictionary)} symbols")
        return cls(cfg, dictionary, meta)

    def build_model(self, cfg, from_checkpoint=False):
        check_head_name("--relation-head-name", self.cfg.relation_head_name)
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "register_relation_head"):
            raise UsageError(f"relation_extraction needs a spanbert model (--arch spanbert_*), got {type(model).__name__}")
        model.register_relation_head(self.cfg.relation_head_name, len(self.labels), str(self.cfg.re_pooling))
        if not from_checkpoint:
            path, resumed = run_resumed_checkpoint(cfg)
            match_saved_head_labels(model, path, "relation_heads", self.cfg.relation_head_name, self.labels, resumed)
        if self.meta["max_seq_length"] > model.max_positions():
            raise UsageError(
                f"{self.cfg.data}: examples of up to {self.meta['max_seq_length']} tokens exceed the model's "
                f"{model.max_positions()} positions; prepare the data again with a smaller --max-seq-length"
            )
        return model

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        is_train = self.loads_training_form(split, kwargs)
        dropper = span_dropper(self.cfg, self.dictionary, self.cfg.data, self.cfg.seed) if is_train else None
        transform = relation_span_drop(dropper, self.meta, self.cfg.data, split) if dropper is not None else None
        dataset = RelationDataset.load(self.cfg.data, split, self.dictionary, shuffle=is_train, seed=self.cfg.seed,
                                       transform=transform)
        logger.info(f"{os.path.join(self.cfg.data, split)}: {len(dataset)} examples")
        self.keep_dataset(split, dataset, is_train)

    def max_positions(self):
        return int(self.meta["max_seq_length"])
