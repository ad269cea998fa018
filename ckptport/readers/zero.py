"""DeepSpeed ZeRO's saved partitions as the fp32 state dict ``zero_to_fp32`` makes of them.

``readers.deepspeed`` finds a tag's rank files and proves they are of one
save; this module reads what they hold: per stage, where each parameter's
fp32 elements lie in the ranks' flat partitions (ZeRO-1/2: each group's
partitions concatenated over ranks; ZeRO-3: ``ceil(n / world)`` elements of
every rank), the frozen parameters, the buffers and the ties, in
``zero_to_fp32``'s order, each parameter a ``TensorInfo`` over the byte
ranges it spans (``assembled``), never gathered. Stage 0 with bf16 keeps
per-parameter masters in the model states instead, matched to the module.
Apart from the folder's reading because it is the format's arithmetic, and
changes with DeepSpeed's partitioning, not with how folders are named.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import cast

from ..dtypes import DTYPES, dtype_of
from ..errors import InputError
from ..tensors import CHUNK_BYTES, Pending, TensorInfo, ViewKey, chunks, view_key
from ..tree import Key, TensorLeaf, Tree, is_tensor, rebuild_dict
from .assembled import Box, assemble, flat_box
from .layouts import LayoutError

__all__ = ["Branch", "require_dict", "require_list", "zero_fp32", "stage0_fp32"]

Branch = dict[Key, Tree]
"""One dict of a rank file's tree (the model states, the optimizer's state dict)."""


def _entry(tree: Tree, key: str, path: Path, kind: type) -> Tree:
    if not isinstance(tree, dict) or key not in tree:
        raise InputError(f"has no {key!r}: not a DeepSpeed checkpoint file", path)
    value = tree[key]
    if not isinstance(value, kind):
        raise InputError(f"{key!r} is a {type(value).__name__}, not what DeepSpeed writes",
                         path)
    return value


def require_dict(tree: Tree, key: str, path: Path) -> Branch:
    """``tree[key]``, a dict, in a tree that must be a dict (else not DeepSpeed's file)."""
    return cast(Branch, _entry(tree, key, path, dict))


def require_list(tree: Tree, key: str, path: Path) -> list[Tree]:
    """``tree[key]``, a list, in a tree that must be a dict (else not DeepSpeed's file)."""
    return cast("list[Tree]", _entry(tree, key, path, list))


def _shape(value: Tree, name: Key, path: Path) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(d) is int and d >= 0
                                                       for d in value):
        raise InputError(f"param_shapes gives {name!r} a shape that is not a tuple of sizes",
                         path)
    return tuple(value)


def _tensors(value: Tree, what: str, path: Path) -> list[TensorInfo]:
    if not isinstance(value, list) or not all(isinstance(t, TensorInfo) and len(t.shape) <= 1
                                              for t in value):
        raise InputError(f"{what} is not a list of flat tensors", path)
    return value


def _fp32(leaf: TensorLeaf) -> TensorLeaf:
    """A buffer as zero_to_fp32 keeps it: floating point ones in fp32."""
    dtype = dtype_of(leaf)
    if dtype.is_floating_point and dtype != DTYPES["float32"]:
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


def stage0_fp32(states: Branch, module: Branch, path: Path
                ) -> tuple[Branch, dict[str, str], tuple[str, ...]]:
    """Stage 0: fp32 masters per parameter in the model states, matched to ``module``."""
    optimizer = states.get("optimizer")
    groups = optimizer.get("fp32_groups") if isinstance(optimizer, dict) else None
    names = require_list(states, "buffer_names", path)
    if not all(isinstance(name, str) for name in names):
        raise InputError("buffer_names is not a list of names", path)
    buffers = set(names)
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
    tree, frozen = _masters_matched(module, buffers, masters, path)
    notes = (f"frozen parameters kept from the module copy (no fp32 master): "
             f"{', '.join(map(str, frozen))}",) if frozen else ()
    return tree, {"zero_stage": "0", "world_size": str(states.get("dp_world_size", "?")),
                  "optimizer": "bf16 (stage 0)"}, notes


def _masters_matched(module: Branch, buffers: set[Tree], masters: list[TensorInfo],
                     path: Path) -> tuple[Branch, list[Key]]:
    """Each trainable parameter of ``module`` in its order, replaced by the next master it
    is the rounding of (ties kept); the parameters no master matches (frozen) named."""
    tree: Branch = OrderedDict()
    seen: dict[ViewKey, Key] = {}
    frozen: list[Key] = []
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
    return tree, frozen


def _rounds_to(master: TensorInfo, half: TensorLeaf) -> bool:
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


def zero_fp32(stage: int, world: int, models: list[Tree], optims: list[Branch],
              model_files: list[Path], optim_files: list[Path]
              ) -> tuple[Branch, tuple[str, ...]]:
    """The fp32 state dict in zero_to_fp32's order: buffers, frozen, trainable, ties."""
    path0 = model_files[0]
    module = require_dict(models[0], "module", path0)
    states = cast(Branch, models[0])  # require_dict: a dict
    buffers = require_list(states, "buffer_names", path0)
    shapes = require_list(states, "param_shapes", path0)
    if not all(isinstance(group, dict) for group in shapes):
        raise InputError("param_shapes is not a list of name -> shape maps", path0)
    groups = cast("list[Branch]", shapes)
    tree: Branch = OrderedDict(
        (k, _fp32(v)) for k, v in module.items() if k in buffers and is_tensor(v))
    notes: list[str] = []
    trainable = {name for group in groups for name in group}
    shared = states.get("shared_params") or {}
    if not isinstance(shared, dict):
        raise InputError("shared_params is not a name -> name map", path0)
    frozen_shapes = states.get("frozen_param_shapes")
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
                         f"{', '.join(map(str, kept))}")
    key = "fp32_flat_groups" if stage == 3 else "single_partition_of_fp32_groups"
    flats = [_tensors(o.get(key), key, p) for o, p in zip(optims, optim_files, strict=True)]
    if stage == 3:
        _zero3(tree, world, groups, flats, optim_files, path0)
    else:
        paddings = optims[0].get("param_alignment_paddings")
        _zero12(tree, world, groups, flats, paddings, optim_files, path0)
    for name, target in shared.items():
        if isinstance(target, str) and target in tree:
            tree[name] = tree[target]
    return tree, tuple(notes)


def _zero12(tree: Branch, world: int, shapes: list[Branch], flats: list[list[TensorInfo]],
            paddings: Tree, files: list[Path], path0: Path) -> None:
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
            tree[name] = assemble(str(name), files[0], DTYPES["float32"], dims,
                                  whole.boxes(offset, numel, 0, str(name)), frame=(numel,))
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


def _zero3(tree: Branch, world: int, shapes: list[Branch], flats: list[list[TensorInfo]],
           files: list[Path], path0: Path) -> None:
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
                boxes += flat.boxes(offset, take, rank * part, str(name))
            tree[name] = assemble(str(name), files[0], DTYPES["float32"], dims, boxes,
                                  frame=(numel,))
            offset += part
    if offset != ranks[0].numel:
        raise InputError(f"param_shapes use {offset} elements of each rank's flat fp32 "
                         f"groups of {ranks[0].numel} (lying shapes or a short group)",
                         files[0])


def _frozen(tree: Branch, stage: int, world: int, shapes: Branch, models: list[Tree],
            files: list[Path]) -> None:
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
                boxes.append(flat_box(piece, 0, take, at, str(name), path, path.name))
            at += take
        if len(dtypes) != 1:
            raise LayoutError(f"the ranks' fragments of frozen parameter {name!r} differ in "
                              "dtype: rank files of different runs", files[0])
        tree[name] = assemble(str(name), files[0], dtypes.pop(), dims, boxes, frame=(numel,))
