"""``ckptport inspect``: what is in a checkpoint, without running or reading it.

The file is read for a report (``lenient``): objects of classes outside the
allow-list, and even globals that would run code, are kept as inert records
and listed by name, so the report says exactly what blocks
``torch.load(weights_only=True)``. Tensors stay lazy: shapes, dtypes and
storages come from the pickle, and no tensor byte is read unless ``--hash``
asks for the file's sha256.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint, Format, KeyPath, SourceFacts, format_path, is_tensor
from .errors import InputError, SelectionError
from .readers import allowlist, read, resolve
from .readers.restricted import Backref, GlobalRef, ObjectRecord
from .rules.prefixes import DATA_PARALLEL_PREFIX, WRAPPER_NAMES
from .rules.select import Select, is_state_dict

__all__ = ["InspectReport", "LayoutNode", "BlockingObject", "StorageBloat", "inspect",
           "read_for_report", "describe_for_report", "DEFAULT_DEPTH"]

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
    hidden: int = 0  # entries below --depth, not listed
    container: bool = False


@dataclass(frozen=True)
class BlockingObject:
    """An object ``torch.load(weights_only=True)`` refuses, and the global it needs."""

    key: str
    global_name: str
    dangerous: bool = False


@dataclass(frozen=True)
class StorageBloat:
    """A storage larger than the bytes its tensors use (a saved slice drags it along)."""

    key: str
    storage_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class InspectReport:
    path: Path
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
    tensor_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensor_bytes", sum(self.bytes_by_dtype.values()))


def read_for_report(path: str | os.PathLike[str]) -> Checkpoint:
    """Read any checkpoint for a report: pickled files leniently, nothing run either way."""
    source, _ = resolve(path)
    if source.is_file() and not source.name.endswith(".index.json"):
        from .readers.sniff import sniff

        fmt = sniff(source)
        if fmt is not Format.SAFETENSORS:
            from .readers.torch_pickle import read_torch

            try:
                return read_torch(source, fmt, lenient=True)
            except RecursionError:
                raise InputError("pickle nests too deeply to read", source) from None
    return read(path)


def describe_for_report(path: str | os.PathLike[str]) -> Checkpoint:
    """What a report needs, without torch where possible (``readers.describe``).

    Tensor leaves are ``TensorInfo`` descriptions; where the torch-free
    reader cannot vouch for an exact description, the file is read by
    ``read_for_report`` instead (real, lazy tensors). Reports are the same
    either way.
    """
    from .readers.describe import NotDescribable, describe

    try:
        return describe(path)
    except NotDescribable:
        return read_for_report(path)


def inspect(path: str | os.PathLike[str] | Checkpoint, *, depth: int = DEFAULT_DEPTH,
            with_hash: bool = False) -> InspectReport:
    """Describe a checkpoint (a path or an already read ``Checkpoint``)."""
    checkpoint = path if isinstance(path, Checkpoint) else describe_for_report(path)
    source = checkpoint.source
    tree = checkpoint.tree
    sha256 = None
    if with_hash:  # the same digest normalize records as ckptport.source_sha256
        from .convert import sha256_files

        sha256 = sha256_files(source.files)
    weights_path, weights = _weights(checkpoint)
    unique = _unique_tensors(tree)
    by_dtype: Counter[str] = Counter()
    for tensor in unique.values():
        by_dtype[str(tensor.dtype).removeprefix("torch.")] += _nbytes(tensor)
    beyond, dangerous = classify_globals(source)
    prefixes = wrapper_prefixes(tree)
    return InspectReport(
        path=source.path,
        format=source.format,
        size=source.size,
        sha256=sha256,
        layout=_layout("<root>", tree, depth),
        tensors=sum(1 for _ in checkpoint.tensors()),
        parameters=sum(t.numel() for t in _unique_tensors(weights).values()),
        weights=weights_path,
        bytes_by_dtype=dict(sorted(by_dtype.items())),
        storage_locations=dict(source.storage_locations),
        wrapper_prefixes=prefixes,
        wrapper_examples={p: first_key_with(tree, p) for p in prefixes},
        blocking_objects=tuple(blocking_objects(tree, set(dangerous))),
        globals=source.globals,
        globals_beyond_weights_only=beyond,
        dangerous_globals=dangerous,
        shared_storages=source.shared_storages,
        storage_bloat=storage_bloat(tree),
        metadata=dict(source.metadata),
    )


def classify_globals(source: SourceFacts) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(globals plain ``torch.load(weights_only=True)`` refuses, those that can run code)."""
    from .readers.describe import TORCH_DEFAULT_NAMES, is_allowed

    allowed = TORCH_DEFAULT_NAMES  # torch's own list, as a snapshot: no torch import
    dangerous = tuple(dict.fromkeys([*source.refused_globals, *(
        g for g in source.globals if allowlist.is_dangerous(g) and not is_allowed(g))]))
    beyond = tuple(g for g in source.globals if g not in allowed and g not in dangerous)
    return beyond, dangerous


def _weights(checkpoint: Checkpoint) -> tuple[str | None, Any]:
    try:
        picked, result = Select("auto")(checkpoint)
    except SelectionError:
        return None, checkpoint.tree
    return str(result.details["picked"]), picked.tree


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())


def _unique_tensors(tree: Any) -> dict[Any, Any]:
    """Tensors by view, so a tied weight counts once."""
    from .checkpoint import iter_tensors
    from .tensorops import view_key

    return {view_key(t) or (id(t),): t for _, t in iter_tensors(tree)}


def _layout(key: str, value: Any, depth: int) -> LayoutNode:
    entries = _entries(value)
    if entries is None:
        kind, summary = _leaf(value)
        nbytes = _nbytes(value) if is_tensor(value) else 0
        return LayoutNode(key, kind, summary, int(is_tensor(value)), nbytes)
    children = [_layout(str(k), v, depth - 1) for k, v in entries]
    tensors = sum(c.tensors for c in children)
    nbytes = sum(c.nbytes for c in children)
    summary = f"{len(entries)} {'entry' if len(entries) == 1 else 'entries'}"
    shown = tuple(children) if depth > 0 else ()
    return LayoutNode(key, _kind(value), summary, tensors, nbytes, shown,
                      len(children) - len(shown), container=True)


def _entries(value: Any) -> list[tuple[Any, Any]] | None:
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    if isinstance(value, ObjectRecord):
        return [(k, v) for k, v in _record_parts(value) if v not in (None, (), {}, [])]
    if isinstance(value, argparse.Namespace):
        return list(vars(value).items())
    return None


def _record_parts(record: ObjectRecord) -> list[tuple[str, Any]]:
    state = record.state
    parts = [("args", record.args), ("kwargs", record.kwargs), ("items", record.items),
             ("list", record.listitems)]
    if isinstance(state, dict) and all(isinstance(k, str) for k in state):
        return parts + list(state.items())
    return [*parts, ("state", state)]


def _kind(value: Any) -> str:
    if isinstance(value, ObjectRecord):
        return value.name if value.kind == "instance" else f"call {value.name}"
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _leaf(value: Any) -> tuple[str, str]:
    if is_tensor(value):
        from .tensorops import human_bytes

        dtype = str(value.dtype).removeprefix("torch.")
        shape = ", ".join(map(str, value.shape))
        return "tensor", f"{dtype}[{shape}] {human_bytes(_nbytes(value))}"
    if isinstance(value, GlobalRef):
        return "global", value.name
    if isinstance(value, Backref):
        return "reference", f"back to {value.target}"
    text = repr(value)
    return _kind(value), text if len(text) <= 60 else text[:57] + "..."


def wrapper_prefixes(tree: Any) -> dict[str, int]:
    """Wrapper prefixes (``module.``, ``_orig_mod.`` …) in state-dict keys, with counts."""
    found: Counter[str] = Counter()
    for _, state in _state_dicts(tree):
        for key in state:
            found.update({f"{p}." for p in key.split(".") if p in WRAPPER_NAMES})
            if key.startswith(DATA_PARALLEL_PREFIX):
                found[DATA_PARALLEL_PREFIX] += 1
    return dict(sorted(found.items()))


def first_key_with(tree: Any, prefix: str) -> str:
    """The first state-dict key carrying a wrapper prefix, to point a finding at."""
    return next(format_path((*path, key)) for path, state in _state_dicts(tree)
                for key in state if key.startswith(prefix) or f".{prefix}" in f".{key}")


def _state_dicts(tree: Any, path: KeyPath = ()) -> list[tuple[KeyPath, Mapping[str, Any]]]:
    if is_state_dict(tree):
        return [(path, tree)]
    found = []
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            found += _state_dicts(value, (*path, key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            found += _state_dicts(value, (*path, index))
    return found


def blocking_objects(tree: Any, dangerous: set[str], path: KeyPath = ()) -> list[BlockingObject]:
    """Every object the plain weights-only reader refuses, with where it sits."""
    found = []
    name = _needed_global(tree)
    if name is not None:
        found.append(BlockingObject(format_path(path), name, name in dangerous))
    for key, value in _entries(tree) or ():
        found += blocking_objects(value, dangerous, (*path, key))
    return found


def _needed_global(value: Any) -> str | None:
    if isinstance(value, (ObjectRecord, GlobalRef)):
        return value.name
    if isinstance(value, argparse.Namespace):
        return "argparse.Namespace"
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        return f"{module}.{type(value).__qualname__}"
    return None


def storage_bloat(tree: Any) -> tuple[StorageBloat, ...]:
    """Storages holding more bytes than the union of their views uses."""
    from .checkpoint import iter_tensors
    from .tensorops import storage_key

    spans: dict[int, list[tuple[int, int]]] = {}
    first: dict[int, tuple[str, int]] = {}
    for key_path, tensor in iter_tensors(tree):
        storage = storage_key(tensor)
        if storage is None:
            continue
        start = int(tensor.storage_offset()) * tensor.element_size()
        extent = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
        stop = start + int(extent if tensor.numel() else 0) * tensor.element_size()
        spans.setdefault(storage, []).append((start, stop))
        first.setdefault(storage, (format_path(key_path), tensor.untyped_storage().nbytes()))
    bloated = []
    for storage, ranges in spans.items():
        used, end = 0, 0
        for start, stop in sorted(ranges):
            used += max(0, stop - max(start, end))
            end = max(end, stop)
        key, total = first[storage]
        if total > used:
            bloated.append(StorageBloat(key, total, used))
    return tuple(bloated)
