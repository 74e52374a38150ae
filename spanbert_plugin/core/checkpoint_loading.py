"""Reading fairseq checkpoints: torch's safe loading kept on, damaged files named in one line.

torch >= 2.6 loads with ``weights_only=True`` by default. fairseq checkpoints
can hold a few plain Python objects besides tensors: ``argparse.Namespace``
(the legacy ``args`` entry of older checkpoints and hub models), ordered dicts,
and numpy scalars in logged metrics. Rather than turning safe loading off,
allowlist exactly those types.
"""
import argparse
import collections
import contextlib
import functools
import logging
import os
import zipfile

import numpy as np
import torch

from .errors import UsageError
from .run_config import run_section

logger = logging.getLogger(__name__)


def _numpy_scalar_globals():
    try:
        from numpy._core.multiarray import scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import scalar
    dtypes = [type(np.dtype(t)) for t in (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_)]
    return [scalar, np.dtype, *dtypes]


SAFE_CHECKPOINT_GLOBALS = [argparse.Namespace, collections.OrderedDict, *_numpy_scalar_globals()]

torch.serialization.add_safe_globals(SAFE_CHECKPOINT_GLOBALS)


# ---------------------------------------------------------------------------
# Damaged or foreign checkpoint files: one line naming the file, not a traceback.
#
# fairseq reads every checkpoint through ``checkpoint_utils.load_checkpoint_to_cpu``
# (fairseq-train's resume, ``--finetune-from-model``, hub loading, export); a
# truncated, empty or foreign file surfaces there as an EOFError, a zip-reader
# RuntimeError or a KeyError deep inside fairseq. The wrapper below looks at the
# file only after such a failure and re-raises a ``CheckpointError``, which
# fairseq-train prints as one line (``spanbert_plugin.core.errors``).

ZIP_MAGIC, PICKLE_MAGIC = b"PK\x03\x04", b"\x80"


class CheckpointError(UsageError):
    """A checkpoint file that cannot be used; the message names the file (``path``) and the problem."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def load_mapped(path):
    """``torch.load`` of a checkpoint (weights only), memory-mapped where torch can map it: a zip archive, not its
    legacy format, which it then reads whole."""
    with open(path, "rb") as f:
        zipped = f.read(len(ZIP_MAGIC)) == ZIP_MAGIC
    return torch.load(path, map_location="cpu", mmap=zipped, weights_only=True)


def _holds_fairseq_state(path):
    """Does the file hold a fairseq checkpoint dict with model weights? (None: unreadable)"""
    try:
        state = load_mapped(path)
    except Exception:  # noqa: BLE001 - unreadable means "no"; the caller reports the original error
        return None
    return isinstance(state, dict) and "model" in state and ("cfg" in state or "args" in state)


def diagnose_checkpoint(path, error=None):
    """Why ``path`` is not a usable fairseq checkpoint, in words, or None when the file looks sound."""
    if not os.path.isfile(path):
        return None
    if os.path.getsize(path) == 0:
        return "empty file (0 bytes), not a checkpoint (an interrupted save?)"
    with open(path, "rb") as f:
        head = f.read(512)
    if head.startswith(ZIP_MAGIC):
        if not zipfile.is_zipfile(path):
            return "truncated or damaged checkpoint: its zip archive is incomplete (an interrupted save or a partial copy?)"
        try:
            with zipfile.ZipFile(path) as archive:
                broken = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            return f"damaged checkpoint ({err})"
        if broken is not None:
            return f"damaged checkpoint (its entry {broken} fails the CRC check)"
    elif head.startswith(PICKLE_MAGIC):  # legacy (pre-zip) torch format
        if isinstance(error, (EOFError, RuntimeError)) or type(error).__name__ == "UnpicklingError":
            return f"truncated or damaged checkpoint ({type(error).__name__}: {str(error)[:200]})"
    else:
        try:
            head.decode("utf-8")
            return "a text file, not a PyTorch checkpoint"
        except UnicodeDecodeError:
            return "not a PyTorch checkpoint (unknown file format)"
    if _holds_fairseq_state(path) is False:
        return "a PyTorch file but not a fairseq checkpoint (no 'model' and 'cfg' entries)"
    return None


def _checked_load_checkpoint_to_cpu(load):
    @functools.wraps(load)
    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except Exception as err:  # noqa: BLE001 - diagnosed below; anything undiagnosed propagates unchanged
            problem = diagnose_checkpoint(path, err)
            if problem is None:
                raise
            raise CheckpointError(path, problem) from err

    load_checkpoint_to_cpu.spanbert_checked = True
    return load_checkpoint_to_cpu


def _other_checkpoints(damaged):
    """Names of the other .pt files beside a damaged checkpoint."""
    folder = os.path.dirname(os.path.abspath(damaged))
    return sorted(n for n in os.listdir(folder) if n.endswith(".pt") and n != os.path.basename(damaged))


def _resume_hint(load_checkpoint):
    """fairseq-train's resume: name --restore-file (and the earlier checkpoints there) on a damaged file."""

    @functools.wraps(load_checkpoint)
    def load_checkpoint_with_hint(cfg, trainer, **kwargs):
        try:
            return load_checkpoint(cfg, trainer, **kwargs)
        except AssertionError as err:
            # fairseq's Trainer asserts that a resumed optimizer and criterion are the checkpoint's: one line
            if not str(err).startswith(("Optimizer does not match", "Criterion does not match")):
                raise
            raise UsageError(f"resuming from {cfg.save_dir}: {err}; or train in a new --save-dir") from None
        except CheckpointError as err:
            if cfg.finetune_from_model and os.path.abspath(err.path) == os.path.abspath(cfg.finetune_from_model):
                raise
            others = _other_checkpoints(err.path)
            where = f" (there: {', '.join(others[:5])})" if others else ""
            raise CheckpointError(
                err.path, f"{err.problem}; --restore-file can name an earlier checkpoint to resume from{where}, "
                "or move the damaged file away to start afresh",
            ) from err.__cause__

    load_checkpoint_with_hint.spanbert_checked = True
    return load_checkpoint_with_hint


def _plain_cfg_broadcast(broadcast):
    """fairseq's broadcast of a loaded checkpoint from rank 0 to the other workers (a multi-process resume or
    ``--finetune-from-model``), made to pass torch's safe loading.

    The other ranks unpickle what rank 0 sends with ``torch.load``, whose ``weights_only=True`` refuses the
    ``DictConfig`` that ``load_checkpoint_to_cpu`` builds under ``"cfg"``, and fairseq's own placeholders for the
    tensors it sends apart (an index each). The state is sent with ``cfg`` as the plain dict it is on disk,
    every rank (rank 0 too) rebuilds the ``DictConfig`` as fairseq's loader does, and the placeholder type is
    allowed for this load only."""
    from fairseq.distributed.utils import _TensorPlaceholder
    from omegaconf import OmegaConf

    @functools.wraps(broadcast)
    def broadcast_object(obj, *args, **kwargs):
        if isinstance(obj, dict) and OmegaConf.is_config(obj.get("cfg")):
            obj = {**obj, "cfg": OmegaConf.to_container(obj["cfg"])}
        with torch.serialization.safe_globals([_TensorPlaceholder]):
            result = broadcast(obj, *args, **kwargs)
        if isinstance(result, dict) and isinstance(result.get("cfg"), dict):
            result["cfg"] = OmegaConf.create(result["cfg"])
        return result

    broadcast_object.spanbert_checked = True
    return broadcast_object


def install_checkpoint_checks():
    """Wrap fairseq's checkpoint readers so damaged files give a CheckpointError, and its broadcast of a loaded
    checkpoint so that multi-process runs can start from one under safe loading (idempotent)."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "spanbert_checked", False):
        checkpoint_utils.load_checkpoint_to_cpu = _checked_load_checkpoint_to_cpu(checkpoint_utils.load_checkpoint_to_cpu)
    if not getattr(checkpoint_utils.load_checkpoint, "spanbert_checked", False):
        checkpoint_utils.load_checkpoint = _resume_hint(checkpoint_utils.load_checkpoint)
    if not getattr(distributed_utils.broadcast_object, "spanbert_checked", False):
        distributed_utils.broadcast_object = _plain_cfg_broadcast(distributed_utils.broadcast_object)


# ---------------------------------------------------------------------------
# The encoder's shape comes from the checkpoint a run starts from.
#
# fairseq builds the model from the command's options before it loads
# ``--finetune-from-model`` (or the checkpoint it resumes), so ``--arch spanbert_base``
# with a 6-layer, 384-wide checkpoint would build 12 x 768 and fail with "please
# ensure that the architectures match". Options left at their architecture's
# defaults take the checkpoint's values instead; a value that differs from both
# was given on purpose, and contradicting the checkpoint is a one-line error.

# the options that fix the shape of a spanbert model's weights (attention heads: the weights' meaning)
SHAPE_OPTIONS = (
    "encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim", "encoder_attention_heads",
    "max_positions", "type_vocab_size", "sbo_position_slots", "sbo_position_dim",
)


def save_dir_last_checkpoint(checkpoint_cfg) -> str:
    """The ``checkpoint_last.pt`` of the run's ``--save-dir`` (fairseq's default ``checkpoints``)."""
    return os.path.join(checkpoint_cfg.get("save_dir") or "checkpoints", "checkpoint_last.pt")


def starting_checkpoint(checkpoint_cfg):
    """The file fairseq-train will load first (as ``checkpoint_utils.load_checkpoint`` chooses it), or None.

    ``checkpoint_last.pt`` in ``save_dir`` when it exists (a resumed run), else ``--continue-once`` (the run
    goes on from another run's checkpoint), else ``--finetune-from-model``; an explicit ``--restore-file``
    otherwise.
    """
    restore = checkpoint_cfg.get("restore_file") or "checkpoint_last.pt"
    if restore != "checkpoint_last.pt":
        path = restore
    else:
        last = save_dir_last_checkpoint(checkpoint_cfg)
        path = last if os.path.exists(last) else (checkpoint_cfg.get("continue_once")
                                                  or checkpoint_cfg.get("finetune_from_model"))
    return path if path and os.path.isfile(path) else None


def starts_anew_from(checkpoint_cfg, path) -> bool:
    """Does the run start a new training from ``path`` (``--finetune-from-model`` on a first launch, or a
    ``--restore-file`` with ``--reset-optimizer``) rather than go on with it (a resume: its optimizer state holds
    every parameter the checkpoint's model had)?"""
    if resumes_its_save_dir(checkpoint_cfg, path):
        return False
    finetune = checkpoint_cfg.get("finetune_from_model")
    return bool(checkpoint_cfg.get("reset_optimizer")) or (
        bool(finetune) and os.path.abspath(path) == os.path.abspath(finetune))


def refuse_a_named_checkpoint_that_is_missing(checkpoint_cfg, distributed_cfg=None) -> None:
    """UsageError for a ``--restore-file`` or (on a first launch) ``--continue-once`` or ``--finetune-from-model``
    that is no file: fairseq starts a missing ``--restore-file`` or ``--continue-once`` from fresh weights after one
    log line (a typo trains a new model in the place of a resumed one), and stops on a missing
    ``--finetune-from-model`` with a traceback.

    Left to fairseq: names it suffixes (``--checkpoint-suffix``, sharded FSDP state, model parallel parts), and a
    ``--restore-file`` naming the save-dir's own ``checkpoint_last.pt``, which launch scripts pass on every launch (the
    first starts fresh)."""
    from fairseq.file_io import PathManager

    distributed = distributed_cfg if distributed_cfg is not None else {}
    if (checkpoint_cfg.get("checkpoint_suffix") or (checkpoint_cfg.get("model_parallel_size") or 1) > 1
            or (distributed.get("model_parallel_size") or 1) > 1
            or (distributed.get("ddp_backend") == "fully_sharded" and distributed.get("use_sharded_state"))):
        return
    restore = checkpoint_cfg.get("restore_file") or "checkpoint_last.pt"
    last = save_dir_last_checkpoint(checkpoint_cfg)
    if (restore != "checkpoint_last.pt" and os.path.abspath(restore) != os.path.abspath(last)
            and not PathManager.isfile(restore)):
        raise UsageError(f"--restore-file {restore}: no such checkpoint (fairseq would start from fresh weights)")
    if restore != "checkpoint_last.pt" or os.path.exists(last):
        return  # fairseq loads neither of the others then
    continue_once, finetune = checkpoint_cfg.get("continue_once"), checkpoint_cfg.get("finetune_from_model")
    if continue_once and not PathManager.isfile(continue_once):
        raise UsageError(f"--continue-once {continue_once}: no such checkpoint (fairseq would start from fresh weights)")
    if finetune and not continue_once and not PathManager.isfile(finetune):
        raise UsageError(f"--finetune-from-model {finetune}: no such checkpoint")


def resumes_its_save_dir(checkpoint_cfg, path) -> bool:
    """Is ``path`` the ``checkpoint_last.pt`` of the run's own ``--save-dir`` (by default or named by
    ``--restore-file``), which fairseq-train goes on with (its epoch and updates unless ``--reset-dataloader``, its
    optimizer unless ``--reset-optimizer``, its best score) and whose checkpoints it overwrites? Only both resets
    say that the run is meant to start afresh there."""
    if not path or (checkpoint_cfg.get("reset_dataloader") and checkpoint_cfg.get("reset_optimizer")):
        return False
    last = save_dir_last_checkpoint(checkpoint_cfg)
    return os.path.abspath(path) == os.path.abspath(last)


def run_resumed_checkpoint(model_cfg):
    """(the file the run starts from or None, whether it is the run's own checkpoint_last.pt that it resumes)."""
    path = run_starting_checkpoint(model_cfg)
    checkpoint = run_section(model_cfg, "checkpoint")
    return path, checkpoint is not None and resumes_its_save_dir(checkpoint, path)


def run_starting_checkpoint(model_cfg):
    """The file the run ``model_cfg`` (a task's or model's section) belongs to starts from, or None (no run, no file)."""
    checkpoint = run_section(model_cfg, "checkpoint")
    return starting_checkpoint(checkpoint) if checkpoint is not None else None


def stored_checkpoint(path) -> dict:
    """The checkpoint's top-level dict, memory-mapped (its weights are not read), or {}; a damaged file is left to
    fairseq's own loading, which names it in one line."""
    try:
        state = load_mapped(path)
    except Exception:  # noqa: BLE001 - reported by the real load that follows
        return {}
    return state if isinstance(state, dict) else {}


def match_saved_head_labels(model, path, group: str, head: str, labels, resumed: bool = False) -> None:
    """A starting checkpoint whose task state records its head's class names (a fine-tuned or imported classifier
    or relation model) keeps the head's output rows only for ``labels``: reordered where the names are the same in
    another order (labels are stored sorted, transformers' id2label need not be), left out (fresh) where they
    differ. A head of another size the model's loading leaves out itself; names the checkpoint does not record
    cannot be compared (rows kept in order). ``group``: the model's ``classification_heads`` or ``relation_heads``.
    ``resumed``: ``path`` is the run's own checkpoint_last.pt (``resumes_its_save_dir``), where other names are a
    UsageError."""
    state = stored_checkpoint(path) if path else {}
    task_state, weights = state.get("task_state"), state.get("model")
    kind = group.replace("_heads", "")
    saved = task_state.get("labels") if isinstance(task_state, dict) else None
    if isinstance(weights, dict) and f"{group}.{head}.out_proj.weight" not in weights:
        # nothing of it is loaded: this one starts fresh, and a fine-tuned head under another name is left out of a
        # new training (SpanBertModel.only_heads_of_this_run; kept as it is on a resume); said where the other head
        # could have gone on (its size and labels are this data's: not MNLI's for RTE)
        same_labels = not isinstance(saved, list) or sorted(saved) == sorted(labels)
        others = sorted({key.split(".")[1] for key, value in weights.items() if key.startswith(group + ".")
                         and key.endswith(".out_proj.weight") and len(value) == len(labels)})
        if others and same_labels:
            logger.warning(f"{path}: its {kind} head is named {', '.join(others)}, not {head}: {head} starts from "
                           f"fresh weights (--{kind}-head-name {others[0]} continues the checkpoint's)")
        return
    if not isinstance(saved, list) or saved == list(labels) or not isinstance(weights, dict):
        return
    if resumed and sorted(saved) != sorted(labels):
        # the run in --save-dir would go on (its epoch, updates, optimizer state and best score) with a fresh head
        # for other labels: another data set's run, continued and overwritten
        raise UsageError(f"{path}: the run in this --save-dir trained a {kind} head for {saved}, this data's labels "
                         f"are {list(labels)}: it is another data set's run; train in a new --save-dir (with "
                         f"--finetune-from-model {path} to start from its weights)")
    if len(saved) != len(labels):
        return  # a head of another size: the model's loading leaves it out, with a warning
    if sorted(saved) == sorted(labels):
        model.map_saved_head(group, head, [saved.index(label) for label in labels])
        logger.info(f"{path}: its {kind} head's classes {saved} reordered to this data's {list(labels)}")
    else:
        model.map_saved_head(group, head, None)
        logger.warning(f"{path}: its {kind} head predicts {saved}, this data's labels are {list(labels)}: the head's "
                       "output layer starts from fresh weights (name the labels as the checkpoint does to keep it)")


def stored_run_option(path, group, key):
    """One option of the run config a fairseq checkpoint saved (``group`` "task", "criterion", ...), or None."""
    cfg = stored_checkpoint(path).get("cfg")
    section = cfg.get(group) if isinstance(cfg, dict) else None
    return section.get(key) if isinstance(section, dict) else None


def stored_model_options(path):
    """The model options a fairseq checkpoint was built with (a dict), or None when the file does not tell."""
    state = stored_checkpoint(path)
    if not state:
        return None
    if isinstance(state.get("cfg"), dict) and isinstance(state["cfg"].get("model"), (dict, argparse.Namespace)):
        model = state["cfg"]["model"]
    elif isinstance(state.get("args"), argparse.Namespace):
        model = state["args"]
    else:
        return None
    return dict(vars(model)) if isinstance(model, argparse.Namespace) else dict(model)


def architecture_defaults(name):
    """The option values an architecture (``spanbert_base``) or a model's dataclass (``spanbert``) fills in by itself."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY

    dataclass = MODEL_DATACLASS_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(name, name))
    defaults = {} if dataclass is None else {k: v for k, v in vars(dataclass()).items() if not k.startswith("_")}
    if name in ARCH_CONFIG_REGISTRY:
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[name](args)
        defaults.update(vars(args))
    return defaults


def take_shape_from_checkpoint(model_cfg, path):
    """Set ``model_cfg``'s shape options left at their defaults to the checkpoint's; return the changes made.

    An option set to a value other than its architecture's default and the checkpoint's
    is a UsageError naming the option, the file and both values.
    """
    stored = stored_model_options(path)
    if not stored:
        return {}
    defaults = architecture_defaults(model_cfg.get("_name") or model_cfg.get("arch") or "")
    changes = {}
    for key in SHAPE_OPTIONS:
        ours, theirs = model_cfg.get(key), stored.get(key)
        if ours is None or theirs is None or ours == theirs:
            continue
        if key not in defaults or ours != defaults[key]:
            flag = "--" + key.replace("_", "-")
            raise UsageError(
                f"{flag} {ours} (model.{key}) contradicts {path}, whose model has {key} {theirs}: leave {flag} out "
                "to take the checkpoint's value"
            )
        changes[key] = theirs
    if changes:
        from omegaconf import OmegaConf, open_dict

        with open_dict(model_cfg) if OmegaConf.is_config(model_cfg) else contextlib.nullcontext():
            for key, value in changes.items():
                model_cfg[key] = value
    return changes

install_checkpoint_checks()
