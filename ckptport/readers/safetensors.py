"""Read ``.safetensors`` files: the header parsed strictly, tensors described by position.

What a file holds is what the safetensors library would load: its tensor
names, dtypes, shapes and bytes. ckptport's own metadata in a file
(``ckptport.tree``: the whole tree of ``--select all``, key order and
state-dict ``_metadata``; ``ckptport.aliases``: tied names) is a claim like
any other. It is used only when it agrees with the tensors — every tensor
appears under its own name, and any other name that leads to it is a
declared alias — otherwise the reader keeps the library's view and says
why in the source's notes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from .. import treejson
from ..checkpoint import Checkpoint, Format, SourceFacts
from ..containers.safetensors import Header, parse_header
from ..tensors import Blob, StorageInfo, TensorInfo, contiguous_strides
from ..tree import KEY_ALIASES, KEY_TREE, format_path, iter_tensors
from .base import ReadOptions, Source

__all__ = ["SafetensorsReader", "header_of"]


def header_of(source: Source) -> Header:
    assert source.file is not None
    return source.parsed("header", lambda: parse_header(source.file))  # type: ignore[arg-type]


def _tensors(source: Source, header: Header) -> dict[str, TensorInfo]:
    assert source.file is not None
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.entries.items():
        blob = Blob(source.file, header.data_start + entry.start, entry.nbytes,
                    name=f"tensor {name}")
        storage = StorageInfo(name, "cpu", entry.dtype, entry.nbytes, blob)
        tensors[name] = TensorInfo(entry.dtype, entry.shape, contiguous_strides(entry.shape),
                                   0, storage)
    return tensors


def _aliases(metadata: Any, tensors: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """``ckptport.aliases``, if well formed: tensor name -> its other names."""
    if KEY_ALIASES not in metadata:
        return {}
    aliases = json.loads(metadata[KEY_ALIASES])
    if not isinstance(aliases, dict) or not all(
            name in tensors and isinstance(others, list) and all(
                isinstance(o, str) and o not in tensors for o in others)
            for name, others in aliases.items()):
        raise treejson.TreeDecodeError(f"{KEY_ALIASES} names tensors the file does not hold")
    flat = [o for others in aliases.values() for o in others]
    if len(set(flat)) != len(flat):
        raise treejson.TreeDecodeError(f"{KEY_ALIASES} gives one name to two tensors")
    return {name: tuple(others) for name, others in aliases.items()}


def _claimed_tree(metadata: Any, tensors: dict[str, TensorInfo]) -> Any:
    """The tree ``ckptport.tree`` claims, if every tensor sits under its own or an alias name."""
    aliases = _aliases(metadata, tensors)
    tree = treejson.decode(metadata[KEY_TREE], tensors)
    by_id = {id(t): name for name, t in tensors.items()}
    seen: set[str] = set()
    for path, leaf in iter_tensors(tree):
        name, where = by_id[id(leaf)], format_path(path)
        if where != name and where not in aliases.get(name, ()):
            raise treejson.TreeDecodeError(f"{KEY_TREE} puts tensor {name!r} at {where!r}, "
                                           "where the safetensors library would not")
        seen.add(name)
    if seen != set(tensors):
        raise treejson.TreeDecodeError(f"{KEY_TREE} leaves out tensors the file holds")
    return tree


class SafetensorsReader:
    format = Format.SAFETENSORS

    def claims(self, source: Source) -> bool:
        return source.format is Format.SAFETENSORS

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        assert source.file is not None
        header = header_of(source)
        tensors = _tensors(source, header)
        tree: Any = OrderedDict(tensors)
        notes: tuple[str, ...] = ()
        aliases: dict[str, tuple[str, ...]] = {}
        if KEY_TREE in header.metadata:
            try:
                tree = _claimed_tree(header.metadata, tensors)
                aliases = _aliases(header.metadata, tensors)
            except (treejson.TreeDecodeError, ValueError, RecursionError) as exc:
                tree = OrderedDict(tensors)
                notes = (f"{KEY_TREE} metadata ignored ({exc}): the tensors are read as the "
                         "safetensors library lists them",)
        return Checkpoint(tree, SourceFacts(
            path=source.main, format=self.format, size=source.file.size,
            storage_locations={"cpu": len(tensors)} if tensors else {},
            shared_storages=tuple((name, *others) for name, others in aliases.items()),
            metadata=dict(header.metadata), notes=notes))
