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
"""

from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, Format
from ..dtypes import DTYPES
from ..errors import InputError
from ..tensors import CHUNK_BYTES, Pending, TensorInfo, chunks, view_key
from ..tree import is_tensor, rebuild_dict
from .assembled import Box, assemble, flat_box
from .base import Layout, Names, ReadOptions, Source
from .layouts import PROBLEMS, LayoutError, layout_problem, merged_facts, missing_ranks

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


def _one_run(trees: list[Any], files: list[Path], facts: tuple[str, ...], folder: Path) -> None:
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


def _get(tree: Any, key: str, path: Path, kind: type | tuple[type, ...] = object) -> Any:
    if not isinstance(tree, dict) or key not in tree:
        raise InputError(f"has no {key!r}: not a DeepSpeed checkpoint file", path)
    value = tree[key]
    if not isinstance(value, kind):
        raise InputError(f"{key!r} is a {type(value).__name__}, not what DeepSpeed writes",
                         path)
    return value


def _shape(value: Any, name: str, path: Path) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(d) is int and d >= 0
                                                       for d in value):
        raise InputError(f"param_shapes gives {name!r} a shape that is not a tuple of sizes",
                         path)
    return tuple(value)


def _tensors(value: Any, what: str, path: Path) -> list[TensorInfo]:
    if not isinstance(value, list) or not all(isinstance(t, TensorInfo) and len(t.shape) <= 1
                                              for t in value):
        raise InputError(f"{what} is not a list of flat tensors", path)
    return value


def _fp32(leaf: Any) -> Any:
    """A buffer as zero_to_fp32 keeps it: floating point ones in fp32."""
    if leaf.dtype.is_floating_point and leaf.dtype != DTYPES["float32"]:
        return Pending(leaf, DTYPES["float32"])
    return leaf


class _Flat:
    """The flat fp32 vector of one param group (ZeRO-1/2) or of all groups (ZeRO-3) on
    each rank, read as element ranges: what ``torch.cat`` would make, never made."""

    def __init__(self, parts: list[TensorInfo], path: Path,
                 origins: list[str] | None = None) -> None:
        self.parts, self.path = parts, path
        self.origins = origins or [path.name] * len(parts)
        self.ends = list(_running(p.numel() for p in parts))
        self.numel = self.ends[-1] if self.ends else 0

    def boxes(self, start: int, count: int, at: int, name: str) -> Iterator[Box]:
        """Elements ``start..start + count``, placed at element ``at`` of ``name``."""
        if start + count > self.numel:
            raise InputError(f"{name} needs elements {start}..{start + count} of a flat fp32 "
                             f"partition of {self.numel}: the flat group is shorter than "
                             "param_shapes need", self.path)
        begin = 0
        for part, end, origin in zip(self.parts, self.ends, self.origins, strict=True):
            low, high = max(start, begin), min(start + count, end)
            if low < high:
                yield flat_box(part, low - begin, high - low, at + low - start, name,
                               self.path, origin)
            begin = end


def _running(values: Iterator[int]) -> Iterator[int]:
    total = 0
    for value in values:
        total += value
        yield total


class DeepSpeedReader:
    format = FORMAT

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Any, names: Names, name: str | None, tag: str | None
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
        folder = source.main
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
        states = model0.tree
        module = _get(states, "module", found.model[0], dict)
        if not found.optim:
            tree, metadata, notes = self._stage0(states, module, found.model[0])
            files: tuple[Path, ...] = (found.model[0],)
        else:
            optim0 = self.load_file(found.optim[0], options)
            osd = _get(optim0.tree, "optimizer_state_dict", found.optim[0], dict)
            count = osd.get("partition_count")
            ints = isinstance(count, list) and count and all(type(c) is int for c in count)
            world = max(count) if ints else count
            if type(world) is not int or world < 1:
                raise InputError("partition_count is not a world size", found.optim[0])
            dp = states.get("dp_world_size")
            if type(dp) is int and dp != world:
                raise LayoutError(f"the model states say {dp} data-parallel ranks, the "
                                  f"optimizer states {world}", folder)
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
            for other, path in zip(optims, optim_files, strict=True):
                theirs = _get(other.tree, "optimizer_state_dict", path, dict)
                if theirs.get("partition_count") != count or theirs.get(
                        "zero_stage", 1) != stage:
                    raise LayoutError(f"{path.name} says {theirs.get('partition_count')!r} "
                                      f"ranks at stage {theirs.get('zero_stage', 1)!r}, rank 0 "
                                      f"says {count!r} at stage {stage!r}: rank files of "
                                      "different runs", folder)
            tree, notes = _zero(stage, world, [m.tree for m in models],
                                [o.tree["optimizer_state_dict"] for o in optims],
                                model_files, optim_files)
            metadata = {"zero_stage": str(stage), "world_size": str(world),
                        "optimizer": "BF16_Optimizer" if "zero_stage" not in osd else
                        f"ZeRO stage {stage}"}
        metadata = {"framework": "deepspeed", "tag": folder.name,
                    "master_dtype": "float32", **metadata}
        for key, fact in (("ds_version", "deepspeed_version"),
                          ("pytorch-lightning_version", "lightning_version")):
            if isinstance(states.get(key), str):
                metadata[fact] = states[key]
        if problems:
            metadata[PROBLEMS] = "\n".join(problems)
        notes = (*notes, _half_copy(folder, found.model[0], metadata.get("zero_stage")))
        return Checkpoint(tree, merged_facts(folder, FORMAT, parts, files, metadata,
                                             tuple(notes)))

    @staticmethod
    def _stage0(states: dict[str, Any], module: dict[str, Any], path: Path
                ) -> tuple[dict[str, Any], dict[str, str], tuple[str, ...]]:
        """Stage 0: fp32 masters per parameter in the model states, matched to ``module``."""
        optimizer = states.get("optimizer")
        groups = optimizer.get("fp32_groups") if isinstance(optimizer, dict) else None
        buffers = _get(states, "buffer_names", path, list)
        if not all(isinstance(name, str) for name in buffers):
            raise InputError("buffer_names is not a list of names", path)
        buffers = set(buffers)
        if groups is None:
            return rebuild_dict(module, list(module.items())), {
                "zero_stage": "0", "master_dtype": "module"}, (
                "no fp32 master weights saved (stage 0 without bf16): the module's own "
                "weights",)
        if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
            raise InputError("optimizer.fp32_groups is not a list of parameter lists", path)
        masters = [t for group in groups for t in group]
        if not all(isinstance(t, TensorInfo) for t in masters):
            raise InputError("optimizer.fp32_groups holds something other than tensors", path)
        tree: dict[str, Any] = OrderedDict()
        seen: dict[Any, str] = {}
        frozen: list[str] = []
        queue = list(masters)
        for name, leaf in module.items():
            if name in buffers or not is_tensor(leaf):
                tree[name] = _fp32(leaf) if name in buffers and is_tensor(leaf) else leaf
                continue
            tie = seen.get(view_key(leaf))
            if tie is not None:
                tree[name] = tree[tie]
                continue
            seen[view_key(leaf)] = name
            if queue and queue[0].shape == tuple(leaf.shape) and _rounds_to(queue[0], leaf):
                tree[name] = queue.pop(0)
            else:
                tree[name] = leaf
                frozen.append(name)
        if queue:
            raise InputError(f"{len(queue)} fp32 masters in optimizer.fp32_groups match no "
                             "parameter of the module (names follow the module's order)", path)
        notes = (f"frozen parameters kept from the module copy (no fp32 master): "
                 f"{', '.join(frozen)}",) if frozen else ()
        return tree, {"zero_stage": "0", "world_size": str(states.get("dp_world_size", "?")),
                      "optimizer": "bf16 (stage 0)"}, notes


def _half_copy(folder: Path, model0: Path, stage: str | None) -> str:
    """Where the half-precision copy the engine trained with is, and how to get it."""
    if stage == "3":
        return ("these are the fp32 master weights; ZeRO-3 saves no whole half-precision "
                "copy (each rank's 'module' holds empty placeholders)")
    return (f"these are the fp32 master weights; the half-precision copy the engine trained "
            f"with is 'module' in {folder.name}/{model0.name}: ckptport normalize {model0} "
            "--select module DST")


def _rounds_to(master: TensorInfo, half: Any) -> bool:
    """Whether ``half`` is ``master`` rounded to its dtype: the engine's copy of that master."""
    import numpy as np

    if master.dtype != DTYPES["float32"] or half.dtype not in (DTYPES["bfloat16"],
                                                              DTYPES["float16"]):
        return True  # nothing to tell them apart by but the shape
    step = CHUNK_BYTES // 4
    for full, low in zip(chunks(master, step * 4), chunks(half, step * 2), strict=False):
        bits = np.frombuffer(full, dtype="<u4")
        if half.dtype == DTYPES["bfloat16"]:
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        else:
            rounded = bits.view("<f4").astype("<f2").view("<u2")
        if not np.array_equal(rounded, np.frombuffer(low, dtype="<u2")):
            return False
    return True


def _zero(stage: int, world: int, models: list[Any], optims: list[dict[str, Any]],
          model_files: list[Path], optim_files: list[Path]
          ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The fp32 state dict in zero_to_fp32's order: buffers, frozen, trainable, ties."""
    path0 = model_files[0]
    states = models[0]
    module = _get(states, "module", path0, dict)
    buffers = _get(states, "buffer_names", path0, list)
    shapes = _get(states, "param_shapes", path0, list)
    if not all(isinstance(group, dict) for group in shapes):
        raise InputError("param_shapes is not a list of name -> shape maps", path0)
    tree: dict[str, Any] = OrderedDict(
        (k, _fp32(v)) for k, v in module.items() if k in buffers and is_tensor(v))
    notes: list[str] = []
    frozen_shapes = states.get("frozen_param_shapes")
    trainable = {name for group in shapes for name in group}
    shared = states.get("shared_params") or {}
    if not isinstance(shared, dict):
        raise InputError("shared_params is not a name -> name map", path0)
    if frozen_shapes:
        if not isinstance(frozen_shapes, dict):
            raise InputError("frozen_param_shapes is not a name -> shape map", path0)
        _frozen(tree, stage, world, frozen_shapes, models, model_files)
    else:
        kept = [k for k, v in module.items() if is_tensor(v) and k not in buffers
                and k not in trainable and k not in shared]
        for name in kept:
            tree[name] = module[name]
        if kept:
            notes.append(f"frozen parameters kept from the module copy (DeepSpeed saves no "
                         f"fp32 copy of them at stage {stage}; zero_to_fp32 drops them): "
                         f"{', '.join(kept)}")
    key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    flats = [_tensors(o.get(key), key, p) for o, p in zip(optims, optim_files, strict=True)]
    if stage == 3:
        _zero3(tree, world, shapes, flats, optim_files, path0)
    else:
        paddings = optims[0].get("param_alignment_paddings")
        _zero12(tree, world, shapes, flats, paddings, optim_files, path0)
    for name, target in shared.items():
        if isinstance(target, str) and target in tree:
            tree[name] = tree[target]
    return tree, tuple(notes)


def _zero12(tree: dict[str, Any], world: int, shapes: list[dict[str, Any]],
            flats: list[list[TensorInfo]], paddings: Any, files: list[Path],
            path0: Path) -> None:
    """ZeRO-1/2: each group's partitions concatenated over ranks, parameters in order."""
    if any(len(groups) != len(shapes) for groups in flats):
        raise InputError(f"the optimizer states hold {len(flats[0])} flat groups, "
                         f"param_shapes {len(shapes)}", files[0])
    align = 2 * world
    for index, group in enumerate(shapes):
        whole = _Flat([groups[index] for groups in flats], files[0], [f.name for f in files])
        pads = paddings[index] if isinstance(paddings, list) and index < len(paddings) else None
        if pads is not None and (not isinstance(pads, list) or len(pads) != len(group)):
            raise InputError(f"param_alignment_paddings of group {index} do not match its "
                             f"{len(group)} parameters", files[0])
        offset = 0
        for position, (name, shape) in enumerate(group.items()):
            dims = _shape(shape, name, path0)
            numel = math.prod(dims)
            tree[name] = assemble(name, files[0], DTYPES["float32"], dims,
                                  whole.boxes(offset, numel, 0, name), frame=(numel,))
            offset += numel
            if pads is not None:
                pad = pads[position]
                if type(pad) is not int or pad < 0:
                    raise InputError("a parameter alignment padding is not a count", files[0])
                offset += pad
        if -(-offset // align) * align != -(-whole.numel // align) * align:
            raise InputError(f"param group {index}: param_shapes use {offset} elements of a "
                             f"flat fp32 group of {whole.numel} (lying shapes or a short "
                             "group)", files[0])
    for flat in flats:
        if any(t.dtype != DTYPES["float32"] for t in flat):
            raise InputError("a flat fp32 group is not float32", files[0])


def _zero3(tree: dict[str, Any], world: int, shapes: list[dict[str, Any]],
           flats: list[list[TensorInfo]], files: list[Path], path0: Path) -> None:
    """ZeRO-3: each parameter is ``ceil(n / world)`` elements of every rank's flat groups,
    concatenated over ranks and cut to ``n``."""
    ranks = [_Flat(groups, path) for groups, path in zip(flats, files, strict=True)]
    if any(r.numel != ranks[0].numel for r in ranks):
        raise LayoutError("the ranks' flat fp32 groups differ in size: rank files of "
                          "different runs", files[0])
    offset = 0
    for group in shapes:
        for name, shape in group.items():
            dims = _shape(shape, name, path0)
            numel = math.prod(dims)
            part = -(-numel // world)
            boxes: list[Box] = []
            for rank, flat in enumerate(ranks):
                take = max(0, min(part, numel - rank * part))
                boxes += flat.boxes(offset, take, rank * part, name)
            tree[name] = assemble(name, files[0], DTYPES["float32"], dims, boxes,
                                  frame=(numel,))
            offset += part
    if offset != ranks[0].numel:
        raise InputError(f"param_shapes use {offset} elements of each rank's flat fp32 "
                         f"groups of {ranks[0].numel} (lying shapes or a short group)",
                         files[0])


def _frozen(tree: dict[str, Any], stage: int, world: int, shapes: dict[str, Any],
            models: list[Any], files: list[Path]) -> None:
    """Frozen parameters: whole in rank 0's model states (ZeRO-2), or one fragment per
    rank's model states, concatenated and cut (ZeRO-3)."""
    fragments = [m.get("frozen_param_fragments") if isinstance(m, dict) else None
                 for m in models]
    for name, shape in shapes.items():
        dims = _shape(shape, name, files[0])
        numel = math.prod(dims)
        if stage < 3:
            leaf = fragments[0].get(name) if isinstance(fragments[0], dict) else None
            if not isinstance(leaf, TensorInfo) or leaf.numel() != numel:
                raise InputError(f"frozen parameter {name!r} is missing from "
                                 "frozen_param_fragments or has the wrong size", files[0])
            tree[name] = leaf
            continue
        boxes: list[Box] = []
        at = 0
        dtypes = set()
        for frags, path in zip(fragments, files, strict=True):
            piece = frags.get(name) if isinstance(frags, dict) else None
            if not isinstance(piece, TensorInfo):
                raise InputError(f"frozen parameter {name!r} has no fragment", path)
            dtypes.add(piece.dtype)
            take = max(0, min(piece.numel(), numel - at))
            if take:
                boxes.append(flat_box(piece, 0, take, at, name, path, path.name))
            at += take
        if len(dtypes) != 1:
            raise LayoutError(f"the ranks' fragments of frozen parameter {name!r} differ in "
                              "dtype: rank files of different runs", files[0])
        tree[name] = assemble(name, files[0], dtypes.pop(), dims, boxes, frame=(numel,))
