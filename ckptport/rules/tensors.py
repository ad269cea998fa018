"""Make every tensor stand alone, and cast dtypes: decided here, computed when written.

A saved slice of a big tensor carries the whole storage (a 4-byte bias can
drag a 400 MB embedding along); views of one flat buffer at different
offsets share it. Each such tensor becomes a ``Pending`` leaf: its own
contiguous, compact bytes, computed when a writer needs them, one tensor at
a time. Tensors that are one tensor under several names (same storage,
offset, shape, stride) stay one leaf, so ties survive. ``--dtype`` casts
floating-point tensors the same way (``Pending`` with the target dtype),
never the codes or scales of a quantized weight (``rules/quantized.py``).

Without ``lazy`` (the Python API's ``normalize``) the pending leaves are
computed at once into real, compact torch tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ..checkpoint import Checkpoint
from ..dtypes import DTYPES, DType, dtype_of
from ..tensors import (
    Pending,
    TensorInfo,
    ViewKey,
    human_bytes,
    is_compact,
    nbytes,
    to_torch,
    view_key,
)
from ..tree import KeyPath, TensorLeaf, Tree, format_path, is_tensor, iter_tensors, map_tree
from .base import Change, RuleResult
from .quantized import refuse_cast

if TYPE_CHECKING:
    import torch

__all__ = ["CompactTensors", "CastDtype", "CAST_CHOICES"]

CAST_CHOICES = ("keep", "float32", "float16", "bfloat16")


def _pending(source: TensorLeaf, target: DType, lazy: bool) -> TensorLeaf:
    leaf = Pending(source, target)
    return leaf if lazy else to_torch(leaf)


@dataclass(frozen=True)
class CompactTensors:
    lazy: bool = False
    name: str = "compact-tensors"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        changes: list[Change] = []
        done: dict[ViewKey, Tree] = {}

        def compact(path: KeyPath, value: Tree) -> Tree:
            if not is_tensor(value) or isinstance(value, Pending):
                return value
            key = view_key(value)
            if key in done:
                return done[key]
            result: Tree = value
            if not is_compact(value):  # so not a deferred leaf: a described or torch tensor
                stored = cast("TensorInfo | torch.Tensor", value)
                result = _pending(stored, dtype_of(stored), self.lazy)
                changes.append(Change(format_path(path), "compacted", _why(stored)))
            done[key] = result
            return result

        tree = map_tree(checkpoint.tree, compact)
        summary = f"compacted {len(changes)} tensors" if changes else "all tensors compact"
        return checkpoint.with_tree(tree), RuleResult(self.name, tuple(changes), summary)


def _why(tensor: TensorInfo | torch.Tensor) -> str:
    storage = tensor.untyped_storage().nbytes()
    own = nbytes(tensor)
    if not tensor.is_contiguous():
        return f"non-contiguous (stride {tuple(tensor.stride())}) -> contiguous, {human_bytes(own)}"
    return f"storage {human_bytes(storage)} -> {human_bytes(own)}"


@dataclass(frozen=True)
class CastDtype:
    dtype: str = "keep"
    lazy: bool = False
    name: str = "cast-dtype"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        if self.dtype == "keep":
            return checkpoint, RuleResult(self.name, summary="dtypes kept")
        target = DTYPES[self.dtype]
        changes: list[Change] = []
        done: dict[ViewKey, Tree] = {}
        dtypes = {format_path(path): dtype_of(value)
                  for path, value in iter_tensors(checkpoint.tree)}
        refuse_cast(checkpoint, target, dtypes,
                    {name for name, dtype in dtypes.items() if _casts(dtype, target)})

        def to_dtype(path: KeyPath, value: Tree) -> Tree:
            if not is_tensor(value):
                return value
            source = dtype_of(value)
            if not _casts(source, target):
                return value
            key = view_key(value)
            if key in done:
                return done[key]
            result = _pending(value, target, self.lazy)
            changes.append(Change(format_path(path), "cast", f"{source} -> {target}"))
            done[key] = result
            return result

        tree = map_tree(checkpoint.tree, to_dtype)
        summary = f"cast {len(changes)} tensors to {self.dtype}"
        return checkpoint.with_tree(tree), RuleResult(self.name, tuple(changes), summary)


def _casts(source: DType, target: DType) -> bool:
    return source.is_floating_point and source != target
