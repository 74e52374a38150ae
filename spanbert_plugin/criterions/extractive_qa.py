"""The ``extractive_qa`` criterion: start/end cross-entropy; EM/F1 over whole questions at validation.

Loss per window: (CE(start) + CE(end)) / 2 over the window's real tokens
(padding masked), log-softmax in fp32. At validation every batch holds whole
questions (see ``ExtractiveQADataset``); the criterion answers them exactly as
``spanbert-predict-qa`` does and logs one record per question, which a meter
accumulates over the split: ``em`` and ``f1`` (SQuAD 2.0 also ``has_ans_f1``,
``no_ans_f1``, ``best_f1``, ``best_f1_thresh``) are exact over the whole split,
across batches and workers.
"""
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging.meters import Meter

from ..modules.ad_drop import pseudo_label_span_objective


@dataclass
class ExtractiveQACriterionConfig(FairseqDataclass):
    n_best: int = field(default=20, metadata={"help": "validation: best start and end positions kept per window"})
    max_answer_length: int = field(default=30, metadata={"help": "validation: longest answer in tokens"})
    null_threshold: float = field(
        default=0.0, metadata={"help": "validation (SQuAD 2.0): answer '' when null score - best span score exceeds this"}
    )


def qa_logits(model, sample):
    """Start and end logits in fp32, padding positions set to the most negative value."""
    (start, end), _ = model(**sample["net_input"], qa=True)
    padding = sample["net_input"]["src_tokens"].eq(model.encoder.padding_idx)
    fill = torch.finfo(torch.float32).min
    return start.float().masked_fill(padding, fill), end.float().masked_fill(padding, fill)


class QARecordsMeter(Meter):
    """Collects per-question records during one validation; summarised at the end."""

    def __init__(self, with_negative=False):
        self.records, self.with_negative = [], with_negative

    def update(self, records, with_negative):
        self.records.append(np.asarray(records, dtype=np.float64).reshape(-1, 6))
        self.with_negative = with_negative

    def reset(self):
        self.records = []

    def state_dict(self):
        return {"records": self.all().tolist(), "with_negative": self.with_negative}

    def load_state_dict(self, state_dict):
        self.records = [np.asarray(state_dict["records"], dtype=np.float64).reshape(-1, 6)]
        self.with_negative = state_dict["with_negative"]

    def all(self):
        return np.concatenate(self.records) if self.records else np.zeros((0, 6))

    def summary(self):
        from ..qa.scoring import summarize

        return summarize(self.all(), self.with_negative)

    @property
    def smoothed_value(self):
        return None  # reported through the derived metrics below


@register_criterion("extractive_qa", dataclass=ExtractiveQACriterionConfig)
class ExtractiveQACriterion(FairseqCriterion):
    """Span extraction: start/end cross-entropy; exact SQuAD metrics at validation."""

    def __init__(self, task, n_best=20, max_answer_length=30, null_threshold=0.0):
        super().__init__(task)
        self.n_best, self.max_answer_length, self.null_threshold = n_best, max_answer_length, null_threshold

    def ad_drop_objective(self, model, sample):
        """AD-DROP attribution scalar: minus the cross-entropy of the predicted start and end positions."""
        return pseudo_label_span_objective(*qa_logits(model, sample))

    def forward(self, model, sample, reduce=True):
        start, end = qa_logits(model, sample)
        loss = (
            F.nll_loss(F.log_softmax(start, dim=-1), sample["start_positions"], reduction="sum")
            + F.nll_loss(F.log_softmax(end, dim=-1), sample["end_positions"], reduction="sum")
        ) / 2
        n = sample["nsentences"]
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"], "nsentences": n, "sample_size": n}
        if not model.training and "qa_split" in sample:
            from ..qa.scoring import AnswerOptions, score_windows

            split = self.task.qa_split(sample["qa_split"])
            options = AnswerOptions(self.n_best, self.max_answer_length, self.null_threshold)
            _, records = score_windows(split, sample["id"].cpu().numpy(), start.detach().cpu().numpy(),
                                       end.detach().cpu().numpy(), options)
            logging_output["qa_records"] = records.tolist()
            logging_output["qa_with_negative"] = split.with_negative
        return loss, n, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = sum(float(log.get("loss", 0)) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / max(sample_size, 1) / np.log(2), sample_size, round=3)
        records = [r for log in logging_outputs for r in log.get("qa_records", [])]
        if any("qa_records" in log for log in logging_outputs):
            with_negative = any(log.get("qa_with_negative", False) for log in logging_outputs)
            _log_to_this_validation(QARecordsMeter, "_qa_records", records, with_negative)
            keys = ["em", "f1"] + (["has_ans_f1", "no_ans_f1", "best_f1", "best_f1_thresh"] if with_negative else [])
            for key in keys:
                metrics.log_derived(key, lambda meters, key=key: _summary_value(meters, key))

    def logging_outputs_can_be_summed(self) -> bool:
        # training logs scalars only; validation logs per-question records, gathered as lists
        return self.training


def _log_to_this_validation(meter_cls, key, *args):
    """Update ``key`` only in the temporary aggregators of the current validation.

    fairseq also keeps a named "valid" aggregator for the whole run and saves it
    in checkpoints; per-question records there would grow with every validation.
    """
    persistent = {id(agg) for agg in getattr(metrics, "_aggregators", {}).values()}
    for agg in metrics.get_active_aggregators():
        if id(agg) in persistent:
            continue
        if key not in agg:
            agg.add_meter(key, meter_cls(), 50)
        agg[key].update(*args)


def _summary_value(meters, key):
    if "_qa_records" not in meters:
        return float("nan")
    value = meters["_qa_records"].summary().get(key)
    return round(float(value), 4) if value is not None else float("nan")
