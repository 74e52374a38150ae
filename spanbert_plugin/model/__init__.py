"""The ``spanbert`` model: encoder layers, the MLM/SBO heads and the task heads several features share
(classification, QA span, relation), and the hub interface. Imports only ``core``."""
