"""A tensor leaf's elements: its canonical bytes in bounded pieces, or a real tensor.

Every consumer of tensor data (writers, verification, diff, ``check
--finite``, the manifest) reads a leaf through ``chunks`` or ``to_torch``
here, never by kind: a ``TensorInfo`` by position from its ``Blob`` (a
truncated source is an error, not a crash), a deferred leaf by computing it
from its source or inputs, a torch tensor as it is. Apart from
``tensors.leaves`` because this is the half that needs numpy and torch.
"""

from __future__ import annotations

import contextlib
import sys
import zlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

from ..dtypes import dtype_of
from ..errors import InputError
from ..tree import TensorLeaf
from .leaves import Computed, Pending, StorageInfo, TensorInfo, extent, nbytes

if TYPE_CHECKING:
    import numpy as np
    import torch

    from ..sources import SourceFile

__all__ = ["CHUNK_BYTES", "chunks", "file_range", "announce", "to_numpy", "to_torch",
           "realize"]

CHUNK_BYTES = 1 << 24  # 16 MiB: what one read, hash or comparison step holds


def chunks(leaf: TensorLeaf, size: int = CHUNK_BYTES) -> Iterator[memoryview]:
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
        crc = 0
        for piece in _memory_chunks(_as_bytes(_computed(leaf)), size):
            crc = zlib.crc32(piece, crc)
            yield piece
        leaf.streamed[:] = [crc]  # only once the stream is whole
    else:  # ckptport's leaves are the three above
        yield from _memory_chunks(_as_bytes(cast("torch.Tensor", leaf).detach().contiguous()),
                                  size)


def file_range(leaf: TensorLeaf) -> tuple[SourceFile, int, int] | None:
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


def announce(leaves: Iterable[TensorLeaf]) -> None:
    """Tell each source file the byte ranges a writer is about to read, in the order it
    reads them (``SourceFile.expect``): a remote one prefetches those, not the bytes after
    the last read (a shard's tensors lie apart in the source when their order is not the
    file's: a safetensors file sorted by dtype, a set of shards regrouped)."""
    plans: dict[int, tuple[SourceFile, list[tuple[int, int]]]] = {}
    for leaf in leaves:
        for file, start, stop in _read_ranges(leaf):
            plans.setdefault(id(file), (file, []))[1].append((start, stop))
    for file, ranges in plans.values():
        file.expect(ranges)


def _read_ranges(leaf: TensorLeaf) -> Iterator[tuple[SourceFile, int, int]]:
    """Where ``chunks(leaf)`` reads, in order (a contiguous tensor of a file; its inputs)."""
    if isinstance(leaf, Pending):
        yield from _read_ranges(leaf.source)
    elif isinstance(leaf, Computed):
        for source in leaf.inputs:
            yield from _read_ranges(source)
    elif isinstance(leaf, TensorInfo) and leaf.numel() and leaf.is_contiguous():
        blob = leaf.storage.blob
        if blob.file is not None and blob.data is None:
            start = blob.offset + leaf.offset * leaf.dtype.itemsize
            yield blob.file, start, start + nbytes(leaf)


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
    return flat.numpy().data.cast("B")


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


def to_numpy(leaf: TensorLeaf) -> np.ndarray[Any, Any]:  # Any: shape and dtype are the leaf's
    """The leaf as a contiguous numpy array of its dtype's numpy twin (raw bytes if none)."""
    import numpy as np

    data = b"".join(bytes(c) for c in chunks(leaf))
    return np.frombuffer(data, dtype=dtype_of(leaf).to_numpy()).reshape(leaf.shape)


def to_torch(leaf: TensorLeaf, storages: dict[int, torch.UntypedStorage] | None = None
             ) -> torch.Tensor:
    """A real tensor for ``leaf``: a view of the mapped file for described tensors.

    ``storages`` shares one torch storage per described storage across a
    tree, so views and ties stay what they were in the file.
    """
    if isinstance(leaf, Pending):
        return realize(to_torch(leaf.source, storages).detach(), leaf)
    if isinstance(leaf, Computed):
        return _computed(leaf)
    if not isinstance(leaf, TensorInfo):  # ckptport's leaves are the three here
        return cast("torch.Tensor", leaf)
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


def _computed(leaf: Computed) -> torch.Tensor:
    return leaf.value(tuple(to_torch(i) for i in leaf.inputs))


def _torch_storage(info: StorageInfo) -> torch.UntypedStorage:
    import torch

    blob = info.blob
    if blob.file is not None and not info.big_endian:
        whole = cast("torch.UntypedStorage", blob.file.torch_storage())
        piece: torch.UntypedStorage = whole[blob.offset:blob.offset + info.declared_bytes]
        return piece
    raw = bytearray(blob.read(0, info.declared_bytes))
    if info.big_endian:
        raw = bytearray(_swapped(bytes(raw), info.itemsize))
    if not raw:
        return torch.UntypedStorage(0)  # type: ignore[no-untyped-call]
    return torch.frombuffer(raw, dtype=torch.uint8).untyped_storage()


