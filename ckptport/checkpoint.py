"""The Checkpoint model shared by every command: a tree, and facts about its source.

A checkpoint is a tree of plain data whose leaves may be tensors
(``ckptport.tree``), plus what the source recorded: its format, files,
the devices its storages were saved on, the globals its pickle names, the
storages its tensors share. Readers make Checkpoints; rules, writers and
reports only read them.

This module imports no torch: ``Checkpoint`` is needed by code paths
(``inspect``, ``check``, ``--help``) that must start without it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, ClassVar

from .tensors import StorageInfo, TensorInfo, group_by_storage
from .tree import (
    KeyPath,
    TensorLeaf,
    Tree,
    format_path,
    is_tensor,
    iter_tensors,
    map_tree,
    rebuild_dict,
)

if TYPE_CHECKING:
    from .remote.urls import Where

__all__ = ["Format", "SourceFacts", "Checkpoint", "KeyPath", "TensorInfo", "StorageInfo",
           "format_path", "is_tensor", "iter_tensors", "map_tree", "rebuild_dict",
           "shared_storages"]


class Format(str):
    """A container format's name, as reports and ``check --require-format`` spell it.

    Names are interned, so ``is`` compares them, and every name made is
    known: a new reader names its own format (``Format("npz")`` in its
    module) and nothing else has to list it.
    """

    __slots__ = ()
    _known: ClassVar[dict[str, Format]] = {}
    TORCH_ZIP: ClassVar[Format]
    TORCH_LEGACY: ClassVar[Format]
    SAFETENSORS: ClassVar[Format]
    TORCH_SHARDS: ClassVar[Format]
    SAFETENSORS_SHARDS: ClassVar[Format]
    DCP: ClassVar[Format]
    TORCHSCRIPT: ClassVar[Format]

    def __new__(cls, name: str) -> Format:
        known = cls._known.get(name)
        if known is None:
            known = cls._known[name] = super().__new__(cls, name)
        return known

    @property
    def value(self) -> str:
        return str.__str__(self)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(cls._known)


Format.TORCH_ZIP = Format("torch-zip")
Format.TORCH_LEGACY = Format("torch-legacy")
Format.SAFETENSORS = Format("safetensors")
Format.TORCH_SHARDS = Format("torch-shards")
Format.SAFETENSORS_SHARDS = Format("safetensors-shards")
Format.DCP = Format("dcp")
Format.TORCHSCRIPT = Format("torchscript")


@dataclass(frozen=True)
class SourceFacts:
    """What the source recorded, kept for reports and checks.

    ``storage_locations`` counts storages by the device the file recorded
    (``cuda:3``). ``globals`` are the names the pickle refers to, resolved
    as Python's unpickler resolves them; ``spellings`` maps a resolved name
    to the file's own spelling where they differ (``commands.Popen``).
    ``refused_globals`` are the code-running ones (kept, never run, when
    read for a report); ``unproven`` the unknown names the file calls with
    no proof that they are classes; ``files`` every file the checkpoint's
    bytes come from, in the order they are hashed; ``origins`` the member file
    each global was first met in, where the checkpoint is several files (a
    finding names the rank file that carries it, not the folder).
    """

    path: Where
    format: Format
    size: int
    storage_locations: Mapping[str, int] = field(default_factory=dict)
    globals: tuple[str, ...] = ()
    shared_storages: tuple[tuple[str, ...], ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    trusted: bool = False
    refused_globals: tuple[str, ...] = ()
    files: tuple[Where, ...] = ()
    spellings: Mapping[str, str] = field(default_factory=dict)
    unproven: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    materialized: int = 0  # bytes the pickled tensors hold once made real, views apart
    largest: tuple[tuple[str, int], ...] = ()  # the biggest of them: (path, bytes)
    origins: Mapping[str, Where] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.files:  # a single-file source is its own content
            object.__setattr__(self, "files", (self.path,))

    def spelled(self, name: str) -> str:
        """A resolved global as reports show it: with the file's own spelling if different."""
        raw = self.spellings.get(name)
        return f"{name} (named {raw} in the file)" if raw else name


@dataclass(frozen=True)
class Checkpoint:
    """A tree of plain data with tensor leaves, and the facts of its source."""

    tree: Tree
    source: SourceFacts

    def with_tree(self, tree: Tree) -> Checkpoint:
        return replace(self, tree=tree)

    def tensors(self) -> Iterator[tuple[KeyPath, TensorLeaf]]:
        return iter_tensors(self.tree)


def shared_storages(tree: Tree) -> tuple[tuple[str, ...], ...]:
    """Paths grouped by the storage their tensors share, groups of two or more."""
    return tuple(tuple(format_path(path) for path, _ in members)
                 for members in group_by_storage(tree).values() if len(members) > 1)
