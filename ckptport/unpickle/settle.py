"""After the pickle has run: check the tree's shape and give it the tree's vocabulary.

A pickle can share one object a billion times over (memo references), nest
deeper than any recursive rule can follow, or build a container that holds
itself. Every command walks the tree, so all three are decided here, once:
sharing is counted as the tree expands (a memo bomb is refused), nesting is
bounded, and cycles are cut at mutable containers (``Backref``).

The same walk turns stand-ins into the tree's vocabulary: stand-in classes
used as values become ``GlobalRef``, numpy records real numpy values (built
from checked parts), ``io.BytesIO`` its bytes. Things ckptport does not
convert are refused here with the key where they sit: a bare storage, a
sparse or quantized tensor, an integer too large to print.

The walk visits every object of files holding millions of them, so it is
written for speed: scalars are passed over inline, paths are kept as a
trail of keys and spelled out only for messages.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..dtypes import DType
from ..tensors import Pending, TensorInfo
from ..tree import (
    Backref,
    GlobalRef,
    Key,
    ObjectRecord,
    RecordKind,
    Tree,
    children,
    format_path,
    is_tensor,
)
from . import names
from .numpy_values import NumpyValue, finalize
from .values import (
    Allowed,
    BytesRecord,
    DefaultDict,
    Device,
    Marker,
    Namespace,
    Recorded,
    Refusal,
    Size,
    StorageRef,
    Unsupported,
)

__all__ = ["Settled", "settle", "MAX_NODES", "MAX_DEPTH", "MAX_INT_BITS"]

MAX_NODES = 10_000_000  # objects shared references may add when the tree is walked as a tree
MAX_DEPTH = 300  # nesting ckptport's recursive rules handle without exhausting the stack
LARGEST_SHOWN = 3  # tensors an error about materialized bytes names
MAX_INT_BITS = 14_000  # about 4,300 decimal digits: Python's own limit for printing an int

_SCALARS = frozenset({str, float, bool, type(None), bytes, bytearray, complex, slice, range})
_INT_LIMIT = 1 << MAX_INT_BITS
_MAPPINGS = frozenset({dict, collections.OrderedDict, DefaultDict, collections.Counter})
_LEAVES = frozenset({TensorInfo, Pending, Size, Device, DType})


@dataclass(frozen=True)
class Settled:
    value: Tree
    unproven: tuple[str, ...]  # unknown names called with no proof they are classes
    calls: tuple[str, ...]  # unknown names called as functions: normalize refuses them
    materialized: int = 0  # bytes the tensors hold once made real (each view on its own)
    largest: tuple[tuple[str, int], ...] = ()  # the biggest tensors (path, bytes), biggest first


def _verdicts(registry: list[Recorded], settled: dict[int, int]
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Decide, per recorded name, whether the file instantiates a class or calls something.

    A name is provably a class when ckptport knows it as one (the standard
    library's data classes), or when the pickle made an instance of it the
    way only classes are made (``NEWOBJ``) before it first called it. Every
    other called name is *unproven*: a third-party callable that full
    unpickling would run (``check`` names it, CKP012). Its records keep the
    call as data (an enum member, a config object) unless the call is handed
    tensors (``typing.OrderedDict([(key, tensor)])``): torch would build the
    value by running it, and ckptport cannot know what that value holds, so
    normalize refuses those. Capitalisation never decides.
    """
    firsts: dict[str, tuple[int | None, int | None]] = {}
    for record in registry:
        made, called = firsts.get(record.name, (None, None))
        if record.called and called is None:
            called = record.order
        elif not record.called and made is None:
            made = record.order
        firsts[record.name] = (made, called)
    unproven = [name for name, (made, called) in firsts.items() if called is not None
                and not (names.known_class(name) or (made is not None and made < called))]
    refused: set[str] = set()
    holds = _tensor_finder()
    for record in registry:
        if record.called and record.name in unproven and id(record) in settled and (
                holds(record.args) or holds(record.kwargs)):
            refused.add(record.name)
    for record in registry:
        if record.called and record.name in refused:
            record.kind = RecordKind.CALL
    calls = [name for name in unproven if name in refused and name not in names.RECOGNIZED_CALLS]
    return tuple(unproven), tuple(calls)


def _tensor_finder() -> Callable[[Tree], bool]:
    """Whether a settled value holds a tensor; each container is searched once per load."""
    known: dict[int, bool] = {}

    def holds(node: Tree) -> bool:
        if type(node) in _SCALARS or type(node) is int:
            return False
        if is_tensor(node):
            return True
        found = known.get(id(node))
        if found is None:
            found = known[id(node)] = any(holds(child) for _, child in children(node) or ())
        return found

    return holds


def _is_scalar(value: object) -> bool:
    return type(value) in _SCALARS or (type(value) is int and -_INT_LIMIT < value < _INT_LIMIT)


def _plain(value: object) -> bool:
    """A value fit to be a dict key or a set item: scalars and (shallow) tuples of them."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is tuple:
            if depth >= MAX_DEPTH:
                raise Refusal(f"a dict key or set item nests deeper than {MAX_DEPTH} levels")
            stack.extend((v, depth + 1) for v in item)
        elif not _is_scalar(item):
            return False
    return True


_CYCLE = object()


class _Settler:
    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}  # id(container) -> its expanded size, once settled
        self.active: dict[int, int] = {}  # id(container) on the current path -> trail length
        self.trail: list[Key] = []  # keys from the root to the node being settled
        self.total = 0  # objects of the tree walked as a tree (shared parts once per use)
        self.shared = 0  # of those, the ones only shared references add (memo references)
        self.replaced: dict[int, Tree] = {}
        self.keep: list[Tree] = []  # replaced originals stay alive: their ids stay unique
        self.materialized = 0
        self.largest: list[tuple[int, str]] = []  # a min-heap of the biggest tensors

    def tensor(self, node: TensorInfo | Pending) -> None:
        """Count what the view materializes: a stride-0 view of a few bytes can claim GiBs."""
        size = math.prod(node.shape) * node.dtype.itemsize
        self.materialized += size
        entry = (size, self.where())
        if len(self.largest) < LARGEST_SHOWN:
            heapq.heappush(self.largest, entry)
        elif size > self.largest[0][0]:
            heapq.heapreplace(self.largest, entry)

    def where(self, extra: Key | None = None) -> str:
        return format_path((*self.trail, extra) if extra is not None else tuple(self.trail))

    # Any: the walker's nodes and items are narrowed by the type() it holds in ``kind``
    # (mypy narrows only isinstance and an inline type() test); a cast() would cost a call
    # per object of files holding millions
    def visit(self, node: Any, depth: int) -> Tree:
        """``node`` settled (a non-scalar); ``_CYCLE`` when it is on the current path."""
        key = id(node)
        size = self.sizes.get(key)
        if size is not None:
            self.total += size
            self.shared += size
            if self.shared > MAX_NODES:
                raise Refusal(f"shared references expand the tree by more than {MAX_NODES} "
                              "objects beyond what the file holds (a memo bomb)")
            return self.replaced.get(key, node)
        if key in self.active:
            return _CYCLE
        if depth > MAX_DEPTH:
            raise Refusal(f"the pickle nests deeper than {MAX_DEPTH} levels")
        start = self.total
        self.active[key] = len(self.trail)
        kind = type(node)
        if kind is list:
            new = self.sequence(node, depth, mutable=True)
        elif kind in _MAPPINGS:
            new = self.mapping(node, depth)
        elif kind is tuple:
            new = self.sequence(node, depth, mutable=False)
        elif kind in _LEAVES:
            new = node
            if kind is TensorInfo or kind is Pending:
                self.tensor(node)
        elif isinstance(node, ObjectRecord):
            new = self.record(node, depth)
        elif kind is set or kind is frozenset:
            if not all(_plain(v) for v in node):
                raise Refusal(f"a set at {self.where()} holds something other than plain "
                              "values")
            self.total += len(node)
            new = node
        elif kind is Namespace:
            new = self.namespace(node, depth)
        else:
            new = self.stand_in(node)
        del self.active[key]
        self.total += 1
        self.sizes[key] = self.total - start
        if new is not node:
            self.replaced[key] = new
            self.keep.append(node)
        return new

    def child(self, value: Any, key: Key, depth: int, mutable: bool) -> Tree:  # Any: visit's
        kind = type(value)
        if kind in _SCALARS:
            self.total += 1
            return value
        if kind is int:
            if -_INT_LIMIT < value < _INT_LIMIT:
                self.total += 1
                return value
            raise Refusal(f"an integer of {value.bit_length()} bits at {self.where(key)}, too "
                          "large to print or convert")
        if (kind is tuple or kind is list or kind is dict) and self.flat(value, kind):
            return value
        self.trail.append(key)
        settled = self.visit(value, depth + 1)
        self.trail.pop()
        if settled is _CYCLE:
            if not mutable:
                raise Refusal(f"a reference cycle through an immutable container at "
                              f"{self.where(key)}")
            return Backref(format_path(tuple(self.trail[:self.active[id(value)]])))
        return settled

    def flat(self, value: Any, kind: type) -> bool:  # Any: as visit's, items narrowed by kind
        """Count a container of scalars (and tuples of scalars) in one pass.

        Most containers of big files are such: vocabularies, tables, the
        attribute dicts of recorded objects. They cannot hold cycles or
        anything to convert, so they skip the bookkeeping of ``visit``.
        """
        scalars, limit = _SCALARS, _INT_LIMIT
        count = len(value)
        for item in (value.values() if kind is dict else value):
            item_kind = type(item)
            if item_kind in scalars or (item_kind is int and -limit < item < limit):
                continue
            if item_kind is not tuple:
                return False
            for inner in item:
                inner_kind = type(inner)
                if not (inner_kind in scalars or (inner_kind is int and -limit < inner < limit)):
                    return False
            count += len(item)
        if kind is dict and not all(type(k) is str for k in value):
            return False
        self.total += count + 1
        return True

    def sequence(self, node: Any, depth: int, mutable: bool) -> Tree:  # Any: as visit's
        scalars, limit = _SCALARS, _INT_LIMIT
        changed: list[tuple[int, Tree]] = []
        plain = 0
        for index, item in enumerate(node):
            kind = type(item)
            if kind in scalars or (kind is int and -limit < item < limit):
                plain += 1
                continue
            settled = self.child(item, index, depth, mutable)
            if settled is not item:
                changed.append((index, settled))
        self.total += plain
        if not changed:
            return node
        if mutable:
            for index, settled in changed:
                node[index] = settled
            return node
        rebuilt = list(node)
        for index, settled in changed:
            rebuilt[index] = settled
        return tuple(rebuilt)

    def mapping(self, node: Any, depth: int) -> Tree:  # Any: as visit's
        scalars, limit = _SCALARS, _INT_LIMIT
        plain = 0
        changed: list[tuple[Key, Tree]] = []
        for key, value in node.items():
            if type(key) is not str and not _plain(key):
                raise Refusal(f"a dict key at {self.where()} is a {type(key).__name__}; "
                              "ckptport keeps keys that are plain values")
            kind = type(value)
            if kind in scalars or (kind is int and -limit < value < limit):
                plain += 1
                continue
            settled = self.child(value, key, depth, True)
            if settled is not value:
                changed.append((key, settled))
        for key, settled in changed:
            node[key] = settled
        self.total += plain
        if type(node) is collections.OrderedDict or type(node) is collections.Counter:
            self.attributes(node, depth)
        return node

    def namespace(self, node: Namespace, depth: int) -> argparse.Namespace:
        """The real ``argparse.Namespace`` for the pickle's read-only stand-in."""
        fields = vars(node)
        if not all(type(name) is str for name in fields):
            raise Refusal(f"an argparse.Namespace at {self.where()} has an attribute name "
                          "that is not a string")
        return argparse.Namespace(**{name: self.child(value, name, depth, True)
                                     for name, value in fields.items()})

    def attributes(self, node: object, depth: int) -> None:
        """A state dict's ``_metadata`` is data; any other attribute is a place to hide it."""
        extra = vars(node)
        unexpected = [k for k in extra if k != "_metadata"
                      or type(node) is not collections.OrderedDict]
        if unexpected:
            raise Refusal(f"a {type(node).__name__} at {self.where()} carries the attribute "
                          f"{unexpected[0]!r}; only a state dict's _metadata is kept")
        if extra:
            extra["_metadata"] = self.child(extra["_metadata"], "_metadata", depth, True)

    def record(self, node: ObjectRecord, depth: int) -> Tree:
        if isinstance(node, BytesRecord):
            return node.value()
        for part in ("args", "kwargs", "state", "items", "listitems"):
            value = getattr(node, part)
            if value is None or (type(value) in (tuple, dict, list) and not value):
                continue
            settled = self.child(value, part, depth, True)
            if settled is not value:
                setattr(node, part, settled)
        return node

    def stand_in(self, node: object) -> Tree:
        if isinstance(node, type) and issubclass(node, Recorded):
            return GlobalRef(node.record_name, node.dangerous)
        if isinstance(node, (Allowed, Marker)):
            return GlobalRef(node.name)
        if isinstance(node, NumpyValue):
            try:
                return finalize(node)
            except (ValueError, TypeError, OverflowError, MemoryError) as exc:
                raise Refusal(f"a numpy value at {self.where()} that numpy itself rejects "
                              f"({str(exc) or type(exc).__name__})") from None
        if isinstance(node, StorageRef):
            raise Refusal(f"a bare storage (not a tensor) at {self.where()}: ckptport converts "
                          "tensors, not storages")
        if isinstance(node, Unsupported):
            raise Refusal(f"{node.kind} at {self.where()}: ckptport converts dense tensors "
                          "only (convert it with .to_dense() / .dequantize() before saving)")
        if isinstance(node, (GlobalRef, Backref)):
            return node
        if isinstance(node, type):
            return GlobalRef(f"{node.__module__}.{node.__qualname__}")
        raise Refusal(f"a {type(node).__name__} at {self.where()}, which ckptport does not "
                      "convert")


def settle(value: Tree, registry: list[Recorded]) -> Settled:
    """The settled tree, and the verdicts on the names it records; ``Refusal`` if not fit."""
    settler = _Settler()
    settled = value if _is_scalar(value) else settler.visit(value, 0)
    unproven, calls = _verdicts(registry, settler.sizes)
    largest = tuple((path, size) for size, path in sorted(settler.largest, reverse=True))
    return Settled(settled, unproven, calls, settler.materialized, largest)
