"""AD-DROP options and training step for the fine-tuning tasks (SPEC §3).

A fine-tuning task adds the options by deriving its config from ``ADDropConfig``
and the behaviour by listing ``ADDropMixin`` before ``FairseqTask`` among its
bases. Its criterion provides ``ad_drop_objective(model, sample)``, the scalar
whose gradient with respect to the attention probabilities is the attribution.

On an AD-DROP step: (1) a forward pass without masks materialises the attention
probabilities of the chosen layers; (2) the attribution is the gradient of the
criterion's pseudo-label scalar with respect to them (``torch.autograd.grad``:
no parameter gradient), the probabilities themselves (``attention``) or random
(``random``); (3) ``addrop.attribution.drop_masks`` turns it into drop masks; (4) the usual
training step runs with those masks and the gold labels. That first pass runs
in training mode (dropout on), as in the authors' code.

Cross-tuning: the authors count epochs from 0 and apply AD-DROP on odd epochs
(the first epoch plain). fairseq counts epochs from 1, so AD-DROP runs on even
fairseq epochs (2, 4, ...) and epochs 1, 3, ... are plain; the epoch comes from
``begin_epoch``, which fairseq also calls after resuming from a checkpoint.
"""
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from ..core.errors import UsageError
from ..core.metrics import log_mean, total
from ..core.precision import amp_autocast
from ..core.tasks import register_options_check
from .attribution import ATTRIBUTIONS, drop_counts, drop_masks, mask_generator


@dataclass
class ADDropConfig(FairseqDataclass):
    """Task options for AD-DROP (``--ad-drop-*``)."""

    ad_drop_p: float = field(
        default=0.0, metadata={"help": "AD-DROP: share of each attention row's real keys that are drop candidates "
                                       "(highest attribution; ceil(p x keys)); 0: off"}
    )
    ad_drop_q: float = field(default=0.5, metadata={"help": "AD-DROP: probability that a candidate is dropped"})
    ad_drop_layers: str = field(
        default="0", metadata={"help": "AD-DROP: comma-separated encoder layer indices (from 0), or 'all'"}
    )
    ad_drop_attribution: ChoiceEnum(ATTRIBUTIONS) = field(
        default="gradient", metadata={"help": "AD-DROP candidates by gradient attribution (AD-DROP), attention "
                                              "weights (AA baseline) or at random (RD baseline)"}
    )
    ad_drop_every_epoch: bool = field(
        default=False, metadata={"help": "AD-DROP on every epoch (default: cross-tuning, AD-DROP on even epochs 2, 4, ...)"}
    )
    seed: int = II("common.seed")


def check_ad_drop_options(cfg) -> None:
    """UsageError for p or q outside [0, 1] or a malformed ``--ad-drop-layers``."""
    for flag, value in (("--ad-drop-p", cfg.ad_drop_p), ("--ad-drop-q", cfg.ad_drop_q)):
        if not 0.0 <= value <= 1.0:
            raise UsageError(f"{flag} {value}: expected a probability in [0, 1]")
    parse_layers(cfg.ad_drop_layers, None)


@register_options_check
def ad_drop_options_while_off(options):
    if options.get("ad_drop_p") == 0:
        return [(("ad_drop_q", "ad_drop_layers", "ad_drop_attribution", "ad_drop_every_epoch"),
                 "since AD-DROP is off (--ad-drop-p 0)")]
    return []


def parse_layers(spec: str, num_layers):
    """Sorted layer indices of ``--ad-drop-layers`` ('all' or '0,2'); checked against ``num_layers`` when given."""
    text = str(spec).strip()
    if text == "all":
        if num_layers is None:
            return []
        return list(range(num_layers))
    try:
        layers = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise UsageError(f"--ad-drop-layers {spec!r}: expected comma-separated layer indices (from 0) or 'all'") from None
    bad = [i for i in layers if i < 0 or (num_layers is not None and i >= num_layers)]
    if bad:
        have = f"the model has layers 0-{num_layers - 1}" if num_layers else "indices count from 0"
        raise UsageError(f"--ad-drop-layers {spec!r}: no layer {bad[0]}; {have}")
    return layers


def is_ad_drop_epoch(epoch: int, every_epoch: bool) -> bool:
    """Cross-tuning: AD-DROP on even fairseq epochs (the authors' odd epochs counted from 0), or every epoch."""
    return bool(every_epoch) or epoch % 2 == 0


def _data_parallel_rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


class ADDropMixin:
    """AD-DROP for a fine-tuning task: ``class MyTask(ADDropMixin, FairseqTask)`` with a config derived from ADDropConfig."""

    def __init__(self, cfg, *args, **kwargs):
        check_ad_drop_options(cfg)
        super().__init__(cfg, *args, **kwargs)
        self.ad_drop_epoch = 1
        self.ad_drop_layers = None  # checked against the model in build_model
        self._micro_batch = (None, 0)  # (update, micro-batches seen): distinct masks under --update-freq

    @property
    def ad_drop_enabled(self) -> bool:
        return self.cfg.ad_drop_p > 0 and self.cfg.ad_drop_q > 0

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if self.ad_drop_enabled:
            if not hasattr(getattr(getattr(model, "encoder", None), "encoder", None), "layer"):
                raise UsageError(f"AD-DROP (--ad-drop-p) needs a spanbert model, got {type(model).__name__}")
            self.selected_layers(model)
        return model

    def build_criterion(self, cfg, from_checkpoint=False):
        criterion = super().build_criterion(cfg, from_checkpoint)
        if self.ad_drop_enabled and self.cfg.ad_drop_attribution != "random" and not hasattr(criterion, "ad_drop_objective"):
            raise UsageError(
                f"--ad-drop-attribution {self.cfg.ad_drop_attribution}: criterion {type(criterion).__name__} has no "
                "ad_drop_objective; use the task's own criterion"
            )
        return criterion

    def begin_epoch(self, epoch, model):
        super().begin_epoch(epoch, model)
        self.ad_drop_epoch = epoch

    def selected_layers(self, model):
        """The ``--ad-drop-layers`` indices, checked against ``model`` (once)."""
        if self.ad_drop_layers is None:
            self.ad_drop_layers = parse_layers(self.cfg.ad_drop_layers, len(model.encoder.encoder.layer))
        return self.ad_drop_layers

    def ad_drop_active(self) -> bool:
        """Whether this epoch's training steps use AD-DROP."""
        return self.ad_drop_enabled and is_ad_drop_epoch(self.ad_drop_epoch, self.cfg.ad_drop_every_epoch)

    def ad_drop_masks(self, sample, model, criterion, update_num, optimizer=None):
        """{layer: B x heads x T x T drop mask} for ``sample``, reproducible from (seed, epoch, update, micro-batch)."""
        layers = self.selected_layers(model)
        update, seen = self._micro_batch
        seen = seen + 1 if update == update_num else 0
        self._micro_batch = (update_num, seen)
        tokens = sample["net_input"]["src_tokens"]
        padding = tokens.eq(model.encoder.padding_idx)
        attribution = str(self.cfg.ad_drop_attribution)
        probs = {layer: None for layer in layers}
        if attribution != "random":
            first_pass = dict(sample, net_input=dict(sample["net_input"], attention_probs_out=probs))
            while hasattr(model, "module"):  # outside DDP: this pass must not start a gradient all-reduce
                model = model.module
            with amp_autocast(optimizer), self.forward_precision(model):
                with torch.set_grad_enabled(attribution == "gradient"):
                    objective = criterion.ad_drop_objective(model, first_pass)
            if attribution == "gradient":
                grads = torch.autograd.grad(objective, [probs[layer] for layer in layers])
                probs = dict(zip(layers, grads))
        heads = model.encoder.encoder.layer[0].heads
        generator = mask_generator(tokens.device, self.cfg.seed, self.ad_drop_epoch, update_num, seen,
                                   _data_parallel_rank())
        shape = (tokens.size(0), heads, tokens.size(1), tokens.size(1))
        return drop_masks(probs, padding, self.cfg.ad_drop_p, self.cfg.ad_drop_q, generator, shape)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if not self.ad_drop_enabled:
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        masks = {}
        if self.ad_drop_active():
            model.train()
            masks = self.ad_drop_masks(sample, model, criterion, update_num, optimizer)
            sample = dict(sample, net_input=dict(sample["net_input"], attention_drop_masks=masks))
        loss, sample_size, logging_output = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        padding = sample["net_input"]["src_tokens"].eq(model.encoder.padding_idx)
        # plain (cross-tuning) steps log a rate of 0 rather than nothing
        logging_output["ad_drop_dropped"], logging_output["ad_drop_entries"] = drop_counts(
            masks.values(), padding, model.encoder.encoder.layer[0].heads * len(self.selected_layers(model))
        )
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        if any("ad_drop_entries" in log for log in logging_outputs):
            # share of real (query, key) attention entries dropped in the chosen layers: about p x q
            log_mean("ad_drop_rate", total(logging_outputs, "ad_drop_dropped"),
                     total(logging_outputs, "ad_drop_entries"), round=4)
