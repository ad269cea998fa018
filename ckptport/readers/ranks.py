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
from typing import Any

from ..checkpoint import Checkpoint, Format
from ..tensors import view_key
from ..tree import rebuild_dict
from ..unpickle.distributed_values import DTENSOR, ShardLayout, ShardRecord
from .assembled import Run, assemble, box_runs
from .base import Layout, Names, ReadOptions, Source
from .layouts import PROBLEMS, LayoutError, layout_problem, merged_facts, missing_ranks

__all__ = ["RankFilesReader", "rank_files", "one_rank", "FORMAT"]

FORMAT = Format("rank-files")
_RANK = re.compile(r"(?i)(.*?rank[_-]?)(\d+)(.*\.(?:pt|pth|bin))")

LoadFile = Callable[[Path, ReadOptions], Checkpoint]


def rank_files(folder: Path, names: frozenset[str]) -> dict[int, Path] | None:
    """The folder's rank files by rank, when all its checkpoint files are one set of them
    (one name with the rank number in it: ``model_rank0.pt``, ``rank_1.pth``)."""
    sets: dict[tuple[str, str], dict[int, Path]] = {}
    others = 0
    for name in sorted(names):
        match = _RANK.fullmatch(name)
        if match is None:
            others += name.lower().endswith((".pt", ".pth", ".bin"))
            continue
        sets.setdefault((match[1], match[3]), {})[int(match[2])] = folder / name
    if len(sets) != 1 or others:
        return None
    return next(iter(sets.values()))


def _walk(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Key paths of the distributed tensors in a state dict's dicts and lists."""
    if isinstance(tree, ShardRecord):
        return [path]
    if isinstance(tree, dict):
        return [p for key, value in tree.items() for p in _walk(value, (*path, key))]
    if isinstance(tree, (list, tuple)):
        return [p for index, value in enumerate(tree) for p in _walk(value, (*path, index))]
    return []


def one_rank(tree: Any) -> tuple[str, ShardLayout] | None:
    """The first tensor a tree holds only part of (one rank's file read alone), if any."""
    for path in _walk(tree):
        record = _at(tree, path)
        if record.layout is not None:
            return _key(path), record.layout
    return None


def _at(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        if isinstance(tree, dict) and key in tree:
            tree = tree[key]
        elif isinstance(tree, (list, tuple)) and type(key) is int and 0 <= key < len(tree):
            tree = tree[key]
        else:
            return None
    return tree


def _replaced(tree: Any, values: dict[tuple[Any, ...], Any], path: tuple[Any, ...] = ()) -> Any:
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


def _key(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


class RankFilesReader:
    format = FORMAT

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Any, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A folder whose checkpoint files are one set of rank files."""
        ranks = None if names is None else rank_files(folder, names)
        if ranks is None:
            return None
        return Layout(folder, tuple(ranks.values()), self, FORMAT)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        folder = source.main
        files = rank_files(folder, frozenset(f.name for f in source.files)) or {}
        problems: list[str] = []
        try:
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
        layouts = [_at(first.tree, p).layout for p in paths]
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
        values: dict[tuple[Any, ...], Any] = {}
        made: dict[Any, Any] = {}  # one shard under two names (tied weights): one tensor
        placements: Counter[str] = Counter()
        for path, layout in zip(paths, layouts, strict=True):
            record = (layout.shape, tuple((p.offsets, view_key(p.tensor))
                                          for p in layout.pieces))
            if record not in made:
                name = _key(path)
                shards = [_shard(part.tree, path, layout, rank, file, world, name)
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


def _shard(tree: Any, path: tuple[Any, ...], layout: ShardLayout, rank: int, file: Path,
           world: int, name: str) -> ShardLayout:
    """Rank ``rank``'s shard of the tensor at ``path``, checked to be of the same tensor."""
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
    if theirs.rank >= 0 and theirs.rank != rank:
        raise LayoutError(f"{file.name} holds rank {theirs.rank}'s shard of {name!r}, not "
                          f"rank {rank}'s", file.parent)
    return theirs


def _assembled(name: str, folder: Path, layout: ShardLayout, shards: list[ShardLayout]
               ) -> Any:
    """The whole tensor from every rank's pieces; replicated pieces are read once."""
    boxes: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = {}
    for shard in shards:
        for piece in shard.pieces:
            boxes.setdefault((piece.offsets, piece.sizes), piece)
    runs: list[Run] = []
    for piece in boxes.values():
        runs += box_runs(layout.shape, piece.offsets, piece.tensor, name, folder)
    tensor = assemble(name, folder, layout.dtype, layout.shape, runs)
    if layout.expected and set(boxes) != set(layout.expected):
        raise LayoutError(f"{name!r}: the shard metadata lists {len(layout.expected)} shards; "
                          f"the rank files hold {len(boxes)} others", folder)
    return tensor
