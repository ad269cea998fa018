"""Read a folder of per-rank ``torch.save`` files of one sharded state dict as one checkpoint.

FSDP1's ``SHARDED_STATE_DICT`` (ShardedTensors) and FSDP2's or tensor
parallelism's ``model.state_dict()`` (DTensors), saved by every rank to a
file whose name carries the rank number (``model_rank3.pt``), are one
model in N files. Each file is read by ckptport's own reader: its
distributed tensors come back as ``ShardRecord``s (the local shard, where
it lies, the placements, the global shape; ``unpickle.distributed_values``).
Here every tensor is assembled from all ranks' shards by their recorded
offsets (uneven shards, replicated copies read once) into a ``TensorInfo``
over byte ranges of the rank files (``assembled``); everything else is
rank 0's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar, cast

from ..checkpoint import Checkpoint, Format
from ..tensors import TensorInfo, ViewKey, view_key
from ..tree import KeyPath, Tree, rebuild_dict
from ..unpickle.distributed_values import DTENSOR, ShardLayout, ShardRecord
from .assembled import Box, TilingError, assemble, shard_box
from .base import Layout, Names, ReadOptions, Source, Where, local
from .layouts import PROBLEMS, LayoutError, layout_problem, merged_facts, missing_ranks

__all__ = ["RankFilesReader", "rank_files", "claimed", "one_claim", "one_rank", "FORMAT"]

FORMAT = Format("rank-files")
_RANK = re.compile(r"(?i)(.*?rank[_-]?)([0-9]+)(.*\.(?:pt|pth|bin))")  # ASCII digits only

LoadFile = Callable[[Path, ReadOptions], Checkpoint]
_Where = TypeVar("_Where", bound="_Folder")


class _Folder(Protocol):
    """A local folder or a remote one: what ``/`` makes of a name is of its kind."""

    def __truediv__(self: _Where, name: str) -> _Where: ...


def rank_files(folder: Path, names: frozenset[str]) -> dict[int, Path] | None:
    """The folder's rank files by rank, when all its checkpoint files are one set of them
    (one name with the rank number in it: ``model_rank0.pt``, ``rank_1.pth``); a rank
    two names claim (``model_rank1.pt``, ``model_rank01.pt``) is the first of them here,
    and refused by the reader (``claimed``)."""
    claims = claimed(folder, names)
    return None if claims is None else {rank: paths[0] for rank, paths in claims.items()}


def claimed(folder: _Where, names: frozenset[str]) -> dict[int, list[_Where]] | None:
    """Every name of the folder's one set of rank files, by the rank number it spells
    (leading zeros and all); None when its checkpoint files are not one such set."""
    sets: dict[tuple[str, str], dict[int, list[_Where]]] = {}
    others = 0
    for name in sorted(names):
        match = _RANK.fullmatch(name)
        if match is None:
            others += name.lower().endswith((".pt", ".pth", ".bin"))
            continue
        sets.setdefault((match[1], match[3]), {}).setdefault(int(match[2]), []).append(
            folder / name)
    if len(sets) != 1 or others:
        return None
    return next(iter(sets.values()))


def one_claim(claims: dict[int, list[Path]], folder: Path, what: str = "rank") -> None:
    """Refuse a rank that two files claim under two spellings: reading either would
    silently leave the other out (one of them is another run's)."""
    for rank, paths in sorted(claims.items()):
        if len(paths) > 1:
            raise LayoutError(f"{what} {rank} is claimed by {len(paths)} files "
                              f"({', '.join(p.name for p in paths)}): one rank, one file; "
                              "remove the one that is not this run's", folder)


def _walk(tree: Tree, path: KeyPath = ()) -> list[KeyPath]:
    """Key paths of the distributed tensors in a state dict's dicts and lists."""
    if isinstance(tree, ShardRecord):
        return [path]
    if isinstance(tree, dict):
        return [p for key, value in tree.items() for p in _walk(value, (*path, key))]
    if isinstance(tree, (list, tuple)):
        return [p for index, value in enumerate(tree) for p in _walk(value, (*path, index))]
    return []


def one_rank(tree: Tree) -> tuple[str, ShardLayout] | None:
    """The first tensor a tree holds only part of (one rank's file read alone), if any."""
    for path in _walk(tree):
        record = _record(tree, path)
        if record.layout is not None:
            return _key(path), record.layout
    return None


def _record(tree: Tree, path: KeyPath) -> ShardRecord:
    return cast(ShardRecord, _at(tree, path))  # where _walk found one


def _at(tree: Tree, path: KeyPath) -> Tree:
    for key in path:
        if isinstance(tree, dict) and key in tree:
            tree = tree[key]
        elif isinstance(tree, (list, tuple)) and type(key) is int and 0 <= key < len(tree):
            tree = tree[key]
        else:
            return None
    return tree


def _replaced(tree: Tree, values: dict[KeyPath, TensorInfo], path: KeyPath = ()) -> Tree:
    if path in values:
        return values[path]
    if isinstance(tree, dict):  # a state dict keeps its kind and module versions
        return rebuild_dict(tree, [(key, _replaced(value, values, (*path, key)))
                                   for key, value in tree.items()])
    if isinstance(tree, list):
        return [_replaced(v, values, (*path, i)) for i, v in enumerate(tree)]
    if isinstance(tree, tuple):
        return tuple(_replaced(v, values, (*path, i)) for i, v in enumerate(tree))
    return tree


def _key(path: KeyPath) -> str:
    return ".".join(str(p) for p in path)


class RankFilesReader:
    format = FORMAT

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A folder whose checkpoint files are one set of rank files."""
        claims = None if names is None else claimed(folder, names)
        if claims is None:
            return None  # every name that claims a rank is covered: two of one are refused
        return Layout(folder, tuple(p for paths in claims.values() for p in paths), self,
                      FORMAT)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        folder = local(source.main, FORMAT)
        claims = claimed(folder, frozenset(f.name for f in source.files)) or {}
        files = {rank: paths[0] for rank, paths in claims.items()}
        problems: list[str] = []
        try:
            one_claim(claims, folder)
            return self._load(folder, files, options, problems)
        except LayoutError as exc:
            if not options.lenient:
                raise
            return layout_problem(folder, FORMAT, tuple(files.values()), "torch.distributed",
                                  [*problems, exc.message])

    def _load(self, folder: Path, files: dict[int, Path], options: ReadOptions,
              problems: list[str]) -> Checkpoint:
        if 0 not in files:
            raise LayoutError(f"has rank files {sorted(files)} but none of rank 0", folder)
        first = self.load_file(files[0], options)
        if first.source.refused_globals:  # lenient: name them, read nothing further
            return Checkpoint({}, merged_facts(folder, FORMAT, [first], (files[0],), {}))
        paths = _walk(first.tree)
        # the unpickler makes every ShardRecord with its layout (unpickle.distributed_values)
        layouts = [cast(ShardLayout, _record(first.tree, p).layout) for p in paths]
        world = max((lay.world for lay in layouts), default=1)
        missing = missing_ranks(files, world)
        if missing:
            raise LayoutError(f"rank {missing[0]} of {world} is missing ({missing[1]} of "
                              f"{world} rank files absent; the tensors are sharded over "
                              f"{world} ranks)", folder)
        stale = sorted(r for r in files if r >= world)
        if stale:
            problems.append(f"{len(stale)} rank files beyond the world size of {world} "
                            f"({', '.join(files[r].name for r in stale)}), left over from an "
                            "earlier run with more ranks; ignored")
        used = [files[r] for r in range(world)]
        parts = [first] + [self.load_file(p, options) for p in used[1:]]
        if any(part.source.refused_globals for part in parts):  # lenient: name them
            return Checkpoint({}, merged_facts(folder, FORMAT, parts, tuple(used), {}))
        values: dict[KeyPath, TensorInfo] = {}
        # one shard under two names (tied weights): one tensor
        made: dict[tuple[tuple[int, ...], tuple[tuple[tuple[int, ...], ViewKey], ...]],
                   TensorInfo] = {}
        placements: Counter[str] = Counter()
        for path, layout in zip(paths, layouts, strict=True):
            record = (layout.shape, tuple((p.offsets, view_key(p.tensor))
                                          for p in layout.pieces))
            if record not in made:
                name = _key(path)
                shards = [(_shard(part.tree, path, layout, rank, file, world, name), file)
                          for rank, (part, file) in enumerate(zip(parts, used, strict=True))]
                made[record] = _assembled(name, folder, layout, shards)
                placements.update(layout.placements)
            values[path] = made[record]
        tree = _replaced(first.tree, values)
        kinds = {lay.kind for lay in layouts}
        metadata = {"framework": "torch.distributed " + (", ".join(sorted(
            "DTensor (FSDP2, tensor parallel)" if k == DTENSOR else "ShardedTensor (FSDP1)"
            for k in kinds)) or "(whole tensors only)"),
            "world_size": str(world), "rank_files": str(len(used)),
            "placements": ", ".join(f"{p} x{n}" for p, n in sorted(placements.items()))}
        if problems:
            metadata[PROBLEMS] = "\n".join(problems)
        return Checkpoint(tree, merged_facts(folder, FORMAT, parts, tuple(used), metadata))


def _shard(tree: Tree, path: KeyPath, layout: ShardLayout, rank: int, file: Path,
           world: int, name: str) -> ShardLayout:
    """Rank ``rank``'s shard of the tensor at ``path``, checked to be of the same tensor,
    laid out the same way (placements, the shard list), by the rank its name says."""
    value = _at(tree, path)
    if not isinstance(value, ShardRecord) or value.layout is None:
        raise LayoutError(f"{file.name} holds no shard of {name!r}; rank 0's file does",
                          file.parent)
    theirs = value.layout
    if (theirs.kind, theirs.shape, theirs.dtype, theirs.world) != (
            layout.kind, layout.shape, layout.dtype, layout.world):
        raise LayoutError(f"{file.name} holds {name!r} as a {theirs.dtype.name}"
                          f"{list(theirs.shape)} over {theirs.world} ranks, rank 0 as a "
                          f"{layout.dtype.name}{list(layout.shape)} over {world}: rank files "
                          "of different runs", file.parent)
    if (theirs.placements, theirs.expected) != (layout.placements, layout.expected):
        raise LayoutError(f"{file.name} lays {name!r} out as {', '.join(theirs.placements)}"
                          f", rank 0's file as {', '.join(layout.placements)} (or lists "
                          "other shards): rank files of different runs", file.parent)
    if theirs.rank >= 0 and theirs.rank != rank:
        raise LayoutError(f"{file.name} holds rank {theirs.rank}'s shard of {name!r}, not "
                          f"rank {rank}'s", file.parent)
    return theirs


def _assembled(name: str, folder: Path, layout: ShardLayout,
               shards: list[tuple[ShardLayout, Path]]) -> TensorInfo:
    """The whole tensor from every rank's pieces, proven to tile it (``assembled``).

    A box two ranks hold is read once where the placements replicate it
    (``Replicate`` on a mesh dimension); anywhere else it is an overlap.
    """
    replicated = layout.kind == DTENSOR and "Replicate()" in layout.placements
    holders: dict[tuple[tuple[int, ...], tuple[int, ...]], Path] = {}
    boxes: list[Box] = []
    for shard, file in shards:
        for piece in shard.pieces:
            key = (piece.offsets, piece.sizes)
            if key in holders and 0 not in piece.sizes:  # a piece of no elements holds none
                if replicated:
                    continue
                raise TilingError(f"{name}: {holders[key].name} and {file.name} both hold "
                                  f"its shard of {list(piece.sizes)} at {list(piece.offsets)}"
                                  ": overlapping shards", folder)
            holders[key] = file
            boxes.append(shard_box(piece.offsets, piece.tensor, name, folder, file.name))
    if layout.expected and set(holders) != set(layout.expected):
        raise LayoutError(f"{name!r}: the shard metadata lists {len(layout.expected)} shards; "
                          f"the rank files hold {len(holders)} others", folder)
    return assemble(name, folder, layout.dtype, layout.shape, boxes)
