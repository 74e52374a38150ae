"""spanbert_plugin: SpanBERT pre-training and span-aware fine-tuning for fairseq.

Importing this package registers every component with fairseq exactly once
(``user_dir/`` imports it for ``--user-dir``) and allowlists what fairseq
checkpoints hold for torch's safe loading.
"""
import logging

# fairseq logs an install hint for an unused speech task at import; keep CLIs' output clean
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
# one of fairseq's model modules calls logging.basicConfig(level=DEBUG) at import: keep the caller's level
_root_level = logging.getLogger().level

from . import checkpoint_loading  # noqa: F401,E402  (first: safe-loading allowlist)
from .errors import install_excepthook  # noqa: E402

install_excepthook()

# Registered components, one import per line.
from .coref import criterion as coref_criterion  # noqa: F401,E402
from .coref import task as coref_task  # noqa: F401,E402
from .criterions import extractive_qa  # noqa: F401,E402
from .criterions import relation_extraction  # noqa: F401,E402
from .criterions import span_bert  # noqa: F401,E402
from .criterions import sentence_classification  # noqa: F401,E402
from .models import spanbert  # noqa: F401,E402
from .tasks import extractive_qa as extractive_qa_task  # noqa: F401,E402
from .tasks import find_animals  # noqa: F401,E402
from .tasks import relation_extraction as relation_extraction_task  # noqa: F401,E402
from .tasks import sentence_classification as sentence_classification_task  # noqa: F401,E402
from .tasks import spanbert_pretraining, span_masked_lm  # noqa: F401,E402  (span_masked_lm: its deprecated alias)

logging.getLogger().setLevel(_root_level)

from .models.spanbert import SpanBertModel  # noqa: E402  (public surface)

__all__ = ["SpanBertModel"]

__version__ = "0.1.0"
