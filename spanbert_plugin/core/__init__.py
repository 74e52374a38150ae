"""Shared lowest layer: errors, output-folder safety, checkpoint loading, tokenization, the dictionary,
prepared-folder I/O, dataset building blocks and the task/metric helpers every feature uses. Imports nothing else
of the package."""
