"""Readers: one per container format, each producing a ``Checkpoint``.

``read`` recognizes the container from the file's bytes and dispatches. No
reader executes code from the file unless the caller passes ``trust=True``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoint import Checkpoint, Format
from ..errors import InputError
from .sniff import sniff

__all__ = ["read"]


def read(path: str | os.PathLike[str], *, trust: bool = False) -> Checkpoint:
    """Read any supported checkpoint; tensors are CPU tensors backed by the file."""
    source = Path(path)
    fmt = sniff(source)
    if fmt is Format.SAFETENSORS:
        from .safetensors import read_safetensors

        return read_safetensors(source)
    from .torch_pickle import read_torch

    try:
        return read_torch(source, fmt, trust=trust)
    except RecursionError:
        raise InputError("pickle nests too deeply to read", source) from None
