"""Write ``.safetensors`` files deterministically, one tensor at a time.

The header is written by ckptport (sorted keys, padded to 8 bytes) because
``safetensors.save_file`` orders metadata differently per process. Tensors
are laid out largest element size first, then by name, as the safetensors
library does, so every tensor is aligned in the file for zero-copy reads.
Tied tensors are stored once; their other names go in ``ckptport.aliases``,
and the whole tree (non-tensor leaves of ``--select all``, key order,
state-dict ``_metadata``) in ``ckptport.tree``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Union

from .. import treejson
from .._version import __version__
from ..checkpoint import KeyPath, format_path, iter_tensors
from ..dtypes import dtype_code
from ..errors import OutputError
from ..lazy import materialize
from ..readers.safetensors import ALIASES_KEY, TREE_KEY
from ..safetensors_layout import ITEMSIZE, Entry, encode_header
from ..tensorops import as_bytes, view_key

__all__ = ["Pending", "MetadataValue", "SafetensorsPlan", "plan_safetensors",
           "write_safetensors"]


@dataclass(frozen=True)
class Pending:
    """A metadata value still being computed while tensors are written (the source's sha256).

    The header is written with a placeholder of the same width and patched
    in place once the value is known, so hashing overlaps writing.
    """

    future: Future[str]
    width: int

    def placeholder(self) -> str:
        return "0" * self.width


MetadataValue = Union[str, Pending]  # noqa: UP007 (a runtime alias on Python 3.10)


@dataclass(frozen=True)
class SafetensorsPlan:
    """What goes where: computed once, used to write and then to verify."""

    tensors: Mapping[str, Any]
    entries: Mapping[str, Entry]
    aliases: Mapping[str, tuple[str, ...]]
    metadata: Mapping[str, MetadataValue]
    header: bytes = field(init=False)

    def __post_init__(self) -> None:
        placeholders = {k: v.placeholder() if isinstance(v, Pending) else v
                        for k, v in self.metadata.items()}
        object.__setattr__(self, "header", encode_header(placeholders, self.entries))

    def final_header(self) -> bytes:
        """The header with every pending value resolved; same length as ``header``."""
        values = {k: v.future.result() if isinstance(v, Pending) else v
                  for k, v in self.metadata.items()}
        header = encode_header(values, self.entries)
        if len(header) != len(self.header):
            raise ValueError("a pending metadata value changed the header's length")
        return header


def plan_safetensors(tree: Any, metadata: Mapping[str, MetadataValue],
                     dst: Any) -> SafetensorsPlan:
    canonical: dict[Any, str] = {}
    names: dict[int, str] = {}
    tensors: dict[str, Any] = {}
    aliases: dict[str, list[str]] = {}
    for path, tensor in iter_tensors(tree):
        name = format_path(path)
        if name in tensors or any(name in a for a in aliases.values()):
            raise OutputError(f"two tensors would both be named {name!r} in safetensors; "
                              "write .pth instead", dst)
        if dtype_code(tensor.dtype) is None:
            raise OutputError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors "
                              "cannot store; write .pth or cast with --dtype", dst)
        key = view_key(tensor)
        if key is not None and key in canonical:
            aliases.setdefault(canonical[key], []).append(name)
        else:
            tensors[name] = tensor
            if key is not None:
                canonical[key] = name
        names[id(tensor)] = canonical.get(key, name) if key is not None else name

    def tensor_name(path: KeyPath, tensor: Any) -> str:
        return names[id(tensor)]

    entries = _layout(tensors)
    meta = {"format": "pt", "ckptport.version": __version__, **metadata,
            TREE_KEY: treejson.encode(tree, tensor_name)}
    if aliases:
        meta[ALIASES_KEY] = json.dumps(dict(sorted(aliases.items())),
                                       separators=(",", ":"))
    return SafetensorsPlan(tensors, entries, {k: tuple(v) for k, v in aliases.items()}, meta)


def _layout(tensors: Mapping[str, Any]) -> dict[str, Entry]:
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    entries, offset = {}, 0
    for name in order:
        tensor = tensors[name]
        code = dtype_code(tensor.dtype)
        assert code is not None and ITEMSIZE[code] == tensor.element_size()
        size = tensor.numel() * tensor.element_size()
        entries[name] = Entry(code, tuple(tensor.shape), offset, offset + size)
        offset += size
    return entries


def write_safetensors(plan: SafetensorsPlan, file: BinaryIO,
                      advance: Callable[[int], None]) -> None:
    file.write(plan.header)
    for name in plan.entries:
        tensor = materialize(plan.tensors[name]).contiguous()  # one tensor at a time
        if tensor.numel():
            file.write(as_bytes(tensor).numpy().data)  # a view of the bytes, no copy
        advance(tensor.numel() * tensor.element_size())
        del tensor  # released before the next one is made
    if any(isinstance(v, Pending) for v in plan.metadata.values()):
        file.seek(0)
        file.write(plan.final_header())
        file.seek(0, 2)
