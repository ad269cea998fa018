"""The non-tensor part of a checkpoint tree as JSON, for safetensors metadata.

safetensors holds a flat map of named tensors; ``--select all`` also keeps
the epoch, the optimizer's hyper-parameters, the training arguments. They
travel as JSON in the file's ``ckptport.tree`` metadata with every tensor
replaced by its name, so the tree reads back the same: dict key types and
order, tuples, bytes, non-finite floats, state-dict ``_metadata`` and tied
tensors (two leaves naming one stored tensor).

Decoding treats the JSON as what it is, a claim from the file: it must be
shallow enough to walk, every node well formed, and it may only name
tensors the file holds; anything else is a ``TreeDecodeError`` and the
reader falls back to the tensors as the safetensors library lists them.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias, cast

from .errors import OutputError
from .tree import Key, KeyPath, TensorLeaf, Tree, format_path, is_tensor

__all__ = ["encode", "decode", "TreeEncodeError", "TreeDecodeError", "MAX_DEPTH",
           "sorted_items"]

MAX_DEPTH = 200

Json: TypeAlias = "None | bool | int | float | str | list[Json] | dict[str, Json]"
"""A JSON value as ``json.dumps`` writes it."""


class TreeEncodeError(OutputError):
    """A leaf JSON cannot carry; the message names its path."""


class TreeDecodeError(ValueError):
    """``ckptport.tree`` metadata that is not a tree ckptport wrote."""


def sorted_items(items: Iterable[Tree]) -> list[Tree]:
    """A set's items in an order that does not depend on hashing (so bytes are stable)."""
    return sorted(items, key=lambda v: (type(v).__name__, repr(v)))


def encode(tree: Tree, tensor_name: Callable[[KeyPath, TensorLeaf], str]) -> str:
    return json.dumps(_enc(tree, (), tensor_name), separators=(",", ":"), ensure_ascii=False)


def _enc(value: Tree, path: KeyPath, tensor_name: Callable[[KeyPath, TensorLeaf], str]
         ) -> Json:
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode("ascii")}
    if isinstance(value, complex):
        return {"__complex__": [_enc(value.real, path, tensor_name),
                                _enc(value.imag, path, tensor_name)]}
    if isinstance(value, set):
        return {"__set__": [_enc(v, path, tensor_name) for v in sorted_items(value)]}
    if is_tensor(value):
        return {"__tensor__": tensor_name(path, value)}
    if isinstance(value, list):
        return [_enc(v, (*path, i), tensor_name) for i, v in enumerate(value)]
    if type(value) is tuple:
        return {"__tuple__": [_enc(v, (*path, i), tensor_name) for i, v in enumerate(value)]}
    if isinstance(value, Mapping):
        node: dict[str, Json] = {
            "__dict__": [[_enc(k, path, tensor_name), _enc(v, (*path, k), tensor_name)]
                         for k, v in value.items()]
        }
        if isinstance(value, OrderedDict):
            node["__ordered__"] = True
            versions = getattr(value, "_metadata", None)
            if versions is not None:
                node["__versions__"] = _enc(versions, path, tensor_name)
        return node
    raise TreeEncodeError(f"{format_path(path)}: a {type(value).__name__} cannot be stored in "
                          "safetensors metadata; write .pth instead")


def decode(text: str, tensors: Mapping[str, Tree]) -> Tree:
    """The tree ``text`` describes; ``TreeDecodeError`` if it is not one ckptport wrote."""
    try:
        doc: object = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise TreeDecodeError(f"not JSON: {str(exc)[:80]}") from None
    return _dec(doc, tensors, 0)


def _dec(node: object, tensors: Mapping[str, Tree], depth: int) -> Tree:
    if depth > MAX_DEPTH:
        raise TreeDecodeError(f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(node, list):
        return [_dec(v, tensors, depth + 1) for v in node]
    if not isinstance(node, dict):
        if isinstance(node, (str, bool, int, float)) or node is None:
            return node
        raise TreeDecodeError(f"holds a {type(node).__name__}")
    if len(node) == 1:
        (tag, body), = node.items()
        if tag == "__tensor__":
            if not isinstance(body, str) or body not in tensors:
                raise TreeDecodeError(f"names a tensor {str(body)[:60]!r} the file does not hold")
            return tensors[body]
        if tag in ("__float__", "__bytes__"):
            return _scalar(tag, body)
        if tag == "__tuple__" and isinstance(body, list):
            return tuple(_dec(v, tensors, depth + 1) for v in body)
        if tag == "__complex__" and isinstance(body, list) and len(body) == 2:
            parts = [_dec(v, tensors, depth + 1) for v in body]
            if all(type(p) in (int, float) for p in parts):
                return complex(*cast("list[float]", parts))
        if tag == "__set__" and isinstance(body, list):
            items = [_dec(v, tensors, depth + 1) for v in body]
            if all(isinstance(v, (str, int, float, bool, bytes, tuple)) or v is None
                   for v in items):
                return set(items)
    return _mapping(node, tensors, depth)


def _scalar(tag: str, body: object) -> float | bytes:
    if not isinstance(body, str):
        raise TreeDecodeError(f"a {tag} node that is not a string")
    try:
        if tag == "__float__":
            value = float(body)
            if math.isfinite(value):
                raise ValueError(body)
            return value
        return base64.b64decode(body.encode("ascii"), validate=True)
    except (ValueError, binascii.Error, UnicodeEncodeError):
        raise TreeDecodeError(f"a malformed {tag} node") from None


def _mapping(node: dict[str, object], tensors: Mapping[str, Tree], depth: int) -> Tree:
    pairs = node.get("__dict__")
    if not isinstance(pairs, list) or set(node) - {"__dict__", "__ordered__", "__versions__"}:
        raise TreeDecodeError("a node of unknown shape")
    items = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise TreeDecodeError("a dict entry that is not a [key, value] pair")
        key = _dec(pair[0], tensors, depth + 1)
        if not isinstance(key, (str, int, float, bool, bytes, tuple)) and key is not None:
            raise TreeDecodeError("a dict key that is not a plain value")
        items.append((key, _dec(pair[1], tensors, depth + 1)))
    if len({repr(k) for k, _ in items}) != len(items):
        raise TreeDecodeError("a dict with a key twice")
    if not node.get("__ordered__"):
        return dict(items)
    result: OrderedDict[Key, Tree] = OrderedDict(items)
    if "__versions__" in node:
        result._metadata = _dec(node["__versions__"], tensors, depth + 1)  # type: ignore[attr-defined]
    return result
