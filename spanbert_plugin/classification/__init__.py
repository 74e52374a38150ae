"""Sentence and sentence-pair classification (GLUE-style): data preparation and the prepared format."""
