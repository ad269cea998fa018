"""Read RL trainers' FSDP checkpoints (verl): per-rank model files named by world size.

verl's FSDP checkpoint manager saves, from every rank, the model's
``SHARDED_STATE_DICT`` (``model_world_size_N_rank_R.pt``: ShardedTensors,
DTensors, or plain tensors at world size 1) beside that rank's optimizer
state and extra state (``optim_…``, ``extra_state_…``: scheduler, RNG) and
the Hugging Face config. The model files are one set of rank files, read and
assembled as every rank-file folder is (``ranks``); the world size their
names spell must be the one their tensors record, every rank of it present.
The optimizer and extra state hold no model weights: checked by ``check``,
left by folder mode unless ``--select all``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ..checkpoint import Checkpoint, Format
from .base import Layout, Names, ReadOptions, Source, Where, local
from .layouts import LayoutError, missing_ranks, or_problem
from .ranks import RankFilesReader, one_claim

__all__ = ["VerlReader", "FORMAT"]

FORMAT = Format("verl-fsdp")
_MODEL = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")
_STATE = re.compile(r"(?:optim|extra_state)_world_size_\d+_rank_\d+\.pt")


class VerlReader:
    format = FORMAT

    def __init__(self, ranks: RankFilesReader) -> None:
        self.ranks = ranks

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A folder of ``model_world_size_N_rank_R.pt`` files: those files; the optimizer
        and extra state beside them hold no model weights."""
        models = sorted((n for n in names or () if _MODEL.fullmatch(n)), key=_spelled)
        if not models:
            return None
        state = tuple(folder / n for n in sorted(names or ()) if _STATE.fullmatch(n))
        quiet = tuple(folder / n for n in ("fsdp_config.json",) if n in (names or ()))
        return Layout(folder, tuple(folder / n for n in models), self, FORMAT, quiet=quiet,
                      unweighted=state)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        checkpoint = or_problem(lambda: self._load(source, options), source.main, FORMAT,
                                source.files, "verl", options.lenient)
        facts = checkpoint.source
        return replace(checkpoint, source=replace(facts, format=FORMAT, metadata={
            **facts.metadata, "framework": f"verl FSDP ({facts.metadata.get('framework')})"}))


    def _load(self, source: Source, options: ReadOptions) -> Checkpoint:
        world = _world(local(source.main, FORMAT), tuple(map(local, source.files)))
        checkpoint = self.ranks.load(source, options)
        recorded = checkpoint.source.metadata.get("world_size")
        if recorded is not None and recorded != str(world):
            raise LayoutError(f"the files are named for world size {world}, their tensors are "
                              f"sharded over {recorded} ranks", source.main)
        return checkpoint


def _spelled(name: str) -> tuple[int, int]:
    match = _MODEL.fullmatch(name)
    assert match is not None  # only model file names are sorted by it
    return int(match[1]), int(match[2])


def _world(folder: Path, files: tuple[Path, ...]) -> int:
    """The one world size the model files' names spell, every rank of it present once."""
    spelled = [_spelled(f.name) for f in files]
    worlds = sorted({world for world, _ in spelled})
    if len(worlds) > 1:
        raise LayoutError(f"holds model files of world sizes {', '.join(map(str, worlds))}: "
                          "files of different runs; keep one run's", folder)
    world = worlds[0]
    claims: dict[int, list[Path]] = {}
    for path, (_, rank) in zip(files, spelled, strict=True):
        claims.setdefault(rank, []).append(path)
    one_claim(claims, folder)
    ranks = set(claims)
    missing = missing_ranks(ranks, world)
    if missing:
        raise LayoutError(f"model_world_size_{world}_rank_{missing[0]}.pt is missing "
                          f"({missing[1]} of {world} rank files absent)", folder)
    beyond = sorted(r for r in ranks if r >= world)
    if beyond:
        raise LayoutError(f"model_world_size_{world}_rank_{beyond[0]}.pt names a rank beyond "
                          f"its world size of {world}", folder)
    return world
