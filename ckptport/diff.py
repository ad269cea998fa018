"""``ckptport diff``: do two checkpoints hold the same weights, in any formats?

Both sides go through the same normalize rules (so a DDP ``.pth`` recorded on
``cuda:3`` compares equal to its clean ``.safetensors`` twin), then every
leaf is matched by its path. Tensors are compared chunk by chunk straight
from the lazy, file-backed tensors the readers hand out, and the pages of a
chunk are handed back to the kernel once it is compared, so memory stays
near one chunk pair whatever the size of the files.

Value semantics (documented in the README and ``ckptport diff --help``):

- equality is by value: NaN equals NaN (any payload), ``-0.0`` equals
  ``0.0``; an element differs when ``|a - b| > atol + rtol * |a|`` (A is the
  reference); the default tolerance is exact;
- tensors of different dtypes are a difference and their values are not
  compared, unless ``cast`` is set: then both are compared by value at a
  common precision (float64, complex128 or int64) and the dtype change is
  listed as a note only;
- tensors of different shapes are a difference and are never compared.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checkpoint import Checkpoint, KeyPath, format_path, is_tensor
from .compare import _leaf_equal
from .progress import Advance, Progress, no_progress
from .readers import read
from .rules import NormalizeOptions, normalize
from .tensorops import as_bytes

if TYPE_CHECKING:
    import torch

__all__ = [
    "DiffReport",
    "DtypeMismatch",
    "LeafMismatch",
    "ShapeMismatch",
    "Side",
    "TensorDelta",
    "Tolerance",
    "diff",
]

CHUNK_ELEMENTS = 1 << 20
"""Elements compared at once: float64 temporaries of 8 MiB each."""


@dataclass(frozen=True)
class Tolerance:
    """When two elements count as equal: ``|a - b| <= atol + rtol * |a|``, or both NaN."""

    atol: float = 0.0
    rtol: float = 0.0
    cast: bool = False

    def __post_init__(self) -> None:
        if not (self.atol >= 0 and self.rtol >= 0):  # also refuses NaN
            raise ValueError(f"atol and rtol must be >= 0, not {self.atol!r}, {self.rtol!r}")

    @property
    def exact(self) -> bool:
        return self.atol == 0 and self.rtol == 0


@dataclass(frozen=True)
class Side:
    """One input: where it came from and what normalizing it did (``raw``: nothing)."""

    path: str
    format: str
    tensors: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShapeMismatch:
    key: str
    shape_a: tuple[int, ...]
    shape_b: tuple[int, ...]
    dtype_a: str
    dtype_b: str


@dataclass(frozen=True)
class DtypeMismatch:
    """Same shape, different dtype: a difference, or only a note under ``cast``."""

    key: str
    shape: tuple[int, ...]
    dtype_a: str
    dtype_b: str


@dataclass(frozen=True)
class TensorDelta:
    """A tensor pair whose values are not all equal.

    ``differing`` counts elements outside the tolerance (0: the tensor is
    equal within tolerance but not exactly); ``index`` locates the largest
    ``|a - b|`` (the first one on ties), where A held ``a`` and B held ``b``.
    Relative error is ``|a - b| / |a|``: infinite where ``a`` is 0.
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
    a: Any
    b: Any


@dataclass(frozen=True)
class LeafMismatch:
    """A non-tensor leaf (epoch, lr, an argument) that differs; values as ``repr``."""

    key: str
    a: str
    b: str


@dataclass(frozen=True)
class DiffReport:
    a: Side
    b: Side
    tolerance: Tolerance
    raw: bool
    tensors_compared: int
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    shape_mismatches: tuple[ShapeMismatch, ...] = ()
    dtype_mismatches: tuple[DtypeMismatch, ...] = ()
    value_mismatches: tuple[TensorDelta, ...] = ()
    within_tolerance: tuple[TensorDelta, ...] = ()
    leaf_mismatches: tuple[LeafMismatch, ...] = ()
    compared: tuple[str, ...] = ()  # keys compared by value, in model order
    tensors_differing: int = field(init=False)
    largest: TensorDelta | None = field(init=False)
    equal: bool = field(init=False)

    def __post_init__(self) -> None:
        failing_dtypes = () if self.tolerance.cast else self.dtype_mismatches
        differing = len(self.shape_mismatches) + len(failing_dtypes) + len(self.value_mismatches)
        deltas = self.value_mismatches or self.within_tolerance
        object.__setattr__(self, "tensors_differing", differing)
        object.__setattr__(self, "largest", max(deltas, key=lambda d: d.max_abs, default=None))
        object.__setattr__(self, "equal", not (differing or self.only_in_a or self.only_in_b
                                               or self.leaf_mismatches))

    def summary(self) -> str:
        """The first line of every rendering, e.g. ``3 tensors compared: 2 equal, 1 differ``."""
        line = (f"{self.tensors_compared} tensors compared: "
                f"{self.tensors_compared - self.tensors_differing} equal, "
                f"{self.tensors_differing} differ")
        if self.largest is not None:
            within = "" if self.value_mismatches else ", within tolerance"
            line += (f" (largest |Δ| {format_number(self.largest.max_abs)} "
                     f"at {self.largest.key}{within})")
        extra = [f"{len(keys)} only in {side}"
                 for side, keys in (("A", self.only_in_a), ("B", self.only_in_b)) if keys]
        if self.leaf_mismatches:
            extra.append(f"{len(self.leaf_mismatches)} non-tensor values differ")
        return "; ".join([line, *extra])


def format_number(value: float) -> str:
    """Deltas as ``3.1e-03``; ``0`` and ``inf`` as such."""
    return "0" if value == 0 else f"{value:.1e}"


def diff(
    a: str | os.PathLike[str] | Checkpoint,
    b: str | os.PathLike[str] | Checkpoint,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    cast: bool = False,
    options: NormalizeOptions | None = None,
    raw: bool = False,
    progress: Progress = no_progress,
) -> DiffReport:
    """Compare ``a`` and ``b`` (paths or Checkpoints) after normalizing both alike.

    ``raw=True`` compares the trees as stored. Unreadable input raises a
    ``CkptportError`` naming the file.
    """
    if raw and options is not None:
        raise ValueError("raw=True compares as stored; it takes no normalize options")
    tolerance = Tolerance(atol, rtol, cast)
    side_a, leaves_a, release_a = _prepare(a, options, raw)
    side_b, leaves_b, release_b = _prepare(b, options, raw)
    shapes: list[ShapeMismatch] = []
    dtypes: list[DtypeMismatch] = []
    leaves: list[LeafMismatch] = []
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # to compare by value
    tensors_compared = 0
    for path, value_a in leaves_a.items():
        if path not in leaves_b:
            continue
        value_b, key = leaves_b[path], format_path(path)
        if not (is_tensor(value_a) and is_tensor(value_b)):
            if not _same_leaf(value_a, value_b):
                leaves.append(LeafMismatch(key, _describe(value_a), _describe(value_b)))
            continue
        tensors_compared += 1
        if value_a.shape != value_b.shape:
            shapes.append(ShapeMismatch(key, tuple(value_a.shape), tuple(value_b.shape),
                                        _dtype(value_a), _dtype(value_b)))
            continue
        if value_a.dtype != value_b.dtype:
            dtypes.append(DtypeMismatch(key, tuple(value_a.shape), _dtype(value_a),
                                        _dtype(value_b)))
        if value_a.dtype == value_b.dtype or cast:
            pairs.append((key, value_a, value_b))
    releaser = _PageReleaser(release_a + release_b)
    advance = progress("diff", sum(_nbytes(a) for _, a, _ in pairs))
    deltas = [d for d in (_compare_tensor(*pair, tolerance, releaser, advance) for pair in pairs)
              if d is not None]
    return DiffReport(
        a=side_a, b=side_b, tolerance=tolerance, raw=raw, tensors_compared=tensors_compared,
        only_in_a=tuple(format_path(p) for p in leaves_a if p not in leaves_b),
        only_in_b=tuple(format_path(p) for p in leaves_b if p not in leaves_a),
        shape_mismatches=tuple(shapes), dtype_mismatches=tuple(dtypes),
        value_mismatches=tuple(d for d in deltas if d.differing),
        within_tolerance=tuple(d for d in deltas if not d.differing),
        leaf_mismatches=tuple(leaves), compared=tuple(key for key, _, _ in pairs),
    )


def _prepare(
    source: str | os.PathLike[str] | Checkpoint, options: NormalizeOptions | None, raw: bool
) -> tuple[Side, dict[KeyPath, Any], list[Path]]:
    """Read (if a path), normalize (unless raw) and flatten one side.

    Returns the files whose mapped pages the diff may drop after use: only
    files it opened itself, whose tensors no one else can have written to.
    """
    checkpoint = source if isinstance(source, Checkpoint) else read(source)
    opened = [] if isinstance(source, Checkpoint) else [checkpoint.source.path]
    notes: tuple[str, ...] = ()
    if not raw:
        normalized = normalize(checkpoint, options)
        checkpoint = normalized.checkpoint
        notes = tuple(f"{r.rule}: {r.summary}" for r in normalized.results
                      if r.changed or r.rule == "select")
    leaves = dict(_leaves(checkpoint.tree))
    side = Side(str(checkpoint.source.path), checkpoint.source.format.value,
                sum(1 for v in leaves.values() if is_tensor(v)), notes)
    return side, leaves, opened


def _leaves(tree: Any, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every leaf (tensor or plain value) with its path; empty containers are leaves."""
    if isinstance(tree, Mapping) and tree:
        for key, value in tree.items():
            yield from _leaves(value, (*prefix, key))
    elif isinstance(tree, (list, tuple)) and tree:
        for index, value in enumerate(tree):
            yield from _leaves(value, (*prefix, index))
    else:
        yield prefix, tree


def _same_leaf(a: Any, b: Any) -> bool:
    """Plain values by type and value (NaN equals NaN); any two empty dicts are equal."""
    if is_tensor(a) or is_tensor(b):
        return False
    return (isinstance(a, Mapping) and isinstance(b, Mapping)) or _leaf_equal(a, b)


def _describe(value: Any) -> str:
    if is_tensor(value):
        return f"tensor {_dtype(value)}{list(value.shape)}"
    return repr(value)


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class _Worst:
    """Running statistics of one tensor pair, merged chunk by chunk."""

    differing: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    flat_index: int = 0


def _compare_tensor(key: str, a: torch.Tensor, b: torch.Tensor, tolerance: Tolerance,
                    releaser: _PageReleaser, advance: Advance) -> TensorDelta | None:
    """Stats of ``a`` vs ``b`` (same shape), or None when every value is equal."""
    flat_a, flat_b = a.detach().reshape(-1), b.detach().reshape(-1)
    worst = _Worst()
    for start in range(0, flat_a.numel(), CHUNK_ELEMENTS):
        chunk_a = flat_a[start:start + CHUNK_ELEMENTS]
        chunk_b = flat_b[start:start + CHUNK_ELEMENTS]
        _compare_chunk(chunk_a, chunk_b, start, tolerance, worst)
        releaser(chunk_a)
        releaser(chunk_b)
        advance(_nbytes(chunk_a))
    if worst.max_abs == 0 and not worst.differing:
        return None
    index = _unravel(worst.flat_index, tuple(a.shape))
    return TensorDelta(key, tuple(a.shape), _dtype(a), _dtype(b), a.numel(), worst.differing,
                       worst.max_abs, worst.max_rel, index, _item(flat_a[worst.flat_index]),
                       _item(flat_b[worst.flat_index]))


def _compare_chunk(a: torch.Tensor, b: torch.Tensor, offset: int, tolerance: Tolerance,
                   worst: _Worst) -> None:
    """Fold one chunk pair into ``worst``; identical chunks cost one word compare."""
    import torch

    if a.dtype == b.dtype and _same_words(a, b):
        return
    work = _work_dtype(a.dtype, b.dtype)
    x, y = a.to(work), b.to(work)
    same = x == y
    if work.is_floating_point or work.is_complex:
        same |= x.isnan() & y.isnan()
    if bool(same.all()):  # -0.0 vs 0.0, NaN payloads: equal by value
        return
    if not (work.is_floating_point or work.is_complex):  # int64 differences can overflow
        x, y = x.to(torch.float64), y.to(torch.float64)
    magnitude = x.abs()
    delta = torch.where(same, 0.0, (x - y).abs()).nan_to_num(nan=float("inf"))
    relative = torch.where(delta == 0, 0.0, delta / magnitude).nan_to_num(nan=float("inf"))
    inside = same | (delta <= tolerance.atol + tolerance.rtol * magnitude)
    worst.differing += int((~inside).sum())
    local = int(delta.argmax())
    if float(delta[local]) > worst.max_abs:
        worst.max_abs, worst.flat_index = float(delta[local]), offset + local
    worst.max_rel = max(worst.max_rel, float(relative.max()))


def _same_words(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two chunks hold the same bytes, compared as the widest words that fit.

    numpy rather than ``torch.equal``: it compares on one thread, and torch's
    thread pool spends more time waiting for busy cores than comparing (5x
    slower on a loaded 2-core machine); on words it runs near memory speed.
    """
    import numpy as np

    bytes_a, bytes_b = as_bytes(a).numpy(), as_bytes(b).numpy()
    for dtype in (np.int64, np.int32, np.int16):
        width = np.dtype(dtype).itemsize
        if all(x.size % width == 0 and x.ctypes.data % width == 0 for x in (bytes_a, bytes_b)):
            return bool(np.array_equal(bytes_a.view(dtype), bytes_b.view(dtype)))
    return bool(np.array_equal(bytes_a, bytes_b))


def _work_dtype(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    """A dtype holding both sides' values exactly (int64 for every integer and bool)."""
    import torch

    if a.is_complex or b.is_complex:
        return torch.complex128
    if a.is_floating_point or b.is_floating_point:
        return torch.float64
    return torch.int64


def _item(element: torch.Tensor) -> Any:
    value = element.item()
    return str(value) if isinstance(value, complex) else value


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index: list[int] = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


class _PageReleaser:
    """Give compared pages of the input files back to the kernel (Linux).

    The readers map files privately; every page a comparison touches stays
    in the process's resident set until the mapping goes, so a diff of two
    2 GB files would peak near 4 GB. Dropping a page of a file mapping that
    nobody wrote to loses nothing: the next access reads it from the page
    cache again. Only mappings of the given files are touched, never heap
    memory (where dropping pages would zero them).
    """

    _MADV_DONTNEED = 4

    def __init__(self, files: list[Path]) -> None:
        self._ranges = _mapped_ranges(files) if files else []
        self._madvise = ctypes.CDLL(None, use_errno=True).madvise if self._ranges else None
        self._page = os.sysconf("SC_PAGE_SIZE") if self._ranges else 1

    def __call__(self, tensor: torch.Tensor) -> None:
        if self._madvise is None or not tensor.numel():
            return
        start = tensor.data_ptr()
        end = start + _nbytes(tensor)
        for low, high in self._ranges:
            if low <= start and end <= high:
                first = start - start % self._page
                last = min(high, -(-end // self._page) * self._page)
                self._madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first),
                              self._MADV_DONTNEED)
                return


def _mapped_ranges(files: list[Path]) -> list[tuple[int, int]]:
    """Address ranges where this process maps any of ``files`` privately."""
    identities = set()
    for path in files:
        stat = path.stat()
        identities.add((os.major(stat.st_dev), os.minor(stat.st_dev), stat.st_ino))
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.readlines()
    except OSError:  # not Linux: pages stay until the mapping is closed
        return []
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[1][3] != "p":
            continue
        major, minor = (int(part, 16) for part in fields[3].split(":"))
        if (major, minor, int(fields[4])) in identities:
            low, high = (int(part, 16) for part in fields[0].split("-"))
            ranges.append((low, high))
    return ranges
