"""Relation extraction (TACRED style): entity markers, data preparation, the ``relation_extraction`` task and
criterion, TACRED metrics, prediction and the SpanDrop adapter."""
