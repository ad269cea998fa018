"""Turn the objects that block weights-only loading into plain data.

``torch.Size`` becomes a tuple, ``argparse.Namespace`` a dict, numpy
scalars Python numbers, numpy arrays tensors, numpy dtypes their names,
``nn.Parameter`` a plain detached tensor. Objects of classes outside the
allow-list, which the restricted reader kept as inert records, become plain
dicts naming their class (``{"__class__": "omegaconf.dictconfig.DictConfig",
...}``) holding the data they were pickled with. After this rule the tree
holds only what ``torch.load(weights_only=True)`` accepts with no allowlist.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checkpoint import Checkpoint, KeyPath, format_path, rebuild_dict
from ..readers.restricted import Backref, GlobalRef, ObjectRecord
from .base import Change, RuleResult

__all__ = ["ConvertObjects", "record_dict"]


@dataclass(frozen=True)
class ConvertObjects:
    name: str = "convert-objects"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        changes: list[Change] = []
        parameters: dict[int, Any] = {}
        tree = _convert(checkpoint.tree, (), changes, parameters)
        summary = f"converted {len(changes)} objects" if changes else "nothing to convert"
        return checkpoint.with_tree(tree), RuleResult(self.name, tuple(changes), summary)


def _convert(value: Any, path: KeyPath, changes: list[Change], parameters: dict[int, Any]) -> Any:
    plain = _plain(value, parameters)
    if plain is not value:
        changes.append(Change(format_path(path), "converted",
                              f"{_qualname(value)} -> {_qualname(plain)}"))
        value = plain
    if isinstance(value, Mapping):
        return rebuild_dict(value, [(k, _convert(v, (*path, k), changes, parameters))
                                    for k, v in value.items()])
    if isinstance(value, list):
        return [_convert(v, (*path, i), changes, parameters) for i, v in enumerate(value)]
    if type(value) is tuple:
        return tuple(_convert(v, (*path, i), changes, parameters) for i, v in enumerate(value))
    return value


def _plain(value: Any, parameters: dict[int, Any]) -> Any:
    """The plain equivalent of ``value``, or ``value`` itself when already plain."""
    if isinstance(value, argparse.Namespace):
        return dict(vars(value))
    if isinstance(value, ObjectRecord):
        return record_dict(value)
    if isinstance(value, GlobalRef):
        return {"__global__": value.name}
    if isinstance(value, Backref):
        return {"__backref__": value.target}
    module = type(value).__module__
    if module.startswith("torch"):
        import torch

        if type(value) is torch.Size:
            return tuple(value)
        if isinstance(value, torch.nn.Parameter):
            # one Parameter under two names stays one tensor (tied)
            return parameters.setdefault(id(value), value.detach().requires_grad_(False))
        return value
    if module == "numpy" or module.startswith("numpy."):
        import numpy as np
        import torch

        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            try:
                return torch.from_numpy(np.ascontiguousarray(value))
            except TypeError:  # strings and other dtypes torch has no tensor for
                return value.tolist()
        if isinstance(value, np.dtype):
            return str(value)
    return value


def record_dict(record: ObjectRecord) -> dict[str, Any]:
    """An object record as a plain dict: its class, then the data it was pickled with.

    A dict state (the usual ``__dict__``) is spread into the dict; other
    parts keep dunder keys so nothing from the file is lost or confused
    with an attribute.
    """
    out: dict[str, Any] = {"__class__": record.name}
    parts = {"__args__": list(record.args), "__kwargs__": record.kwargs,
             "__items__": record.items, "__list__": record.listitems}
    out.update((key, part) for key, part in parts.items() if part)
    state = record.state
    if isinstance(state, dict) and all(isinstance(k, str) and k not in out for k in state):
        out.update(state)
    elif state is not None:
        out["__state__"] = state
    return out


def _qualname(value: Any) -> str:
    if isinstance(value, (ObjectRecord, GlobalRef)):
        return value.name
    if isinstance(value, Backref):
        return "reference cycle"
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"
