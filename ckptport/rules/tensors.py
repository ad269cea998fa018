"""Make every tensor stand alone: contiguous, its storage exactly its bytes.

A saved slice of a big tensor carries the whole storage (a 4-byte bias can
drag a 400 MB embedding along); views of one flat buffer at different
offsets share it. Each such tensor is copied into its own compact storage,
one at a time. Tensors that are one tensor under several names (same
storage, offset, shape, stride) stay one tensor, so ties survive.

``--dtype`` casts floating-point tensors here too, with the same care for
ties.

With ``lazy`` (the streaming pipeline of ``convert``) neither rule copies:
compaction is left to the writers, which write each tensor's own bytes one
tensor at a time, and a cast becomes a deferred tensor (``ckptport.lazy``)
computed just before it is written. The report is the same either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from ..checkpoint import Checkpoint, format_path, is_tensor, map_tree
from ..lazy import deferred
from ..tensorops import human_bytes, is_compact, view_key
from .base import Change, RuleResult

__all__ = ["CompactTensors", "CastDtype", "CAST_CHOICES"]

CAST_CHOICES = ("keep", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class CompactTensors:
    lazy: bool = False
    name: str = "compact-tensors"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        changes: list[Change] = []
        done: dict[Any, Any] = {}

        def compact(path: tuple[Any, ...], value: Any) -> Any:
            if not is_tensor(value):
                return value
            key = view_key(value)
            if key is not None and key in done:
                return done[key]
            result = value
            if not is_compact(value):
                result = value if self.lazy else value.contiguous().clone()
                changes.append(Change(format_path(path), "compacted", _why(value)))
            if key is not None:
                done[key] = result
            return result

        tree = map_tree(checkpoint.tree, compact)
        summary = f"compacted {len(changes)} tensors" if changes else "all tensors compact"
        return checkpoint.with_tree(tree), RuleResult(self.name, tuple(changes), summary)


def _why(tensor: Any) -> str:
    storage = tensor.untyped_storage().nbytes()
    own = tensor.numel() * tensor.element_size()
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
        import torch

        target = getattr(torch, self.dtype)
        changes: list[Change] = []
        done: dict[Any, Any] = {}

        def cast(path: tuple[Any, ...], value: Any) -> Any:
            if not is_tensor(value) or not value.is_floating_point() or value.dtype == target:
                return value
            key = view_key(value)
            if key is not None and key in done:
                return done[key]
            if self.lazy:
                result = deferred(value.shape, target, partial(value.to, target))
            else:
                result = value.to(target)
            changes.append(Change(format_path(path), "cast", f"{value.dtype} -> {target}"))
            if key is not None:
                done[key] = result
            return result

        tree = map_tree(checkpoint.tree, cast)
        summary = f"cast {len(changes)} tensors to {self.dtype}"
        return checkpoint.with_tree(tree), RuleResult(self.name, tuple(changes), summary)
