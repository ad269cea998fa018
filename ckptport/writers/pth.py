"""Write torch ``.pth`` files that load anywhere with ``weights_only=True``, streaming.

The pickle is made first (protocol 2, what ``torch.save`` writes), with every
tensor referring to a storage record by key, and without importing torch:
the torch globals it names are stand-ins renamed in the bytes
(``torchnames``), while torch is imported on another thread for the
verification that follows the writing; then each record's bytes are
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

import contextlib
import io
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from ..dtypes import dtype_of
from ..errors import OutputError
from ..tensors import chunks, contiguous_strides, file_range, nbytes, view_key
from ..tree import Leaf, TensorLeaf, Tree, format_path, is_tensor, iter_tensors, rebuild_dict
from ..treejson import sorted_items
from . import torchnames
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
    """Pickles tensors as references to records; remembers how to produce each record.

    The torch globals it names come from ``names`` (``torchnames``: stand-ins, or torch's
    own); ``used`` counts the distinct ones.
    """

    def __init__(self, location: str, tap: Tap | None = None,
                 names: Callable[[str], object] = torchnames.standin) -> None:
        self.buffer = io.BytesIO()
        super().__init__(self.buffer, protocol=PICKLE_PROTOCOL)
        self.location, self.tap, self.names = location, tap, names
        self.used: set[str] = set()
        self.records: dict[str, tuple[Produce, int, Range | None]] = {}
        self._keys: dict[Hashable, str] = {}

    def _global(self, name: str) -> object:
        self.used.add(name)
        return self.names(name)

    def _rebuild(self, name: str) -> Callable[..., object]:
        """A ``torch._utils._rebuild_tensor_*`` function (or its stand-in, callable too)."""
        return cast("Callable[..., object]", self._global(name))

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
        if not is_tensor(obj):
            return NotImplemented
        if not isinstance(obj, Leaf) and _torch_reduces(obj):
            return NotImplemented  # sparse, quantized, subclasses: torch's own reduction
        dtype = dtype_of(obj)
        size = nbytes(obj)
        produce = partial(chunks, obj) if self.tap is None else partial(_tapped, self.tap, obj)
        key = self._key(view_key(obj), produce, size, file_range(obj))
        shape = tuple(obj.shape)
        stride = contiguous_strides(shape)
        hooks: OrderedDict[str, object] = OrderedDict()  # backward hooks: never any
        storage = torchnames.storage_class(dtype)
        if storage is None:
            ref = _StorageRef(key, self._global("UntypedStorage"), size)
            return (self._rebuild("_rebuild_tensor_v3"),
                    (ref, 0, shape, stride, False, hooks, self._global(dtype.name)))
        ref = _StorageRef(key, self._global(storage), size // max(dtype.itemsize, 1))
        return (self._rebuild("_rebuild_tensor_v2"), (ref, 0, shape, stride, False, hooks))

    def persistent_id(self, obj: object) -> object:
        if isinstance(obj, _StorageRef):
            return ("storage", obj.storage_type, obj.key, self.location, obj.numel)
        if not type(obj).__module__.startswith("torch"):
            return None  # (torch objects exist only once torch is imported)
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


def _pickle(tree: Tree, anchor: str, tap: Tap | None) -> tuple[bytes, _Pickler]:
    """``tree``'s pickle and the pickler that knows its records, made without torch
    (``torchnames``) unless the tree's own strings spell the stand-ins' marker."""
    value = canonical(tree)
    pickler = _Pickler(anchor, tap)
    pickler.dump(value)
    pickled = torchnames.to_torch_names(pickler.buffer.getvalue(), len(pickler.used))
    if pickled is None:
        pickler = _Pickler(anchor, tap, torchnames.real)
        pickler.dump(value)
        pickled = pickler.buffer.getvalue()
    return pickled, pickler


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
        # verification needs torch: it is imported on a thread while this one writes
        with torchnames.imported_meanwhile() if options.verify else contextlib.nullcontext():
            write_pth(tree, file, options.anchor, advance, options.tap)

    def verify(self, path: Path, tree: Tree, written: None, options: WriteOptions,
               advance: Callable[[int], None]) -> None:
        from .verify import verify_pth

        verify_pth(path, tree, options.anchor, advance, options.jobs)


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
    pickled, pickler = _pickle(tree, anchor, tap)
    archive = ZipWriter(file)
    reserved = preallocate(file, archive.bound([len(pickled)]
                                               + [n for _, n, _ in pickler.records.values()]))
    archive.record("data.pkl", [pickled])
    archive.record(".format_version", [b"1"])
    archive.record(".storage_alignment", [b"64"])
    archive.record("byteorder", [sys.byteorder.encode()])
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
