"""Readers: one per container format, each producing a ``Checkpoint``.

``read`` recognizes the container from the file's bytes (a folder or
``*.index.json`` is a shard set) and dispatches. No reader executes code
from the file unless the caller passes ``trust=True``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoint import Checkpoint, Format
from ..errors import InputError
from .sniff import sniff

__all__ = ["read", "read_file", "resolve"]


def resolve(path: str | os.PathLike[str]) -> tuple[Path, tuple[Path, ...]]:
    """The file to read (a folder's shard index) and every file its bytes come from."""
    source = Path(path)
    if source.is_dir():
        from .dcp import METADATA_FILE, is_dcp

        if is_dcp(source):
            return source, (source / METADATA_FILE, *sorted(source.glob("*.distcp")))
        source = _weights_in(source)
    if source.name.endswith(".index.json"):
        from .shards import shard_files

        return source, (source, *shard_files(source)[2])
    return source, (source,)


SINGLE_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def _weights_in(folder: Path) -> Path:
    """The weights of a folder: its shard index, or a Hugging Face model folder's file."""
    from .shards import find_index

    index = find_index(folder)
    if index is not None:
        return index
    for name in SINGLE_WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    raise InputError("is a directory with no checkpoint in it (no *.index.json shard index, "
                     f"no {' or '.join(SINGLE_WEIGHTS)}, no DCP .metadata)", folder)


def read(path: str | os.PathLike[str], *, trust: bool = False) -> Checkpoint:
    """Read any supported checkpoint; tensors are CPU tensors backed by the file."""
    source, _ = resolve(path)
    if source.is_dir():
        from .dcp import read_dcp

        return read_dcp(source)
    if source.name.endswith(".index.json"):
        from .shards import read_shards

        return read_shards(source, trust=trust)
    return read_file(source, trust=trust)


def read_file(source: Path, *, trust: bool = False) -> Checkpoint:
    """Read one checkpoint file."""
    fmt = sniff(source)
    if fmt is Format.SAFETENSORS:
        from .safetensors import read_safetensors

        return read_safetensors(source)
    from .torch_pickle import read_torch

    try:
        return read_torch(source, fmt, trust=trust)
    except RecursionError:
        raise InputError("pickle nests too deeply to read", source) from None
