"""``ckptport diff``: do two checkpoints hold the same weights, in any formats?

Both sides go through the same normalize rules (so a DDP ``.pth`` recorded on
``cuda:3`` compares equal to its clean ``.safetensors`` twin), then every
leaf is matched by its path. Tensors are compared window by window, read by
position from the files (``tensors.chunks``): identical windows cost one
word-wise comparison, so memory stays near one window pair whatever the size
of the files, and torch is imported only to compute the values of windows
that differ in dtypes numpy cannot hold (bfloat16, float8). A name that only
one side holds but that is tied to a name both hold (the hub leaves tied
names out of its files) is listed, not counted as a difference.

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

import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from ..checkpoint import Checkpoint, KeyPath, format_path, is_tensor
from ..compare import leaf_equal
from ..dtypes import DType, dtype_of
from ..errors import RuleError
from ..progress import Advance, Progress, no_progress
from ..readers import open_checkpoint
from ..rules import NormalizeOptions, Recipe, apply_rules
from ..tensors import chunks, view_key
from ..tree import children
from .manifest import Manifest, is_manifest, load_manifest, manifest, manifest_options
from .manifest import one_side as manifest_one_side

__all__ = [
    "DiffReport",
    "DtypeMismatch",
    "HashMismatch",
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
class HashMismatch:
    """Same name, dtype and shape, other content: compared by sha256 (a manifest side)."""

    key: str
    sha256_a: str
    sha256_b: str


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
    tied_only_in_a: tuple[str, ...] = ()  # names tied to a compared name; not differences
    tied_only_in_b: tuple[str, ...] = ()
    # with a manifest on one side: tensors whose sha256 differs (their values are not at hand)
    hash_mismatches: tuple[HashMismatch, ...] = ()
    tensors_differing: int = field(init=False)
    largest: TensorDelta | None = field(init=False)
    equal: bool = field(init=False)

    def __post_init__(self) -> None:
        failing_dtypes = () if self.tolerance.cast else self.dtype_mismatches
        differing = len(self.shape_mismatches) + len(failing_dtypes) + len(self.value_mismatches) \
            + len(self.hash_mismatches)
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
        tied = len(self.tied_only_in_a) + len(self.tied_only_in_b)
        if tied:
            extra.append(f"{tied} tied names on one side only (the same tensor as a compared "
                         "name)")
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
    trust: bool = False,
    map_a: Recipe | str | os.PathLike[str] | None = None,
    map_b: Recipe | str | os.PathLike[str] | None = None,
    max_expansion: float | None = None,
    progress: Progress = no_progress,
) -> DiffReport:
    """Compare ``a`` and ``b`` (paths or Checkpoints) after normalizing both alike.

    ``raw=True`` compares the trees as stored. ``map_a``/``map_b`` apply a
    key recipe (``--map FILE``) to one side only, so a renamed checkpoint
    compares with its source. Unreadable input raises a ``CkptportError``
    naming the file; ``trust`` unpickles both with full Python (TorchScript,
    files the user vouches for).
    """
    if raw and (options is not None or map_a is not None or map_b is not None):
        raise ValueError("raw=True compares as stored; it takes no normalize options")
    tolerance = Tolerance(atol, rtol, cast)
    if any(not isinstance(x, Checkpoint) and is_manifest(x) for x in (a, b)):
        if map_a is not None or map_b is not None:
            raise RuleError("--map-a/--map-b: a manifest side is normalized as the manifest "
                            "records; make the manifest with --map instead")
        return _diff_manifests(a, b, tolerance, trust, progress)
    side_a, leaves_a = _prepare(a, _mapped(options, map_a), raw, trust, max_expansion)
    side_b, leaves_b = _prepare(b, _mapped(options, map_b), raw, trust, max_expansion)
    shapes: list[ShapeMismatch] = []
    dtypes: list[DtypeMismatch] = []
    leaves: list[LeafMismatch] = []
    pairs: list[tuple[str, Any, Any]] = []  # to compare by value
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
        if tuple(value_a.shape) != tuple(value_b.shape):
            shapes.append(ShapeMismatch(key, tuple(value_a.shape), tuple(value_b.shape),
                                        _dtype(value_a), _dtype(value_b)))
            continue
        if dtype_of(value_a) != dtype_of(value_b):
            dtypes.append(DtypeMismatch(key, tuple(value_a.shape), _dtype(value_a),
                                        _dtype(value_b)))
        if dtype_of(value_a) == dtype_of(value_b) or cast:
            pairs.append((key, value_a, value_b))
    advance = progress("diff", sum(_nbytes(x) for _, x, _ in pairs))
    deltas = [d for d in (_compare_tensor(*pair, tolerance, advance) for pair in pairs)
              if d is not None]
    only_a, tied_a = _one_side(leaves_a, leaves_b)
    only_b, tied_b = _one_side(leaves_b, leaves_a)
    return DiffReport(
        a=side_a, b=side_b, tolerance=tolerance, raw=raw, tensors_compared=tensors_compared,
        only_in_a=only_a, only_in_b=only_b,
        shape_mismatches=tuple(shapes), dtype_mismatches=tuple(dtypes),
        value_mismatches=tuple(d for d in deltas if d.differing),
        within_tolerance=tuple(d for d in deltas if not d.differing),
        leaf_mismatches=tuple(leaves), compared=tuple(key for key, _, _ in pairs),
        tied_only_in_a=tied_a, tied_only_in_b=tied_b,
    )


def _mapped(options: NormalizeOptions | None,
            recipe: Recipe | str | os.PathLike[str] | None) -> NormalizeOptions | None:
    """One side's options: the shared ones, with that side's recipe."""
    if recipe is None:
        return options
    if options is not None and options.key_steps:
        raise RuleError("--map-a/--map-b: the key steps of --map, --subtree, --keep, --drop "
                        "and --rename apply to both sides; give one side's steps in its map")
    return replace(options or NormalizeOptions(), recipe=recipe)


def _diff_manifests(a: str | os.PathLike[str] | Checkpoint, b: str | os.PathLike[str] | Checkpoint,
                    tolerance: Tolerance, trust: bool, progress: Progress) -> DiffReport:
    """A manifest on one side (or both): the other is normalized as the manifest records
    and hashed; tensors compare by name, dtype, shape and sha256."""
    given = [load_manifest(x) for x in (a, b) if not isinstance(x, Checkpoint)
             and is_manifest(x)]
    options = manifest_options(given[0])

    def side(source: str | os.PathLike[str] | Checkpoint) -> tuple[Side, Manifest]:
        if not isinstance(source, Checkpoint) and is_manifest(source):
            made = load_manifest(source)
            return Side(str(source), "manifest", len(made.tensors),
                        (f"weights digest {made.digest}",)), made
        made = manifest(source, options, trust=trust, progress=progress)
        path = str(source.source.path if isinstance(source, Checkpoint) else source)
        return Side(path, "normalized as the manifest records", len(made.tensors),
                    (f"weights digest {made.digest}",)), made

    side_a, made_a = side(a)
    side_b, made_b = side(b)
    want, have = made_a.by_name(), made_b.by_name()
    shapes, dtypes, hashes = [], [], []
    for name in (n for n in want if n in have):
        x, y = want[name], have[name]
        if x.shape != y.shape:
            shapes.append(ShapeMismatch(name, x.shape, y.shape, x.dtype, y.dtype))
        elif x.dtype != y.dtype:
            dtypes.append(DtypeMismatch(name, x.shape, x.dtype, y.dtype))
        elif x.sha256 != y.sha256:
            hashes.append(HashMismatch(name, x.sha256, y.sha256))
    only_a, tied_a = manifest_one_side(want, have)
    only_b, tied_b = manifest_one_side(have, want)
    return DiffReport(
        a=side_a, b=side_b, tolerance=tolerance, raw=False,
        tensors_compared=sum(1 for n in want if n in have),
        only_in_a=only_a, only_in_b=only_b, tied_only_in_a=tied_a, tied_only_in_b=tied_b,
        shape_mismatches=tuple(shapes), dtype_mismatches=tuple(dtypes),
        hash_mismatches=tuple(hashes))


def _one_side(mine: dict[KeyPath, Any], theirs: dict[KeyPath, Any]
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Paths only in ``mine``: (differences, names tied to a tensor both sides hold)."""
    shared = {view_key(v) for p, v in mine.items() if p in theirs and is_tensor(v)}
    only, tied = [], []
    for path, value in mine.items():
        if path in theirs:
            continue
        if is_tensor(value) and view_key(value) in shared:
            tied.append(format_path(path))
        else:
            only.append(format_path(path))
    return tuple(only), tuple(tied)


def _prepare(source: str | os.PathLike[str] | Checkpoint, options: NormalizeOptions | None,
             raw: bool, trust: bool, max_expansion: float | None
             ) -> tuple[Side, dict[KeyPath, Any]]:
    """Read (if a path), normalize (unless raw) and flatten one side."""
    checkpoint = source if isinstance(source, Checkpoint) else \
        open_checkpoint(source, trust=trust, max_expansion=max_expansion)
    notes: tuple[str, ...] = ()
    if not raw:
        normalized = apply_rules(checkpoint, options, lazy=True, require_prefix_match=False)
        checkpoint = normalized.checkpoint
        notes = tuple(f"{r.rule}: {r.summary}" for r in normalized.results
                      if r.changed or r.rule == "select")
    leaves = dict(_leaves(checkpoint.tree))
    side = Side(str(checkpoint.source.path), checkpoint.source.format.value,
                sum(1 for v in leaves.values() if is_tensor(v)), notes)
    return side, leaves


def _leaves(tree: Any, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every leaf (tensor or plain value) with its path; empty containers are leaves."""
    entries = None if is_tensor(tree) else children(tree)
    if entries:
        for key, value in entries:
            yield from _leaves(value, (*prefix, key))
    else:
        yield prefix, tree


def _same_leaf(a: Any, b: Any) -> bool:
    """Plain values by type and value (NaN equals NaN); any two empty dicts are equal."""
    if is_tensor(a) or is_tensor(b):
        return False
    return (isinstance(a, dict) and isinstance(b, dict)) or leaf_equal(a, b)


def _describe(value: Any) -> str:
    if is_tensor(value):
        return f"tensor {_dtype(value)}{list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _dtype(tensor: Any) -> str:
    return dtype_of(tensor).name


def _nbytes(tensor: Any) -> int:
    return math.prod(tensor.shape) * dtype_of(tensor).itemsize


@dataclass
class _Worst:
    """Running statistics of one tensor pair, merged window by window."""

    differing: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    flat_index: int = 0
    a: Any = None
    b: Any = None


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


def _compare_tensor(key: str, a: Any, b: Any, tolerance: Tolerance,
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
        if type_a != type_b or not _same_words(window_a, window_b):
            _compare_window(window_a, window_b, type_a, type_b, start, tolerance, worst)
        start += count
        advance(len(window_a))
    if worst.max_abs == 0 and not worst.differing:
        return None
    index = _unravel(worst.flat_index, tuple(a.shape))
    return TensorDelta(key, tuple(a.shape), type_a.name, type_b.name, math.prod(a.shape),
                       worst.differing, worst.max_abs, worst.max_rel, index, worst.a, worst.b)


def _same_words(a: bytes | memoryview, b: bytes | memoryview) -> bool:
    """Whether two windows hold the same bytes, compared as the widest words that fit.

    numpy rather than torch: it compares on one thread near memory speed, and
    needs no torch import for the common case (the files agree).
    """
    import numpy as np

    if len(a) != len(b):
        return False
    word = np.uint64 if len(a) % 8 == 0 else np.uint8
    return bool(np.array_equal(np.frombuffer(a, word), np.frombuffer(b, word)))


def _values(window: bytes | memoryview, dtype: DType) -> Any:
    """A window's values at a precision that holds them exactly (float64, complex128, int64)."""
    import numpy as np

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
    """Fold one window pair into ``worst``."""
    import numpy as np

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


def _item(value: Any) -> Any:
    item = value.item()
    return str(item) if isinstance(item, complex) else item


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index: list[int] = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))
