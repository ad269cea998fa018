"""A survey of a checkpoint read for a report: what ``inspect`` shows and ``check`` gates on.

The checkpoint was read leniently: objects of classes outside the allow-list,
and even globals that would run code, are inert records listed by name, so
the report says exactly what blocks ``torch.load(weights_only=True)``.
Tensors are described, not loaded: no tensor byte is read, and nothing here
imports torch.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..checkpoint import Checkpoint, Format, KeyPath, SourceFacts, format_path, is_tensor
from ..errors import CkptportError
from ..remote.urls import Where
from ..rules.prefixes import DATA_PARALLEL_PREFIX, WRAPPER_NAMES
from ..rules.quantized import quantization_of
from ..rules.select import Select
from ..tensors import (
    Pending,
    ViewKey,
    extent,
    group_by_storage,
    human_bytes,
    nbytes,
    storage_key,
    storage_nbytes,
    view_key,
)
from ..tree import (
    Backref,
    GlobalRef,
    ObjectRecord,
    RecordKind,
    StateDict,
    TensorLeaf,
    Tree,
    children,
    is_state_dict,
    iter_nodes,
    iter_tensors,
    paused_gc,
    type_name,
)
from ..unpickle.snapshots import TORCH_DEFAULT_NAMES
from ..unpickle.values import DefaultDict

__all__ = ["InspectReport", "LayoutNode", "BlockingObject", "StorageBloat", "survey",
           "classify_globals", "wrapper_prefixes", "storage_bloat", "DEFAULT_DEPTH"]

DEFAULT_DEPTH = 2


@dataclass(frozen=True)
class LayoutNode:
    """One entry of the tree: its type in words, and what it holds below."""

    key: str
    kind: str
    summary: str
    tensors: int
    nbytes: int
    children: tuple[LayoutNode, ...] = ()
    hidden: int = 0  # entries not listed: below --depth, or plain data past PLAIN_SHOWN
    container: bool = False


@dataclass(frozen=True)
class BlockingObject:
    """An object ``torch.load(weights_only=True)`` refuses, and the global it needs."""

    key: str  # where the first one sits
    global_name: str
    dangerous: bool = False
    count: int = 1  # objects of this global in the file


@dataclass(frozen=True)
class StorageBloat:
    """A storage larger than the bytes its tensors use (a saved slice drags it along)."""

    key: str
    storage_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class InspectReport:
    path: Where
    format: Format
    size: int
    sha256: str | None
    layout: LayoutNode
    tensors: int
    parameters: int
    weights: str | None  # where the parameters were counted (``--select auto``'s pick)
    bytes_by_dtype: Mapping[str, int]
    storage_locations: Mapping[str, int]
    wrapper_prefixes: Mapping[str, int]
    wrapper_examples: Mapping[str, str]  # prefix -> the first key carrying it
    blocking_objects: tuple[BlockingObject, ...]
    globals: tuple[str, ...]
    globals_beyond_weights_only: tuple[str, ...]
    dangerous_globals: tuple[str, ...]
    shared_storages: tuple[tuple[str, ...], ...]
    storage_bloat: tuple[StorageBloat, ...]
    metadata: Mapping[str, str] = field(default_factory=dict)  # safetensors header, DCP planner
    unproven_callables: tuple[str, ...] = ()  # unknown names the file calls: maybe functions
    spellings: Mapping[str, str] = field(default_factory=dict)  # resolved -> as in the file
    notes: tuple[str, ...] = ()
    # schemes and their weights (``Recognition.describe``), or ``{"error": why}``
    quantization: Mapping[str, object] = field(default_factory=dict)
    tensor_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensor_bytes", sum(self.bytes_by_dtype.values()))


def survey(checkpoint: Checkpoint, *, depth: int = DEFAULT_DEPTH,
           sha256: str | None = None) -> InspectReport:
    """The report of a checkpoint read for a report; ``sha256`` of its files, if computed."""
    source = checkpoint.source
    tree = checkpoint.tree
    weights_path, weights = _weights(checkpoint)
    beyond, dangerous = classify_globals(source)
    with paused_gc():
        walked = _Survey(tree, set(dangerous))
        layout = walked.layout(depth)
    unique = {view_key(t): t for _, t in walked.tensors}
    by_dtype: Counter[str] = Counter()
    for tensor in unique.values():
        by_dtype[str(tensor.dtype).removeprefix("torch.")] += nbytes(tensor)
    prefixes = wrapper_prefixes(tree, walked.state_dicts)
    return InspectReport(
        path=source.path,
        format=source.format,
        size=source.size,
        sha256=sha256,
        layout=layout,
        tensors=len(unique),
        parameters=sum(t.numel() for t in _unique_tensors(weights).values()),
        weights=weights_path,
        bytes_by_dtype=dict(sorted(by_dtype.items())),
        storage_locations=dict(source.storage_locations),
        wrapper_prefixes=prefixes,
        wrapper_examples={p: first_key_with(tree, p, walked.state_dicts) for p in prefixes},
        blocking_objects=tuple(walked.blocking.values()),
        globals=source.globals,
        globals_beyond_weights_only=beyond,
        dangerous_globals=dangerous,
        shared_storages=source.shared_storages,
        storage_bloat=storage_bloat(tree, walked.tensors),
        metadata=dict(source.metadata),
        unproven_callables=tuple(n for n in source.unproven if n not in dangerous),
        spellings=dict(source.spellings),
        notes=source.notes,
        quantization=quantization_of(checkpoint),
    )


def classify_globals(source: SourceFacts) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(globals plain ``torch.load(weights_only=True)`` refuses, those that can run code).

    Names are compared resolved, as the unpickler resolves them: protocol-2
    files name ``int`` as ``__builtin__.long``, which is ``builtins.int``.
    """
    dangerous = tuple(dict.fromkeys(source.refused_globals))
    beyond = tuple(g for g in source.globals
                   if g not in TORCH_DEFAULT_NAMES and g not in dangerous
                   and not _storage_name(g))
    return beyond, dangerous


def _storage_name(name: str) -> bool:
    """torch resolves any ``*Storage`` name itself (its loader's own rule)."""
    from ..dtypes import STORAGE_CLASSES

    attribute = name.rpartition(".")[2]
    return attribute in STORAGE_CLASSES or attribute == "UntypedStorage"


def _weights(checkpoint: Checkpoint) -> tuple[str | None, Tree]:
    try:
        picked, result = Select("auto")(checkpoint)
    except CkptportError:
        return None, checkpoint.tree
    return str(result.details["picked"]), picked.tree


def _unique_tensors(tree: Tree) -> dict[ViewKey, TensorLeaf]:
    """Tensors by view, so a tied weight counts once."""
    return {view_key(t): t for _, t in iter_tensors(tree)}


_PLAIN = frozenset({str, int, float, bool, type(None), bytes, complex})
PLAIN_SHOWN = 20  # plain entries listed per container; every tensor-holding one is listed


class _Survey:
    """One walk over the tree for everything the report needs.

    Files can hold millions of small objects (vocabularies, per-sample
    records), so the tree is walked once: tensors, state dicts and objects
    the weights-only loader refuses are collected on the way, and the
    layout is built afterwards for the levels it shows only.
    """

    def __init__(self, tree: Tree, dangerous: set[str]) -> None:
        self.tree = tree
        self.tensors: list[tuple[KeyPath, TensorLeaf]] = []
        self.state_dicts: list[tuple[KeyPath, StateDict]] = []
        first: dict[str, KeyPath] = {}
        counts: Counter[str] = Counter()
        stack: list[tuple[KeyPath, Tree]] = [((), tree)]
        while stack:  # iter_nodes, but passing over plain values without a visit
            path, node = stack.pop()
            if is_tensor(node):
                self.tensors.append((path, node))
                continue
            name = _needed_global(node)
            if name is not None:
                first.setdefault(name, path)
                counts[name] += 1
            below = children(node)
            if below:
                if isinstance(node, dict) and is_state_dict(node):
                    self.state_dicts.append((path, node))
                stack.extend(((*path, key), child) for key, child in reversed(below)
                             if type(child) not in _PLAIN)
        self.blocking = {name: BlockingObject(format_path(path), name, name in dangerous,
                                              counts[name]) for name, path in first.items()}
        self.totals: dict[KeyPath, tuple[int, int]] = {}  # path -> (tensors, bytes) below it
        for path, tensor in self.tensors:
            size = nbytes(tensor)
            for end in range(len(path) + 1):
                count, total = self.totals.get(path[:end], (0, 0))
                self.totals[path[:end]] = (count + 1, total + size)

    def layout(self, depth: int) -> LayoutNode:
        return self._node((), "<root>", self.tree, depth)

    def _node(self, path: KeyPath, key: str, value: Tree, depth: int) -> LayoutNode:
        count, size = self.totals.get(path, (0, 0))
        entries = None if is_tensor(value) else children(value)
        if entries is None:
            kind, summary = _leaf(value)
            return LayoutNode(key, kind, summary, count, size)
        if isinstance(value, ObjectRecord):
            entries = [(k, v) for k, v in entries if v not in (None, (), {}, [])]
        summary = f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}"
        shown: list[LayoutNode] = []
        if depth > 0 and not count:  # no tensor below: the first entries are all it shows
            shown = [self._node((*path, k), str(k), v, depth - 1)
                     for k, v in entries[:PLAIN_SHOWN]]
        elif depth > 0:
            plain = 0
            for k, v in entries:
                below = (*path, k)
                if below not in self.totals:
                    plain += 1
                    if plain > PLAIN_SHOWN:
                        continue
                shown.append(self._node(below, str(k), v, depth - 1))
        return LayoutNode(key, _kind(value), summary, count, size, tuple(shown),
                          len(entries) - len(shown), container=True)


def _kind(value: Tree) -> str:
    if isinstance(value, ObjectRecord):
        return value.name if value.kind is RecordKind.INSTANCE else f"call {value.name}"
    return type_name(value)


def _leaf(value: Tree) -> tuple[str, str]:
    if is_tensor(value):
        dtype = str(value.dtype).removeprefix("torch.")
        shape = ", ".join(map(str, value.shape))
        return "tensor", f"{dtype}[{shape}] {human_bytes(nbytes(value))}"
    if isinstance(value, GlobalRef):
        return "global", value.name
    if isinstance(value, Backref):
        return "reference", f"back to {value.target}"
    text = _short_repr(value)
    return _kind(value), text if len(text) <= 60 else text[:57] + "..."


def _short_repr(value: Tree) -> str:
    try:
        return repr(value)
    except ValueError:  # an int too long to print
        return f"<{type_name(value)}>"


def wrapper_prefixes(tree: Tree, state_dicts: list[tuple[KeyPath, StateDict]] | None = None
                     ) -> dict[str, int]:
    """Wrapper prefixes (``module.``, ``_orig_mod.`` …) in state-dict keys, with counts."""
    found: Counter[str] = Counter()
    for _, state in _state_dicts(tree) if state_dicts is None else state_dicts:
        for key in state:
            found.update({f"{p}." for p in key.split(".") if p in WRAPPER_NAMES})
            if key.startswith(DATA_PARALLEL_PREFIX):
                found[DATA_PARALLEL_PREFIX] += 1
    return dict(sorted(found.items()))


def first_key_with(tree: Tree, prefix: str,
                   state_dicts: list[tuple[KeyPath, StateDict]] | None = None) -> str:
    """The first state-dict key carrying a wrapper prefix, to point a finding at."""
    found = _state_dicts(tree) if state_dicts is None else state_dicts
    return next(format_path((*path, key)) for path, state in found
                for key in state if key.startswith(prefix) or f".{prefix}" in f".{key}")


def _state_dicts(tree: Tree) -> list[tuple[KeyPath, StateDict]]:
    return [(path, node) for path, node in iter_nodes(tree)
            if is_state_dict(node)]


_BLOCKING_TYPES = {argparse.Namespace: "argparse.Namespace", DefaultDict: "collections.defaultdict",
                   frozenset: "builtins.frozenset", slice: "builtins.slice",
                   range: "builtins.range"}


def _needed_global(value: Tree) -> str | None:
    if isinstance(value, (ObjectRecord, GlobalRef)):
        return value.name
    if type(value) in _BLOCKING_TYPES:
        return _BLOCKING_TYPES[type(value)]
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        return f"{module}.{type(value).__qualname__}"
    return None


def storage_bloat(tree: Tree, tensors: list[tuple[KeyPath, TensorLeaf]] | None = None
                  ) -> tuple[StorageBloat, ...]:
    """Storages holding more bytes than the union of their views uses."""
    bloated = []
    for members in group_by_storage(tree, tensors).values():
        first_path, first = members[0]
        if storage_key(first) is None or isinstance(first, Pending):
            continue
        spans = []
        for _, tensor in members:
            start = int(tensor.storage_offset()) * tensor.element_size()
            spans.append((start, start + extent(tensor) * tensor.element_size()))
        used, end = 0, 0
        for start, stop in sorted(spans):
            used += max(0, stop - max(start, end))
            end = max(end, stop)
        total = storage_nbytes(first)
        if total > used:
            bloated.append(StorageBloat(format_path(first_path), total, used))
    return tuple(bloated)
