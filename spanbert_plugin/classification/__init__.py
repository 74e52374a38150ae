"""Sentence and sentence-pair classification (GLUE-style): data preparation, the ``sentence_classification``
task and criterion, metrics, prediction and the SpanDrop adapter."""
