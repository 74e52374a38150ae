"""Datasets and data transforms."""
