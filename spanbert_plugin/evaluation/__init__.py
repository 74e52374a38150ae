"""Evaluation metrics, testable without a model (official SQuAD definitions, classification, relations)."""
