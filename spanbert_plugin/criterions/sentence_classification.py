"""The ``sentence_classification`` criterion: cross-entropy (or MSE) with GLUE metrics exact over a split.

Classification logs the K x K confusion matrix of every batch; it is summed
across workers and batches (a ``SumMeter``), and accuracy, F1 (binary) or
macro F1, and MCC are derived from the total, so the validation figures are
those of the whole split, not averages of per-batch values. Regression needs
every (prediction, target) pair for Spearman's rank correlation: in
validation only, the criterion returns them per example and declares its
logging outputs not summable, so fairseq gathers them from all workers
(``all_gather_list``) instead of summing; a concatenating meter collects them
over the split. fairseq's ``sentence_prediction`` criterion computes these
metrics with lists of predictions while declaring its outputs summable, which
breaks with several workers.
"""
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..evaluation.classification import classification_metrics, regression_metrics
from ..modules.ad_drop import pseudo_label_logit_sum

REGRESSION_METRICS = ("pearson", "spearman")


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

    def ad_drop_objective(self, model, sample):
        """AD-DROP attribution scalar: the summed logits of the predicted classes; for regression the loss."""
        if self.regression:
            return self(model, sample)[0]
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
                logging_output["predictions"] = predictions.detach().cpu().numpy()
                logging_output["targets"] = targets.detach().float().cpu().numpy()
        else:
            lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
            loss = F.nll_loss(lprobs, targets, reduction="sum")
            k = self.num_classes
            cells = targets * k + logits.detach().argmax(dim=-1)
            logging_output["confusion"] = torch.bincount(cells, minlength=k * k).view(k, k)
        logging_output["loss"] = loss.detach()
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        """Loss per example; confusion counts and regression pairs accumulated for exact split metrics."""
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        confusions = [log["confusion"] for log in logging_outputs if "confusion" in log]
        if confusions:
            metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size, round=3)
            confusion = sum(c.double().cpu() for c in confusions)
            metrics.log_scalar_sum("_confusion", confusion)
            f1 = "f1" if len(confusion) == 2 else "macro_f1"
            for name in ("accuracy", f1, "mcc"):
                metrics.log_derived(name, _classification_metric(name))
            return
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1), sample_size, round=4)  # mean squared error
        predictions = [log["predictions"] for log in logging_outputs if "predictions" in log]
        if predictions:
            metrics.log_concat_tensor("_predictions", torch.from_numpy(np.concatenate(predictions)).double())
            targets = [log["targets"] for log in logging_outputs if "targets" in log]
            metrics.log_concat_tensor("_targets", torch.from_numpy(np.concatenate(targets)).double())
            for name in REGRESSION_METRICS:
                metrics.log_derived(name, _regression_metric(name))

    def logging_outputs_can_be_summed(self) -> bool:
        """Not in regression validation: per-example pairs are gathered from workers, not summed."""
        return self.training or not self.regression


def _classification_metric(name):
    def derive(meters):
        return round(classification_metrics(meters["_confusion"].sum.numpy())[name], 2)

    return derive


def _regression_metric(name):
    def derive(meters):
        pairs = meters["_predictions"].tensor.numpy(), meters["_targets"].tensor.numpy()
        return round(regression_metrics(*pairs)[name], 2)

    return derive
