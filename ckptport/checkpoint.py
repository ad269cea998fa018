"""The Checkpoint model shared by every command.

A checkpoint is a tree of plain data (dict, list, tuple, str, int, float,
bool, None) whose leaves may be tensors, plus facts about where it came from.
Tensors stay lazy: readers hand out tensors backed by a memory map of the
file, so nothing is read from disk until a command touches the bytes.

This module imports torch lazily: ``Checkpoint`` and the tree helpers are
needed by code paths (the CLI's ``--help``) that must start without torch.
"""

from __future__ import annotations

import enum
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "Format",
    "SourceFacts",
    "Checkpoint",
    "KeyPath",
    "TensorInfo",
    "StorageInfo",
    "format_path",
    "is_tensor",
    "iter_tensors",
    "map_tree",
    "rebuild_dict",
    "shared_storages",
]

KeyPath = tuple[Any, ...]


class Format(str, enum.Enum):
    """Container formats ckptport reads and writes."""

    TORCH_ZIP = "torch-zip"
    TORCH_LEGACY = "torch-legacy"
    SAFETENSORS = "safetensors"
    TORCH_SHARDS = "torch-shards"
    SAFETENSORS_SHARDS = "safetensors-shards"
    DCP = "dcp"
    TORCHSCRIPT = "torchscript"


@dataclass(frozen=True)
class SourceFacts:
    """What the source file recorded, kept for reports and checks.

    ``storage_locations`` counts storages by the device the file recorded
    (``cuda:3``), although every tensor in the tree lives on the CPU.
    ``globals`` are the importable names the pickle refers to;
    ``shared_storages`` groups tree paths whose tensors share one storage.
    ``files`` are every file the checkpoint's bytes come from (a shard set's
    index and shards), in the order they are hashed.
    """

    path: Path
    format: Format
    size: int
    storage_locations: Mapping[str, int] = field(default_factory=dict)
    globals: tuple[str, ...] = ()
    shared_storages: tuple[tuple[str, ...], ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    trusted: bool = False
    # dangerous globals and refused calls, kept as inert records when read for a report
    refused_globals: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if not self.files:  # a single-file source is its own content
            object.__setattr__(self, "files", (self.path,))


@dataclass(frozen=True)
class Checkpoint:
    """A tree of plain data with tensor leaves, and the facts of its source."""

    tree: Any
    source: SourceFacts

    def with_tree(self, tree: Any) -> Checkpoint:
        return replace(self, tree=tree)

    def tensors(self) -> Iterator[tuple[KeyPath, torch.Tensor]]:
        return iter_tensors(self.tree)


@dataclass(frozen=True, eq=False)
class StorageInfo:
    """A storage described, not loaded: where its bytes are and how many.

    Answers the few questions reports ask of a torch storage (``nbytes()``,
    ``size()`` in elements, ``element_size()``, ``data_ptr()`` as an
    identity), so report code reads described and loaded trees alike.
    """

    file: Path
    key: str
    location: str
    dtype: Any  # a described dtype: ``str()`` gives ``torch.float32``
    itemsize: int
    declared_bytes: int

    def nbytes(self) -> int:
        return self.declared_bytes

    def size(self) -> int:
        return self.declared_bytes // self.itemsize if self.itemsize else 0

    def element_size(self) -> int:
        return self.itemsize

    def data_ptr(self) -> int:
        return id(self)  # one object per storage record, alive as long as the tree


@dataclass(frozen=True, eq=False)
class TensorInfo:
    """A tensor described, not loaded (``readers.describe``): a tree leaf for reports.

    Duck-types the tensor attributes ``inspect`` and ``check`` use
    (``dtype``, ``shape``, ``numel()``, ``element_size()``, ``stride()``,
    ``storage_offset()``, ``untyped_storage()``); it has no bytes, so a
    command that needs values must read the file with a tensor reader.
    """

    dtype: Any
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    storage: StorageInfo
    requires_grad: bool = False

    def numel(self) -> int:
        count = 1
        for n in self.shape:
            count *= n
        return count

    def element_size(self) -> int:
        return self.storage.itemsize

    def stride(self) -> tuple[int, ...]:
        return self.strides

    def storage_offset(self) -> int:
        return self.offset

    def untyped_storage(self) -> StorageInfo:
        return self.storage


def is_tensor(value: object) -> bool:
    """True for torch tensors and ``TensorInfo`` descriptions, never importing torch.

    Without torch imported no value can be a torch tensor.
    """
    if isinstance(value, TensorInfo):
        return True
    module = type(value).__module__
    if not module.startswith("torch"):
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def format_path(path: KeyPath) -> str:
    """A path as users write it for ``--select``: keys joined with dots."""
    return ".".join(str(part) for part in path) if path else "<root>"


def iter_tensors(tree: Any, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, torch.Tensor]]:
    """Every tensor leaf with its path, in the tree's own order."""
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from iter_tensors(value, (*prefix, key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from iter_tensors(value, (*prefix, index))
    elif is_tensor(tree):
        yield prefix, tree


def shared_storages(tree: Any) -> tuple[tuple[str, ...], ...]:
    """Paths grouped by the storage their tensors share, groups of two or more."""
    groups: dict[int, list[str]] = {}
    for key_path, tensor in iter_tensors(tree):
        storage = tensor.untyped_storage()
        if storage.nbytes():
            groups.setdefault(storage.data_ptr(), []).append(format_path(key_path))
    return tuple(tuple(paths) for paths in groups.values() if len(paths) > 1)


def rebuild_dict(original: Mapping[Any, Any], items: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A dict of the same kind as ``original`` holding ``items``.

    A state dict is an ``OrderedDict`` carrying ``_metadata`` (module
    versions BatchNorm and others read on load); rebuilding must keep both.
    """
    if isinstance(original, OrderedDict):
        rebuilt: dict[Any, Any] = OrderedDict(items)
        metadata = getattr(original, "_metadata", None)
        if metadata is not None:
            rebuilt._metadata = metadata  # type: ignore[attr-defined]
        return rebuilt
    return dict(items)


def map_tree(
    tree: Any,
    leaf: Callable[[KeyPath, Any], Any],
    prefix: KeyPath = (),
) -> Any:
    """Rebuild ``tree`` with ``leaf(path, value)`` applied to every non-container.

    Containers are rebuilt (dict kinds and ``_metadata`` kept), so rules
    never mutate the reader's tree in place.
    """
    if isinstance(tree, Mapping):
        return rebuild_dict(
            tree, [(k, map_tree(v, leaf, (*prefix, k))) for k, v in tree.items()]
        )
    if isinstance(tree, list):
        return [map_tree(v, leaf, (*prefix, i)) for i, v in enumerate(tree)]
    if isinstance(tree, tuple) and type(tree) is tuple:
        return tuple(map_tree(v, leaf, (*prefix, i)) for i, v in enumerate(tree))
    return leaf(prefix, tree)
