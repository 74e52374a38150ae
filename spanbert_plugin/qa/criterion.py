"""The ``extractive_qa`` criterion: start/end cross-entropy; EM/F1 over whole questions at validation.

Loss per window: (CE(start) + CE(end)) / 2 over the window's real tokens
(padding masked), log-softmax in fp32. At validation every batch holds whole
questions (see ``ExtractiveQADataset``); the criterion answers them exactly as
``spanbert-predict-qa`` does and logs one record per question, placed at the
question's index in an array over the whole split (zero elsewhere): summed over
batches and workers these arrays hold every question once, so ``em`` and ``f1``
(SQuAD 2.0 also ``has_ans_f1``, ``no_ans_f1``, ``best_f1``, ``best_f1_thresh``)
are exact over the whole split, and the logging outputs stay summable (fairseq
gathers non-summable outputs with CUDA tensors only).
"""
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..addrop.attribution import pseudo_label_span_objective
from ..core.errors import UsageError
from ..core.metrics import BITS, log_mean, log_sum_to_this_validation, total


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


# logged where the validation split has unanswerable questions (SQuAD 2.0 rules)
UNANSWERABLE_METRICS = ("has_ans_f1", "no_ans_f1", "best_f1", "best_f1_thresh")


@register_criterion("extractive_qa", dataclass=ExtractiveQACriterionConfig)
class ExtractiveQACriterion(FairseqCriterion):
    """Span extraction: start/end cross-entropy; exact SQuAD metrics at validation."""

    def __init__(self, task, n_best=20, max_answer_length=30, null_threshold=0.0):
        super().__init__(task)
        for flag, value in (("--n-best", n_best), ("--max-answer-length", max_answer_length)):
            if value < 1:  # no answer to validate: postprocess would fail at the first validation
                raise UsageError(f"{flag} must be at least 1, got {value}")
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
            from .scoring import AnswerOptions, score_windows

            split = self.task.qa_split(sample["qa_split"])
            options = AnswerOptions(self.n_best, self.max_answer_length, self.null_threshold)
            _, records = score_windows(split, sample["id"].cpu().numpy(), start.detach().cpu().numpy(),
                                       end.detach().cpu().numpy(), options)
            logging_output["qa_records"] = records_by_question(records, split.num_questions)
            logging_output["qa_with_negative"] = int(split.with_negative)
        return loss, n, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss = total(logging_outputs, "loss")  # a tensor: read when the meters are
        sample_size = total(logging_outputs, "sample_size")
        log_mean("loss", loss, sample_size, BITS, round=3)
        records = [log["qa_records"] for log in logging_outputs if "qa_records" in log]
        if records:
            with_negative = any(log.get("qa_with_negative", 0) for log in logging_outputs)
            log_sum_to_this_validation("_qa_records", sum(torch.as_tensor(r, dtype=torch.float64).cpu() for r in records))
            keys = ["em", "f1"] + (list(UNANSWERABLE_METRICS) if with_negative else [])
            for key in keys:
                metrics.log_derived(key, lambda meters, key=key: _summary_value(meters, key, with_negative))

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def records_by_question(records: np.ndarray, num_questions: int) -> torch.Tensor:
    """[fields, num_questions] float64: a 1 and the record's other values at each scored question's index."""
    table = torch.zeros((records.shape[1], num_questions), dtype=torch.float64)
    index = torch.as_tensor(records[:, 0], dtype=torch.long)
    table[0, index] = 1.0
    table[1:, index] = torch.as_tensor(records[:, 1:].T, dtype=torch.float64)
    return table


def _summary_value(meters, key, with_negative):
    from .scoring import summarize

    table = meters["_qa_records"].sum.numpy()
    seen = table[0] > 0  # --max-valid-steps may validate part of the split
    records = np.concatenate([np.flatnonzero(seen)[:, None], (table[1:, seen] / table[0, seen]).T], axis=1)
    value = summarize(records, with_negative).get(key)
    return round(float(value), 4) if value is not None else float("nan")
