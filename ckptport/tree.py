"""The vocabulary of a checkpoint tree, shared by every layer: the bottom module.

A checkpoint is a tree of plain data (dict, list, tuple, str, int, float,
bool, None, bytes) whose leaves may be tensors. Readers add three kinds of
record for what a pickle names but ckptport never builds: ``ObjectRecord``
(an instance of a class outside the allow-list, or a call ckptport did not
make), ``GlobalRef`` (a global used as a value) and ``Backref`` (where a
reference cycle was cut). Rules, writers, reports and diff walk the tree
with the helpers here, so every layer agrees on what the tree holds: a
tensor inside a recorded object is a tensor for every command.

The ``ckptport.*`` metadata keys that ckptport writes into safetensors
headers are defined here too, once.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import gc
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, TypeGuard, TypeVar, cast, overload

if TYPE_CHECKING:
    import torch

__all__ = [
    "Tree", "Key", "TensorLeaf", "StateDict", "KeyPath", "format_path", "Leaf", "is_tensor",
    "ObjectRecord", "RecordKind", "TextEnum", "GlobalRef", "Backref",
    "record_parts", "children", "iter_tensors", "iter_nodes", "map_tree", "rebuild_dict",
    "is_state_dict", "KEY_VERSION", "KEY_TREE", "KEY_ALIASES", "KEY_SOURCE_SHA256",
    "KEY_RULES", "KEY_PREFIX", "type_name", "state_dicts", "replace_state_dicts", "SCALARS",
]

Tree: TypeAlias = object
"""A checkpoint tree, or any node of one: a container (dict and its kinds, list, tuple, an
``argparse.Namespace``, an ``ObjectRecord``), a scalar (``SCALARS``), a tensor leaf
(``TensorLeaf``), a ``GlobalRef`` or ``Backref``, or another value of the allow-list (a numpy
array, ``torch.Size``, a dtype). Spelled ``object``, not ``Any``: what a pickle holds is not
known until it is looked at, so every walker narrows (``children``, ``is_tensor``) before it
uses a node, and mypy holds it to that."""

Key: TypeAlias = Hashable
"""A key of a tree's container: a dict key (str, int, or any hashable a pickle used), a list
index, a record part's name."""

KeyPath = tuple[Key, ...]

TensorLeaf: TypeAlias = "Leaf | torch.Tensor"
"""A tensor as a tree holds it: ckptport's own leaf (described, file-backed, deferred) or a
torch tensor."""

StateDict: TypeAlias = Mapping[str, Tree]
"""A module's state: names to tensors (and the odd plain leaf), as ``load_state_dict`` takes."""

# the metadata keys ckptport writes (safetensors __metadata__, shard indexes) start with this
# prefix: ckptport writes them itself and never carries a source's
KEY_PREFIX = "ckptport."
KEY_VERSION = f"{KEY_PREFIX}version"
KEY_TREE = f"{KEY_PREFIX}tree"
KEY_ALIASES = f"{KEY_PREFIX}aliases"
KEY_SOURCE_SHA256 = f"{KEY_PREFIX}source_sha256"
KEY_RULES = f"{KEY_PREFIX}rules"


def format_path(path: KeyPath) -> str:
    """A path as users write it for ``--select``: keys joined with dots."""
    return ".".join(str(part) for part in path) if path else "<root>"


class Leaf:
    """Base of ckptport's own tensor leaves (described, file-backed, deferred).

    Subclasses answer what reports and rules ask of a tensor, as a torch
    tensor answers it, so code given a ``TensorLeaf`` asks either alike;
    ``ckptport.tensors`` reads their bytes.
    """

    __slots__ = ()

    if TYPE_CHECKING:  # what every subclass answers (``tensors.leaves._TensorLike``)
        dtype: object  # a ``dtypes.DType`` (that layer sits above); ``dtypes.dtype_of`` reads it
        shape: tuple[int, ...]

        @property
        def device(self) -> str: ...  # where it was saved (``cuda:3``), as the file records

        def numel(self) -> int: ...

        def element_size(self) -> int: ...

        def stride(self) -> tuple[int, ...]: ...

        def storage_offset(self) -> int: ...

        def is_contiguous(self) -> bool: ...

        def is_floating_point(self) -> bool: ...


def is_tensor(value: object) -> TypeGuard[TensorLeaf]:
    """True for ckptport's leaves and torch tensors, never importing torch."""
    if isinstance(value, Leaf):
        return True
    if not type(value).__module__.startswith("torch"):
        return False
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


@dataclass(frozen=True)
class GlobalRef:
    """A global the pickle uses as a value (``typing.Any``); it was never imported."""

    name: str
    dangerous: bool = False


class TextEnum(str, enum.Enum):
    """An enum whose members print and compare as their text: reports and JSON show the
    value (``error``), never the member's name."""

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


class RecordKind(TextEnum):
    """How the file made an object: as classes are made, or by calling something."""

    INSTANCE = "instance"
    CALL = "call"


@dataclass(eq=False)
class ObjectRecord:
    """An instance of a class outside the allow-list, or a call ckptport did not make.

    ``kind`` is ``instance`` (built the way classes are: ``NEWOBJ``, or a
    class called with arguments) or ``call`` (a function the file calls).
    ``args``/``kwargs`` are what it was created with; ``state`` what
    ``BUILD`` set; ``items``/``listitems`` what ``SETITEMS``/``APPENDS``
    added. Nothing of it was ever run; it is the file's data, by name.
    """

    name: str
    kind: RecordKind = RecordKind.INSTANCE
    args: tuple[Tree, ...] = ()
    kwargs: dict[str, Tree] = field(default_factory=dict)
    state: Tree = None
    items: dict[Key, Tree] = field(default_factory=dict)
    listitems: list[Tree] = field(default_factory=list)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Backref:
    """Where a reference cycle (``child._parent`` back to its parent) was cut."""

    target: str


def type_name(value: Tree) -> str:
    """A value's type as reports name it: the recorded class for records, never "ObjectRecord";
    ``torch.Tensor`` for a tensor however ckptport holds it (what loading the output gives,
    never an internal name like ``ckptport.tensors.TensorInfo``)."""
    if isinstance(value, Leaf):
        return "torch.Tensor"
    if isinstance(value, ObjectRecord):
        return value.name
    if isinstance(value, GlobalRef):
        return f"global {value.name}"
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def record_parts(record: ObjectRecord) -> list[tuple[str, Tree]]:
    """A record's data as named entries, the way ``inspect`` shows and ``--select`` walks it.

    The usual ``__dict__`` state is spread into attribute names
    (``model._modules.lstm``); other parts keep their own names.
    """
    parts: list[tuple[str, Tree]] = [(name, value) for name, value in (
        ("args", record.args), ("kwargs", record.kwargs), ("items", record.items),
        ("list", record.listitems)) if value]
    state = record.state
    if isinstance(state, dict) and all(isinstance(k, str) for k in state):
        return parts + [(k, v) for k, v in state.items() if k not in dict(parts)]
    if state is not None:
        parts.append(("state", state))
    return parts


SCALARS = frozenset({str, int, float, bool, type(None), bytes, complex})  # leaves, not nodes


def children(node: Tree) -> list[tuple[Key, Tree]] | None:
    """(key, child) pairs of a container, or None for a leaf.

    Dicts by key, lists and tuples by index, records by part, namespaces by
    attribute. Sets hold only hashable leaves, so nothing is below them.
    """
    kind = type(node)
    if kind is dict or kind is OrderedDict:  # the common cases first: files hold millions
        return list(cast("dict[Key, Tree]", node).items())
    if kind is list or kind is tuple:
        return list(enumerate(cast("list[Tree]", node)))
    if kind in SCALARS:
        return None
    if isinstance(node, ObjectRecord):
        parts: list[tuple[Key, Tree]] = list(record_parts(node))
        return parts
    if isinstance(node, Mapping):
        return list(node.items())
    if isinstance(node, (list, tuple)):
        return list(enumerate(node))
    if isinstance(node, argparse.Namespace):
        return list(vars(node).items())
    return None


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection while a big tree is walked or built.

    Each collection traverses every live container, and a checkpoint can
    hold millions: the collector's passes then cost more than the walk.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def iter_nodes(tree: Tree, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Tree]]:
    """Every node (containers first, then what they hold) with its path, in tree order."""
    stack: list[tuple[KeyPath, Tree]] = [(prefix, tree)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if type(node) in SCALARS:
            continue
        below = children(node)
        if below:
            stack.extend(((*path, key), child) for key, child in reversed(below))


def iter_tensors(tree: Tree, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, TensorLeaf]]:
    """Every tensor leaf with its path, in the tree's own order, inside records too."""
    stack: list[tuple[KeyPath, Tree]] = [(prefix, tree)]
    while stack:
        path, node = stack.pop()
        kind = type(node)
        if kind in SCALARS:
            continue
        if is_tensor(node):
            yield path, node
            continue
        below = children(node)
        if below:
            stack.extend(((*path, key), child) for key, child in reversed(below)
                         if type(child) not in SCALARS)


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")
_W = TypeVar("_W")


@overload
def rebuild_dict(original: OrderedDict[_K, _W], items: Iterable[tuple[_K, _V]]
                 ) -> OrderedDict[_K, _V]: ...


@overload
def rebuild_dict(original: Mapping[_K, object], items: Iterable[tuple[_K, _V]]
                 ) -> dict[_K, _V]: ...


def rebuild_dict(original: Mapping[_K, object], items: Iterable[tuple[_K, _V]]) -> dict[_K, _V]:
    """A dict of the same kind as ``original`` holding ``items``.

    A state dict is an ``OrderedDict`` carrying ``_metadata`` (module
    versions BatchNorm and others read on load); rebuilding must keep both.
    """
    if isinstance(original, OrderedDict):
        rebuilt: dict[_K, _V] = OrderedDict(items)
        metadata = getattr(original, "_metadata", None)
        if metadata is not None:
            rebuilt._metadata = metadata  # type: ignore[attr-defined]
        return rebuilt
    return dict(items)


def map_tree(tree: Tree, leaf: Callable[[KeyPath, Tree], Tree], prefix: KeyPath = ()) -> Tree:
    """Rebuild ``tree`` with ``leaf(path, value)`` applied to every non-container.

    Containers are rebuilt (dict kinds and ``_metadata`` kept; records and
    namespaces copied), so rules never change the reader's tree in place.
    """
    if isinstance(tree, Mapping):
        return rebuild_dict(tree, [(k, map_tree(v, leaf, (*prefix, k))) for k, v in tree.items()])
    if isinstance(tree, list):
        return [map_tree(v, leaf, (*prefix, i)) for i, v in enumerate(tree)]
    if type(tree) is tuple:
        return tuple(map_tree(v, leaf, (*prefix, i)) for i, v in enumerate(tree))
    if isinstance(tree, ObjectRecord):
        return _map_record(tree, leaf, prefix)
    if isinstance(tree, argparse.Namespace):
        return argparse.Namespace(**{k: map_tree(v, leaf, (*prefix, k))
                                     for k, v in vars(tree).items()})
    return leaf(prefix, tree)


def _map_record(record: ObjectRecord, leaf: Callable[[KeyPath, Tree], Tree],
                prefix: KeyPath) -> ObjectRecord:
    spread = isinstance(record.state, dict) and all(isinstance(k, str) for k in record.state)
    state_prefix = prefix if spread else (*prefix, "state")
    return ObjectRecord(
        record.name, record.kind,
        args=cast("tuple[Tree, ...]", map_tree(record.args, leaf, (*prefix, "args"))),
        kwargs=cast("dict[str, Tree]", map_tree(record.kwargs, leaf, (*prefix, "kwargs"))),
        state=map_tree(record.state, leaf, state_prefix),
        items=cast("dict[Key, Tree]", map_tree(record.items, leaf, (*prefix, "items"))),
        listitems=cast("list[Tree]", map_tree(record.listitems, leaf, (*prefix, "list"))),
    )


def is_state_dict(value: Tree) -> TypeGuard[StateDict]:
    """A non-empty mapping of string keys to tensors or plain leaves, holding a tensor."""
    if not isinstance(value, Mapping) or not value:
        return False
    has_tensor = False
    for key, item in value.items():
        if not isinstance(key, str) or isinstance(item, (Mapping, list, tuple, ObjectRecord)):
            return False
        has_tensor = has_tensor or is_tensor(item)
    return has_tensor


def state_dicts(node: Tree, path: KeyPath = ()) -> list[tuple[KeyPath, StateDict]]:
    """Every state dict the key rules act on, through dicts and lists (``--select all`` may
    hold several: a model's and an EMA's)."""
    if is_state_dict(node):
        return [(path, node)]
    found: list[tuple[KeyPath, StateDict]] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            found += state_dicts(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += state_dicts(value, (*path, index))
    return found


def replace_state_dicts(node: Tree, edit: Callable[[KeyPath, StateDict], Tree],
                        path: KeyPath = ()) -> Tree:
    """``node`` rebuilt with ``edit(path, state_dict)`` in place of each of ``state_dicts``."""
    if is_state_dict(node):
        return edit(path, node)
    if isinstance(node, Mapping):
        return rebuild_dict(node, [(k, replace_state_dicts(v, edit, (*path, k)))
                                   for k, v in node.items()])
    if isinstance(node, list):
        return [replace_state_dicts(v, edit, (*path, i)) for i, v in enumerate(node)]
    return node
