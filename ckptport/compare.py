"""Comparing tensors and trees: bit-exact for verification, by value within a tolerance for diff.

Bit-exact: tensors compare by dtype, shape and bytes (NaN payloads and the
sign of zero included), read piece by piece so no tensor is held twice;
floats compare equal when both are NaN; a dict and an OrderedDict with the
same items are equal (the pickle keeps the kind, JSON metadata does not
need to). Ties must survive too: tensors that were one storage must be one
storage again.

By value (``compare_tensor``, what ``diff`` reports): both tensors are read
window by window; identical windows cost one word-wise comparison (the same
``_equal`` as above), so memory stays near one window pair whatever the
size, and torch is imported only to compute the values of windows that
differ in dtypes numpy cannot hold (bfloat16, float8). NaN equals NaN (any
payload), ``-0.0`` equals ``0.0``; an element differs when
``|a - b| > atol + rtol * |a|`` (A is the reference).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from .dtypes import DType, dtype_of
from .errors import OptionError
from .parallel import run_all
from .progress import Advance
from .tensors import ViewKey, chunks, nbytes, view_key
from .tree import KeyPath, TensorLeaf, Tree, format_path, is_tensor, iter_tensors

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["tree_mismatches", "tie_groups", "same_bytes", "leaf_equal", "Tolerance",
           "TensorDelta", "compare_tensor", "CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 1 << 20
"""Elements compared by value at once: float64 temporaries of 8 MiB each."""

Pieces = Callable[[TensorLeaf], Iterable[bytes | memoryview]]
Scalar = float | str  # an element as ``TensorDelta`` shows it (an int, a float; complex as text)


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


def _crc32(stream: Iterable[bytes | memoryview]) -> int:
    crc = 0
    for piece in stream:
        crc = zlib.crc32(piece, crc)
    return crc


def _pieces(stream: Iterable[bytes | memoryview]) -> Iterator[memoryview]:
    for piece in stream:
        view = memoryview(piece).cast("B")
        if len(view):
            yield view


def tree_mismatches(expected: Tree, actual: Tree, limit: int = 5,
                    on_tensor: Callable[[int], None] | None = None,
                    expected_pieces: Pieces = chunks, jobs: int | None = None,
                    ties: bool = True,
                    expected_crc: Callable[[TensorLeaf], int | None] | None = None
                    ) -> list[str]:
    """Up to ``limit`` descriptions of where ``actual`` differs from ``expected``.

    ``expected_pieces`` reads an expected tensor's bytes (verification passes
    an independent reader of the source); ``expected_crc`` gives, for a tensor
    known by the CRC-32 of the bytes written (a computed one), that CRC, which
    the actual bytes must have. Tensor bytes are compared on ``jobs`` threads
    (default: every core). ``ties=False`` for a format that stores every name
    on its own (DCP).
    """
    found: list[str] = []
    pairs: list[tuple[str, TensorLeaf, TensorLeaf]] = []
    _walk(expected, actual, (), found, limit, pairs)
    advance = on_tensor or (lambda n: None)

    def compare(pair: tuple[str, TensorLeaf, TensorLeaf]) -> str | None:
        where, a, b = pair
        crc = None if expected_crc is None else expected_crc(a)
        if crc is not None:
            if _crc32(chunks(b)) != crc:
                return f"{where}: tensor bytes differ from the bytes written (CRC-32)"
        elif not same_bytes(expected_pieces(a), chunks(b)):
            return f"{where}: tensor bytes differ"
        advance(nbytes(a))
        return None

    found += [m for m in run_all(compare, pairs, jobs=jobs, size=lambda p: nbytes(p[1])) if m]
    if ties and not found and tie_groups(expected) != tie_groups(actual):
        found.append("tied tensors (one storage under several names) were not kept tied")
    return found[:limit]


def _walk(a: Tree, b: Tree, path: KeyPath, found: list[str], limit: int,
          pairs: list[tuple[str, TensorLeaf, TensorLeaf]]) -> None:
    """Structure, dtypes, shapes and plain values now; tensor pairs collected for later."""
    if len(found) >= limit:
        return
    where = format_path(path)
    if is_tensor(a) or is_tensor(b):
        if not (is_tensor(a) and is_tensor(b)):
            found.append(f"{where}: tensor vs {type(b if is_tensor(a) else a).__name__}")
            return
        if dtype_of(a) != dtype_of(b) or tuple(a.shape) != tuple(b.shape):
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
        left, right = cast("Sequence[Tree]", a), cast("Sequence[Tree]", b)  # lists or tuples
        if len(left) != len(right):
            found.append(f"{where}: length {len(left)} vs {len(right)}")
            return
        for index, (item_a, item_b) in enumerate(zip(left, right, strict=True)):
            _walk(item_a, item_b, (*path, index), found, limit, pairs)
    elif not leaf_equal(a, b, bits=True):
        found.append(f"{where}: {a!r} vs {b!r}"[:300])


def leaf_equal(a: Tree, b: Tree, *, bits: bool = False) -> bool:
    """Plain values by type and value, NaN equal to NaN (complex parts too).

    ``bits``: the sign of zero counts too (verification: ``-0.0`` written as
    ``0.0`` is a change); a NaN's payload does not (JSON metadata cannot carry it).
    Else by value (``diff``).
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, complex) and isinstance(b, complex):  # one type, as just checked
        return leaf_equal(a.real, b.real, bits=bits) and leaf_equal(a.imag, b.imag, bits=bits)
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and (not bits or math.copysign(1, a) == math.copysign(1, b))
    return bool(a == b)


def tie_groups(tree: Tree) -> list[list[str]]:
    """Paths grouped by the exact view they hold, groups of two or more only."""
    groups: dict[ViewKey, list[str]] = {}
    for path, tensor in iter_tensors(tree):
        groups.setdefault(view_key(tensor), []).append(format_path(path))
    return sorted(g for g in groups.values() if len(g) > 1)


# -- by value, within a tolerance (diff) ------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """When two elements count as equal: ``|a - b| <= atol + rtol * |a|``, or both NaN."""

    atol: float = 0.0
    rtol: float = 0.0
    cast: bool = False

    def __post_init__(self) -> None:
        if not (self.atol >= 0 and self.rtol >= 0):  # also refuses NaN
            raise OptionError(f"atol and rtol must be >= 0, not {self.atol!r}, {self.rtol!r}")

    @property
    def exact(self) -> bool:
        return self.atol == 0 and self.rtol == 0


@dataclass(frozen=True)
class TensorDelta:
    """A tensor pair whose values are not all equal.

    ``differing`` counts elements outside the tolerance (0: the tensor is
    equal within tolerance but not exactly); ``index`` locates the largest
    ``|a - b|`` (the first one on ties), where A held ``a`` and B held ``b``.
    Relative error is ``|a - b| / |a|``: infinite where ``a`` is 0. ``max_steps``
    (a weight ``--dequantize`` computed on either side): the largest ``|a - b|``
    in units of the quantization step of its element (its block's, group's or
    row's scale): how far from the best encoding, 0.5 for a rounded integer code.
    """

    key: str
    shape: tuple[int, ...]
    dtype_a: str
    dtype_b: str
    numel: int
    differing: int
    max_abs: float
    max_rel: float
    index: tuple[int, ...]
    a: Scalar
    b: Scalar
    max_steps: float | None = field(default=None, metadata={"omit_none": True})


@dataclass
class _Worst:
    """Running statistics of one tensor pair, merged window by window."""

    differing: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    flat_index: int = 0
    a: Scalar | None = None
    b: Scalar | None = None


def _windows(pieces: Iterable[bytes | memoryview], size: int) -> Iterator[bytes | memoryview]:
    """The stream re-cut into windows of exactly ``size`` bytes (the last may be shorter)."""
    held = bytearray()
    for piece in pieces:
        if not held and len(piece) == size:
            yield piece
            continue
        held += piece
        while len(held) >= size:
            yield bytes(held[:size])
            del held[:size]
    if held:
        yield bytes(held)


def compare_tensor(key: str, a: TensorLeaf, b: TensorLeaf, tolerance: Tolerance,
                   advance: Advance) -> TensorDelta | None:
    """Stats of ``a`` vs ``b`` (same shape), or None when every value is equal."""
    type_a, type_b = dtype_of(a), dtype_of(b)
    worst = _Worst()
    start = 0
    size_a, size_b = CHUNK_ELEMENTS * type_a.itemsize, CHUNK_ELEMENTS * type_b.itemsize
    windows_b = _windows(chunks(b, size_b), size_b)  # read in windows: nothing re-cut
    for window_a in _windows(chunks(a, size_a), size_a):
        window_b = next(windows_b)
        count = len(window_a) // type_a.itemsize
        if type_a != type_b or len(window_a) != len(window_b) or \
                not _equal(memoryview(window_a), memoryview(window_b)):
            _compare_window(window_a, window_b, type_a, type_b, start, tolerance, worst)
        start += count
        advance(len(window_a))
    if worst.max_abs == 0 and not worst.differing:
        return None
    assert worst.a is not None and worst.b is not None  # set with the first differing window
    index = _unravel(worst.flat_index, tuple(a.shape))
    return TensorDelta(key, tuple(a.shape), type_a.name, type_b.name, math.prod(a.shape),
                       worst.differing, worst.max_abs, worst.max_rel, index, worst.a, worst.b)


def _values(window: bytes | memoryview, dtype: DType
            ) -> npt.NDArray[np.int64 | np.float64 | np.complex128]:
    """A window's values at a precision that holds them exactly (float64, complex128, int64)."""
    import numpy as np

    if not dtype.has_values:  # packed and bit types: each unit's bytes as one integer code
        units = np.frombuffer(window, dtype=np.uint8).reshape(-1, dtype.itemsize)
        weights = np.array([1 << (8 * i) for i in range(dtype.itemsize)], dtype=np.int64)
        return units.astype(np.int64) @ weights
    if dtype.numpy is not None:
        values = np.frombuffer(window, dtype=dtype.to_numpy())
    else:  # bfloat16, float8 and the like: torch knows their values
        import torch

        raw = torch.frombuffer(bytearray(window), dtype=dtype.to_torch()) if len(window) else \
            torch.empty(0, dtype=dtype.to_torch())
        values = raw.to(torch.float64 if dtype.is_floating_point else torch.int64).numpy()
    if values.dtype.kind == "c":
        return values.astype(np.complex128)
    if values.dtype.kind == "f":
        return values.astype(np.float64)
    return values.astype(np.int64)


def _compare_window(a: bytes | memoryview, b: bytes | memoryview, type_a: DType,
                    type_b: DType, offset: int, tolerance: Tolerance, worst: _Worst) -> None:
    """Fold one window pair into ``worst``; codes (packed, bit types) compare exactly."""
    import numpy as np

    if not (type_a.has_values and type_b.has_values):
        tolerance = Tolerance()
    x, y = _values(a, type_a), _values(b, type_b)
    if x.dtype.kind == "c" or y.dtype.kind == "c":
        x, y = x.astype(np.complex128), y.astype(np.complex128)
    elif x.dtype.kind == "f" or y.dtype.kind == "f":
        x, y = x.astype(np.float64), y.astype(np.float64)
    with np.errstate(all="ignore"):
        same = x == y
        if x.dtype.kind in "fc":
            same |= np.isnan(x) & np.isnan(y)
        if bool(same.all()):  # -0.0 vs 0.0, NaN payloads: equal by value
            return
        fx, fy = (x, y) if x.dtype.kind in "fc" else (x.astype(np.float64), y.astype(np.float64))
        magnitude = np.abs(fx)
        delta = np.where(same, 0.0, np.abs(fx - fy))
        delta = np.nan_to_num(delta, nan=np.inf)
        relative = np.where(delta == 0, 0.0, delta / magnitude)
        relative = np.nan_to_num(relative, nan=np.inf)
        inside = same | (delta <= tolerance.atol + tolerance.rtol * magnitude)
    worst.differing += int((~inside).sum())
    local = int(delta.argmax())
    if float(delta[local]) > worst.max_abs or (worst.a is None and not inside.all()):
        worst.max_abs, worst.flat_index = float(delta[local]), offset + local
        worst.a, worst.b = _item(x[local]), _item(y[local])
    worst.max_rel = max(worst.max_rel, float(relative.max()))


def _item(value: np.generic) -> Scalar:
    item: Scalar | complex = value.item()
    return str(item) if isinstance(item, complex) else item


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index: list[int] = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))
