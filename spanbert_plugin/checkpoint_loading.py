"""Let torch's safe checkpoint loading (``weights_only=True``) read fairseq checkpoints.

torch >= 2.6 loads with ``weights_only=True`` by default. fairseq checkpoints
can hold a few plain Python objects besides tensors: ``argparse.Namespace``
(the legacy ``args`` entry of older checkpoints and hub models), ordered dicts,
and numpy scalars in logged metrics. Rather than turning safe loading off,
allowlist exactly those types.
"""
import argparse
import collections

import numpy as np
import torch


def _numpy_scalar_globals():
    try:
        from numpy._core.multiarray import scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import scalar
    dtypes = [type(np.dtype(t)) for t in (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_)]
    return [scalar, np.dtype, *dtypes]


SAFE_CHECKPOINT_GLOBALS = [argparse.Namespace, collections.OrderedDict, *_numpy_scalar_globals()]

torch.serialization.add_safe_globals(SAFE_CHECKPOINT_GLOBALS)
