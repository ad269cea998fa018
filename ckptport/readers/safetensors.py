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
import re
from collections import OrderedDict
from collections.abc import Mapping

from .. import treejson
from ..checkpoint import Checkpoint, Format, SourceFacts
from ..containers.safetensors import Header, parse_header
from ..errors import InputError
from ..sources import SourceFile
from ..tensors import Blob, StorageInfo, TensorInfo, contiguous_strides
from ..tree import KEY_ALIASES, KEY_TREE, Tree, format_path, iter_tensors
from .base import ReadOptions, Source, Where
from .layouts import PROBLEMS, LayoutError

__all__ = ["SafetensorsReader", "header_of", "tensors_of", "sharding_offsets", "SHARD_FILE",
           "SHARDING_INFO"]

# torch's HuggingFaceStorageWriter: rank R's part of model file I of N (ranks and files
# from 1), the parts' offsets in the whole tensors in the header's DCP_SHARDING_INFO
SHARD_FILE = re.compile(r"shard-([0-9]+)-model-([0-9]+)-of-([0-9]+)\.safetensors")
SHARDING_INFO = "DCP_SHARDING_INFO"


def header_of(source: Source) -> Header:
    file = source.file
    assert file is not None
    return source.parsed("header", lambda: parse_header(file))


def tensors_of(file: SourceFile, header: Header) -> dict[str, TensorInfo]:
    """The file's tensors, described by position, in file order."""
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.entries.items():
        blob = Blob(file, header.data_start + entry.start, entry.nbytes,
                    name=f"tensor {name}")
        storage = StorageInfo(name, "cpu", entry.dtype, entry.nbytes, blob)
        tensors[name] = TensorInfo(entry.dtype, entry.shape, contiguous_strides(entry.shape),
                                   0, storage)
    return tensors


def sharding_offsets(header: Header, path: Where) -> dict[str, tuple[int, ...]] | None:
    """``DCP_SHARDING_INFO``'s offsets of each tensor's part in its whole tensor, checked
    to name exactly the file's tensors; None when the header has none."""
    text = header.metadata.get(SHARDING_INFO)
    if text is None:
        return None
    try:
        info = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        info = None
    offsets: dict[str, tuple[int, ...]] = {}
    for name, entry in header.entries.items():
        record = info.get(name) if isinstance(info, dict) else None
        saved = record.get("saved_offsets") if isinstance(record, dict) else None
        if not isinstance(saved, list) or len(saved) != len(entry.shape) or not all(
                type(o) is int and o >= 0 for o in saved):
            raise InputError(f"{SHARDING_INFO} gives {name!r} no offsets of its "
                             f"{len(entry.shape)} dimensions", path)
        offsets[name] = tuple(saved)
    if not isinstance(info, dict) or set(info) != set(offsets):
        raise InputError(f"{SHARDING_INFO} names tensors the file does not hold", path)
    return offsets


def _part_alone(header: Header, path: Where) -> str | None:
    """Why a file read alone is part of a distributed save (a rank's shard file, or parts
    at offsets other than 0), or None when it is whole."""
    offsets = sharding_offsets(header, path)
    if offsets is None:
        return None
    moved = next(((name, at) for name, at in offsets.items() if any(at)), None)
    named = SHARD_FILE.fullmatch(path.name)
    if moved is None and named is None:
        return None  # rank-0 checkpointing: whole tensors, offsets 0
    what = f"rank {int(named[1])}'s shard file" if named else "a shard file"
    detail = (f"; {moved[0]!r} is its part at {list(moved[1])} of a larger tensor, the rest "
              "in other ranks' files") if moved else (
        "; the other ranks' parts of its tensors are in their own files")
    return (f"is {what} of a torch.distributed.checkpoint HuggingFaceStorageWriter save "
            f"({SHARDING_INFO}){detail}: read the folder holding every rank's "
            "shard-*-model-*-of-*.safetensors files as one checkpoint")


def _aliases(metadata: Mapping[str, str], tensors: Mapping[str, TensorInfo]
             ) -> dict[str, tuple[str, ...]]:
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


def _claimed_tree(metadata: Mapping[str, str], tensors: dict[str, TensorInfo]) -> Tree:
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
        partial = _part_alone(header, source.main)
        if partial is not None and not options.lenient:
            raise LayoutError(partial, source.main)
        tensors = tensors_of(source.file, header)
        tree: Tree = OrderedDict(tensors)
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
            metadata={**header.metadata, **({PROBLEMS: partial} if partial else {})},
            notes=notes))
