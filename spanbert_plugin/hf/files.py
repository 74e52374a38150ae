"""Reading the files of a HuggingFace folder: JSON objects and weight files, with one-line errors naming the file."""
import torch

from ..core.errors import UsageError
from ..core.file_utils import read_json as core_read_json


class InteropError(UsageError):
    """Bad input for export/import: the message names the file and the problem."""


def read_json(path):
    """A JSON object from a file (core's reader: one line naming the file, its line, a byte-order mark allowed);
    any other JSON value is an InteropError naming the file."""
    value = core_read_json(path)
    if not isinstance(value, dict):
        raise InteropError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def read_weights(path):
    """Tensors of a safetensors or torch file; a damaged or truncated file is an InteropError."""
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            weights = load_file(path)
        else:
            weights = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any reader failure means a damaged file
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise InteropError(f"{path}: damaged or truncated weights file ({reason})") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise InteropError(f"{path}: expected a dictionary of tensors (a state dict)")
    return weights
