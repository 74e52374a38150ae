"""The ``coreference`` criterion: c2f-coref's marginal log-likelihood (+ the mention loss), and exact CoNLL metric
counts at validation under both scoring conventions.

Validation logs the scores of the task's convention under their plain names
(``muc_f1`` ... ``conll_f1``, ``ceafm_f1``, ``blanc_f1``, ``lea_f1``, ``mentions_f1``; ``conll_f1`` picks
checkpoint_best) and
the other convention's with its name in front (``without_singletons_conll_f1``).
"""
import logging

import torch
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..core.metrics import BITS, log_mean, log_scalar_sum, total
from .head import predicted_clusters
from .long_document import bounded_notice, bounded_prediction, predicts_bounded
from .metrics import CONVENTIONS, COUNT_KEYS, SCORED, convention_counts, coref_scores

logger = logging.getLogger(__name__)


def gold_clusters(gold: torch.Tensor):
    """Word-span clusters from rows (start, end, cluster)."""
    clusters = {}
    for start, end, cluster in gold.tolist():
        clusters.setdefault(cluster, []).append((start, end))
    return list(clusters.values())


def coref_outputs(model, sample):
    """The head's output dict for the batch's document."""
    out, _ = model(**sample["net_input"], coref=sample["coref"])
    return out


@register_criterion("coreference", dataclass=FairseqDataclass)
class CoreferenceCriterion(FairseqCriterion):
    """Summed loss over a document's top spans (sample_size = documents); validation adds the twelve metric counts."""

    def forward(self, model, sample, reduce=True):
        if not model.training and predicts_bounded(self.task.cfg, sample["coref"]["num_words"]):
            # a document too long for the exact head: its clusters and the head's loss over each block's candidates
            logger.info(bounded_notice(self.task.cfg, sample["coref"]["num_words"]))
            predicted, loss = bounded_prediction(model, self.task.cfg, sample, self.task.singleton_threshold)
            loss = loss if loss is not None else sample["net_input"]["src_tokens"].new_zeros((), dtype=torch.float)
            out = {}
        else:
            out = coref_outputs(model, sample)
            loss, predicted = out["loss"], None
        logging_output = {"loss": loss.detach(), "ntokens": sample["ntokens"], "nsentences": 1, "sample_size": 1}
        if "mention_loss" in out:
            logging_output["mention_loss"] = out["mention_loss"].detach()
        if not model.training:
            if predicted is None:
                predicted = predicted_clusters(out, sample["coref"]["token_word"], self.task.singleton_threshold)
            by_convention = convention_counts(gold_clusters(sample["gold"]), predicted)
            in_use = self.task.scoring_convention
            for convention, counts in by_convention.items():
                prefix = "" if convention == in_use else convention + "_"
                logging_output.update({prefix + key: value for key, value in counts.items()})
        return loss, 1, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        documents = total(logging_outputs, "sample_size")
        # losses stay tensors (read when the meters are); the counts are host numbers already
        log_mean("loss", total(logging_outputs, "loss"), documents, BITS, round=4)
        if any("mention_loss" in log for log in logging_outputs):
            mention_loss = total(logging_outputs, "mention_loss")
            log_mean("mention_loss", mention_loss, documents, BITS, round=4)
        for prefix in ("",) + tuple(c + "_" for c in CONVENTIONS):
            if not any(prefix + COUNT_KEYS[0] in log for log in logging_outputs):
                continue
            for key in COUNT_KEYS:
                log_scalar_sum(prefix + key, float(total(logging_outputs, prefix + key)))
            parts = ("p", "r", "f1") if not prefix else ("f1",)
            names = [f"{m}_{part}" for m in SCORED for part in parts] + ["conll_f1"]
            for name in names:
                metrics.log_derived(prefix + name, lambda meters, name=name, prefix=prefix: round(
                    coref_scores({k: meters[prefix + k].sum for k in COUNT_KEYS})[name], 4))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
