"""The ``coreference`` criterion: c2f-coref's marginal log-likelihood, and exact CoNLL metric counts at validation."""
import math

import torch
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from .head import predicted_clusters
from .metrics import COUNT_KEYS, METRICS, coref_counts, coref_scores


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
        out = coref_outputs(model, sample)
        loss = out["loss"]
        logging_output = {"loss": loss.detach(), "ntokens": sample["ntokens"], "nsentences": 1, "sample_size": 1}
        if not model.training:
            predicted = predicted_clusters(out, sample["coref"]["token_word"])
            logging_output.update(coref_counts(gold_clusters(sample["gold"]), predicted))
        return loss, 1, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(log.get(key, 0) for log in logging_outputs)

        documents = total("sample_size")
        metrics.log_scalar("loss", float(total("loss")) / max(documents, 1) / math.log(2), documents, round=4)
        if not any(COUNT_KEYS[0] in log for log in logging_outputs):
            return
        for key in COUNT_KEYS:
            metrics.log_scalar_sum(key, float(total(key)))
        names = [f"{m}_{part}" for m in METRICS for part in ("p", "r", "f1")] + ["conll_f1"]
        for name in names:
            metrics.log_derived(name, lambda meters, name=name: round(
                coref_scores({k: meters[k].sum for k in COUNT_KEYS})[name], 4))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
