"""The harmless globals ckptport lets the weights-only unpickler build.

Real training checkpoints hold ``argparse.Namespace`` hyper-parameters,
numpy scalars and arrays, ``torch.Size`` and ``OrderedDict``. None of these
can run code when rebuilt, so they are allowed — for one ``torch.load`` call
at a time (``torch.serialization.safe_globals``), never process-wide, so
ckptport never widens what other code in the user's process accepts.

numpy pickles name their helpers ``numpy.core.*`` (numpy 1) or
``numpy._core.*`` (numpy 2); both spellings map to the installed functions.
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

__all__ = ["safe_globals", "allowed_names"]


def _numpy_entries() -> list[Any]:
    try:
        import numpy as np
    except ImportError:  # numpy objects then stay refused, naming the global
        return []
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    entries: list[Any] = [np.ndarray, np.dtype]
    for name in ("scalar", "_reconstruct"):
        func = getattr(multiarray, name)
        entries += [(func, f"numpy.{core}.multiarray.{name}") for core in ("core", "_core")]
    dtype_classes = {type(np.dtype(code)) for code in np.typecodes["All"] if code not in "O"}
    entries += sorted(dtype_classes, key=lambda cls: cls.__name__)
    return entries


def safe_globals() -> list[Any]:
    """Entries for ``torch.serialization.safe_globals``."""
    import torch

    return [argparse.Namespace, collections.OrderedDict, torch.Size, *_numpy_entries()]


def allowed_names() -> frozenset[str]:
    """Qualified names of the allowlist, to tell what a refusal was about."""
    names = set()
    for entry in safe_globals():
        if isinstance(entry, tuple):
            names.add(entry[1])
        else:
            names.add(f"{entry.__module__}.{entry.__qualname__}")
    return frozenset(names)
