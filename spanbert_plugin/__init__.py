"""spanbert_plugin: SpanBERT pre-training and span-aware fine-tuning for fairseq.

Importing this package registers every component with fairseq exactly once
(``user_dir/`` imports it for ``--user-dir``) and allowlists what fairseq
checkpoints hold for torch's safe loading.
"""
import logging

# fairseq logs an install hint for an unused speech task at import; keep CLIs' output clean
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)

from . import checkpoint_loading  # noqa: F401  (first: safe-loading allowlist)
from .criterions import span_bert  # noqa: F401
from .models import spanbert  # noqa: F401
from .tasks import find_animals, span_masked_lm  # noqa: F401

__version__ = "0.1.0"
