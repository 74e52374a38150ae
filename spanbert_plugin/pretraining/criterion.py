"""The ``span_bert`` criterion: MLM + sbo_weight * SBO cross-entropy over masked tokens (SPEC §1.2)."""
from dataclasses import dataclass, field

from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..core.errors import UsageError
from ..core.metrics import BITS, PERCENT, log_mean, log_scalar, total
from .vocab_cross_entropy import vocab_cross_entropy


@dataclass
class SpanBertCriterionConfig(FairseqDataclass):
    sbo_weight: float = field(
        default=1.0, metadata={"help": "weight of the span boundary objective; 0 turns SBO off (ablation)"}
    )


@register_criterion("span_bert", dataclass=SpanBertCriterionConfig)
class SpanBertCriterion(FairseqCriterion):
    """Summed losses over masked tokens; ``sample_size`` = number of masked (MLM target) tokens.

    fairseq divides gradients by ``sample_size`` (summed over workers and
    update_freq), so the losses returned here are sums, not means: the
    optimised objective is the per-masked-token mean of L_MLM + w * L_SBO,
    normalised exactly once.
    """

    def __init__(self, task, sbo_weight=1.0):
        super().__init__(task)
        if sbo_weight < 0:
            raise UsageError(f"--sbo-weight must be >= 0, got {sbo_weight}")
        self.sbo_weight = sbo_weight
        self.padding_idx = task.source_dictionary.pad()

    def forward(self, model, sample, reduce=True):
        """Losses and counts stay tensors in the logging output (fairseq reduces them when it logs): with the
        collater's ``masked_index``/``sbo_index`` nothing here waits for the device."""
        target = sample["target"]
        masked_index = sample.get("masked_index")
        if masked_index is None:  # a batch built elsewhere: select on the device
            masked_index = target.reshape(-1).ne(self.padding_idx).nonzero().squeeze(1)
        use_sbo = self.sbo_weight > 0
        out, _ = model(
            **sample["net_input"],
            masked_index=masked_index,
            span_left=sample["span_left"] if use_sbo else None,
            span_right=sample["span_right"] if use_sbo else None,
            span_offset=sample["span_offset"] if use_sbo else None,
            sbo_index=sample.get("sbo_index") if use_sbo else None,
        )
        targets = target.reshape(-1).index_select(0, masked_index)
        # log-softmax in fp32 (fp16- and bf16-safe), chunk by chunk
        mlm_loss, mlm_correct = vocab_cross_entropy(out["mlm_logits"], targets)
        loss = mlm_loss
        num_masked = targets.numel()
        logging_output = {
            "ntokens": sample["ntokens"],
            "nsentences": sample["nsentences"],
            "sample_size": num_masked,
            "num_masked": num_masked,
            "mlm_loss": mlm_loss.detach(),
            "mlm_correct": mlm_correct,
        }
        if use_sbo:
            sbo_targets = targets.index_select(0, out["sbo_index"])
            sbo_loss, sbo_correct = vocab_cross_entropy(out["sbo_logits"], sbo_targets)
            loss = loss + self.sbo_weight * sbo_loss
            logging_output.update(num_sbo=sbo_targets.numel(), sbo_loss=sbo_loss.detach(), sbo_correct=sbo_correct)
        logging_output["loss"] = loss.detach()
        return loss, num_masked, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        sample_size, num_masked, num_sbo = (total(logging_outputs, key) for key in ("sample_size", "num_masked", "num_sbo"))
        log_scalar("num_masked", num_masked, priority=900, round=0)
        # Batches without a masked token measure nothing: they log no loss (weight-0 values would still set the
        # meters' last value, and a whole validation of them would report a loss of 0 and win checkpoint_best).
        # spanbert_pretraining masks at least one token in every block that has one, and refuses splits without.
        if sample_size:
            # losses logged in base 2, as fairseq's masked_lm does
            log_mean("loss", total(logging_outputs, "loss"), sample_size, BITS, round=3)
        if num_masked:
            log_mean("mlm_loss", total(logging_outputs, "mlm_loss"), num_masked, BITS, round=3)
            log_mean("mlm_acc", total(logging_outputs, "mlm_correct"), num_masked, PERCENT, round=2)
            metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["mlm_loss"].avg))
        if num_sbo:
            log_mean("sbo_loss", total(logging_outputs, "sbo_loss"), num_sbo, BITS, round=3)
            log_mean("sbo_acc", total(logging_outputs, "sbo_correct"), num_sbo, PERCENT, round=2)
            log_scalar("num_sbo", num_sbo, priority=901, round=0)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
