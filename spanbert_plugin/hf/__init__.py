"""HuggingFace ``transformers`` interop: ``spanbert-export-hf`` and ``spanbert-import-hf``."""
