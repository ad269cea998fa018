"""Tensor leaves and how their bytes are read: the one place that touches tensor data.

A tree's tensor leaves come in four kinds, and every consumer (writers,
verification, diff, ``check --finite``, the manifest) reads them through
the functions here, never by kind:

- ``TensorInfo``: a tensor the readers described, backed by a ``Blob``
  (a byte range of a source file, or bytes in memory); its bytes are read
  by position when needed, so nothing is loaded up front and a truncated
  source is an error rather than a crash;
- ``Pending``: a tensor computed when its bytes are needed, from another
  leaf: made contiguous and compact, and cast (``--dtype``). Rules return
  these instead of copying, so a cast of a 10 GB checkpoint holds one
  tensor at a time;
- ``Computed``: a tensor made from several leaves by a function (a
  dequantized weight from its codes and scales), one tensor at a time;
- torch tensors (``ckptport.read``, ``--trust``, DCP sources, API callers).

``chunks(leaf)`` yields a leaf's canonical bytes (contiguous, row-major,
little-endian) in bounded pieces; ``to_torch(leaf)`` makes a real tensor.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .dtypes import DType, dtype_of
from .errors import InputError
from .sealed import sealed
from .tree import KeyPath, Leaf, iter_tensors

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .sources import SourceFile

__all__ = ["Blob", "StorageInfo", "TensorInfo", "Pending", "Computed", "ViewKey", "view_key",
           "group_by_storage",
           "storage_key", "nbytes", "is_compact", "location", "chunks", "to_torch",
           "to_numpy", "contiguous_strides", "human_bytes", "CHUNK_BYTES", "extent", "realize",
           "file_range"]

CHUNK_BYTES = 1 << 24  # 16 MiB: what one read, hash or comparison step holds


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

    source: Any
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
    time, and verification computes the value again from the inputs read
    afresh (``compute`` receives real tensors, in ``inputs``' order).
    """

    dtype: DType
    shape: tuple[int, ...]
    inputs: tuple[Any, ...]
    compute: Callable[..., Any]
    device: str = "cpu"

    def value(self, inputs: tuple[Any, ...] | None = None) -> torch.Tensor:
        """The computed tensor, from ``inputs`` (real tensors) or from this leaf's own."""
        made = self.compute(*(tuple(to_torch(i) for i in self.inputs) if inputs is None
                              else inputs))
        if tuple(made.shape) != self.shape or dtype_of(made) != self.dtype:
            raise AssertionError(f"computed {made.dtype}{list(made.shape)}, planned "
                                 f"{self.dtype}{list(self.shape)}")
        return made.contiguous()


ViewKey = tuple[Any, ...]


def group_by_storage(tree: Any, tensors: list[tuple[KeyPath, Any]] | None = None
                     ) -> dict[int, list[tuple[KeyPath, Any]]]:
    """Tensor leaves grouped by the storage behind them, in tree order (empty ones apart);
    ``tensors`` when the tree's were already collected."""
    groups: dict[int, list[tuple[KeyPath, Any]]] = {}
    for path, leaf in iter_tensors(tree) if tensors is None else tensors:
        key = storage_key(leaf)
        groups.setdefault(id(leaf) if key is None else key, []).append((path, leaf))
    return groups


def storage_key(leaf: Any) -> int | None:
    """Identity of the storage behind ``leaf``; None for empty storages.

    A ``Pending`` or ``Computed`` leaf is its own storage: tied names share the one object.
    """
    if isinstance(leaf, (Pending, Computed)):
        return id(leaf)
    if isinstance(leaf, TensorInfo):
        return id(leaf.storage) if leaf.storage.declared_bytes else None
    storage = leaf.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


def view_key(leaf: Any) -> ViewKey:
    """Identity of the exact view: two leaves with equal keys are one tensor (tied).

    An empty tensor has no storage to share, so only the very same object
    met twice in the tree is tied, as pickle's memo would make it.
    """
    storage = storage_key(leaf)
    if storage is None:
        return ("object", id(leaf))
    return (storage, int(leaf.storage_offset()), tuple(leaf.shape), tuple(leaf.stride()),
            str(leaf.dtype))


def nbytes(leaf: Any) -> int:
    return int(math.prod(leaf.shape)) * dtype_of(leaf).itemsize


def extent(leaf: Any) -> int:
    """Elements between the first and one past the last element the view touches."""
    if not math.prod(leaf.shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(leaf.shape, leaf.stride(), strict=True))


def is_compact(leaf: Any) -> bool:
    """True when the storage holds exactly this tensor's bytes, in order."""
    if isinstance(leaf, (Pending, Computed)):
        return True
    return (leaf.is_contiguous() and leaf.storage_offset() == 0
            and leaf.untyped_storage().nbytes() == nbytes(leaf))


def location(leaf: Any) -> str:
    """The device a leaf's storage is recorded on (``cuda:3``), or where a tensor lives."""
    if isinstance(leaf, (TensorInfo, Pending, Computed)):
        return leaf.device
    return str(leaf.device)


# -- bytes ---------------------------------------------------------------------------


def chunks(leaf: Any, size: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """The leaf's canonical bytes (contiguous, row-major, little-endian), piece by piece.

    A piece is valid until the next one is asked for: file-backed streams read
    into one buffer (no allocation per piece); copy a piece to keep it.
    """
    if isinstance(leaf, TensorInfo):
        yield from _info_chunks(leaf, size)
    elif isinstance(leaf, Pending):
        if leaf.dtype == dtype_of(leaf.source) and not leaf.transform:
            yield from chunks(leaf.source, size)
        else:
            yield from _memory_chunks(_as_bytes(to_torch(leaf)), size)
    elif isinstance(leaf, Computed):
        yield from _memory_chunks(_as_bytes(leaf.value()), size)
    else:
        yield from _memory_chunks(_as_bytes(leaf.detach().contiguous()), size)


def file_range(leaf: Any) -> tuple[SourceFile, int, int] | None:
    """Source file, offset and length where ``chunks(leaf)`` lies verbatim, if it does.

    So a writer can copy it file to file inside the kernel: a contiguous,
    little-endian tensor of an open source file (or a ``Pending`` of one that
    neither casts nor transforms). Views needing a gather, casts, big-endian storages and bytes
    held in memory have no such range.
    """
    if isinstance(leaf, Pending):
        unchanged = leaf.dtype == dtype_of(leaf.source) and not leaf.transform
        return file_range(leaf.source) if unchanged else None
    if not isinstance(leaf, TensorInfo) or not leaf.numel() or not leaf.is_contiguous():
        return None
    storage = leaf.storage
    blob = storage.blob
    if storage.big_endian or blob.file is None or blob.data is not None or blob.file.fd < 0:
        return None
    start, total = leaf.offset * leaf.dtype.itemsize, nbytes(leaf)
    blob._check(start, total)
    return blob.file, blob.offset + start, total


def _memory_chunks(data: memoryview, size: int) -> Iterator[memoryview]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def _as_bytes(tensor: torch.Tensor) -> memoryview:
    import torch

    if not tensor.numel():
        return memoryview(b"")
    flat = tensor.reshape(-1).view(torch.uint8)
    if sys.byteorder == "big":  # pragma: no cover - no big-endian machines here
        flat = flat.view(-1, tensor.element_size()).flip(1).reshape(-1)
    return memoryview(flat.numpy()).cast("B")  # type: ignore[arg-type]


def _info_chunks(leaf: TensorInfo, size: int) -> Iterator[memoryview]:
    itemsize = leaf.dtype.itemsize
    count = leaf.numel()
    if not count:
        return
    storage = leaf.storage
    if leaf.is_contiguous():
        start, total = leaf.offset * itemsize, count * itemsize
        step = max(itemsize, size - size % itemsize)
        if storage.big_endian or storage.blob.file is None:
            for at in range(start, start + total, step):
                data = storage.blob.read(at, min(step, start + total - at))
                yield memoryview(_swapped(data, itemsize) if storage.big_endian else data)
            return
        with _buffer(min(step, total)) as buffer:  # one buffer for the whole stream
            for at in range(start, start + total, step):
                piece = buffer[:min(step, start + total - at)]
                storage.blob.read_into(at, piece)
                yield piece
        return
    span = _gathered(leaf)
    yield from _memory_chunks(memoryview(span).cast("B"), size)


_SPARE: list[bytearray] = []  # read buffers of finished streams, reused (no page faults)
_MAX_SPARE = 8


@contextlib.contextmanager
def _buffer(size: int) -> Iterator[memoryview]:
    spare = _SPARE.pop() if _SPARE else bytearray()  # list.pop is atomic: thread-safe
    if len(spare) < size:
        spare = bytearray(size)
    try:
        yield memoryview(spare)[:size]
    finally:
        if len(_SPARE) < _MAX_SPARE:
            _SPARE.append(spare)


def _swapped(data: bytes, itemsize: int) -> bytes:
    import numpy as np

    return np.frombuffer(data, dtype=f">u{itemsize}" if itemsize in (2, 4, 8) else "u1"
                         ).astype(f"<u{itemsize}" if itemsize in (2, 4, 8) else "u1").tobytes()


def _gathered(leaf: TensorInfo) -> bytes:
    """The elements of a strided view, read as one span of its storage and copied in order."""
    import numpy as np

    itemsize = leaf.dtype.itemsize
    first = leaf.offset * itemsize
    raw = leaf.storage.blob.read(first, extent(leaf) * itemsize)
    if leaf.storage.big_endian:
        raw = _swapped(raw, itemsize)
    cell = np.dtype(f"V{itemsize}")
    base = np.frombuffer(raw, dtype=cell)
    view = np.lib.stride_tricks.as_strided(
        base, shape=leaf.shape, strides=tuple(s * itemsize for s in leaf.strides),
        writeable=False)
    return np.ascontiguousarray(view).tobytes()


def to_numpy(leaf: Any) -> np.ndarray[Any, Any]:
    """The leaf as a contiguous numpy array of its dtype's numpy twin (raw bytes if none)."""
    import numpy as np

    data = b"".join(bytes(c) for c in chunks(leaf))
    return np.frombuffer(data, dtype=dtype_of(leaf).to_numpy()).reshape(leaf.shape)


# -- torch ---------------------------------------------------------------------------


def to_torch(leaf: Any, storages: dict[int, Any] | None = None) -> torch.Tensor:
    """A real tensor for ``leaf``: a view of the mapped file for described tensors.

    ``storages`` shares one torch storage per described storage across a
    tree, so views and ties stay what they were in the file.
    """
    if isinstance(leaf, Pending):
        return realize(to_torch(leaf.source, storages).detach(), leaf)
    if isinstance(leaf, Computed):
        return leaf.value()
    if not isinstance(leaf, TensorInfo):
        return leaf
    import torch

    cache = {} if storages is None else storages
    storage = cache.get(id(leaf.storage))
    if storage is None:
        storage = _torch_storage(leaf.storage)
        cache[id(leaf.storage)] = storage
    tensor = torch.empty(0, dtype=leaf.dtype.to_torch())
    if leaf.storage.declared_bytes:
        tensor.set_(storage, leaf.offset, leaf.shape, leaf.strides)
    elif leaf.numel():  # never an uninitialized tensor in place of bytes the file lacks
        raise InputError(f"{leaf.storage.key}: {leaf.numel()} elements over a storage of no "
                         "bytes")
    else:
        tensor = torch.empty(leaf.shape, dtype=leaf.dtype.to_torch())  # no elements
    if leaf.parameter:
        return torch.nn.Parameter(tensor, requires_grad=leaf.requires_grad)
    return tensor.requires_grad_(leaf.requires_grad) if leaf.requires_grad else tensor


def realize(source: torch.Tensor, leaf: Pending) -> torch.Tensor:
    """``leaf``'s value from its source's values: the load-time transform, then the cast."""
    value = source
    for step in leaf.transform:
        value = value.neg() if step == "neg" else value.conj()
    value = value.resolve_conj().resolve_neg().to(leaf.dtype.to_torch())
    return value.contiguous().clone()


def _torch_storage(info: StorageInfo) -> Any:
    import torch

    blob = info.blob
    if blob.file is not None and not info.big_endian:
        whole: Any = blob.file.torch_storage()
        untyped = whole[blob.offset:blob.offset + info.declared_bytes]
    else:
        raw = bytearray(blob.read(0, info.declared_bytes))
        if info.big_endian:
            raw = bytearray(_swapped(bytes(raw), info.itemsize))
        untyped = torch.frombuffer(raw, dtype=torch.uint8).untyped_storage() if raw else \
            torch.UntypedStorage(0)
    return untyped


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
