"""The ``coreference`` task: c2f-coref fine-tuning on ``spanbert-prepare-coref`` data, one document per batch.

The model gets a ``CorefHead``; a checkpoint pre-trained here or imported with
``spanbert-import-hf`` is loaded with ``--finetune-from-model``. Batches always
hold one whole document (``--batch-size``/``--max-tokens`` are ignored; use
``--update-freq`` to accumulate documents). Validation logs MUC, B-cubed, CEAF-e,
CEAF-m, BLANC and LEA precision/recall/F1 and ``conll_f1`` from counts summed over the split.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..core.datasets import refuse_token_ids_beyond
from ..core.dictionary import SpanBertDictionary
from ..spandrop.sampler import SpanDropSampling, check_span_drop_args
from ..core.errors import UsageError
from ..core.precision import SharedTrainingConfig
from ..core.tasks import OneDictionaryTask, prepared_data_folder, record_in_run_config, load_data_dictionary
from .conll import GENRES
from .dataset import CorefDataset
from .head import CorefHead
from .prediction_modes import (DEFAULT_ENTITY_CACHE_SIZE, DEFAULT_EXACT_MAX_WORDS, DEFAULT_MAX_ANTECEDENT_DISTANCE,
                            PREDICTION_MODES)
from .metrics import CONVENTIONS
from .prepare import COMMAND, data_has_singletons, load_coref_meta

logger = logging.getLogger(__name__)
# the task state's key (saved in checkpoints) for the genres of the training documents
TRAINED_GENRES = "trained_genres"


@dataclass
class CoreferenceConfig(SharedTrainingConfig, SpanDropSampling):
    data: str = field(default="", metadata={"help": "spanbert-prepare-coref output folder"})
    max_span_width: int = field(default=30, metadata={"help": "widest candidate span, in tokens"})
    top_span_ratio: float = field(default=0.4, metadata={"help": "spans kept after mention scoring, per word"})
    max_top_antecedents: int = field(default=50, metadata={"help": "antecedents per span kept by the coarse scores"})
    coref_depth: int = field(default=1, metadata={"help": "rounds of higher-order span refinement (0: none)"})
    coref_ffnn_size: int = field(default=3000, metadata={"help": "hidden size of the mention and pair scorers"})
    coref_feature_size: int = field(default=20, metadata={"help": "size of width, distance, speaker, genre embeddings"})
    coref_dropout: float = field(default=0.3, metadata={"help": "dropout in the coreference head"})
    max_training_segments: int = field(
        default=0, metadata={"help": "train on a random run of this many consecutive segments of each document "
                             "(c2f-coref's max_training_sentences, e.g. 3 with 384-token segments); "
                             "0: whole documents"})
    mention_loss_weight: Optional[float] = field(
        default=None, metadata={"help": "weight of the mention loss (binary cross-entropy of every candidate span's "
                                "mention score against 'is a gold mention'), added to the antecedent loss; default: "
                                "1 when the training data holds singletons (prepare_stats.json), else 0"})
    singleton_threshold: float = field(
        default=0.5, metadata={"help": "a kept span with no antecedent becomes a one-mention cluster when its mention "
                               "probability is above this"})
    no_singletons: Optional[bool] = field(
        default=None, metadata={"help": "predict no one-mention clusters (the OntoNotes convention); default: when "
                                "the training data holds none (prepare_stats.json), so that the predictions follow "
                                "its convention"})
    scoring_convention: ChoiceEnum(("auto",) + CONVENTIONS) = field(
        default="auto", metadata={"help": "which scores conll_f1 (and so checkpoint_best) reports: with_singletons "
                                  "(LitBank, PreCo, GUM), without_singletons (OntoNotes: one-mention clusters "
                                  "removed from key and response); auto: with_singletons when the data holds "
                                  "singletons. Validation logs both"})
    coref_prediction: ChoiceEnum(PREDICTION_MODES) = field(
        default="auto", metadata={"help": "exact: the whole document through the head at once (memory and time grow "
                                  "faster than its length); bounded: block by block in bounded memory, antecedents "
                                  "within --max-antecedent-distance words or an entity's latest mention; auto: "
                                  "bounded for documents longer than --exact-prediction-max-words"})
    exact_prediction_max_words: int = field(
        default=DEFAULT_EXACT_MAX_WORDS, metadata={"help": "with --coref-prediction auto, the longest document "
                                                   "predicted exactly (about 2 GB of memory on a CPU)"})
    max_antecedent_distance: int = field(
        default=DEFAULT_MAX_ANTECEDENT_DISTANCE, metadata={"help": "bounded prediction: words from an antecedent's "
                                                           "first word to the span's, beyond which only an entity's "
                                                           "latest mention is a candidate"})
    entity_cache_size: int = field(
        default=DEFAULT_ENTITY_CACHE_SIZE, metadata={"help": "bounded prediction: entities (clusters and likely "
                                                     "one-mention ones) whose latest mention stays a candidate past "
                                                     "--max-antecedent-distance; the least recently mentioned go first"})
    span_drop_unit: ChoiceEnum(("sentence", "token")) = field(
        default="sentence", metadata={"help": "SpanDrop unit: whole sentences or words holding no gold mention"})
    seed: int = II("common.seed")


@register_task("coreference", dataclass=CoreferenceConfig)
class CoreferenceTask(OneDictionaryTask, FairseqTask):
    """Coreference resolution with the c2f-coref head over independent segments (SPEC section 1.4)."""

    criteria = ("coreference",)
    cfg: CoreferenceConfig

    def __init__(self, cfg: CoreferenceConfig, dictionary: SpanBertDictionary, meta: dict):
        super().__init__(cfg)
        self.dictionary, self.meta = dictionary, meta

    @classmethod
    def setup_task(cls, cfg: CoreferenceConfig, **kwargs):
        data = prepared_data_folder(cfg, "coreference", COMMAND)
        meta = load_coref_meta(data)
        check_span_drop_args(cfg.span_drop_p, cfg.span_drop_gamma)
        for name in ("max_span_width", "max_top_antecedents", "coref_ffnn_size", "coref_feature_size"):
            if getattr(cfg, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
        if not 0 < cfg.top_span_ratio <= 1:
            raise UsageError(f"--top-span-ratio must be in (0, 1], got {cfg.top_span_ratio}")
        if cfg.max_training_segments < 0:
            raise UsageError(f"--max-training-segments must be at least 0, got {cfg.max_training_segments}")
        if cfg.coref_depth < 0:
            raise UsageError(f"--coref-depth must be at least 0, got {cfg.coref_depth}")
        if not 0 <= cfg.coref_dropout < 1:
            raise UsageError(f"--coref-dropout must be in [0, 1), got {cfg.coref_dropout}")
        if not 0 < cfg.singleton_threshold < 1:
            raise UsageError(f"--singleton-threshold must be in (0, 1), got {cfg.singleton_threshold}")
        for name in ("exact_prediction_max_words", "max_antecedent_distance", "entity_cache_size"):
            if getattr(cfg, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
        if cfg.mention_loss_weight is not None and not cfg.mention_loss_weight >= 0:
            raise UsageError(f"--mention-loss-weight must be at least 0, got {cfg.mention_loss_weight}")
        singletons = data_has_singletons(data, meta)
        if cfg.mention_loss_weight is None:
            cfg.mention_loss_weight = 1.0 if singletons else 0.0
        if cfg.scoring_convention == "auto":
            cfg.scoring_convention = CONVENTIONS[0] if singletons else CONVENTIONS[1]
        if cfg.no_singletons is None:
            cfg.no_singletons = not singletons
        record_in_run_config(cfg)  # the resolved defaults go into the checkpoint
        dictionary = load_data_dictionary(data)
        logger.info(f"{data}: segments of up to {meta['max_segment_length']} tokens, {len(dictionary)} symbols")
        return cls(cfg, dictionary, meta)

    def build_coref_head(self, hidden: int) -> CorefHead:
        c = self.cfg
        return CorefHead(hidden, c.coref_ffnn_size, c.max_span_width, c.coref_feature_size, len(GENRES),
                         c.coref_depth, c.coref_dropout, c.top_span_ratio, c.max_top_antecedents,
                         c.mention_loss_weight or 0.0, c.max_training_segments)

    @property
    def singleton_threshold(self) -> Optional[float]:
        """The threshold predictions use for one-mention clusters; None with --no-singletons."""
        return None if self.cfg.no_singletons else self.cfg.singleton_threshold

    @property
    def scoring_convention(self) -> str:
        return str(self.cfg.scoring_convention)

    def build_model(self, cfg, from_checkpoint=False):
        from fairseq.models import ARCH_MODEL_REGISTRY

        def refuse_other_models(model_class):
            if not hasattr(model_class, "register_coref_head"):
                raise UsageError(f"coreference needs a spanbert model (--arch spanbert_*), got {model_class.__name__}")

        # before building: another model may need the task's max_positions(), which is None here (whole documents)
        model_class = ARCH_MODEL_REGISTRY.get(getattr(cfg, "_name", None) or getattr(cfg, "arch", None))
        if model_class is not None:
            refuse_other_models(model_class)
        model = super().build_model(cfg, from_checkpoint)
        refuse_other_models(type(model))  # an architecture the registry did not name
        if self.meta["max_segment_length"] > model.max_positions():
            raise UsageError(f"{self.cfg.data}: segments of up to {self.meta['max_segment_length']} tokens exceed the "
                             f"model's {model.max_positions()} positions; prepare again with a smaller "
                             "--max-segment-length")
        model.register_coref_head(self.build_coref_head(model.cfg.encoder_embed_dim))
        return model

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        is_train = self.loads_training_form(split, kwargs)
        span_drop = None
        if is_train and self.cfg.span_drop_p > 0:
            span_drop = (self.cfg.span_drop_p, self.cfg.span_drop_gamma, str(self.cfg.span_drop_unit),
                         str(self.cfg.span_drop_mode))
        mask = self.dictionary.mask_index  # [MASK] or <mask>, as the tokenizer spells it
        if span_drop is not None and span_drop[3] == "mask" and mask is None:
            raise UsageError("--span-drop-mode mask: the dictionary has no mask symbol")
        try:
            dataset = CorefDataset.load(self.cfg.data, split, self.dictionary.pad(), shuffle=is_train,
                                        seed=self.cfg.seed, span_drop=span_drop, mask_index=mask,
                                        max_segments=self.cfg.max_training_segments if is_train else 0)
        except FileNotFoundError:
            raise UsageError(f"{os.path.join(self.cfg.data, split)}.npz: no such file (split {split!r} was not "
                             f"prepared in {self.cfg.data})") from None
        if len(dataset.arrays["tokens"]):  # the embedding lookup would fail mid-step
            refuse_token_ids_beyond(os.path.join(self.cfg.data, split) + ".npz", int(dataset.arrays["tokens"].max()),
                                    self.dictionary)
        logger.info(f"{os.path.join(self.cfg.data, split)}: {len(dataset)} documents")
        if is_train:  # saved with every checkpoint: raw text is predicted under a genre whose embedding trained
            self.state.merge_state_dict({TRAINED_GENRES: [GENRES[g] for g in sorted(set(dataset.arrays["doc_genre"].tolist()))]})
        self.keep_dataset(split, dataset, is_train)

    def raw_text_genre(self) -> str:
        """The genre raw text is predicted under: ``other`` (LitBank, any data of unknown genre) when training saw
        it or the checkpoint does not say; else newswire, as SpanBERT's example, or the first genre trained (an
        OntoNotes checkpoint never trains the ``other`` row: its embedding would stay as initialised)."""
        trained = self.state.state_dict.get(TRAINED_GENRES)
        if not trained or "other" in trained:
            return "other"
        return "nw" if "nw" in trained else trained[0]

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, **kwargs):
        """One document per batch, whatever --batch-size / --max-tokens say; no document is ever filtered out."""
        return super().get_batch_iterator(dataset, max_tokens=None, max_sentences=1, max_positions=None,
                                          ignore_invalid_inputs=False, required_batch_size_multiple=1, **kwargs)

    def max_positions(self):
        return None
