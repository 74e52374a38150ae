"""spanbert_plugin: SpanBERT pre-training and span-aware fine-tuning for fairseq.

``import spanbert_plugin.registry`` (or ``--user-dir user_dir``) registers every component with fairseq. The
package itself imports nothing heavy, so the console commands answer ``--help`` without loading torch; the public
names below load the model and register everything on first use.
"""
import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "SpanBertModel": "spanbert_plugin.model.spanbert",
    "SpanBertHubInterface": "spanbert_plugin.model.hub_interface",
    "load_hub_model": "spanbert_plugin.model.hub_interface",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'spanbert_plugin' has no attribute {name!r}")
    importlib.import_module("spanbert_plugin.registry")  # every task, criterion and hub method first
    return getattr(importlib.import_module(_PUBLIC[name]), name)
