"""Write torch ``.pth`` files that load anywhere with ``weights_only=True``, streaming.

The pickle is made first (protocol 2, what ``torch.save`` writes), with every
tensor referring to a storage record by key; then each record's bytes are
produced and streamed into the archive (``torchzip``) one tensor at a time,
piece by piece, so no tensor is ever held whole unless a cast must compute
it. Every tensor gets a record holding exactly its own bytes (a saved slice
does not drag its whole storage along); tensors that are one view of one
storage (tied weights) share a record. The storage location recorded is
``cpu`` or ``--anchor cuda:N`` (no GPU needed). Nothing depends on object
identity or time, so the same tree gives the same bytes. Sparse and
quantized torch tensors (read with ``--trust``) go through torch's own
pickling of their storages.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..dtypes import dtype_of
from ..errors import OutputError
from ..tensors import announce, chunks, contiguous_strides, file_range, nbytes, view_key
from ..tree import Leaf, TensorLeaf, Tree, format_path, is_tensor, iter_tensors, rebuild_dict
from ..treejson import sorted_items
from .staging import preallocate
from .torchzip import ZipWriter

if TYPE_CHECKING:
    import torch

    from ..sources import SourceFile
    from .base import Tap, WriteOptions

__all__ = ["PthFile", "write_pth", "canonical", "PICKLE_PROTOCOL"]

PICKLE_PROTOCOL = 2  # what torch.save writes and torch.load(weights_only=True) reads


class _StorageRef:
    """A storage record in the pickle: ``("storage", type, key, location, numel)``."""

    __slots__ = ("key", "storage_type", "numel")

    def __init__(self, key: str, storage_type: object, numel: int) -> None:
        self.key, self.storage_type, self.numel = key, storage_type, numel


Produce = Callable[[], Iterator[bytes | memoryview]]
Range = tuple["SourceFile", int, int]  # where a record's bytes lie verbatim in a source


class _Pickler(pickle.Pickler):
    """Pickles tensors as references to records; remembers how to produce each record."""

    def __init__(self, file: BinaryIO, location: str, tap: Tap | None = None) -> None:
        super().__init__(file, protocol=PICKLE_PROTOCOL)
        self.location, self.tap = location, tap
        self.records: dict[str, tuple[Produce, int, Range | None]] = {}
        self.leaves: list[TensorLeaf] = []  # each record's, in the records' order
        self._keys: dict[Hashable, str] = {}

    def _key(self, identity: Hashable, produce: Produce, size: int, where: Range | None = None
             ) -> str:
        if identity in self._keys:
            return self._keys[identity]
        key = str(len(self.records))
        self.records[key] = (produce, size, where)
        self._keys[identity] = key
        return key

    # Any: a reduce tuple, or NotImplemented (which mypy reads as Any), as pickle declares it
    def reducer_override(self, obj: object) -> Any:
        import torch

        if not is_tensor(obj):
            return NotImplemented
        if not isinstance(obj, Leaf) and _torch_reduces(obj):
            return NotImplemented  # sparse, quantized, subclasses: torch's own reduction
        dtype = dtype_of(obj)
        real = dtype.to_torch()
        size = nbytes(obj)
        produce = partial(chunks, obj) if self.tap is None else partial(_tapped, self.tap, obj)
        identity = view_key(obj)
        if identity not in self._keys:
            self.leaves.append(obj)
        key = self._key(identity, produce, size, file_range(obj))
        shape = tuple(obj.shape)
        stride = contiguous_strides(shape)
        hooks: OrderedDict[str, object] = OrderedDict()  # backward hooks: never any
        if real in torch.storage._new_dtypes():
            ref = _StorageRef(key, torch.UntypedStorage, size)
            return (torch._utils._rebuild_tensor_v3,
                    (ref, 0, shape, stride, False, hooks, real))
        storage_type = getattr(torch, torch.storage._dtype_to_storage_type_map()[real])
        ref = _StorageRef(key, storage_type, size // max(dtype.itemsize, 1))
        return (torch._utils._rebuild_tensor_v2, (ref, 0, shape, stride, False, hooks))

    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, _StorageRef):
            return ("storage", obj.storage_type, obj.key, self.location, obj.numel)
        import torch

        if isinstance(obj, torch.storage.TypedStorage):  # tensors torch reduces itself
            storage = obj._untyped_storage
            key = self._key(storage._cdata, partial(_storage_bytes, storage), storage.nbytes())
            return ("storage", getattr(torch, obj._pickle_storage_type()),  # type: ignore[no-untyped-call]
                    key, self.location, obj._size())  # type: ignore[no-untyped-call]
        if isinstance(obj, torch.UntypedStorage):
            key = self._key(obj._cdata, partial(_storage_bytes, obj), obj.nbytes())
            return ("storage", torch.UntypedStorage, key, self.location, obj.nbytes())
        return None


def _torch_reduces(tensor: torch.Tensor) -> bool:
    """Whether a torch tensor is one torch must pickle itself (not a plain strided one)."""
    import torch

    return bool(tensor.layout != torch.strided or tensor.is_quantized
                or type(tensor) not in (torch.Tensor, torch.nn.Parameter))


def _storage_bytes(storage: torch.UntypedStorage) -> Iterator[bytes | memoryview]:
    import torch

    if storage.nbytes():
        data = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        yield memoryview(data).cast("B")  # type: ignore[arg-type]


def canonical(value: Tree) -> Tree:
    """``value`` rebuilt so its pickle depends on values, not object identity.

    Pickle writes a back-reference for an object it has seen before: two
    equal strings or dicts pickle differently when they are one object than
    when they are two. Fresh containers and interned strings make the bytes
    the same whichever reader produced the tree (a file, a shard set).
    """
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, Mapping):
        rebuilt = rebuild_dict(value, [(canonical(k), canonical(v)) for k, v in value.items()])
        versions = getattr(value, "_metadata", None)
        if versions is not None:
            rebuilt._metadata = canonical(versions)  # type: ignore[attr-defined]
        return rebuilt
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if type(value) is tuple:
        return tuple(canonical(v) for v in value)
    if type(value) is set:
        return _SortedSet(canonical(v) for v in sorted_items(value))
    return value


class _SortedSet(set[Tree]):
    """A set that pickles its items sorted: the same set gives the same bytes in any process."""

    def __reduce__(self) -> tuple[type[set[Tree]], tuple[list[Tree]]]:
        return (set, (sorted_items(self),))


class PthFile:
    """A torch zip checkpoint; verified by ``torch.load(weights_only=True)``."""

    def write(self, tree: Tree, file: BinaryIO, dst: Path, options: WriteOptions,
              advance: Callable[[int], None]) -> None:
        require_torch_dtypes(tree, dst)
        write_pth(tree, file, options.anchor, advance, options.taps)

    def verify(self, path: Path, tree: Tree, written: None, options: WriteOptions,
               advance: Callable[[int], None]) -> None:
        from .verify import verify_pth

        verify_pth(path, tree, options.anchor, advance, options.jobs, options.streamed)


def require_torch_dtypes(tree: Tree, dst: Path) -> None:
    """Refuse, before anything is written, a tensor whose dtype torch does not have (FP6)."""
    for path, tensor in iter_tensors(tree):
        dtype = dtype_of(tensor)
        if not dtype.in_torch:
            raise OutputError(f"tensor {format_path(path)!r} is {dtype.safetensors}, which torch "
                              "has no dtype for (torch 2.13 has no float6); write .safetensors",
                              dst)


def _tapped(tap: Tap, leaf: TensorLeaf) -> Iterator[bytes | memoryview]:
    return iter(tap(leaf, chunks(leaf)))


def write_pth(tree: Tree, file: BinaryIO, anchor: str, advance: Callable[[int], None],
              tap: Tap | None = None) -> None:
    """Write ``tree`` as a torch zip checkpoint, one storage record at a time; ``tap`` sees
    each tensor's pieces as they are written."""
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, anchor, tap)
    pickler.dump(canonical(tree))
    pickled = buffer.getvalue()
    archive = ZipWriter(file)
    reserved = preallocate(file, archive.bound([len(pickled)]
                                               + [n for _, n, _ in pickler.records.values()]))
    archive.record("data.pkl", [pickled])
    archive.record(".format_version", [b"1"])
    archive.record(".storage_alignment", [b"64"])
    archive.record("byteorder", [sys.byteorder.encode()])
    announce(pickler.leaves)
    for key, (produce, _, where) in pickler.records.items():
        archive.record(f"data/{key}", _counted(produce(), advance), where)
    archive.record("version", [b"3\n"])
    archive.close()
    if reserved:  # give back what was reserved beyond the archive
        file.truncate(archive.position)


def _counted(pieces: Iterator[bytes | memoryview], advance: Callable[[int], None]
             ) -> Iterator[bytes | memoryview]:
    for piece in pieces:
        yield piece
        advance(len(piece))
