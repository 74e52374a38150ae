"""Averaging the weights of a run's last checkpoints, as fairseq's ``scripts/average_checkpoints.py`` does.

fairseq's script (in its repository, not in the pip package) sums every tensor of ``state["model"]`` and divides
in place. The plugin's checkpoints carry integer records beside the weights (the vocabulary's symbol hashes and
the tokenizer's name, a coreference head's scoring mode): fairseq 0.12 cannot divide them and later versions'
sums overflow. Here floating-point tensors are averaged in at least float32 (fp16 and bf16 ones too, as fairseq's
script does) and stored in their own dtype; every other tensor is a record that all inputs must hold alike, kept
as it is (a difference is one line naming the key). The rest of the new checkpoint is the first input's, the
newest one when the inputs are picked by number, as in fairseq's script.
"""
import os
import re
import tempfile
from typing import List, Optional

import torch

from .checkpoint_loading import CheckpointError, diagnose_checkpoint
from .errors import UsageError
from .file_utils import OutputError, disk_full_message, is_disk_full, signals_held
from .progress import progress_bar

# fairseq's names: checkpoint{epoch}.pt, and checkpoint_{epoch}_{update}.pt under --save-interval-updates
EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt")
UPDATE_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt")


def last_checkpoints(folder: str, count: int, by_update: bool, upper_bound: Optional[int] = None) -> List[str]:
    """The ``count`` newest epoch (or update) checkpoints of a --save-dir, newest first, none past ``upper_bound``."""
    flag = "--num-update-checkpoints" if by_update else "--num-epoch-checkpoints"
    if count < 1:
        raise UsageError(f"{flag} {count}: expected at least 1")
    if not os.path.isdir(folder):
        raise UsageError(f"--inputs {folder}: not a folder (with {flag}, --inputs names the run's --save-dir)")
    pattern, kind = (UPDATE_CHECKPOINT, "checkpoint_E_U.pt") if by_update else (EPOCH_CHECKPOINT, "checkpointE.pt")
    found = sorted(((int(m.group(1)), name) for name in os.listdir(folder) if (m := pattern.fullmatch(name))),
                   reverse=True)
    kept = [(number, name) for number, name in found if upper_bound is None or number <= upper_bound]
    if len(kept) < count:
        bound = f" up to --checkpoint-upper-bound {upper_bound}" if upper_bound is not None else ""
        raise UsageError(f"--inputs {folder}: {len(kept)} {kind} checkpoints there{bound}, {flag} asks for {count}")
    return [os.path.join(folder, name) for _, name in kept[:count]]


def _read(path: str) -> dict:
    if not os.path.isfile(path):
        raise CheckpointError(path, "no such file" if not os.path.exists(path) else "not a file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - named in one line
        problem = diagnose_checkpoint(path, err) or f"cannot be read ({type(err).__name__}: {str(err)[:200]})"
        raise CheckpointError(path, problem) from err
    if not (isinstance(state, dict) and isinstance(state.get("model"), dict)):
        raise CheckpointError(path, "a PyTorch file but not a fairseq checkpoint (no 'model' entry)")
    if not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
        raise CheckpointError(path, "its 'model' entry holds something other than tensors")
    return state


def _sum_type(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def average_checkpoints(paths: List[str]) -> dict:
    """The first checkpoint's state with its weights replaced by the mean of every checkpoint's (see the module)."""
    if not paths:
        raise UsageError("--inputs: no checkpoints to average")
    seen = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"--inputs: {path} is named twice (also as {seen[real]}); each checkpoint counts once")
        seen[real] = path
    first, sums = None, {}
    for path in progress_bar(paths, desc="averaging", unit="checkpoint"):
        state = _read(path)
        weights = state["model"]
        if first is None:
            first = state
            sums = {k: v.to(_sum_type(v.dtype), copy=True) if v.is_floating_point() else v for k, v in weights.items()}
            continue
        reference = first["model"]
        missing, extra = [k for k in reference if k not in weights], [k for k in weights if k not in reference]
        if missing or extra:
            what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which is not"
            raise CheckpointError(path, f"another model: it {what} in {paths[0]} "
                                        f"({len(missing)} missing, {len(extra)} extra weights)")
        for key, value in weights.items():
            ref = reference[key]
            if value.shape != ref.shape:
                raise CheckpointError(path, f"another model: {key} has shape {tuple(value.shape)}, "
                                            f"{tuple(ref.shape)} in {paths[0]}")
            if ref.is_floating_point():
                if not value.is_floating_point():
                    raise CheckpointError(path, f"{key} is {value.dtype}, {ref.dtype} in {paths[0]}")
                sums[key] += value.to(sums[key].dtype)
            elif value.dtype != ref.dtype or not torch.equal(value, ref):
                raise CheckpointError(path, f"its {key} differs from {paths[0]}'s: a record, not a weight, and "
                                            "checkpoints averaged must agree on it (another vocabulary or model?)")
    count = len(paths)
    averaged = {k: (s / count).to(first["model"][k].dtype) if first["model"][k].is_floating_point() else s
                for k, s in sums.items()}
    return {**first, "model": averaged}


def _check_new_file(output: str) -> str:
    """The folder of ``output``; OutputError when ``output`` exists or its folder does not."""
    if os.path.lexists(output):
        raise OutputError(f"--output {output}: exists; the average is written to a new file only "
                          "(name another, or move that one away)")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise OutputError(f"--output {output}: its folder {parent} does not exist")
    return parent


def check_output(output: str, input_folders: List[str]) -> None:
    """OutputError, before any input is read, for an --output that exists, whose folder does not, or that is named
    like a run's own checkpoints (checkpointE.pt, checkpoint_E_U.pt) in a folder the inputs come from: a later
    average by number would take it for one of them."""
    parent = os.path.realpath(_check_new_file(output))
    name = os.path.basename(output)
    if not (EPOCH_CHECKPOINT.fullmatch(name) or UPDATE_CHECKPOINT.fullmatch(name)):
        return
    for folder in input_folders:
        if os.path.realpath(folder) == parent:
            raise OutputError(f"--output {output}: named like the run's own checkpoints in {folder}, so a later "
                              "--num-epoch-checkpoints or --num-update-checkpoints average would take it as an "
                              "input; name it otherwise (e.g. checkpoint_average.pt)")


def write_new_checkpoint(state: dict, output: str) -> None:
    """Save ``state`` to ``output``, a path that must not exist yet; an interrupted or failed save leaves nothing."""
    parent = _check_new_file(output)  # again: it may have appeared while averaging
    try:
        claimed = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # ours from here on
    except FileExistsError:
        raise OutputError(f"--output {output}: exists (created while averaging)") from None
    except OSError as err:
        raise OutputError(f"--output {output}: cannot be created ({err.strerror})") from None
    os.close(claimed)
    partial = None
    try:
        fd, partial = tempfile.mkstemp(prefix=".averaging-", suffix=".pt.tmp", dir=parent)
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.chmod(partial, os.stat(output).st_mode & 0o777)  # the umask's mode, as a plain open would give
        with signals_held():
            os.replace(partial, output)
            partial = None
    except BaseException as err:
        if partial is not None and os.path.exists(partial):
            os.remove(partial)
        if os.path.isfile(output) and os.path.getsize(output) == 0:
            os.remove(output)
        if is_disk_full(err):
            raise OutputError(disk_full_message(f"writing {output}", parent)) from None
        raise
