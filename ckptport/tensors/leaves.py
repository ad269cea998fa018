"""What a tensor leaf is, and what it is asked without reading its bytes.

The leaf kinds (``TensorInfo`` over a ``Blob``, the deferred ``Pending`` and
``Computed``) and the questions every layer asks of any tensor leaf, torch
tensors included: which storage and view it is (ties), its size in bytes,
whether it is compact, where it was saved. Nothing here reads a tensor's
elements; ``tensors.data`` does, so the leaf types stay free of torch and numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..dtypes import DType, dtype_of
from ..errors import InputError
from ..sealed import sealed
from ..tree import KeyPath, Leaf, TensorLeaf, Tree, iter_tensors

if TYPE_CHECKING:
    import torch

    from ..sources import SourceFile

__all__ = ["Blob", "StorageInfo", "TensorInfo", "Pending", "Computed", "ViewKey", "view_key",
           "group_by_storage", "storage_key", "storage_nbytes", "nbytes", "is_compact", "location",
           "contiguous_strides", "human_bytes", "extent"]


@sealed
@dataclass(frozen=True, eq=False, slots=True)
class Blob:
    """Where a storage's bytes are: ``size`` bytes at ``offset`` of a file, or in memory."""

    file: SourceFile | None
    offset: int
    size: int
    data: bytes | None = None
    name: str = ""
    member: str | None = None  # the zip member the bytes are, for an independent re-read

    def read(self, start: int, n: int) -> bytes:
        self._check(start, n)
        if self.data is not None:
            return self.data[start:start + n]
        assert self.file is not None
        return self.file.read(self.offset + start, n)

    def read_into(self, start: int, buffer: memoryview) -> None:
        self._check(start, len(buffer))
        assert self.file is not None
        self.file.read_into(self.offset + start, buffer)

    def _check(self, start: int, n: int) -> None:
        if start < 0 or start + n > self.size:
            raise InputError(f"{self.name or 'a storage'}: bytes {start}..{start + n} lie "
                             f"outside its {self.size} bytes")

    @classmethod
    def of_bytes(cls, data: bytes, name: str = "") -> Blob:
        return cls(None, 0, len(data), bytes(data), name)


@sealed
@dataclass(frozen=True, eq=False, slots=True)
class StorageInfo:
    """A storage described, not loaded: its bytes, dtype, recorded device and record key.

    Answers the few questions reports ask of a torch storage (``nbytes()``,
    ``size()`` in elements, ``element_size()``, ``data_ptr()`` as an
    identity), so report code reads described and loaded trees alike.
    ``big_endian`` marks storages of files written on big-endian machines.
    """

    key: str
    location: str
    dtype: DType
    declared_bytes: int
    blob: Blob
    big_endian: bool = False

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self.declared_bytes

    def size(self) -> int:
        return self.declared_bytes // self.itemsize if self.itemsize else 0

    def element_size(self) -> int:
        return self.itemsize

    def data_ptr(self) -> int:
        return id(self)  # one object per storage record, alive as long as the tree


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


class _TensorLike(Leaf):
    """What both of ckptport's tensor leaves answer from their ``dtype`` and ``shape``."""

    __slots__ = ()
    dtype: DType
    shape: tuple[int, ...]

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_complex(self) -> bool:
        return self.dtype.is_complex


class _Deferred(_TensorLike):
    """What both deferred leaves answer: made contiguous, each its own storage."""

    __slots__ = ()

    def stride(self) -> tuple[int, ...]:
        return contiguous_strides(self.shape)

    def storage_offset(self) -> int:
        return 0

    def is_contiguous(self) -> bool:
        return True


@sealed
@dataclass(frozen=True, eq=False, slots=True)
class TensorInfo(_TensorLike):
    """A tensor described, not loaded: dtype, shape, strides and where its elements are.

    Duck-types what ``inspect``, ``check`` and the rules ask of a tensor;
    the bytes are read through ``chunks`` or ``to_torch``. ``parameter``
    marks an ``nn.Parameter`` in the file.
    """

    dtype: DType
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    storage: StorageInfo
    requires_grad: bool = False
    parameter: bool = False

    def stride(self) -> tuple[int, ...]:
        return self.strides

    def storage_offset(self) -> int:
        return self.offset

    def untyped_storage(self) -> StorageInfo:
        return self.storage

    def is_contiguous(self) -> bool:
        return all(s == c for n, s, c in zip(self.shape, self.strides,
                                             contiguous_strides(self.shape), strict=True)
                   if n > 1)

    @property
    def device(self) -> str:
        return self.storage.location

    def with_location(self, storage: StorageInfo) -> TensorInfo:
        return replace(self, storage=storage)


@sealed
@dataclass(frozen=True, eq=False, slots=True)
class Pending(_Deferred):
    """A tensor made when its bytes are needed: ``source``'s elements, contiguous, as ``dtype``.

    The explicit form of a rule's decision (compact a view, cast a dtype),
    consumed by writers and verification one tensor at a time. ``transform``
    holds what torch applies on load to a tensor saved as a lazy view
    (``"neg"``, ``"conj"``: the bits ``torch.save`` records as tensor metadata).
    """

    source: TensorLeaf
    dtype: DType
    transform: tuple[str, ...] = ()
    shape: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.source.shape))

    @property
    def device(self) -> str:
        return location(self.source)


@sealed
@dataclass(frozen=True, eq=False, slots=True)
class Computed(_Deferred):
    """A tensor made when its bytes are needed: ``compute`` applied to ``inputs``' values.

    What ``--dequantize`` puts where a quantized weight's codes and scales
    were: the inputs stay lazy leaves, so a writer holds one weight at a
    time (``compute`` receives real tensors, in ``inputs``' order).
    ``streamed`` holds the CRC-32 of the bytes the last whole ``chunks``
    stream gave (what a writer wrote): verification compares the bytes read
    back with it instead of computing the value a second time; a leaf never
    streamed whole is computed again from its inputs read afresh.
    """

    dtype: DType
    shape: tuple[int, ...]
    inputs: tuple[TensorLeaf, ...]
    compute: Callable[..., torch.Tensor]
    device: str = "cpu"
    streamed: list[int] = field(default_factory=list, compare=False, repr=False)

    def value(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The computed tensor, from ``inputs``' values as real tensors (``data.to_torch``
        makes them from this leaf's own; verification from the inputs read afresh)."""
        made = self.compute(*inputs)
        if tuple(made.shape) != self.shape or dtype_of(made) != self.dtype:
            raise AssertionError(f"computed {made.dtype}{list(made.shape)}, planned "
                                 f"{self.dtype}{list(self.shape)}")
        return made.contiguous()


ViewKey = tuple[Hashable, ...]


def group_by_storage(tree: Tree, tensors: list[tuple[KeyPath, TensorLeaf]] | None = None
                     ) -> dict[int, list[tuple[KeyPath, TensorLeaf]]]:
    """Tensor leaves grouped by the storage behind them, in tree order (empty ones apart);
    ``tensors`` when the tree's were already collected."""
    groups: dict[int, list[tuple[KeyPath, TensorLeaf]]] = {}
    for path, leaf in iter_tensors(tree) if tensors is None else tensors:
        key = storage_key(leaf)
        groups.setdefault(id(leaf) if key is None else key, []).append((path, leaf))
    return groups


def storage_key(leaf: TensorLeaf) -> int | None:
    """Identity of the storage behind ``leaf``; None for empty storages.

    A ``Pending`` or ``Computed`` leaf is its own storage: tied names share the one object.
    """
    if isinstance(leaf, TensorInfo):
        return id(leaf.storage) if leaf.storage.declared_bytes else None
    if isinstance(leaf, Leaf):  # Pending, Computed
        return id(leaf)
    storage = leaf.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


def view_key(leaf: TensorLeaf) -> ViewKey:
    """Identity of the exact view: two leaves with equal keys are one tensor (tied).

    An empty tensor has no storage to share, so only the very same object
    met twice in the tree is tied, as pickle's memo would make it.
    """
    storage = storage_key(leaf)
    if storage is None:
        return ("object", id(leaf))
    return (storage, int(leaf.storage_offset()), tuple(leaf.shape), tuple(leaf.stride()),
            str(leaf.dtype))


def nbytes(leaf: TensorLeaf) -> int:
    return int(math.prod(leaf.shape)) * dtype_of(leaf).itemsize


def extent(leaf: TensorLeaf) -> int:
    """Elements between the first and one past the last element the view touches."""
    if not math.prod(leaf.shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(leaf.shape, leaf.stride(), strict=True))


def storage_nbytes(leaf: TensorLeaf) -> int:
    """Bytes of the storage behind ``leaf`` (a deferred leaf is its own, compact one)."""
    if isinstance(leaf, TensorInfo):
        return leaf.storage.declared_bytes
    if isinstance(leaf, Leaf):  # Pending, Computed
        return nbytes(leaf)
    return leaf.untyped_storage().nbytes()


def is_compact(leaf: TensorLeaf) -> bool:
    """True when the storage holds exactly this tensor's bytes, in order."""
    if isinstance(leaf, (Pending, Computed)):
        return True
    return (leaf.is_contiguous() and leaf.storage_offset() == 0
            and storage_nbytes(leaf) == nbytes(leaf))


def location(leaf: TensorLeaf) -> str:
    """The device a leaf's storage is recorded on (``cuda:3``), or where a tensor lives."""
    if isinstance(leaf, Leaf):
        return leaf.device
    return str(leaf.device)


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
