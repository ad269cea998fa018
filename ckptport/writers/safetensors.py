"""Write ``.safetensors`` files deterministically, one tensor at a time.

The header is written by ckptport (sorted keys, padded to 8 bytes) because
``safetensors.save_file`` orders metadata differently per process. Tensors
are laid out largest element size first, then by name, as the safetensors
library does, so every tensor is aligned in the file for zero-copy reads;
each tensor's bytes are streamed in pieces. Tied tensors are stored once;
their other names go in ``ckptport.aliases``, and the whole tree
(non-tensor leaves of ``--select all``, key order, state-dict ``_metadata``)
in ``ckptport.tree``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Union

from .. import treejson
from .._version import __version__
from ..containers.safetensors import METADATA_KEY, Entry, encode_header
from ..dtypes import dtype_of
from ..errors import OutputError
from ..tensors import ViewKey, announce, chunks, file_range, nbytes, view_key
from ..tree import (
    KEY_ALIASES,
    KEY_RULES,
    KEY_SOURCE_SHA256,
    KEY_TREE,
    KEY_VERSION,
    KeyPath,
    TensorLeaf,
    Tree,
    format_path,
    iter_tensors,
)
from .base import LatePatch
from .copy import RangeCopier
from .staging import preallocate

if TYPE_CHECKING:
    from .base import Tap, WriteOptions
    from .provenance import Provenance

__all__ = ["Late", "MetadataValue", "SafetensorsFile", "SafetensorsPlan", "provenance_metadata",
           "plan_safetensors", "write_safetensors"]


@dataclass(frozen=True)
class Late:
    """A metadata value still being computed while tensors are written (the source's sha256).

    The header is written with a placeholder of the same width and patched
    in place once the value is known, so hashing overlaps writing.
    """

    future: Future[str]
    width: int

    def placeholder(self) -> str:
        return "0" * self.width


MetadataValue = Union[str, Late]  # noqa: UP007 (a runtime alias on Python 3.10)


@dataclass(frozen=True)
class SafetensorsPlan:
    """What goes where: computed once, used to write and then to verify."""

    tensors: Mapping[str, TensorLeaf]
    entries: Mapping[str, Entry]
    aliases: Mapping[str, tuple[str, ...]]
    metadata: Mapping[str, MetadataValue]
    header: bytes = field(init=False)

    def __post_init__(self) -> None:
        placeholders = {k: v.placeholder() if isinstance(v, Late) else v
                        for k, v in self.metadata.items()}
        object.__setattr__(self, "header", encode_header(placeholders, self.entries))

    def final_header(self) -> bytes:
        """The header with every pending value resolved; same length as ``header``."""
        values = {k: v.future.result() if isinstance(v, Late) else v
                  for k, v in self.metadata.items()}
        header = encode_header(values, self.entries)
        if len(header) != len(self.header):
            raise ValueError("a pending metadata value changed the header's length")
        return header


class SafetensorsFile:
    """A ``.safetensors`` file; verified by the safetensors library and an independent read."""

    def write(self, tree: Tree, file: BinaryIO, dst: Path, options: WriteOptions,
              advance: Callable[[int], None]) -> SafetensorsPlan:
        plan = plan_safetensors(tree, provenance_metadata(options.provenance), dst)
        write_safetensors(plan, file, advance, options.taps, options.defer)
        return plan

    def verify(self, path: Path, tree: Tree, written: SafetensorsPlan, options: WriteOptions,
               advance: Callable[[int], None]) -> None:
        from .verify import verify_safetensors

        verify_safetensors(path, written.entries, tree, advance, options.jobs,
                           options.streamed)


SHA256_HEX_WIDTH = 64


def provenance_metadata(provenance: Provenance | None) -> dict[str, MetadataValue]:
    """What a safetensors output records of its source: its own metadata (``carried``), the
    sha256 of the files read (patched in once hashed), what the rules did."""
    if provenance is None:
        return {}
    return {**provenance.carried, **provenance.extra,
            KEY_SOURCE_SHA256: Late(provenance.sha256(), SHA256_HEX_WIDTH),
            KEY_RULES: json.dumps(dict(provenance.rules), sort_keys=True,
                                  separators=(",", ":"))}


def plan_safetensors(tree: Tree, metadata: Mapping[str, MetadataValue],
                     dst: Path) -> SafetensorsPlan:
    canonical: dict[ViewKey, str] = {}
    names: dict[KeyPath, str] = {}
    tensors: dict[str, TensorLeaf] = {}
    aliases: dict[str, list[str]] = {}
    taken: set[str] = set()
    for path, tensor in iter_tensors(tree):
        name = format_path(path)
        if name in taken:
            raise OutputError(f"two tensors would both be named {name!r} in safetensors; "
                              "write .pth instead", dst)
        if name == METADATA_KEY:
            raise OutputError(f"a tensor is named {METADATA_KEY!r}, the name safetensors keeps "
                              "for its metadata; write .pth instead", dst)
        taken.add(name)
        if dtype_of(tensor).safetensors is None:
            raise OutputError(f"tensor {name!r} has dtype {dtype_of(tensor)}, which "
                              "safetensors cannot store; write .pth or cast with --dtype", dst)
        key = view_key(tensor)
        if key in canonical:
            aliases.setdefault(canonical[key], []).append(name)
        else:
            tensors[name] = tensor
            canonical[key] = name
        names[path] = canonical[key]

    def tensor_name(path: KeyPath, tensor: TensorLeaf) -> str:
        return names[path]

    meta = {"format": "pt", KEY_VERSION: __version__, **metadata,
            KEY_TREE: treejson.encode(tree, tensor_name)}
    if aliases:
        meta[KEY_ALIASES] = json.dumps(dict(sorted(aliases.items())), separators=(",", ":"))
    return SafetensorsPlan(tensors, _layout(tensors), {k: tuple(v) for k, v in aliases.items()},
                           meta)


def _layout(tensors: Mapping[str, TensorLeaf]) -> dict[str, Entry]:
    order = sorted(tensors, key=lambda n: (-dtype_of(tensors[n]).itemsize, n))
    entries, offset = {}, 0
    for name in order:
        tensor = tensors[name]
        size = nbytes(tensor)
        entries[name] = Entry(dtype_of(tensor), tuple(tensor.shape), offset, offset + size)
        offset += size
    return entries


def write_safetensors(plan: SafetensorsPlan, file: BinaryIO, advance: Callable[[int], None],
                      tap: Tap | None = None, defer: Callable[[LatePatch], None] | None = None
                      ) -> None:
    preallocate(file, len(plan.header) + sum(e.end - e.start for e in plan.entries.values()))
    file.write(plan.header)
    announce(plan.tensors[name] for name in plan.entries)
    copier = RangeCopier(file)
    for name in plan.entries:
        tensor = plan.tensors[name]
        where = file_range(tensor)
        if tap is None and where is not None and copier.copy(*where):
            advance(where[2])  # copied file to file by the kernel
            continue
        pieces = chunks(tensor) if tap is None else tap(tensor, chunks(tensor))
        done = 0
        for piece in pieces:  # one tensor at a time, piece by piece
            if where is None or not copier.copy(where[0], where[1] + done, len(piece)):
                file.write(piece)
            done += len(piece)
            advance(len(piece))
    if any(isinstance(v, Late) for v in plan.metadata.values()):
        if defer is not None:
            defer(LatePatch(0, len(plan.header), plan.final_header))
            return
        file.seek(0)
        file.write(plan.final_header())
        file.seek(0, 2)
