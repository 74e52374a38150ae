"""Coreference resolution: CoNLL-2012 data, the c2f-coref head, the ``coreference`` task and criterion,
the CoNLL-2012 metrics (MUC, B-cubed, CEAF-phi4), prediction and SpanDrop on documents.

Modules: ``conll`` (readers and the prediction writer), ``metrics``, ``prepare``
(``spanbert-prepare-coref``), ``dataset``, ``head`` (the model's coreference
head), ``long_document`` (bounded-memory prediction of whole books), ``prediction_modes`` (its settings),
``task``, ``criterion``, ``predict`` (``spanbert-predict-coref``), ``hub`` (``hub.coref``), ``hf_head`` (the head
beside a HuggingFace export).
"""
