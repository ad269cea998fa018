"""Read ``torch.distributed.checkpoint`` (DCP) folders without a process group.

torch's own DCP reader is used for tensor data (transforms, chunked
tensors, the ``.distcp`` layout), with the two places it would run code
from the file replaced:

- the ``.metadata`` file, which torch reads with plain ``pickle.load``, is
  scanned like every pickle (lengths, memo indexes, nesting) and then read
  by an unpickler that only builds DCP's own metadata classes;
- non-tensor items, which torch reads with ``torch.load(weights_only=False)``,
  are read by ckptport's unpickler.

Everything the metadata claims is checked before it is used: data file
names (plain ``*.distcp`` names in the folder, no links out of it), item
sizes against the data files, planner key paths (strings and list indexes
no larger than the number of items, not deeper than any real state dict).
Transformed (compressed) storage is refused: ckptport cannot bound what a
transform would allocate. Lightning's FSDP folders keep the rest of the
checkpoint in a ``meta.pt`` beside the DCP files; it is read with the
checkpoint reader and merged in.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, NoReturn, TypeGuard

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..errors import CkptportError, InputError
from ..sources import MemorySource, check_regular
from ..unpickle.engine import bounded
from ..unpickle.scan import ScanError, scan
from .assembled import check_tiling
from .base import Layout, Names, ReadOptions, Source, Where, local
from .layouts import or_problem

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

    from ..tree import Key, Tree
    from ..unpickle.values import Recorded

__all__ = ["DcpReader", "read_dcp_metadata", "dcp_metadata", "METADATA_FILE", "LIGHTNING_META"]

METADATA_FILE = ".metadata"
LIGHTNING_META = "meta.pt"
MAX_PATH_DEPTH = 64
_DCP = "torch.distributed.checkpoint"

LoadFile = Callable[[Path, ReadOptions], Checkpoint]


def dcp_metadata(folder: Path) -> Path:
    """The folder's ``.metadata``; an ``InputError`` when only its data files are there."""
    path = folder / METADATA_FILE
    if not path.exists() and not path.is_symlink():
        raise InputError("holds DCP data files (*.distcp) but no .metadata: a "
                         "torch.distributed.checkpoint folder is read from its .metadata",
                         folder)
    return path


def _allowed() -> dict[str, object]:
    import collections

    import torch
    from torch.distributed.checkpoint import filesystem, metadata

    names: dict[str, object] = {
        f"{_DCP}.metadata.{name}": getattr(metadata, name)
        for name in ("Metadata", "TensorStorageMetadata", "TensorProperties",
                     "ChunkStorageMetadata", "BytesStorageMetadata", "MetadataIndex",
                     "StorageMeta", "_MEM_FORMAT_ENCODING")
        if hasattr(metadata, name)
    }
    names[f"{_DCP}.filesystem._StorageInfo"] = filesystem._StorageInfo
    names["torch.serialization._get_layout"] = torch.serialization._get_layout
    names["torch.Size"] = torch.Size
    names["collections.OrderedDict"] = collections.OrderedDict
    names["pathlib.PosixPath"] = PurePosixPath  # a path value, never a filesystem handle
    names["pathlib.PurePosixPath"] = PurePosixPath
    for name, value in vars(torch).items():
        if isinstance(value, torch.dtype):
            names[f"torch.{name}"] = value
    return names


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata only: any other global is refused, never imported; the names a
    layout records beside it (``records``) become inert records of their state."""

    def __init__(self, file: IO[bytes], path: Path, allowed: dict[str, object],
                 records: tuple[str, ...]) -> None:
        super().__init__(file)
        self._path, self._allowed, self._records = path, allowed, records
        self._made: list[Recorded] = []

    def find_class(self, module: str, name: str) -> object:
        from ..unpickle.values import record_class

        qualified = f"{module}.{name}"
        if qualified in self._records:
            return record_class(qualified, False, self._made)
        if qualified not in self._allowed:
            raise InputError(f"DCP metadata refers to {qualified}, which is not DCP metadata; "
                             "nothing was run", self._path)
        return self._allowed[qualified]

    def persistent_load(self, pid: object) -> NoReturn:
        raise InputError("DCP metadata holds a persistent reference; refused", self._path)


def read_dcp_metadata(folder: Path, records: tuple[str, ...] = ()) -> Metadata:
    """The folder's DCP ``Metadata``, checked against its data files; ``records``: qualified
    names read as inert records (a layout's own planner data beside the metadata)."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = dcp_metadata(folder)
    check_regular(path)
    try:
        data = path.read_bytes()
        found = scan(data)
        allowed = _allowed()
        metadata: object = bounded(data, found, lambda stream: _MetadataUnpickler(
            stream, path, allowed, records))
    except CkptportError:
        raise
    except ScanError as exc:
        raise InputError(f"corrupt DCP metadata: {exc}", path) from None
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None
    except Exception as exc:  # any failure to parse hostile bytes is "corrupt"
        raise InputError(f"corrupt DCP metadata: {type(exc).__name__}: {exc}", path) from None
    if not isinstance(metadata, Metadata) or not isinstance(
            getattr(metadata, "storage_data", None), dict) or not isinstance(
            getattr(metadata, "state_dict_metadata", None), dict):
        raise InputError("corrupt DCP metadata: not a Metadata record of maps", path)
    for info in metadata.storage_data.values():
        name = str(getattr(info, "relative_path", ""))
        if PurePosixPath(name).name != name or not name.endswith(".distcp") or "\\" in name:
            raise InputError(f"DCP metadata names data file {name!r}: only plain *.distcp "
                             "names in the folder are allowed", path)
        data_file = folder / name
        if not data_file.exists():
            raise InputError(f"DCP data file {name} is missing", path)
        if Path(os.path.realpath(data_file)).parent != Path(os.path.realpath(folder)):
            raise InputError(f"DCP data file {name} is a link out of the folder", path)
        check_regular(data_file)
        if getattr(info, "transform_descriptors", None):
            raise InputError(f"DCP data in {name} is transformed (compressed); ckptport reads "
                             "plain DCP data only", path)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise InputError(f"corrupt DCP metadata: a byte range of {name} that is not one",
                             path)
        size = data_file.stat().st_size
        if offset + length > size:
            raise InputError(f"DCP data file {name} holds {size} bytes; the metadata reads "
                             f"bytes {offset}..{offset + length} of it (a truncated data "
                             "file, or another save's)", path)
    return metadata


def _plain_paths(paths: object, items: int) -> TypeGuard[dict[str, Sequence[Key]]]:
    """Planner data as DCP writes it: item name -> a short path of keys and list indexes."""
    return isinstance(paths, dict) and all(
        isinstance(fqn, str) and isinstance(path, (tuple, list)) and 0 < len(path) <=
        MAX_PATH_DEPTH and all(type(part) is str or (type(part) is int and 0 <= part <= items)
                               for part in path)
        for fqn, path in paths.items())


def _byte_item(folder: Path, fqn: str, data: bytes) -> Tree:
    """A non-tensor item: a ``torch.save``'d value, read by ckptport's own readers."""
    from . import load_bytes

    return load_bytes(MemorySource(folder / f"<{fqn}>", data)).tree


def _reader_and_planner(folder: Path, metadata: Metadata
                        ) -> tuple[FileSystemReader, DefaultLoadPlanner]:
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.planner import ReadItem

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            self.state_dict[fqn] = _byte_item(folder, fqn, value.getvalue())

    return SafeReader(folder), SafePlanner(flatten_state_dict=False, flatten_sharded_tensors=False)


def _checked_shape(folder: Path, fqn: str, item: object, data_bytes: int
                   ) -> tuple[tuple[int, ...], torch.dtype]:
    """The tensor's shape and dtype, refused before allocating if the data cannot hold it."""
    import torch

    size, dtype = getattr(item, "size", None), getattr(getattr(item, "properties", None),
                                                        "dtype", None)
    if not isinstance(dtype, torch.dtype) or not isinstance(size, tuple) or not all(
            type(d) is int and d >= 0 for d in size):
        raise InputError(f"corrupt DCP metadata for {fqn!r}: bad size or dtype", folder)
    nbytes = math.prod(size) * dtype.itemsize
    if nbytes > data_bytes:
        raise InputError(f"DCP item {fqn!r} declares {nbytes} bytes but the data files hold "
                         f"{data_bytes}", folder)
    return tuple(size), dtype


def _chunks_tile(folder: Path, fqn: str, item: object, shape: tuple[int, ...],
                 storage: Mapping[object, object]) -> None:
    """Prove the item's chunks tile its declared shape, each with data, before torch
    allocates the tensor uninitialized (``torch.empty``) for DCP to fill: an element no
    chunk covers would be written out as whatever memory held."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    chunks = getattr(item, "chunks", None)
    if not isinstance(chunks, list):
        raise InputError(f"corrupt DCP metadata for {fqn!r}: no chunk list", folder)
    boxes: list[tuple[tuple[int, ...], tuple[int, ...], str]] = []
    for chunk in chunks:
        offsets, sizes = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
        if not (_sizes(offsets, len(shape)) and _sizes(sizes, len(shape))):
            raise InputError(f"corrupt DCP metadata for {fqn!r}: a chunk's offsets or sizes "
                             f"are not {len(shape)} sizes", folder)
        info = storage.get(MetadataIndex(fqn, offsets))
        if info is None:
            raise InputError(f"DCP item {fqn!r}: its chunk at {list(offsets)} has no data "
                             "(no storage entry)", folder)
        boxes.append((offsets, sizes, str(getattr(info, "relative_path", "?"))))
    check_tiling(repr(fqn), folder, shape, boxes)


def _sizes(value: object, rank: int) -> TypeGuard[tuple[int, ...]]:
    """Whether a chunk's ``offsets`` or ``sizes`` are ``rank`` sizes (unpickled: anything)."""
    return (isinstance(value, tuple) and len(value) == rank
            and all(type(d) is int and d >= 0 for d in value))


def _set(tree: dict[Key, Tree], path: tuple[Key, ...], value: Tree) -> None:
    """Place ``value`` at ``path`` as DCP's traversal does: ints index lists, strs key dicts."""
    node: Tree = tree
    for part, following in zip(path, (*path[1:], None), strict=True):
        last = following is None
        if isinstance(node, list):
            if type(part) is not int:
                raise TypeError(part)
            node.extend([None] * (part + 1 - len(node)))
            if last:
                node[part] = value
            else:
                if node[part] is None:
                    node[part] = [] if type(following) is int else {}
                node = node[part]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, [] if type(following) is int else {})
        else:
            raise TypeError(part)


def _planner_facts(metadata: Metadata, paths: Mapping[str, Sequence[Key]], files: tuple[Path, ...]
                   ) -> dict[str, str]:
    """What the DCP planner recorded, as strings for reports (``inspect``)."""
    import json

    facts = {
        "dcp.items": str(len(metadata.state_dict_metadata)),
        "dcp.data_files": ", ".join(f.name for f in files if f.suffix == ".distcp"),
        "dcp.planner_data": json.dumps({fqn: [str(p) for p in path]
                                        for fqn, path in paths.items()}),
    }
    version = getattr(metadata, "version", None)
    if version is not None:
        facts["dcp.version"] = str(version)
    return facts


class DcpReader:
    format = Format.DCP
    records: tuple[str, ...] = ()  # names in .metadata read as inert records (none: DCP's own)

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A DCP folder: its ``.metadata``, or ``*.distcp`` data files that lost it (one
        checkpoint either way; reading the second is an error naming what is missing), and
        Lightning's ``meta.pt`` beside them."""
        if names is None:
            return None
        data = sorted(n for n in names if n.endswith(".distcp"))
        if METADATA_FILE not in names and not data:
            return None
        covered = [n for n in (METADATA_FILE, *data, LIGHTNING_META) if n in names]
        return Layout(folder, tuple(folder / n for n in covered), self, Format.DCP)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        # chunks that do not tile a tensor: CKP013 in reports
        return or_problem(lambda: self._load(source, options), source.main, self.format,
                          source.files, "torch.distributed.checkpoint", options.lenient)

    def _load(self, source: Source, options: ReadOptions) -> Checkpoint:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        folder = local(source.main, self.format)
        metadata = read_dcp_metadata(folder, self.records)
        items = metadata.state_dict_metadata
        paths = getattr(metadata, "planner_data", None) or {}
        if not _plain_paths(paths, len(items)) or not all(isinstance(k, str) for k in items):
            raise InputError("corrupt DCP metadata: planner data or item names are not key "
                             "paths", folder)
        files = tuple(map(local, source.files))
        data_bytes = sum(f.stat().st_size for f in files if f.suffix == ".distcp")
        tree: dict[Key, Tree] = {}
        for fqn, item in items.items():
            value = _item(folder, fqn, item, metadata, data_bytes)
            try:
                _set(tree, tuple(paths.get(fqn, (fqn,))), value)
            except (TypeError, KeyError, IndexError, AttributeError):
                raise InputError(f"corrupt DCP planner data for {fqn!r}", folder) from None
        meta_facts: dict[str, str] = {}
        meta = folder / LIGHTNING_META
        if meta in files:
            extra = self.load_file(meta, options)
            if isinstance(extra.tree, dict):
                tree = {**extra.tree, **tree}
                meta_facts["lightning.meta"] = LIGHTNING_META
        tensors = sum(isinstance(i, TensorStorageMetadata) for i in items.values())
        return Checkpoint(tree, SourceFacts(
            path=folder, format=self.format, size=sum(f.stat().st_size for f in files),
            storage_locations=dict(Counter({"cpu": tensors})) if tensors else {},
            files=files, metadata={**_planner_facts(metadata, paths, files), **meta_facts}))


def _item(folder: Path, fqn: str, item: object, metadata: Metadata, data_bytes: int) -> Tree:
    """One item read by DCP's own loader: a tensor into one allocated after its chunks were
    proven to tile it, anything else by ckptport's readers (``_byte_item``)."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    value: torch.Tensor | None = None
    if isinstance(item, TensorStorageMetadata):
        shape, dtype = _checked_shape(folder, fqn, item, data_bytes)
        _chunks_tile(folder, fqn, item, shape, metadata.storage_data)
        value = torch.empty(shape, dtype=dtype)  # every element proven written
    loaded: dict[str, Tree] = {fqn: value}
    reader, planner = _reader_and_planner(folder, metadata)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load(loaded, storage_reader=reader, planner=planner, no_dist=True)
    except CkptportError as exc:
        raise exc.at(folder) from None
    except (Exception, CheckpointException) as exc:  # torch reports broken files many ways
        inner = _inner_error(exc)
        if inner is not None:
            raise inner.at(folder) from None
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        raise InputError(f"cannot read DCP item {fqn!r}: {type(exc).__name__}: "
                         f"{detail}", folder) from None
    return loaded[fqn]


def _inner_error(exc: BaseException) -> CkptportError | None:
    """A ckptport error raised inside torch's DCP machinery (it wraps them)."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, CkptportError):
            return current
        stack += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):  # rank -> (exception, traceback)
            stack += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return None
