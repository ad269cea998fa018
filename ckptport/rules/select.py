"""Select the part of a checkpoint to keep: the model weights, or everything.

Training checkpoints wrap the weights in a dict with an optimizer, an epoch
and arguments. ``auto`` looks for the names trainers use, then falls back
to the all-tensor sub-dict holding the most bytes, and always reports what
it picked and what else was there — never a silent guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checkpoint import Checkpoint, KeyPath, format_path, is_tensor
from ..errors import SelectionError
from .base import Change, RuleResult

__all__ = ["Select", "KNOWN_NAMES", "is_state_dict"]

KNOWN_NAMES = ("state_dict", "model_state_dict", "model_state", "model", "module", "net")
TIMM_EMA_NAMES = ("state_dict_ema", "model_ema")
MMENGINE_EMA_ORIGINALS = "ema_state_dict"


def is_state_dict(value: Any) -> bool:
    """A non-empty mapping of string keys whose values are tensors (or plain leaves)."""
    if not isinstance(value, Mapping) or not value:
        return False
    has_tensor = False
    for key, item in value.items():
        if not isinstance(key, str) or isinstance(item, (Mapping, list, tuple)):
            return False
        has_tensor = has_tensor or is_tensor(item)
    return has_tensor


def _tensor_bytes(value: Mapping[str, Any]) -> int:
    return sum(v.numel() * v.element_size() for v in value.values() if is_tensor(v))


@dataclass(frozen=True)
class Select:
    """``--select auto|all|KEY[.KEY…]`` and ``--ema``."""

    select: str = "auto"
    ema: bool = False
    name: str = "select"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        tree = checkpoint.tree
        if self.select == "all":
            return checkpoint, self._result((), "whole checkpoint (--select all)", tree)
        if self.select == "auto":
            path, reason = self._auto(tree, checkpoint)
        else:
            path, reason = _walk(tree, self.select, checkpoint), "named by --select"
        picked = _get(tree, path)
        return checkpoint.with_tree(picked), self._result(path, reason + _hints(tree, picked),
                                                          tree)

    def _auto(self, tree: Any, checkpoint: Checkpoint) -> tuple[KeyPath, str]:
        if not isinstance(tree, Mapping):
            raise SelectionError("--select auto found no state dict: the checkpoint is a "
                                 f"{type(tree).__name__}; use --select all", checkpoint.source.path)
        if self.ema:
            for name in TIMM_EMA_NAMES:
                if is_state_dict(tree.get(name)):
                    return (name,), f"EMA weights ({name}, timm convention; --ema)"
            if is_state_dict(tree.get(MMENGINE_EMA_ORIGINALS)) and is_state_dict(
                tree.get("state_dict")
            ):
                return ("state_dict",), ("EMA weights (mmengine convention: state_dict holds "
                                         "the EMA, ema_state_dict the originals; --ema)")
        for name in KNOWN_NAMES:
            if is_state_dict(tree.get(name)):
                note = ""
                if name == "state_dict" and MMENGINE_EMA_ORIGINALS in tree:
                    note = ("; mmengine convention: these are the EMA weights, the originals "
                            "are in ema_state_dict")
                elif any(is_state_dict(tree.get(n)) for n in TIMM_EMA_NAMES):
                    note = "; EMA weights are also present (--ema picks them)"
                return (name,), f"known name {name!r}{note}"
        if is_state_dict(tree):
            return (), "the checkpoint is a bare state dict"
        candidates = [(p, v) for p, v in _dicts(tree) if is_state_dict(v)]
        if not candidates:
            raise SelectionError("--select auto found no state dict (no dict of tensors); "
                                 "use --select all or --select KEY", checkpoint.source.path)
        path, _ = max(candidates, key=lambda item: _tensor_bytes(item[1]))
        return path, "the dict of tensors holding the most bytes"

    def _result(self, path: KeyPath, reason: str, tree: Any) -> RuleResult:
        others = [str(k) for k in tree if k != path[0]] if path else []
        picked = format_path(path)
        summary = f"picked {picked}: {reason}"
        if others:
            summary += f"; also in the file: {', '.join(others)}"
        changes = (Change(picked, "selected", f"kept {picked}, left out {len(others)} other "
                          "entries"),) if path else ()
        return RuleResult(self.name, changes, summary,
                          details={"picked": picked, "reason": reason, "others": others})


LIGHTNING_VERSION_KEYS = ("pytorch-lightning_version", "lightning_version")
LIGHTNING_PREFIX = "model."


def _hints(tree: Any, picked: Any) -> str:
    """What the report should add: the trainer that wrote the file, the usual next step."""
    if not isinstance(tree, Mapping):
        return ""
    version = next((tree[k] for k in LIGHTNING_VERSION_KEYS if k in tree), None)
    if version is None:
        return ""
    hint = f"; a Lightning checkpoint (version {version})"
    if is_state_dict(picked) and all(k.startswith(LIGHTNING_PREFIX) for k in picked):
        hint += (f"; every key starts with {LIGHTNING_PREFIX!r} (the LightningModule's "
                 f"attribute): add --strip-prefix {LIGHTNING_PREFIX} to load into the bare model")
    return hint


def _dicts(tree: Any, prefix: KeyPath = ()) -> list[tuple[KeyPath, Any]]:
    found = []
    if isinstance(tree, Mapping):
        found.append((prefix, tree))
        for key, value in tree.items():
            found += _dicts(value, (*prefix, key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            found += _dicts(value, (*prefix, index))
    return found


def _walk(tree: Any, spec: str, checkpoint: Checkpoint) -> KeyPath:
    """Resolve ``a.b.c`` against the tree; a key may itself contain dots."""
    path: KeyPath = ()
    node, rest = tree, spec
    while rest:
        if not isinstance(node, Mapping):
            break
        key = rest if rest in node else rest.split(".", 1)[0]
        if key not in node:
            break
        path, node = (*path, key), node[key]
        rest = rest[len(key) + 1:]
    else:
        return path
    available = ", ".join(map(str, node)) if isinstance(node, Mapping) else type(node).__name__
    raise SelectionError(f"--select {spec}: no key {rest!r} under {format_path(path)} "
                         f"(available: {available})", checkpoint.source.path)


def _get(tree: Any, path: KeyPath) -> Any:
    for key in path:
        tree = tree[key]
    return tree
