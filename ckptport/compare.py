"""Exact comparison of two checkpoint trees, for verifying what was written.

Bit-exact: tensors compare by dtype, shape and bytes (NaN payloads and the
sign of zero included); floats compare equal when both are NaN; a dict and
an OrderedDict with the same items are equal (the pickle keeps the kind,
JSON metadata does not need to). Ties must survive too: tensors that were
one storage must be one storage again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from .checkpoint import KeyPath, format_path, is_tensor, iter_tensors
from .lazy import materialize
from .tensorops import bits_equal, view_key

__all__ = ["tree_mismatches", "tie_groups"]


def tree_mismatches(expected: Any, actual: Any, limit: int = 5,
                    on_tensor: Callable[[int], None] | None = None) -> list[str]:
    """Up to ``limit`` descriptions of where ``actual`` differs from ``expected``."""
    found: list[str] = []
    _walk(expected, actual, (), found, limit, on_tensor or (lambda n: None))
    if not found and tie_groups(expected) != tie_groups(actual):
        found.append("tied tensors (one storage under several names) were not kept tied")
    return found[:limit]


def _walk(a: Any, b: Any, path: KeyPath, found: list[str], limit: int,
          on_tensor: Callable[[int], None]) -> None:
    if len(found) >= limit:
        return
    where = format_path(path)
    if is_tensor(a) or is_tensor(b):
        if not (is_tensor(a) and is_tensor(b)):
            found.append(f"{where}: tensor vs {type(b if is_tensor(a) else a).__name__}")
        elif not bits_equal(materialize(a), materialize(b)):  # one tensor at a time
            found.append(f"{where}: tensor bytes, dtype or shape differ")
        else:
            on_tensor(a.numel() * a.element_size())
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            found.append(f"{where}: keys differ")
            return
        for key in a:
            _walk(a[key], b[key], (*path, key), found, limit, on_tensor)
    elif type(a) in (list, tuple) and type(a) is type(b):
        if len(a) != len(b):
            found.append(f"{where}: length {len(a)} vs {len(b)}")
            return
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            _walk(x, y, (*path, index), found, limit, on_tensor)
    elif not _leaf_equal(a, b):
        found.append(f"{where}: {a!r} vs {b!r}")


def _leaf_equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def tie_groups(tree: Any) -> list[list[str]]:
    """Paths grouped by the exact view they hold, groups of two or more only."""
    groups: dict[Any, list[str]] = {}
    for path, tensor in iter_tensors(tree):
        key = view_key(tensor)
        if key is not None:
            groups.setdefault(key, []).append(format_path(path))
    return sorted(g for g in groups.values() if len(g) > 1)
