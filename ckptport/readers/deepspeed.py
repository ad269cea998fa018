"""Read DeepSpeed checkpoint folders: the fp32 master weights, consolidated offline.

A DeepSpeed save folder holds ``latest`` (the newest tag) and one folder
per tag (``global_step100/``): ``mp_rank_00_model_states.pt`` (the
half-precision ``module``, buffers, ``param_shapes``; one file per rank
at ZeRO-3) and one ``*zero_pp_rank_R_mp_rank_00_optim_states.pt`` per
data-parallel rank, whose flat fp32 partitions are the master weights.
This reader rebuilds the fp32 state dict exactly as DeepSpeed's
``zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`` does (same
keys, order, values, padding rules, ties), without DeepSpeed, without
running the files' pickles, and without gathering: each parameter is a
``TensorInfo`` over the byte ranges of the rank partitions it spans
(``assembled``), read by position when written.

Beyond ``zero_to_fp32``: ZeRO-1 with fp32 gradient accumulation
(DeepSpeed's ``BF16_Optimizer``, whose files carry no ``zero_stage``) reads
as stage 1; parameters frozen at stage 0 and 1, for which DeepSpeed saves
no fp32 copy and ``zero_to_fp32`` drops, are kept from the ``module``
copy; stage 0 with bf16 keeps per-parameter fp32 masters in the model
states (``optimizer.fp32_groups``), matched to the ``module``'s names.
Lightning's DeepSpeed checkpoints (``epoch=0.ckpt/checkpoint/``) are the
same layout under Lightning's key names.

This module finds a tag's rank files and proves them one save; what their
partitions mean (the consolidation itself) is ``readers.zero``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import cast

from ..checkpoint import Checkpoint, Format
from ..errors import InputError
from ..tree import Tree
from .base import Layout, Names, ReadOptions, Source, Where, local
from .layouts import PROBLEMS, LayoutError, layout_problem, merged_facts, missing_ranks
from .zero import Branch, require_dict, stage0_fp32, zero_fp32

__all__ = ["DeepSpeedReader", "tag_folder", "tag_files", "FORMAT", "LATEST"]

FORMAT = Format("deepspeed")
LATEST = "latest"
LIGHTNING_TAG = "checkpoint"
_MAX_TAG = 4096
# ASCII digits only: int() reads "١" (Arabic-Indic one) as 1, a second spelling of rank 1
_MODEL = re.compile(r"(zero_pp_rank_([0-9]+)_)?mp_rank_([0-9]+)_model_states\.pt")
_OPTIM = re.compile(r"(bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt")
_RANK_FILE = ("model_states.pt", "optim_states.pt")  # what DeepSpeed's own globs take

LoadFile = Callable[[Path, ReadOptions], Checkpoint]


def _is_tag(folder: Path) -> bool:
    return folder.is_dir() and any(_MODEL.fullmatch(p.name) for p in folder.iterdir())


def tag_files(folder: Path) -> tuple[Path, ...]:
    """The DeepSpeed rank files of a tag folder (none when it is not one)."""
    if not _is_tag(folder):
        return ()
    return tuple(p for p in sorted(folder.iterdir())
                 if _MODEL.fullmatch(p.name) or _OPTIM.fullmatch(p.name))


def tag_folder(path: Path, tag: str | None = None) -> Path | None:
    """The tag folder ``path`` names: itself, ``tag`` (``--tag``) or else the one ``latest``
    names, or Lightning's ``checkpoint/``; None when ``path`` is not a DeepSpeed checkpoint."""
    if tag is not None:
        return _named_tag(path, tag)
    if _is_tag(path):
        return path
    latest = path / LATEST
    if latest.is_file():
        if os.path.realpath(latest) != os.path.join(os.path.realpath(path), LATEST):
            raise InputError("is a link out of the checkpoint folder; not followed", latest)
        if latest.stat().st_size > _MAX_TAG:
            raise InputError("is not a tag name (too large)", latest)
        try:
            tag = latest.read_bytes().decode("utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read the tag: {exc}", latest) from None
        if not _plain_tag(tag):
            raise InputError(f"names {tag!r}, which is not a tag folder inside the checkpoint "
                             "folder; pass the tag folder itself", latest)
        folder = path / tag
        if os.path.realpath(folder) != os.path.join(os.path.realpath(path), tag):
            raise InputError(f"names tag {tag!r}, a link out of the checkpoint folder", latest)
        if not _is_tag(folder):
            raise InputError(f"names tag {tag!r}, but {folder} holds no DeepSpeed model states "
                             "(a missing or partly copied tag); pass an existing tag folder",
                             latest)
        return folder
    if _is_tag(path / LIGHTNING_TAG):
        return path / LIGHTNING_TAG
    return None


def _named_tag(path: Path, tag: str) -> Path:
    """``--tag NAME``: that tag folder of the save folder ``path``, checked like ``latest``."""
    if not _plain_tag(tag):
        raise InputError(f"--tag {tag!r} is not a tag folder's name", path)
    folder = path / tag
    if not _is_tag(folder) or os.path.realpath(folder) != os.path.join(os.path.realpath(path),
                                                                         tag):
        found = sorted(p.name for p in path.iterdir() if p.is_dir() and _is_tag(p)) \
            if path.is_dir() else []
        raise InputError(f"--tag {tag}: no such DeepSpeed tag folder here (tags: "
                         f"{', '.join(found) or 'none'})", path)
    return folder


def _plain_tag(tag: str) -> bool:
    """One folder name: no separator, no control character (a newline in ``latest`` is not a
    name any folder of a checkpoint has), not ``.`` or ``..``."""
    return bool(tag) and tag not in (".", "..") and not any(
        c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in tag)


class _Files:
    """A tag folder's rank files, by kind and rank: each rank claimed by one file.

    Two names can mean one rank: leading zeros (``zero_pp_rank_1``,
    ``zero_pp_rank_01``), the bf16 optimizer's ``bf16_`` prefix beside a plain
    file, ZeRO-3's per-rank model states beside ZeRO 0-2's ``mp_rank_00``. Each is
    a file of another run or a copy; which one DeepSpeed meant cannot be told, so
    the folder is refused naming both, as ``zero_to_fp32`` refuses it (it counts
    every ``*_optim_states.pt``). So is a rank file whose name DeepSpeed's globs
    take but whose rank cannot be read from it.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.model: dict[int, Path] = {}
        self.optim: dict[int, Path] = {}
        kinds: dict[str, dict[bool, Path]] = {"model states": {}, "optimizer states": {}}
        claims: dict[tuple[str, int], list[Path]] = {}
        for path in sorted(folder.iterdir()):
            matched = False
            for pattern, kind, what in ((_MODEL, self.model, "model states"),
                                        (_OPTIM, self.optim, "optimizer states")):
                match = pattern.fullmatch(path.name)
                if match is None:
                    continue
                matched = True
                spelled, rank, mp = match.groups()
                if int(mp):
                    raise InputError(f"holds {path.name}: model-parallel (tensor or pipeline) "
                                     "DeepSpeed checkpoints are not consolidated; only "
                                     "mp_rank_00", folder)
                kinds[what].setdefault(spelled is not None, path)
                claims.setdefault((what, int(rank or 0)), []).append(path)
                kind.setdefault(int(rank or 0), path)
            if not matched and path.name.endswith(_RANK_FILE):
                raise LayoutError(f"holds {path.name}, a DeepSpeed rank file's name whose "
                                  "rank ckptport cannot read (DeepSpeed writes "
                                  "[bf16_]zero_pp_rank_N_mp_rank_00_optim_states.pt and "
                                  "[zero_pp_rank_N_]mp_rank_00_model_states.pt)", folder)
        for what, spellings in kinds.items():
            if len(spellings) > 1:
                raise LayoutError(f"holds {what} of two kinds ({spellings[False].name}, "
                                  f"{spellings[True].name}): files of two runs (ZeRO "
                                  f"{'0-2 and 3' if what == 'model states' else 'and bf16'})"
                                  "; remove the other run's", folder)
        for (what, rank), paths in sorted(claims.items()):
            if len(paths) > 1:
                raise LayoutError(f"rank {rank}'s {what} are claimed by {len(paths)} files "
                                  f"({', '.join(p.name for p in paths)}): one rank, one "
                                  "file; remove the one that is not this run's", folder)
        if 0 not in self.model:
            raise LayoutError("holds no model states of rank 0 (mp_rank_00_model_states.pt "
                              "or zero_pp_rank_0_mp_rank_00_model_states.pt)", folder)

    def ranks(self, kind: dict[int, Path], world: int, problems: list[str]) -> list[Path]:
        """The files of ranks ``0..world-1``; leftovers of a bigger earlier run are noted."""
        missing = missing_ranks(kind, world)
        if missing:
            raise LayoutError(f"rank {missing[0]} of {world} is missing "
                              f"({missing[1]} of {world} rank files absent); the checkpoint "
                              "was not saved by every rank, or was partly copied", self.folder)
        stale = sorted(r for r in kind if r >= world)
        if stale:
            problems.append(f"{len(stale)} rank files beyond the world size of {world} "
                            f"(ranks {stale[0]}..{stale[-1]}), left over from an earlier run "
                            "with more ranks; ignored")
        return [kind[r] for r in range(world)]


# what every file of one save records alike: any rank file, and each rank's model states
# (ZeRO-3; shared_params is per rank: rank 0 records the ties, the others none)
_FILE_FACTS = ("ds_version", "ds_config")
_RUN_FACTS = ("param_shapes", "frozen_param_shapes", "buffer_names", "global_steps",
              "global_samples", "skipped_steps", "dp_world_size", "mp_world_size")


def _one_run(trees: list[Tree], files: list[Path], facts: tuple[str, ...], folder: Path) -> None:
    """Refuse rank files that are not of one save: a fact two files record differs (a
    rank file copied in from another run, or another step of this one). A fact a file
    does not record (older DeepSpeed, Lightning) is not compared."""
    first = trees[0] if isinstance(trees[0], dict) else {}
    for tree, path in zip(trees[1:], files[1:], strict=True):
        if not isinstance(tree, dict):
            continue
        for fact in facts:
            if fact in first and fact in tree and tree[fact] != first[fact]:
                shown = (f" ({tree[fact]!r}, {files[0].name} {first[fact]!r})"
                         if len(repr(tree[fact])) + len(repr(first[fact])) < 80 else "")
                raise LayoutError(f"{path.name} records another {fact} than "
                                  f"{files[0].name}{shown}: rank files of different runs",
                                  folder)


class DeepSpeedReader:
    format = FORMAT

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A DeepSpeed save folder (``latest``), a tag folder, or Lightning's (``checkpoint/``):
        the tag's rank files (``tag`` or the one ``latest`` names)."""
        if names is None:
            return None
        if not any(_MODEL.fullmatch(n) for n in names) and LATEST not in names \
                and f"{LIGHTNING_TAG}/" not in names:
            return None
        if not isinstance(folder, Path):  # a remote folder: its reader reads local ones
            return Layout(folder, (), self, FORMAT)
        if LATEST not in names and not _is_tag(folder) and not _is_tag(folder / LIGHTNING_TAG):
            return None
        chosen = tag_folder(folder, tag)
        if chosen is None:
            return None
        quiet = tuple(folder / n for n in (LATEST, "zero_to_fp32.py") if n in names)
        return Layout(chosen, tag_files(chosen), self, FORMAT, chosen.name, quiet)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        folder = local(source.main, FORMAT)
        problems: list[str] = []
        try:
            return self._load(folder, options, problems)
        except LayoutError as exc:
            if not options.lenient:
                raise
            return layout_problem(folder, FORMAT, tag_files(folder), "deepspeed",
                                  [*problems, exc.message])

    def _load(self, folder: Path, options: ReadOptions, problems: list[str]) -> Checkpoint:
        found = _Files(folder)
        model0 = self.load_file(found.model[0], options)
        parts = [model0]
        if model0.source.refused_globals:  # lenient: name them, read nothing further
            return Checkpoint({}, merged_facts(folder, FORMAT, parts, (found.model[0],), {}))
        module = require_dict(model0.tree, "module", found.model[0])
        states = cast(Branch, model0.tree)  # require_dict: a dict
        if not found.optim:
            tree, metadata, notes = stage0_fp32(states, module, found.model[0])
            files: tuple[Path, ...] = (found.model[0],)
        else:
            optim0 = self.load_file(found.optim[0], options)
            osd = require_dict(optim0.tree, "optimizer_state_dict", found.optim[0])
            count, world = _world(osd, states, found.optim[0], folder)
            optim_files = found.ranks(found.optim, world, problems)
            optims = [optim0] + [self.load_file(p, options) for p in optim_files[1:]]
            stage = osd.get("zero_stage", 1)  # BF16_Optimizer writes none: ZeRO-1's layout
            if type(stage) is not int or not 1 <= stage <= 3:
                raise InputError(f"zero_stage {stage!r} is not 1, 2 or 3", found.optim[0])
            model_files = found.ranks(found.model, world, problems) if stage == 3 else \
                [found.model[0]]
            models = [model0] + [self.load_file(p, options) for p in model_files[1:]]
            parts = [*models, *optims]
            files = (*model_files, *optim_files)
            if any(part.source.refused_globals for part in parts):  # lenient: name them
                return Checkpoint({}, merged_facts(folder, FORMAT, parts, files, {}))
            _one_run([m.tree for m in models], model_files, _RUN_FACTS, folder)
            _one_run([p.tree for p in parts], list(files), _FILE_FACTS, folder)
            osds = [_partitioned_alike(other.tree, path, count, stage, folder)
                    for other, path in zip(optims, optim_files, strict=True)]
            tree, notes = zero_fp32(stage, world, [m.tree for m in models], osds,
                                    model_files, optim_files)
            metadata = {"zero_stage": str(stage), "world_size": str(world),
                        "optimizer": "BF16_Optimizer" if "zero_stage" not in osd else
                        f"ZeRO stage {stage}"}
        metadata = _metadata(folder, states, metadata, problems)
        notes = (*notes, _half_copy(folder, found.model[0], metadata.get("zero_stage")))
        return Checkpoint(tree, merged_facts(folder, FORMAT, parts, files, metadata,
                                             tuple(notes)))


def _world(osd: Branch, states: Branch, path: Path, folder: Path) -> tuple[Tree, int]:
    """Rank 0's ``partition_count`` and the data-parallel world size it gives (one count, or
    one per param group: the largest), which the model states must agree with."""
    count = osd.get("partition_count")
    ints = isinstance(count, list) and count and all(type(c) is int for c in count)
    world = max(cast("list[int]", count)) if ints else count
    if type(world) is not int or world < 1:
        raise InputError("partition_count is not a world size", path)
    dp = states.get("dp_world_size")
    if type(dp) is int and dp != world:
        raise LayoutError(f"the model states say {dp} data-parallel ranks, the "
                          f"optimizer states {world}", folder)
    return count, world


def _partitioned_alike(tree: Tree, path: Path, count: Tree, stage: int, folder: Path
                       ) -> Branch:
    """A rank's optimizer state dict, partitioned as rank 0 says (else another run's)."""
    theirs = require_dict(tree, "optimizer_state_dict", path)
    if theirs.get("partition_count") != count or theirs.get("zero_stage", 1) != stage:
        raise LayoutError(f"{path.name} says {theirs.get('partition_count')!r} "
                          f"ranks at stage {theirs.get('zero_stage', 1)!r}, rank 0 "
                          f"says {count!r} at stage {stage!r}: rank files of "
                          "different runs", folder)
    return theirs


def _metadata(folder: Path, states: Branch, read: dict[str, str], problems: list[str]
              ) -> dict[str, str]:
    """What the output records of the save: the framework, tag, how it was read, versions."""
    metadata = {"framework": "deepspeed", "tag": folder.name, "master_dtype": "float32",
                **read}
    for key, fact in (("ds_version", "deepspeed_version"),
                      ("pytorch-lightning_version", "lightning_version")):
        value = states.get(key)
        if isinstance(value, str):
            metadata[fact] = value
    if problems:
        metadata[PROBLEMS] = "\n".join(problems)
    return metadata


def _half_copy(folder: Path, model0: Path, stage: str | None) -> str:
    """Where the half-precision copy the engine trained with is, and how to get it."""
    if stage == "3":
        return ("these are the fp32 master weights; ZeRO-3 saves no whole half-precision "
                "copy (each rank's 'module' holds empty placeholders)")
    return (f"these are the fp32 master weights; the half-precision copy the engine trained "
            f"with is 'module' in {folder.name}/{model0.name}: ckptport normalize {model0} "
            "--select module DST")
