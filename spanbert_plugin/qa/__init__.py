"""Extractive QA: data preparation (windows), post-processing and the on-disk format they share."""
