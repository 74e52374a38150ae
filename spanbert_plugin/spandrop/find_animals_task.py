"""The ``find_animals`` task (SPEC §2.1): synthetic data generated from seeds, SpanDrop on the letters.

Train with fairseq's ``sentence_prediction`` criterion on a small ``spanbert``
classifier; the ``valid`` split is the held-out test set (position bias never
applies to it), so fairseq's validation accuracy gives the test error.
"""
import logging
from dataclasses import dataclass, field

import numpy as np
from fairseq.data import SortDataset, data_utils
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from ..core.dictionary import SpanBertDictionary
from .find_animals_data import DEFAULT_ANIMALS, LETTERS, POSITION_BIASES, FindAnimalsDataset, generate, parse_animals
from .sampler import SpanDropOptions, apply_span_drop
from ..core.errors import UsageError
from ..core.precision import SharedTrainingConfig
from ..core.tasks import OneDictionaryTask, check_head_name

logger = logging.getLogger(__name__)


@dataclass
class FindAnimalsConfig(SharedTrainingConfig, SpanDropOptions):
    train_size: int = field(default=1000, metadata={"help": "training examples"})
    test_size: int = field(default=10000, metadata={"help": "held-out examples (the valid split)"})
    seq_len: int = field(default=300, metadata={"help": "letters per string (n)"})
    animals: str = field(default=",".join(DEFAULT_ANIMALS), metadata={"help": "comma-separated animal names"})
    positive_ratio: float = field(default=0.5, metadata={"help": "share of positive examples"})
    position_bias: ChoiceEnum(POSITION_BIASES) = field(
        default="uniform", metadata={"help": "where training positives hold the letters: uniform, fixed (10, 110, 210), first100"}
    )
    data_seed: int = field(default=1, metadata={"help": "seed of the generated training data (the test set has its own)"})
    classification_head_name: str = field(default="sentence_classification_head", metadata={"help": "head to train"})
    seed: int = II("common.seed")


@register_task("find_animals", dataclass=FindAnimalsConfig)
class FindAnimalsTask(OneDictionaryTask, FairseqTask):
    """Binary classification: does the animal occur in the letters as a subsequence?"""

    cfg: FindAnimalsConfig

    def __init__(self, cfg, dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.animals = parse_animals(cfg.animals, cfg.seq_len)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        symbols = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(LETTERS)
        return cls(cfg, SpanBertDictionary(symbols))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        train = split == "train"  # the data: the training distribution's examples, else the held-out test set's
        training = self.loads_training_form(split, kwargs)  # SpanDrop: fairseq-train's training load only
        rng = np.random.default_rng((self.cfg.data_seed, 0 if train else 1))
        size = self.cfg.train_size if train else self.cfg.test_size
        bias = str(self.cfg.position_bias) if train else "uniform"
        dataset = FindAnimalsDataset(self.dictionary, self.animals,
                                     *generate(size, self.cfg.seq_len, self.animals, self.cfg.positive_ratio, bias, rng))
        logger.info(f"find_animals {split}: {size} examples, {dataset.labels.mean():.1%} positive, position bias {bias}")
        sizes = dataset.sizes
        if training:
            dataset = apply_span_drop(dataset, self.cfg, self.dictionary, self.cfg.seed)
        # the order an uninterrupted run gets (it loads the data once, in epoch 1), also when a resumed
        # run loads it in a later epoch: keyed by the seed alone, so resuming is bit-identical
        with data_utils.numpy_seed(self.cfg.seed + 1):
            shuffle = np.random.permutation(len(dataset))
        self.keep_dataset(split, SortDataset(dataset, sort_order=[shuffle, sizes]), training)

    def build_model(self, cfg, from_checkpoint=False):
        check_head_name("--classification-head-name", self.cfg.classification_head_name)
        model = super().build_model(cfg, from_checkpoint)
        model_positions = getattr(model, "max_positions", lambda: None)()
        if model_positions is not None and self.max_positions() > model_positions:
            raise UsageError(
                f"find_animals items are up to {self.max_positions()} tokens ([CLS] animal [SEP] {self.cfg.seq_len} letters "
                f"[SEP]) but the model has {model_positions} positions: raise --max-positions or lower --seq-len"
            )
        model.register_classification_head(self.cfg.classification_head_name, num_classes=2)
        return model

    def max_positions(self):
        return self.cfg.seq_len + max(len(a) for a in self.animals) + 3

    @property
    def label_dictionary(self):
        """Labels are 0 (absent) and 1 (present); fairseq's sentence_prediction asks for this."""
        return None
