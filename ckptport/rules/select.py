"""Select the part of a checkpoint to keep: the model weights, or everything.

Training checkpoints wrap the weights in a dict with an optimizer, an epoch
and arguments; some files are a whole pickled model, or a dict of models
(ultralytics keeps ``model`` and ``ema``). ``auto`` looks for the names
trainers use, then for a model recorded whole (its state dict rebuilt from
the record, ``rules.modules``), then for the one dict of tensors outside
optimizer state anywhere in the tree; when there are several, it is an error
listing them (optimizer moments are never weights, and a guess by size once
picked them). It always reports what it picked and what else was there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from ..checkpoint import Checkpoint
from ..errors import SelectionError
from ..remote.urls import Where
from ..tensors import human_bytes, nbytes
from ..tree import (
    Key,
    KeyPath,
    ObjectRecord,
    StateDict,
    Tree,
    children,
    format_path,
    is_state_dict,
    is_tensor,
    rebuild_dict,
    type_name,
)
from .base import Change, RuleResult
from .modules import is_module, module_state_dict

__all__ = ["Select", "KNOWN_NAMES", "EMA_MODES", "LIGHTNING_PREFIX"]

KNOWN_NAMES = ("state_dict", "model_state_dict", "model_state", "model", "module", "net")
TIMM_EMA_NAMES = ("state_dict_ema", "model_ema", "ema")
MMENGINE_EMA_ORIGINALS = "ema_state_dict"
EMA_MODES = ("off", "require", "prefer")
LIGHTNING_VERSION_KEYS = ("pytorch-lightning_version", "lightning_version")
LIGHTNING_PREFIX = "model."
# keys trainers keep optimizer and scheduler state under (never the weights)
OPTIMIZER_KEYS = frozenset({"optimizer", "optimizers", "optimizer_states", "optimizer_state",
                            "optimizer_state_dict", "optim", "optim_state", "opt",
                            "scheduler", "schedulers", "lr_scheduler", "lr_schedulers",
                            "scaler", "amp"})
# what a trainer keeps beside a model flattened into the root (torchtitan's DCP saves: the
# model's FQNs at the top level, next to these)
TRAINING_STATE_KEYS = OPTIMIZER_KEYS | {"dataloader", "train_state"}


def _flattened(tree: Mapping[Key, Tree]) -> _Pick | None:
    """A model flattened into the root beside its trainer's state (torchtitan): the root's
    tensors, when everything else is under a training-state name."""
    apart = tuple(k for k, v in tree.items() if not is_tensor(v))
    if len(apart) == len(tree) or not all(isinstance(k, str) for k in tree) or not all(
            k in TRAINING_STATE_KEYS for k in apart):
        return None
    names = tuple(str(k) for k in apart)  # keys of TRAINING_STATE_KEYS: strings already
    return _Pick((), f"the model flattened into the root (torchtitan); {', '.join(names)} "
                 "left out (training state)", apart=names)


def _bytes(value: StateDict) -> int:
    return sum(nbytes(v) for v in value.values() if is_tensor(v))


@dataclass(frozen=True)
class _Pick:
    path: KeyPath
    reason: str
    module: str | None = None  # the recorded class whose state dict was rebuilt
    apart: tuple[str, ...] = ()  # entries of a flattened root left out (its training state)


@dataclass(frozen=True)
class Select:
    """``--select auto|all|KEY[.KEY…]`` and ``--ema`` (``require`` or ``prefer``)."""

    select: str = "auto"
    ema: str = "off"
    hint: bool = True  # suggest --strip-prefix model (not once the user passed it)
    name: str = "select"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        tree = checkpoint.tree
        if self.select == "all":
            return checkpoint, self._result(_Pick((), "whole checkpoint (--select all)"),
                                            tree, ())
        pick = self._auto(tree, checkpoint) if self.select == "auto" else \
            _Pick(_walk(tree, self.select, checkpoint), "named by --select")
        picked = _get(tree, pick.path)
        if pick.apart:  # a root ``_flattened`` found to be a dict
            root = cast("Mapping[Key, Tree]", picked)
            picked = rebuild_dict(root, [(k, v) for k, v in root.items()
                                         if k not in pick.apart])
        notes: tuple[str, ...] = ()
        if is_module(picked):
            picked, notes = module_state_dict(picked, format_path(pick.path),
                                              checkpoint.source.path)
            pick = _Pick(pick.path, pick.reason, type_name(_get(tree, pick.path)))
        reason = pick.reason + _hints(tree, picked, self.hint)
        return checkpoint.with_tree(picked), self._result(_Pick(pick.path, reason, pick.module),
                                                          tree, notes)

    def _auto(self, tree: Tree, checkpoint: Checkpoint) -> _Pick:
        if self.ema != "off":
            found = _ema(tree)
            if found is not None:
                return found
            if self.ema == "require":
                raise SelectionError(
                    "--ema: the file holds no EMA weights (looked for "
                    f"{', '.join(TIMM_EMA_NAMES)} and mmengine's {MMENGINE_EMA_ORIGINALS}); "
                    f"it holds: {_listing(tree)}. Use --prefer-ema to fall back to the "
                    "weights", checkpoint.source.path)
        if isinstance(tree, Mapping):
            for name in KNOWN_NAMES:
                if is_state_dict(tree.get(name)):
                    return _Pick((name,), f"known name {name!r}{_ema_note(tree, name)}")
            if is_state_dict(tree):
                return _Pick((), "the checkpoint is a bare state dict")
            flat = _flattened(tree)
            if flat is not None:
                return flat
        model = _whole_model(tree)
        if model is not None:
            return model
        candidates = _candidates(tree)
        if len(candidates) == 1:
            return _Pick(candidates[0][0], "the only dict of tensors outside optimizer state")
        if not candidates:
            _one_rank(tree, checkpoint.source.path)
            raise SelectionError(f"--select auto found no state dict: the checkpoint is "
                                 f"{_a(tree)} holding no dict of tensors (outside optimizer "
                                 "state) and no recorded model; use --select all or --select "
                                 "KEY", checkpoint.source.path)
        listing = ", ".join(f"{format_path(p)} ({len(v)} entries, {human_bytes(_bytes(v))})"
                            for p, v in candidates[:8])
        raise SelectionError(f"--select auto cannot tell which dict of tensors holds the "
                             f"weights: {listing}{' …' if len(candidates) > 8 else ''}; name "
                             "one with --select KEY (or --select all)", checkpoint.source.path)

    def _result(self, pick: _Pick, tree: Tree, notes: tuple[str, ...]) -> RuleResult:
        others = [str(k) for k, _ in (children(tree) or ()) if not pick.path or k != pick.path[0]]
        picked = format_path(pick.path)
        summary = f"picked {picked}"
        if pick.module:
            summary += f" (a whole {pick.module}: its state dict rebuilt from the record)"
        summary += f": {pick.reason}"
        if others and pick.path:
            summary += f"; also in the file: {', '.join(others)}"
        summary += "".join(f"; {note}" for note in notes)
        changes = (Change(picked, "selected", f"kept {picked}, left out {len(others)} other "
                          "entries"),) if pick.path or pick.module else ()
        return RuleResult(self.name, changes, summary, details={
            "picked": picked, "reason": pick.reason, "others": others if pick.path else [],
            "module": pick.module, "notes": list(notes)})


def is_optimizer_state(value: Tree) -> bool:
    """An optimizer's ``state_dict()``: its tensors are moments and steps, never weights."""
    return isinstance(value, Mapping) and "state" in value and "param_groups" in value


def _one_rank(tree: Tree, path: Where | None) -> None:
    """A state dict of one rank's shards (FSDP, DTensor) is not the model: say what is."""
    from ..readers.ranks import one_rank

    shard = one_rank(tree)
    if shard is not None:
        key, layout = shard
        raise SelectionError(f"{key!r} is rank {layout.rank}'s shard of a tensor sharded over "
                             f"{layout.world} ranks: this file is one rank's part of a sharded "
                             "state dict; normalize the folder of all rank files "
                             "(model_rank0.pt, model_rank1.pt, ...) as one checkpoint", path)


def _candidates(tree: Tree) -> list[tuple[KeyPath, StateDict]]:
    """Every dict of tensors in the tree, outside optimizer (and scheduler) state."""
    found: list[tuple[KeyPath, StateDict]] = []
    stack: list[tuple[KeyPath, Tree]] = [((), tree)]
    while stack:
        path, node = stack.pop()
        if is_optimizer_state(node) or (path and str(path[-1]).lower() in OPTIMIZER_KEYS):
            continue
        if is_state_dict(node):
            found.append((path, node))
            continue
        below = children(node) if not is_tensor(node) else None
        stack.extend(((*path, key), child) for key, child in reversed(below or ()))
    return found


def _ema(tree: Tree) -> _Pick | None:
    if not isinstance(tree, Mapping):
        return None
    for name in TIMM_EMA_NAMES:
        if is_state_dict(tree.get(name)) or is_module(tree.get(name)):
            return _Pick((name,), f"EMA weights ({name}, timm/ultralytics convention; --ema)")
    if is_state_dict(tree.get(MMENGINE_EMA_ORIGINALS)) and is_state_dict(tree.get("state_dict")):
        return _Pick(("state_dict",), "EMA weights (mmengine convention: state_dict holds the "
                     "EMA, ema_state_dict the originals; --ema)")
    return None


def _ema_note(tree: Mapping[Key, Tree], name: str) -> str:
    if name == "state_dict" and MMENGINE_EMA_ORIGINALS in tree:
        return ("; mmengine convention: these are the EMA weights, the originals are in "
                "ema_state_dict")
    if any(is_state_dict(tree.get(n)) or is_module(tree.get(n)) for n in TIMM_EMA_NAMES):
        return "; EMA weights are also present (--ema picks them)"
    return ""


def _whole_model(tree: Tree) -> _Pick | None:
    """A model pickled whole: the root, or the first known name holding one."""
    if is_module(tree):
        return _Pick((), "the file is a whole pickled model")
    if isinstance(tree, Mapping):
        for name in (*KNOWN_NAMES, *(k for k in tree if isinstance(k, str))):
            if is_module(tree.get(name)):
                modules = [f"{k} ({type_name(v)})" for k, v in tree.items() if is_module(v)]
                note = "; recorded models: " + ", ".join(modules) if len(modules) > 1 else ""
                ema = any(is_module(tree.get(n)) for n in TIMM_EMA_NAMES) and \
                    name not in TIMM_EMA_NAMES
                return _Pick((name,), f"a whole pickled model under {name!r}{note}"
                             + ("; EMA weights are also present (--ema picks them)"
                                if ema else ""))
    return None


def _hints(tree: Tree, picked: Tree, suggest: bool) -> str:
    """What the report should add: the trainer that wrote the file, the usual next step."""
    if not isinstance(tree, Mapping):
        return ""
    version = next((tree[k] for k in LIGHTNING_VERSION_KEYS if k in tree), None)
    if version is None:
        return ""
    hint = f"; a Lightning checkpoint (version {version})"
    if suggest and is_state_dict(picked) and all(k.startswith(LIGHTNING_PREFIX) for k in picked):
        hint += (f"; every key starts with {LIGHTNING_PREFIX!r} (the LightningModule's "
                 f"attribute): add --strip-prefix {LIGHTNING_PREFIX} (or --strip-prefix auto) to "
                 "load into the bare model")
    return hint


def _a(value: Tree) -> str:
    name = type_name(value)
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _listing(node: Tree) -> str:
    entries = children(node)
    if entries is None:
        return _a(node)
    return ", ".join(str(k) for k, _ in entries) or "nothing"


def _walk(tree: Tree, spec: str, checkpoint: Checkpoint) -> KeyPath:
    """Resolve ``a.b.0`` against the tree: dict keys (which may hold dots), list
    indexes, and the parts of recorded objects as ``inspect`` shows them."""
    path: KeyPath = ()
    node, rest = tree, spec
    while rest:
        entries = children(node)
        if entries is None:
            break
        keys = {str(k): k for k, _ in entries}
        part = rest if rest in keys else rest.split(".", 1)[0]
        if part not in keys:
            break
        key = keys[part]
        path = (*path, key)
        node = node[key] if isinstance(node, (list, tuple)) and isinstance(key, int) \
            else dict(entries)[key]
        rest = rest[len(part) + 1:]
    else:
        return path
    raise SelectionError(f"--select {spec}: no key {rest.split('.', 1)[0]!r} under "
                         f"{format_path(path)} ({_a(node)}; it holds: {_listing(node)})",
                         checkpoint.source.path)


def _get(tree: Tree, path: KeyPath) -> Tree:
    for key in path:
        if isinstance(tree, ObjectRecord) or not isinstance(tree, (Mapping, list, tuple)):
            tree = dict(children(tree) or ())[key]
        elif isinstance(tree, Mapping):
            tree = tree[key]
        else:
            tree = tree[cast("int", key)]
    return tree
