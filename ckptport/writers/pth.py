"""Write torch ``.pth`` files that load anywhere with ``weights_only=True``, streaming.

The zip is written with torch's own archive writer, record by record, in
the layout ``torch.save`` produces (``data.pkl``, ``.format_version``,
``.storage_alignment``, ``byteorder``, ``data/N``): the pickle is made
first, with every tensor referring to a storage record by key, then each
record's bytes are produced and written one tensor at a time, so a cast or
a compaction never holds more than one tensor in memory, and a tensor that
is already its own compact storage (memory-mapped from the source) is
written without any copy.

Every tensor gets a record holding exactly its bytes (a saved slice does
not drag its whole storage along); tensors that are one view of one storage
(tied weights) share a record. The storage location recorded is ``cpu`` or
``--anchor cuda:N`` (no GPU needed). The inner folder is always
``archive/`` and nothing depends on object identity or time, so the same
tree gives the same bytes. Tensors of other kinds (sparse, quantized,
subclasses) go through torch's own pickling of their storages.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, BinaryIO

from ..checkpoint import rebuild_dict
from ..lazy import materialize
from ..tensorops import is_compact, view_key

__all__ = ["write_pth", "canonical"]

PICKLE_PROTOCOL = 2  # what torch.save writes and torch.load(weights_only=True) reads


class _Sink:
    """The file torch's zip writer writes into.

    torch turns an ``OSError`` from ``write`` (disk full) into an opaque
    ``RuntimeError``; the sink keeps the real cause to re-raise.
    """

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._file.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self._file.flush()


class _StorageRef:
    """A storage record in the pickle: ``("storage", type, key, location, numel)``."""

    __slots__ = ("key", "storage_type", "numel")

    def __init__(self, key: str, storage_type: Any, numel: int) -> None:
        self.key, self.storage_type, self.numel = key, storage_type, numel


Produce = Callable[[], Any]  # returns the UntypedStorage whose bytes are the record


class _Pickler(pickle.Pickler):
    """Pickles tensors as references to records; remembers how to produce each record."""

    def __init__(self, file: Any, location: str) -> None:
        super().__init__(file, protocol=PICKLE_PROTOCOL)
        self.location = location
        self.records: dict[str, tuple[Produce, int]] = {}
        self._keys: dict[Any, str] = {}

    def _key(self, identity: Any, produce: Produce, nbytes: int) -> str:
        if identity is not None and identity in self._keys:
            return self._keys[identity]
        key = str(len(self.records))
        self.records[key] = (produce, nbytes)
        if identity is not None:
            self._keys[identity] = key
        return key

    def reducer_override(self, obj: Any) -> Any:
        import torch

        if type(obj) is not torch.Tensor or obj.layout != torch.strided or obj.is_quantized:
            return NotImplemented  # Parameters reduce to their plain data; exotic kinds to torch
        nbytes = obj.numel() * obj.element_size()
        key = self._key(view_key(obj), partial(_own_storage, obj), nbytes)
        shape = tuple(obj.shape)
        stride = _contiguous_stride(shape)
        hooks: OrderedDict[Any, Any] = OrderedDict()
        if obj.dtype in torch.storage._new_dtypes():
            ref = _StorageRef(key, torch.UntypedStorage, nbytes)
            return (torch._utils._rebuild_tensor_v3, (ref, 0, shape, stride, False, hooks,
                                                       obj.dtype))
        storage_type = getattr(torch, torch.storage._dtype_to_storage_type_map()[obj.dtype])
        ref = _StorageRef(key, storage_type, obj.numel())
        return (torch._utils._rebuild_tensor_v2, (ref, 0, shape, stride, False, hooks))

    def persistent_id(self, obj: Any) -> Any:
        import torch

        if isinstance(obj, _StorageRef):
            return ("storage", obj.storage_type, obj.key, self.location, obj.numel)
        if isinstance(obj, torch.storage.TypedStorage):  # tensors torch reduces itself
            storage = obj._untyped_storage
            key = self._key(storage._cdata, partial(_given, storage), storage.nbytes())
            return ("storage", getattr(torch, obj._pickle_storage_type()), key, self.location,
                    obj._size())
        if isinstance(obj, torch.UntypedStorage):
            key = self._key(obj._cdata, partial(_given, obj), obj.nbytes())
            return ("storage", torch.UntypedStorage, key, self.location, obj.nbytes())
        return None


def _own_storage(tensor: Any) -> Any:
    """A storage holding exactly ``tensor``'s bytes; no copy when it already is one."""
    import torch

    real = materialize(tensor)
    if not is_compact(real):
        real = real.clone(memory_format=torch.contiguous_format)
    return real.untyped_storage()


def _given(storage: Any) -> Any:
    return storage


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(size, 1)
    return tuple(reversed(stride))


def canonical(value: Any) -> Any:
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
    return value


def write_pth(tree: Any, file: BinaryIO, anchor: str, advance: Callable[[int], None]) -> None:
    """Write ``tree`` as a torch zip checkpoint, one storage record at a time."""
    import torch

    buffer = io.BytesIO()
    pickler = _Pickler(buffer, anchor)
    pickler.dump(canonical(tree))
    data = buffer.getvalue()
    sink = _Sink(file)
    try:
        with torch.serialization._open_zipfile_writer(sink) as archive:  # type: ignore[arg-type]
            archive.write_record("data.pkl", data, len(data))
            archive.write_record(".format_version", "1", 1)
            alignment = getattr(torch.serialization, "_get_storage_alignment", None)
            if alignment is not None:
                text = str(alignment())
                archive.write_record(".storage_alignment", text, len(text))
            archive.write_record("byteorder", sys.byteorder, len(sys.byteorder))
            for key, (produce, nbytes) in pickler.records.items():
                archive.write_record(f"data/{key}", produce(), nbytes)
                advance(nbytes)
    except RuntimeError:
        if sink.error is not None:
            raise sink.error from None
        raise
