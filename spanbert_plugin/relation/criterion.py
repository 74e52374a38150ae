"""The ``relation_extraction`` criterion: cross-entropy over relation labels, exact P/R/F1 counts."""

import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..core.metrics import BITS, log_mean, log_scalar_sum, total
from .metrics import COUNT_KEYS, relation_counts, relation_scores
from ..addrop.attribution import pseudo_label_logit_sum


def relation_logits(model, sample, head_name: str) -> torch.Tensor:
    """B x labels logits of a batch of the relation_extraction task."""
    logits, _ = model(**sample["net_input"], relation_head_name=head_name)
    return logits


@register_criterion("relation_extraction", dataclass=FairseqDataclass)
class RelationExtractionCriterion(FairseqCriterion):
    """Summed fp32 cross-entropy (sample_size = examples); logs the counts behind precision/recall/F1."""

    def __init__(self, task):
        super().__init__(task)
        self.head_name = task.cfg.relation_head_name
        self.negative_index = task.negative_index

    def ad_drop_objective(self, model, sample):
        """AD-DROP attribution scalar: the summed logits of the predicted relations."""
        return pseudo_label_logit_sum(relation_logits(model, sample, self.head_name))

    def forward(self, model, sample, reduce=True):
        logits = relation_logits(model, sample, self.head_name)
        target = sample["target"]
        loss = F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), target, reduction="sum" if reduce else "none")
        predicted = logits.argmax(dim=-1)
        sample_size = target.numel()
        logging_output = {
            "loss": loss.detach(),
            "ntokens": sample["ntokens"],
            "nsentences": sample_size,
            "sample_size": sample_size,
            **relation_counts(predicted, target, self.negative_index),  # tensors on the device
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        sample_size = total(logging_outputs, "sample_size")
        # in bits, like fairseq's other criteria
        log_mean("loss", total(logging_outputs, "loss"), sample_size, BITS, round=4)
        for key in COUNT_KEYS:
            log_scalar_sum(key, total(logging_outputs, key))
        for name in ("precision", "recall", "f1", "accuracy"):
            # float(): after a multi-worker all-reduce the summed counts are tensors, which round() refuses
            metrics.log_derived(
                name, lambda meters, name=name: round(relation_scores({k: float(meters[k].sum) for k in COUNT_KEYS})[name], 3)
            )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
