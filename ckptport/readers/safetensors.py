"""Read ``.safetensors`` files as lazy, zero-copy tensors.

The header is parsed and checked by ckptport (``safetensors_layout``); the
data is mapped privately (copy-on-write) and every tensor is a view of that
map, so reading a 10 GB file costs nothing until a tensor's bytes are used,
and a rule that writes into a tensor never touches the file. A tree saved by
ckptport (``--select all``, tied tensors, state-dict ``_metadata``) is
rebuilt from the ``ckptport.tree`` metadata.
"""

from __future__ import annotations

import json
import mmap
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import treejson
from ..checkpoint import Checkpoint, Format, SourceFacts
from ..dtypes import torch_dtype
from ..errors import InputError
from ..safetensors_layout import ITEMSIZE, Header, parse_header

__all__ = ["read_safetensors", "TREE_KEY", "ALIASES_KEY"]

TREE_KEY = "ckptport.tree"
ALIASES_KEY = "ckptport.aliases"


def read_safetensors(path: Path,
                     make_tensors: Callable[[Path, Header], dict[str, Any]] | None = None
                     ) -> Checkpoint:
    """A Checkpoint of a safetensors file; ``make_tensors`` turns the header's
    entries into leaves (mapped tensors by default; descriptions for ``inspect``)."""
    header = parse_header(path)
    tensors = (make_tensors or _map_tensors)(path, header)
    tree: Any
    if TREE_KEY in header.metadata:
        try:
            tree = treejson.decode(header.metadata[TREE_KEY], tensors)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"corrupt {TREE_KEY} metadata: {exc!r}", path) from None
    else:
        tree = OrderedDict(tensors)
    aliases = _aliases(path, header.metadata)
    return Checkpoint(
        tree=tree,
        source=SourceFacts(
            path=path,
            format=Format.SAFETENSORS,
            size=path.stat().st_size,
            storage_locations={"cpu": len(tensors)} if tensors else {},
            shared_storages=aliases,
            metadata=dict(header.metadata),
        ),
    )


def _map_tensors(path: Path, header: Header) -> dict[str, Any]:
    import torch

    data_start = header.data_start
    ordered = sorted(header.entries.items(), key=lambda item: item[1].start)
    if not any(entry.nbytes for _, entry in ordered):
        return {name: torch.empty(entry.shape, dtype=torch_dtype(entry.dtype))
                for name, entry in ordered}
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    tensors = {}
    for name, entry in ordered:
        dtype = torch_dtype(entry.dtype)
        offset = data_start + entry.start
        if entry.nbytes == 0:
            tensors[name] = torch.empty(entry.shape, dtype=dtype)
        elif offset % ITEMSIZE[entry.dtype] == 0:
            flat = torch.frombuffer(mapped, dtype=dtype, offset=offset,
                                    count=entry.nbytes // ITEMSIZE[entry.dtype])
            tensors[name] = flat.view(entry.shape)
        else:  # unaligned data (files not written by ckptport or safetensors): copy
            raw = torch.frombuffer(mapped, dtype=torch.uint8, offset=offset, count=entry.nbytes)
            tensors[name] = raw.clone().view(dtype).view(entry.shape)
    return tensors


def _aliases(path: Path, metadata: dict[str, str] | Any) -> tuple[tuple[str, ...], ...]:
    if ALIASES_KEY not in metadata:
        return ()
    try:
        aliases = json.loads(metadata[ALIASES_KEY])
        return tuple((name, *others) for name, others in aliases.items())
    except (ValueError, TypeError, AttributeError) as exc:
        raise InputError(f"corrupt {ALIASES_KEY} metadata: {exc!r}", path) from None
