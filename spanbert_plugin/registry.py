"""Registers every component of the plugin with fairseq, exactly once; ``user_dir/`` imports this for ``--user-dir``.

It also allowlists what fairseq checkpoints hold for torch's safe loading, registers the hub's task methods
(``hub.answer``, ``hub.classify``, ``hub.coref``), installs the hook that prints a plugin error in ``fairseq-train`` as one line, and
stops fairseq's prefetch threads at exit.
The package itself stays light (``--help`` of every command starts without torch); this module is the top layer.
"""
import logging

# fairseq logs an install hint for an unused speech task at import; keep CLIs' output clean
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
# one of fairseq's model modules calls logging.basicConfig(level=DEBUG) at import: keep the caller's level
_root_level = logging.getLogger().level

from .core import checkpoint_loading  # noqa: F401,E402  (first: safe-loading allowlist)
from .core.errors import install_excepthook  # noqa: E402

install_excepthook()

from .core import loss_scaler_state  # noqa: E402

loss_scaler_state.install()  # fp16/amp checkpoints keep the whole loss-scaler state (exact resume)

from .core import amp_scaler  # noqa: E402

amp_scaler.install()  # --amp unscales the gradients once, from --amp-init-scale

from .core import clean_exit  # noqa: E402

clean_exit.install()  # a run stopped mid-epoch exits 0, not with an abort from fairseq's prefetch thread

from .core import checkpoint_saving  # noqa: E402

checkpoint_saving.install()  # a failed checkpoint save (a full disk) leaves no .tmp and is one line

from .core import ema_records  # noqa: E402

ema_records.install()  # --store-ema copies the vocabulary record instead of failing to average it

from .core import launchers  # noqa: E402

launchers.install()  # torchrun and srun: the launcher's ranks, and never several runs that each train alone

from .core import logging_reads, update_seeding  # noqa: E402
from .core.tasks import OneDictionaryTask  # noqa: E402

# the plugin's tasks: no host read of the logged values after each update (only when they are logged), and the
# update's seed without a Python stack formatted per device type not in use
logging_reads.install(lambda fairseq_task: isinstance(fairseq_task, OneDictionaryTask))
update_seeding.install(lambda fairseq_task: isinstance(fairseq_task, OneDictionaryTask))

# Registered components (models, tasks, criteria, hub methods), one feature per line.
from .core import torch_adamw  # noqa: F401,E402  (--optimizer torch_adamw)
from .core import composite_clip_per_group  # noqa: F401,E402  (optimizer: composite_clip_per_group)
from .model import spanbert  # noqa: F401,E402
from .pretraining import criterion, span_masked_lm, task  # noqa: F401,E402,F811  (span_masked_lm: deprecated alias)
from .qa import answer, criterion, task  # noqa: F401,E402,F811
from .relation import criterion, task  # noqa: F401,E402,F811
from .classification import criterion, hub, task  # noqa: F401,E402,F811
from .coref import criterion, hub, task  # noqa: F401,E402,F811
from .spandrop import find_animals_task  # noqa: F401,E402

logging.getLogger().setLevel(_root_level)
