"""Exact comparison of two checkpoint trees, for verifying what was written.

Bit-exact: tensors compare by dtype, shape and bytes (NaN payloads and the
sign of zero included), read piece by piece so no tensor is held twice;
floats compare equal when both are NaN; a dict and an OrderedDict with the
same items are equal (the pickle keeps the kind, JSON metadata does not
need to). Ties must survive too: tensors that were one storage must be one
storage again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from .dtypes import dtype_of
from .parallel import run_all
from .tensors import chunks, nbytes, view_key
from .tree import KeyPath, format_path, is_tensor, iter_tensors

__all__ = ["tree_mismatches", "tie_groups", "same_bytes", "leaf_equal"]

Pieces = Callable[[Any], Iterable[bytes | memoryview]]


def same_bytes(a: Iterable[bytes | memoryview], b: Iterable[bytes | memoryview]) -> bool:
    """Whether two streams of pieces hold the same bytes, whatever their piece sizes."""
    left, right = _pieces(a), _pieces(b)
    x, y = next(left, None), next(right, None)
    while x is not None and y is not None:
        n = min(len(x), len(y))
        if not _equal(x[:n], y[:n]):
            return False
        x = x[n:] if len(x) > n else next(left, None)
        y = y[n:] if len(y) > n else next(right, None)
    return x is None and y is None


def _equal(x: memoryview, y: memoryview) -> bool:
    """Compare as the widest words that fit: numpy runs this near memory speed."""
    import numpy as np

    word = np.uint64 if len(x) % 8 == 0 else np.uint8
    return bool(np.array_equal(np.frombuffer(x, word), np.frombuffer(y, word)))


def _pieces(stream: Iterable[bytes | memoryview]) -> Iterator[memoryview]:
    for piece in stream:
        view = memoryview(piece).cast("B")
        if len(view):
            yield view


def tree_mismatches(expected: Any, actual: Any, limit: int = 5,
                    on_tensor: Callable[[int], None] | None = None,
                    expected_pieces: Pieces = chunks, jobs: int | None = None,
                    ties: bool = True) -> list[str]:
    """Up to ``limit`` descriptions of where ``actual`` differs from ``expected``.

    ``expected_pieces`` reads an expected tensor's bytes (verification passes
    an independent reader of the source). Tensor bytes are compared on
    ``jobs`` threads (default: every core). ``ties=False`` for a format that
    stores every name on its own (DCP).
    """
    found: list[str] = []
    pairs: list[tuple[str, Any, Any]] = []
    _walk(expected, actual, (), found, limit, pairs)
    advance = on_tensor or (lambda n: None)

    def compare(pair: tuple[str, Any, Any]) -> str | None:
        where, a, b = pair
        if not same_bytes(expected_pieces(a), chunks(b)):
            return f"{where}: tensor bytes differ"
        advance(nbytes(a))
        return None

    found += [m for m in run_all(compare, pairs, jobs=jobs, size=lambda p: nbytes(p[1])) if m]
    if ties and not found and tie_groups(expected) != tie_groups(actual):
        found.append("tied tensors (one storage under several names) were not kept tied")
    return found[:limit]


def _walk(a: Any, b: Any, path: KeyPath, found: list[str], limit: int,
          pairs: list[tuple[str, Any, Any]]) -> None:
    """Structure, dtypes, shapes and plain values now; tensor pairs collected for later."""
    if len(found) >= limit:
        return
    where = format_path(path)
    if is_tensor(a) or is_tensor(b):
        if not (is_tensor(a) and is_tensor(b)):
            found.append(f"{where}: tensor vs {type(b if is_tensor(a) else a).__name__}")
        elif dtype_of(a) != dtype_of(b) or tuple(a.shape) != tuple(b.shape):
            found.append(f"{where}: dtype or shape differ ({dtype_of(a)}{list(a.shape)} vs "
                         f"{dtype_of(b)}{list(b.shape)})")
        else:
            pairs.append((where, a, b))
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            found.append(f"{where}: keys differ")
            return
        for key in a:
            _walk(a[key], b[key], (*path, key), found, limit, pairs)
    elif type(a) in (list, tuple) and type(a) is type(b):
        if len(a) != len(b):
            found.append(f"{where}: length {len(a)} vs {len(b)}")
            return
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, (*path, index), found, limit, pairs)
    elif not leaf_equal(a, b, bits=True):
        found.append(f"{where}: {a!r} vs {b!r}"[:300])


def leaf_equal(a: Any, b: Any, *, bits: bool = False) -> bool:
    """Plain values by type and value, NaN equal to NaN (complex parts too).

    ``bits``: the sign of zero counts too (verification: ``-0.0`` written as
    ``0.0`` is a change); a NaN's payload does not (JSON metadata cannot carry it).
    Else by value (``diff``).
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, complex):
        return leaf_equal(a.real, b.real, bits=bits) and leaf_equal(a.imag, b.imag, bits=bits)
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and (not bits or math.copysign(1, a) == math.copysign(1, b))
    return bool(a == b)


def tie_groups(tree: Any) -> list[list[str]]:
    """Paths grouped by the exact view they hold, groups of two or more only."""
    groups: dict[Any, list[str]] = {}
    for path, tensor in iter_tensors(tree):
        groups.setdefault(view_key(tensor), []).append(format_path(path))
    return sorted(g for g in groups.values() if len(g) > 1)
