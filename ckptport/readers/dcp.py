"""Read ``torch.distributed.checkpoint`` (DCP) folders without a process group.

torch's own DCP reader is used for the data (transforms, chunked tensors,
the ``.distcp`` layout), with the two places it would run code from the
file replaced: the ``.metadata`` file, which torch reads with plain
``pickle.load``, is read by an unpickler that only builds DCP's own
metadata classes, dtypes and sizes; non-tensor items, which torch's planner
reads with ``torch.load(weights_only=False)``, are read with
``weights_only=True`` and ckptport's allowlist. Data file names in the
metadata are data from the file: anything but a plain ``*.distcp`` name in
the folder is refused. Tensors are loaded one at a time.
"""

from __future__ import annotations

import io
import math
import pickle
import warnings
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..errors import InputError
from . import allowlist
from .pickle_scan import scan_globals

__all__ = ["read_dcp", "is_dcp", "read_dcp_metadata", "METADATA_FILE"]

METADATA_FILE = ".metadata"
_DCP = "torch.distributed.checkpoint"


def is_dcp(folder: Path) -> bool:
    return (folder / METADATA_FILE).is_file()


def _allowed() -> dict[str, Any]:
    import collections

    import torch
    from torch.distributed.checkpoint import filesystem, metadata

    names: dict[str, Any] = {
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
    """Builds DCP metadata only: any other global is refused, never imported."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self._path = path
        self._allowed = _allowed()

    def find_class(self, module: str, name: str) -> Any:
        qualified = f"{module}.{name}"
        if qualified not in self._allowed:
            raise InputError(f"DCP metadata refers to {qualified}, which is not DCP metadata; "
                             "nothing was run", self._path)
        return self._allowed[qualified]

    def persistent_load(self, pid: Any) -> Any:
        raise InputError("DCP metadata holds a persistent reference; refused", self._path)


def read_dcp_metadata(folder: Path) -> Any:
    path = folder / METADATA_FILE
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        data = path.read_bytes()
        # The C unpickler allocates a string's declared length before reading it;
        # walking the opcodes first refuses lengths past the end of the data.
        scan_globals(io.BytesIO(data))
        metadata = _MetadataUnpickler(io.BytesIO(data), path).load()
    except InputError:
        raise
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None
    except Exception as exc:  # any failure to parse hostile bytes is "corrupt"
        raise InputError(f"corrupt DCP metadata: {type(exc).__name__}: {exc}", path) from None
    if not isinstance(metadata, Metadata):
        raise InputError("DCP metadata is not a Metadata record", path)
    if not isinstance(getattr(metadata, "storage_data", None), dict) or not isinstance(
        getattr(metadata, "state_dict_metadata", None), dict
    ):
        raise InputError("corrupt DCP metadata: storage data or items are not maps", path)
    for info in metadata.storage_data.values():
        name = str(getattr(info, "relative_path", ""))
        if PurePosixPath(name).name != name or not name.endswith(".distcp") or "\\" in name:
            raise InputError(f"DCP metadata names data file {name!r}: only plain *.distcp "
                             "names in the folder are allowed", path)
        if not (folder / name).is_file():
            raise InputError(f"DCP data file {name} is missing", path)
    return metadata


def _reader_and_planner(folder: Path, metadata: Any) -> tuple[Any, Any]:
    import torch
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            with torch.serialization.safe_globals(allowlist.safe_globals()):
                try:
                    obj = torch.load(value, weights_only=True, map_location="cpu")
                except pickle.UnpicklingError as exc:
                    raise InputError(f"DCP item {read_item.dest_index.fqn!r} needs globals "
                                     f"outside the weights-only allowlist: "
                                     f"{str(exc).splitlines()[0][:200]}", folder) from None
            self.state_dict[read_item.dest_index.fqn] = obj

    return SafeReader(folder), SafePlanner(flatten_state_dict=False, flatten_sharded_tensors=False)


def read_dcp(folder: Path) -> Checkpoint:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = read_dcp_metadata(folder)
    paths = getattr(metadata, "planner_data", None) or {}
    if not _plain_paths(paths) or not all(isinstance(k, str)
                                          for k in metadata.state_dict_metadata):
        raise InputError("corrupt DCP metadata: planner data or item names are not key paths",
                         folder)
    infos = list(metadata.storage_data.values())
    data_bytes = None if any(getattr(i, "transform_descriptors", None) for i in infos) else sum(
        (folder / name).stat().st_size for name in {str(i.relative_path) for i in infos})
    tree: dict[Any, Any] = {}
    for fqn, item in metadata.state_dict_metadata.items():
        value: Any = None
        if isinstance(item, TensorStorageMetadata):
            shape, dtype = _checked_shape(folder, fqn, item, data_bytes)
            value = torch.empty(shape, dtype=dtype)
        loaded = {fqn: value}
        reader, planner = _reader_and_planner(folder, metadata)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.load(loaded, storage_reader=reader, planner=planner, no_dist=True)
        except InputError:
            raise
        except (Exception, CheckpointException) as exc:  # torch reports broken files many ways
            detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
            raise InputError(f"cannot read DCP item {fqn!r}: {type(exc).__name__}: {detail}",
                             folder) from None
        try:
            set_element(tree, tuple(paths.get(fqn, (fqn,))), loaded[fqn])
        except (TypeError, KeyError, IndexError, AttributeError):
            raise InputError(f"corrupt DCP planner data for {fqn!r}", folder) from None
    files = (folder / METADATA_FILE, *sorted({folder / str(i.relative_path)
                                              for i in metadata.storage_data.values()}))
    tensors = sum(isinstance(i, TensorStorageMetadata)
                  for i in metadata.state_dict_metadata.values())
    return Checkpoint(tree, SourceFacts(
        path=folder, format=Format.DCP, size=sum(f.stat().st_size for f in files),
        storage_locations=dict(Counter({"cpu": tensors})) if tensors else {},
        files=files, metadata=_planner_facts(metadata, paths, files),
    ))



def _checked_shape(folder: Path, fqn: str, item: Any,
                   data_bytes: int | None) -> tuple[Any, Any]:
    """The tensor's shape and dtype, refused before allocating if the data cannot hold it.

    ``data_bytes`` is None when the data is transformed (compressed) and may
    legitimately be smaller than the tensors.
    """
    import torch

    size, dtype = getattr(item, "size", None), getattr(getattr(item, "properties", None),
                                                        "dtype", None)
    if not isinstance(dtype, torch.dtype) or not isinstance(size, tuple) or not all(
        type(d) is int and d >= 0 for d in size
    ):
        raise InputError(f"corrupt DCP metadata for {fqn!r}: bad size or dtype", folder)
    nbytes = math.prod(size) * dtype.itemsize
    if data_bytes is not None and nbytes > data_bytes:
        raise InputError(f"DCP item {fqn!r} declares {nbytes} bytes but the data files hold "
                         f"{data_bytes}", folder)
    return tuple(size), dtype


def _plain_paths(paths: Any) -> bool:
    """Planner data as DCP writes it: item name -> path of str keys and int indexes."""
    return isinstance(paths, dict) and all(
        isinstance(fqn, str) and isinstance(path, (tuple, list)) and path
        and all(type(part) in (str, int) for part in path)
        for fqn, path in paths.items()
    )


def _planner_facts(metadata: Any, paths: dict[str, Any], files: tuple[Path, ...]) -> dict[str, str]:
    """What the DCP planner recorded, as strings for reports (``inspect``)."""
    import json

    facts = {
        "dcp.items": str(len(metadata.state_dict_metadata)),
        "dcp.data_files": ", ".join(f.name for f in files[1:]),
        "dcp.planner_data": json.dumps({fqn: [str(p) for p in path]
                                        for fqn, path in paths.items()}),
    }
    version = getattr(metadata, "version", None)
    if version is not None:
        facts["dcp.version"] = str(version)
    return facts
