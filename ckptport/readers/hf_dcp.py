"""Read the per-rank safetensors shards torch's ``HuggingFaceStorageWriter`` writes, as one.

``torch.distributed.checkpoint.save(state, storage_writer=
HuggingFaceStorageWriter(path, save_distributed=True))`` has every rank
write its part of each tensor to ``shard-{rank}-model-{i}-of-{n}.safetensors``
(ranks from 1, ``i`` the model file ``fqn_to_index_mapping`` puts the
tensor in), each header's ``DCP_SHARDING_INFO`` giving the offsets of its
parts in the whole tensors. Nothing records the whole shapes: each is the
end of its furthest part, as torch's own ``HuggingFaceStorageReader``
infers it. The folder is one checkpoint, every tensor assembled from its
parts by their offsets and proven to tile it (``assembled``); one such
file read alone is a part (the safetensors reader refuses it, naming what
it is part of).

Whole or refused: each (rank, model file) pair is one file under every
spelling of its numbers, every file agrees on how many model files there
are and each of them has parts, a tensor's parts are in one model file
and agree on dtype and rank, and they tile its shape with no gap or
overlap. A rank whose parts all lie past every other's end (the last
rank's file of a tensor split along one dimension, gone) leaves a smaller
tensor that tiles: the files cannot tell, nor can torch's reader.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..containers.safetensors import parse_header
from ..sources import open_source
from ..tensors import TensorInfo
from .assembled import Box, assemble
from .base import Layout, Names, ReadOptions, Source, Where, local
from .layouts import LayoutError, layout_problem
from .safetensors import SHARD_FILE, sharding_offsets, tensors_of

__all__ = ["HfShardsReader", "FORMAT"]

FORMAT = Format("hf-dcp-shards")
FRAMEWORK = "torch.distributed.checkpoint (HuggingFaceStorageWriter, per-rank shards)"
_Part = tuple[int, tuple[int, ...], TensorInfo, str]  # rank, offsets, the part, its file


def _claims(names: frozenset[str]) -> dict[tuple[int, int], list[str]]:
    """The shard files by (rank, model file) their names spell (leading zeros and all)."""
    claims: dict[tuple[int, int], list[str]] = {}
    for name in sorted(names):
        match = SHARD_FILE.fullmatch(name)
        if match is not None:
            claims.setdefault((int(match[1]), int(match[2])), []).append(name)
    return claims


class HfShardsReader:
    """A folder of ``shard-R-model-I-of-N.safetensors`` files: one checkpoint."""

    format = FORMAT

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """The folder's shard files, when it holds any (``sharded/`` of a consolidated save,
        or the save folder itself); other checkpoint files beside them make it a folder of
        checkpoints, never silently one of them."""
        if names is None or not isinstance(folder, Path):
            return None
        shards = sorted(n for n in names if SHARD_FILE.fullmatch(n))
        if not shards:
            return None
        others = sorted(n for n in names if n not in shards and n.lower().endswith(
            (".safetensors", ".pt", ".pth", ".bin", ".index.json")))
        if others:
            return Layout(folder, (), many=f"holds per-rank shard files of a distributed save "
                          f"({shards[0]}, …) beside other checkpoint files ({others[0]}, …): "
                          "name the one to read, or move the shard files to their own folder")
        return Layout(folder, tuple(folder / n for n in shards), self, FORMAT)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        try:
            return self._load(source)
        except LayoutError as exc:
            if not options.lenient:
                raise
            return layout_problem(source.main, FORMAT, source.files, FRAMEWORK, [exc.message])

    def _load(self, source: Source) -> Checkpoint:
        folder = local(source.main, FORMAT)
        claims = _claims(frozenset(f.name for f in source.files))
        for (rank, index), spelled in claims.items():
            if len(spelled) > 1:
                raise LayoutError(f"rank {rank}'s part of model file {index} is claimed by "
                                  f"{len(spelled)} files ({', '.join(spelled)}): one rank, one "
                                  "file; remove the one that is not this save's", folder)
        counts = {int(match[3]) for names in claims.values() for n in names
                  if (match := SHARD_FILE.fullmatch(n))}
        if len(counts) != 1:
            raise LayoutError(f"shard files name {len(counts)} different counts of model files "
                              f"({', '.join(map(str, sorted(counts)))}): files of different "
                              "saves", folder)
        total = counts.pop()
        indexes = {index for _, index in claims}
        absent = sorted(set(range(1, total + 1)) - indexes)
        if absent or max(indexes) > total:
            raise LayoutError(f"model file {absent[0] if absent else max(indexes)} of {total} "
                              f"has {'no shard file' if absent else 'a number past the count'}"
                              " (a missing or partly copied save)", folder)
        parts: dict[str, list[_Part]] = OrderedDict()
        homes: dict[str, int] = {}
        opened = []
        for (rank, index), (name,) in sorted(claims.items(), key=lambda c: (c[0][1], c[0][0])):
            path = folder / name
            file = open_source(path)
            opened.append(file)
            header = parse_header(file)
            offsets = sharding_offsets(header, path)
            if offsets is None:
                raise LayoutError(f"{name} carries no DCP_SHARDING_INFO: not a shard file of "
                                  "a distributed save", folder)
            for key, tensor in tensors_of(file, header).items():
                if homes.setdefault(key, index) != index:
                    raise LayoutError(f"{key!r} has parts in model files {homes[key]} and "
                                      f"{index} ({name}): files of different saves", folder)
                parts.setdefault(key, []).append((rank, offsets[key], tensor, name))
        tree: OrderedDict[str, TensorInfo] = OrderedDict()
        for key, pieces in parts.items():
            tree[key] = _whole(key, folder, pieces)
        ranks = sorted({rank for rank, _ in claims})
        return Checkpoint(tree, SourceFacts(
            path=folder, format=FORMAT, size=sum(f.size for f in opened),
            storage_locations={"cpu": len(tree)} if tree else {}, files=source.files,
            metadata={"framework": FRAMEWORK, "ranks": ", ".join(map(str, ranks)),
                      "model_files": str(total), "rank_files": str(len(opened))},
            notes=("the shard files record no whole shapes: each is where its furthest part "
                   "ends, as torch's HuggingFaceStorageReader infers it (a last rank's parts "
                   "gone would go unseen)",)))


def _whole(key: str, folder: Path, pieces: list[_Part]) -> TensorInfo:
    """One tensor from its parts: its shape is where its furthest part ends."""
    first = pieces[0][2]
    for _, _, tensor, name in pieces:
        if tensor.dtype != first.dtype or len(tensor.shape) != len(first.shape):
            raise LayoutError(f"{key!r} is a {tensor.dtype.name} of {len(tensor.shape)} "
                              f"dimensions in {name}, a {first.dtype.name} of "
                              f"{len(first.shape)} in {pieces[0][3]}: files of different saves",
                              folder)
    shape = tuple(max(o[d] + t.shape[d] for _, o, t, _ in pieces)
                  for d in range(len(first.shape)))
    boxes = [Box(offsets, tensor.shape, tensor.storage.blob, 0, name)
             for _, offsets, tensor, name in pieces if math.prod(tensor.shape)]
    return assemble(key, folder, first.dtype, shape, boxes)
