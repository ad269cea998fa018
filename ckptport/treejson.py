"""The non-tensor part of a checkpoint tree as JSON, for safetensors metadata.

safetensors holds a flat map of named tensors; ``--select all`` also keeps
the epoch, the optimizer's hyper-parameters, the training arguments. They
travel as JSON in the file's metadata with every tensor replaced by its
name, so the reader rebuilds the same tree: dict key types and order,
tuples, non-finite floats, state-dict ``_metadata`` and tied tensors
(two leaves naming one stored tensor) all survive.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from .checkpoint import KeyPath, format_path, is_tensor

__all__ = ["encode", "decode", "TreeEncodeError"]


class TreeEncodeError(ValueError):
    """A leaf JSON cannot carry; the message names its path."""


def encode(tree: Any, tensor_name: Callable[[KeyPath, Any], str]) -> str:
    return json.dumps(_enc(tree, (), tensor_name), separators=(",", ":"), ensure_ascii=False)


def _enc(value: Any, path: KeyPath, tensor_name: Callable[[KeyPath, Any], str]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if is_tensor(value):
        return {"__tensor__": tensor_name(path, value)}
    if isinstance(value, list):
        return [_enc(v, (*path, i), tensor_name) for i, v in enumerate(value)]
    if type(value) is tuple:
        return {"__tuple__": [_enc(v, (*path, i), tensor_name) for i, v in enumerate(value)]}
    if isinstance(value, Mapping):
        node: dict[str, Any] = {
            "__dict__": [[_enc(k, path, tensor_name), _enc(v, (*path, k), tensor_name)]
                         for k, v in value.items()]
        }
        if isinstance(value, OrderedDict):
            node["__ordered__"] = True
            versions = getattr(value, "_metadata", None)
            if versions is not None:
                node["__versions__"] = _enc(versions, path, tensor_name)
        return node
    raise TreeEncodeError(
        f"{format_path(path)}: a {type(value).__name__} cannot be stored in safetensors "
        "metadata; write .pth instead"
    )


def decode(text: str, tensors: Mapping[str, Any]) -> Any:
    return _dec(json.loads(text), tensors)


def _dec(node: Any, tensors: Mapping[str, Any]) -> Any:
    if isinstance(node, list):
        return [_dec(v, tensors) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tensor__" in node:
        return tensors[node["__tensor__"]]
    if "__float__" in node:
        return float(node["__float__"])
    if "__tuple__" in node:
        return tuple(_dec(v, tensors) for v in node["__tuple__"])
    items = [(_hashable(_dec(k, tensors)), _dec(v, tensors)) for k, v in node["__dict__"]]
    if not node.get("__ordered__"):
        return dict(items)
    result: OrderedDict[Any, Any] = OrderedDict(items)
    if "__versions__" in node:
        result._metadata = _dec(node["__versions__"], tensors)  # type: ignore[attr-defined]
    return result


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key
