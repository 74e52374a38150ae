"""Extractive QA: data preparation (windows), the ``extractive_qa`` task and criterion, SQuAD metrics,
post-processing, prediction and the SpanDrop adapter."""
