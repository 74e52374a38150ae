"""The ``sentence_classification`` criterion: cross-entropy (or MSE) with GLUE metrics exact over a split.

Classification logs the K x K confusion matrix of every batch; it is summed
across workers and batches (a ``SumMeter``), and accuracy, F1 (binary) or
macro F1, and MCC are derived from the total, so the validation figures are
those of the whole split, not averages of per-batch values. Regression needs
every (prediction, target) pair for Spearman's rank correlation: in
validation, each batch logs a 3 x N array over the split's N examples
(prediction and target at the example's index, and a count), zero elsewhere.
Every example occurs once in the split, so summing these arrays over batches
and workers is exact and the logging outputs stay summable: fairseq's
gather of non-summable outputs (``all_gather_list``) needs CUDA, and its
``sentence_prediction`` criterion sums lists of predictions across workers.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..core.metrics import BITS, log_mean, log_scalar_sum, log_sum_to_this_validation, total
from .metrics import classification_metrics, regression_metrics
from ..addrop.attribution import pseudo_label_logit_sum

REGRESSION_METRICS = ("pearson", "spearman", "corr")


@dataclass
class SentenceClassificationCriterionConfig(FairseqDataclass):
    pass


def classification_logits(model, sample, head_name):
    """Class logits (B x K), or B x 1 regression outputs, of a batch."""
    logits, _ = model(**sample["net_input"], features_only=True, classification_head_name=head_name)
    return logits


@register_criterion("sentence_classification", dataclass=SentenceClassificationCriterionConfig)
class SentenceClassificationCriterion(FairseqCriterion):
    """Summed cross-entropy (fp32 log-softmax) or squared error; sample_size = number of examples."""

    def __init__(self, cfg, task):
        super().__init__(task)
        self.head_name = task.cfg.classification_head_name
        self.regression = task.regression
        self.num_classes = task.num_classes
        if not self.regression:  # what each example adds to its confusion cell; moved to the device with the criterion
            self.register_buffer("one", torch.ones(1, dtype=torch.long), persistent=False)

    def ad_drop_objective(self, model, sample):
        """AD-DROP attribution scalar: the summed logits of the predicted classes; for regression minus the real loss
        (the authors' STS-B code ranks attention entries by the negated gradient of the loss: high attribution
        supports the prediction, as a logit's gradient does)."""
        if self.regression:
            return -self(model, sample)[0]
        return pseudo_label_logit_sum(classification_logits(model, sample, self.head_name))

    def forward(self, model, sample, reduce=True):
        logits = classification_logits(model, sample, self.head_name)
        targets = sample["target"].view(-1)
        sample_size = targets.numel()
        logging_output = {"ntokens": sample["ntokens"], "nsentences": sample_size, "sample_size": sample_size}
        if self.regression:
            predictions = logits.view(-1).float()
            loss = F.mse_loss(predictions, targets.float(), reduction="sum")
            if not self.training:
                logging_output["regression_pairs"] = pairs_by_index(
                    sample["id"], predictions.detach(), targets.detach(), sample["split_size"])
        else:
            lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
            loss = F.nll_loss(lprobs, targets, reduction="sum")
            k = self.num_classes
            cells = logits.detach().argmax(dim=-1).add_(targets, alpha=k)  # target * k + prediction, one operator
            # counted by index_add_ (deterministic on CUDA under torch.use_deterministic_algorithms), not
            # torch.bincount, whose CUDA kernel reads the input's max and min on the host
            ones = self.one.to(cells.device).expand_as(cells)
            logging_output["confusion"] = cells.new_zeros(k * k).index_add_(0, cells, ones).view(k, k)
        logging_output["loss"] = loss.detach()
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        """Loss per example; confusion counts and regression pairs accumulated for exact split metrics."""
        loss_sum, sample_size = total(logging_outputs, "loss"), total(logging_outputs, "sample_size")
        if any("confusion" in log for log in logging_outputs):
            log_mean("loss", loss_sum, sample_size, BITS, round=3)
            confusion = total(logging_outputs, "confusion")  # counts on the device: read only when metrics are derived
            log_scalar_sum("_confusion", confusion)
            binary = ("f1", "acc_and_f1") if len(confusion) == 2 else ("macro_f1",)
            for name in ("accuracy", *binary, "mcc"):
                metrics.log_derived(name, _classification_metric(name))
            return
        log_mean("loss", loss_sum, sample_size, round=4)  # mean squared error
        pairs = [log["regression_pairs"] for log in logging_outputs if "regression_pairs" in log]
        if pairs:
            log_sum_to_this_validation("_regression_pairs", sum(p.double().cpu() for p in pairs))
            for name in REGRESSION_METRICS:
                metrics.log_derived(name, _regression_metric(name))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def pairs_by_index(ids, predictions, targets, split_size):
    """3 x N float64: prediction, target and 1 at each example's index in the split, 0 elsewhere."""
    pairs = predictions.new_zeros((3, split_size), dtype=torch.float64)
    pairs[0, ids] = predictions.double()
    pairs[1, ids] = targets.double()
    pairs[2, ids] = 1.0
    return pairs


def _classification_metric(name):
    def derive(meters):
        return round(classification_metrics(meters["_confusion"].sum.cpu().numpy())[name], 2)

    return derive


def _regression_metric(name):
    def derive(meters):
        predictions, targets, seen = meters["_regression_pairs"].sum.numpy()
        evaluated = seen > 0  # a split validated with --max-valid-steps covers part of the examples
        return round(regression_metrics(predictions[evaluated] / seen[evaluated], targets[evaluated] / seen[evaluated])[name], 2)

    return derive
