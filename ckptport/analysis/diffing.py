"""Comparing two checkpoints (or manifests): the engine of ``diff`` and ``check --against``.

Both sides go through the same normalize rules (so a DDP ``.pth`` recorded on
``cuda:3`` compares equal to its clean ``.safetensors`` twin), then every
leaf is matched by its path and tensors are compared by value
(``compare.compare_tensor``, window by window from the files). A name that
only one side holds but that is tied to a name both hold (the hub leaves
tied names out of its files) is listed, not counted as a difference.

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

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from ..checkpoint import Checkpoint, KeyPath, format_path, is_tensor
from ..compare import TensorDelta, Tolerance, compare_tensor, leaf_equal
from ..dtypes import dtype_of
from ..errors import RuleError
from ..progress import Progress, no_progress
from ..rules import NormalizeOptions, apply_rules, check_selection
from ..tensors import nbytes, view_key
from ..tree import TensorLeaf, Tree, children
from .manifests import ManifestComparison

__all__ = ["DiffReport", "DtypeMismatch", "HashMismatch", "LeafMismatch", "ShapeMismatch",
           "Side", "TensorDelta", "Tolerance", "compare_checkpoints", "compare_sides",
           "from_manifests", "prepare", "format_number"]


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


def prepare(checkpoint: Checkpoint, options: NormalizeOptions | None, raw: bool
            ) -> tuple[Side, dict[KeyPath, Tree]]:
    """Normalize (unless raw) and flatten one side."""
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


def compare_checkpoints(a: Checkpoint, b: Checkpoint, tolerance: Tolerance, *,
                        options_a: NormalizeOptions | None = None,
                        options_b: NormalizeOptions | None = None, raw: bool = False,
                        progress: Progress = no_progress) -> DiffReport:
    """A against B, each normalized with its options (the same, but for a one-sided map)."""
    if not raw and options_a is not None and options_a == options_b:
        _selects_on_a_side(a, b, options_a)
    side_a, leaves_a = prepare(a, options_a, raw)
    side_b, leaves_b = prepare(b, options_b, raw)
    return compare_sides(side_a, leaves_a, side_b, leaves_b, tolerance, raw, progress)


def _selects_on_a_side(a: Checkpoint, b: Checkpoint, options: NormalizeOptions) -> None:
    """A key option may match one side only (a prefix only B carries), but one that matches
    neither is a typo: when the first option each side's names refuse is the same one, it
    selected nothing in either file (the options before it matched on both)."""
    refused = [exc for exc in (_refusal(a, options), _refusal(b, options)) if exc is not None]
    if len(refused) == 2 and _option(refused[0]) == _option(refused[1]):
        causes = [exc.message.partition(": ")[2] for exc in refused]
        raise RuleError(f"{_option(refused[0])}: matches no key in A or B (A: {causes[0]}; B: "
                        f"{causes[1]})", a.source.path)


def _refusal(side: Checkpoint, options: NormalizeOptions) -> RuleError | None:
    try:
        check_selection(side, options)
    except RuleError as exc:
        return exc
    return None


def _option(exc: RuleError) -> str:
    """The option a rule's error names first (``--keep zzz*``)."""
    return exc.message.partition(": ")[0]


def compare_sides(side_a: Side, leaves_a: dict[KeyPath, Tree], side_b: Side,
                  leaves_b: dict[KeyPath, Tree], tolerance: Tolerance, raw: bool,
                  progress: Progress = no_progress) -> DiffReport:
    """Leaves matched by path: plain values by value, tensors by shape, dtype and values."""
    shapes: list[ShapeMismatch] = []
    dtypes: list[DtypeMismatch] = []
    leaves: list[LeafMismatch] = []
    pairs: list[tuple[str, TensorLeaf, TensorLeaf]] = []  # to compare by value
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
        if dtype_of(value_a) == dtype_of(value_b) or tolerance.cast:
            pairs.append((key, value_a, value_b))
    advance = progress("diff", sum(nbytes(x) for _, x, _ in pairs))
    deltas = [_in_steps(d, pair) for d, pair in
              ((compare_tensor(*pair, tolerance, advance), pair) for pair in pairs)
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


def from_manifests(side_a: Side, side_b: Side, comparison: ManifestComparison,
                   tolerance: Tolerance) -> DiffReport:
    """The report of two manifests compared (``manifests.compare_manifests``): tensors by
    name, dtype, shape and sha256 (their values are not at hand)."""
    shapes, dtypes, hashes = [], [], []
    for x, y in comparison.changed:
        if x.shape != y.shape:
            shapes.append(ShapeMismatch(x.name, x.shape, y.shape, x.dtype, y.dtype))
        elif x.dtype != y.dtype:
            dtypes.append(DtypeMismatch(x.name, x.shape, x.dtype, y.dtype))
        else:
            hashes.append(HashMismatch(x.name, x.sha256, y.sha256))
    return DiffReport(
        a=side_a, b=side_b, tolerance=tolerance, raw=False,
        tensors_compared=comparison.compared, only_in_a=comparison.missing,
        only_in_b=comparison.unexpected, tied_only_in_a=comparison.tied_missing,
        tied_only_in_b=comparison.tied_unexpected, shape_mismatches=tuple(shapes),
        dtype_mismatches=tuple(dtypes), hash_mismatches=tuple(hashes))


def _in_steps(delta: TensorDelta, pair: tuple[str, TensorLeaf, TensorLeaf]) -> TensorDelta:
    """A dequantized weight's delta, with its error in quantization steps."""
    from ..rules.quantized import quantization_steps

    steps = quantization_steps(pair[1], pair[2])
    return delta if steps is None else replace(delta, max_steps=steps)


def _one_side(mine: dict[KeyPath, Tree], theirs: dict[KeyPath, Tree]
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


def _leaves(tree: Tree, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Tree]]:
    """Every leaf (tensor or plain value) with its path; empty containers are leaves."""
    entries = None if is_tensor(tree) else children(tree)
    if entries:
        for key, value in entries:
            yield from _leaves(value, (*prefix, key))
    else:
        yield prefix, tree


def _same_leaf(a: Tree, b: Tree) -> bool:
    """Plain values by type and value (NaN equals NaN); any two empty dicts are equal."""
    if is_tensor(a) or is_tensor(b):
        return False
    return (isinstance(a, dict) and isinstance(b, dict)) or leaf_equal(a, b)


def _describe(value: Tree) -> str:
    if is_tensor(value):
        return f"tensor {_dtype(value)}{list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _dtype(tensor: TensorLeaf) -> str:
    return dtype_of(tensor).name


