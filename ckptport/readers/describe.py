"""Describe a checkpoint without importing torch: the facts ``inspect`` and ``check`` need.

``import torch`` costs seconds; a CI gate over a hundred artifacts should
not pay it a hundred times when no tensor byte is needed. This reader
parses the containers directly and produces a ``Checkpoint`` whose tensor
leaves are ``TensorInfo`` descriptions (dtype, shape, stride, storage key,
offset, recorded location, storage size), never tensors:

- a torch zip: the central directory with ``zipfile``, ``data.pkl`` through
  ckptport's restricted unpickler (``restricted.unpickle_zip_data``) with
  ``Recorders`` passed in, which record torch's rebuild calls instead of
  making them; storage sizes are checked against the zip records;
- safetensors: the header (``safetensors_layout``);
- a shard set: the index and each shard, as ``shards.read_shards`` does.

Where this reader cannot be sure to report exactly what the tensor readers
would (legacy non-zip files, DCP folders, zip names or layouts torch treats
differently from ``zipfile``, globals torch's weights-only loader builds
that are not described here, any unreadable file), it raises
``NotDescribable`` and the caller reads the file with torch instead, so an
error message or a report never depends on which reader ran.

The snapshots below (dtypes, storage classes, the globals plain
``torch.load(weights_only=True)`` accepts) are torch's, taken from the
installed version; ``tests/test_inspect.py`` checks them against torch.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..checkpoint import (
    Checkpoint,
    Format,
    SourceFacts,
    StorageInfo,
    TensorInfo,
    shared_storages,
)
from ..errors import CkptportError
from . import allowlist, resolve
from .allowlist import Allowed, RestrictedArgumentError
from .pickle_scan import scan_globals
from .restricted import Refused, check_tensor_sizes, settle, unpickle_zip_data
from .sniff import sniff

__all__ = ["describe", "NotDescribable", "Recorders", "TORCH_DEFAULT_NAMES", "Dtype",
           "is_allowed"]


class NotDescribable(Exception):
    """This reader cannot vouch for an exact description: read the file with torch."""


_ITEMSIZE = {
    "bfloat16": 2, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1, "bits8": 1, "bool":
    1, "complex128": 16, "complex32": 4, "complex64": 8, "float16": 2, "float32": 4,
    "float4_e2m1fn_x2": 1, "float64": 8, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "int1": 1, "int16": 2, "int2":
    1, "int3": 1, "int32": 4, "int4": 1, "int5": 1, "int6": 1, "int64": 8, "int7": 1, "int8":
    1, "qint32": 4, "qint8": 1, "quint2x4": 1, "quint4x2": 1, "quint8": 1, "uint1": 1,
    "uint16": 2, "uint2": 1, "uint3": 1, "uint32": 4, "uint4": 1, "uint5": 1, "uint6": 1,
    "uint64": 8, "uint7": 1, "uint8": 1
}

_DTYPE_ALIASES = {
    "bit": "uint1", "cdouble": "complex128", "cfloat": "complex64", "chalf": "complex32",
    "double": "float64", "float": "float32", "half": "float16", "int": "int32", "long":
    "int64", "short": "int16"
}

_STORAGE_DTYPES = {
    "BFloat16Storage": "bfloat16", "BoolStorage": "bool", "ByteStorage": "uint8",
    "CharStorage": "int8", "ComplexDoubleStorage": "complex128", "ComplexFloatStorage":
    "complex64", "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage":
    "float16", "IntStorage": "int32", "LongStorage": "int64", "QInt32Storage": "qint32",
    "QInt8Storage": "qint8", "QUInt2x4Storage": "quint2x4", "QUInt4x2Storage": "quint4x2",
    "QUInt8Storage": "quint8", "ShortStorage": "int16", "Storage": "float32"
}

TORCH_DEFAULT_NAMES = frozenset({
    "_codecs.encode", "builtins.bytearray", "builtins.complex", "builtins.set",
    "collections.Counter", "collections.OrderedDict", "torch.BFloat16Storage",
    "torch.BFloat16Tensor", "torch.BoolStorage", "torch.BoolTensor", "torch.ByteStorage",
    "torch.ByteTensor", "torch.CharStorage", "torch.CharTensor", "torch.ComplexDoubleStorage",
    "torch.ComplexFloatStorage", "torch.DoubleStorage", "torch.DoubleTensor",
    "torch.FloatStorage", "torch.FloatTensor", "torch.HalfStorage", "torch.HalfTensor",
    "torch.IntStorage", "torch.IntTensor", "torch.LongStorage", "torch.LongTensor",
    "torch.QInt32Storage", "torch.QInt8Storage", "torch.QUInt2x4Storage",
    "torch.QUInt4x2Storage", "torch.QUInt8Storage", "torch.ShortStorage", "torch.ShortTensor",
    "torch.Size", "torch.Tensor", "torch._tensor._rebuild_from_type_v2",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor",
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_meta_tensor_no_storage", "torch._utils._rebuild_nested_tensor",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_qtensor", "torch._utils._rebuild_sparse_tensor",
    "torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_wrapper_subclass",
    "torch.bfloat16", "torch.bits16", "torch.bits1x8", "torch.bits2x4", "torch.bits4x2",
    "torch.bits8", "torch.bool", "torch.complex128", "torch.complex32", "torch.complex64",
    "torch.cuda.BFloat16Storage", "torch.cuda.BFloat16Tensor", "torch.cuda.BoolStorage",
    "torch.cuda.BoolTensor", "torch.cuda.ByteStorage", "torch.cuda.ByteTensor",
    "torch.cuda.CharStorage", "torch.cuda.CharTensor", "torch.cuda.ComplexDoubleStorage",
    "torch.cuda.ComplexFloatStorage", "torch.cuda.DoubleStorage", "torch.cuda.DoubleTensor",
    "torch.cuda.FloatStorage", "torch.cuda.FloatTensor", "torch.cuda.HalfStorage",
    "torch.cuda.HalfTensor", "torch.cuda.IntStorage", "torch.cuda.IntTensor",
    "torch.cuda.LongStorage", "torch.cuda.LongTensor", "torch.cuda.ShortStorage",
    "torch.cuda.ShortTensor", "torch.cuda.sparse.BFloat16Tensor",
    "torch.cuda.sparse.ByteTensor", "torch.cuda.sparse.CharTensor",
    "torch.cuda.sparse.DoubleTensor", "torch.cuda.sparse.FloatTensor",
    "torch.cuda.sparse.HalfTensor", "torch.cuda.sparse.IntTensor",
    "torch.cuda.sparse.LongTensor", "torch.cuda.sparse.ShortTensor", "torch.device",
    "torch.float16", "torch.float32", "torch.float4_e2m1fn_x2", "torch.float64",
    "torch.float8_e4m3fn", "torch.float8_e4m3fnuz", "torch.float8_e5m2",
    "torch.float8_e5m2fnuz", "torch.float8_e8m0fnu", "torch.int1", "torch.int16", "torch.int2",
    "torch.int3", "torch.int32", "torch.int4", "torch.int5", "torch.int6", "torch.int64",
    "torch.int7", "torch.int8", "torch.nn.parameter.Parameter", "torch.per_channel_affine",
    "torch.per_channel_affine_float_qparams", "torch.per_channel_symmetric",
    "torch.per_tensor_affine", "torch.per_tensor_symmetric", "torch.qint32", "torch.qint8",
    "torch.quint2x4", "torch.quint4x2", "torch.quint8", "torch.serialization._get_layout",
    "torch.sparse.BFloat16Tensor", "torch.sparse.ByteTensor", "torch.sparse.CharTensor",
    "torch.sparse.DoubleTensor", "torch.sparse.FloatTensor", "torch.sparse.HalfTensor",
    "torch.sparse.IntTensor", "torch.sparse.LongTensor", "torch.sparse.ShortTensor",
    "torch.storage.TypedStorage", "torch.storage.UntypedStorage", "torch.uint1",
    "torch.uint16", "torch.uint2", "torch.uint3", "torch.uint32", "torch.uint4", "torch.uint5",
    "torch.uint6", "torch.uint64", "torch.uint7", "torch.uint8"
})


# -- stand-ins for torch's values ----------------------------------------------
# Reports name a value by its type (``torch.dtype``) and show its repr, so the
# stand-ins carry torch's names and reprs.


class Dtype:
    """A torch dtype by name: ``str()`` and ``repr()`` as torch prints them."""

    __module__ = "torch"
    __qualname__ = "dtype"

    def __init__(self, name: str) -> None:
        self.name, self.itemsize = name, _ITEMSIZE[name]

    def __repr__(self) -> str:
        return f"torch.{self.name}"


Dtype.__name__ = "dtype"


class Size(tuple[int, ...]):
    """``torch.Size`` as a value in the tree."""

    __module__ = "torch"
    __qualname__ = "Size"

    def __repr__(self) -> str:
        return f"torch.Size([{', '.join(map(str, self))}])"


Size.__name__ = "Size"
_DEVICE_TYPES = frozenset({"cpu", "cuda", "meta", "mps", "xpu", "hpu", "mtia", "privateuseone"})


class Device:
    """``torch.device`` as a value in the tree."""

    __module__ = "torch"
    __qualname__ = "device"

    def __init__(self, kind: str, index: int | None) -> None:
        self.type, self.index = kind, index

    def __repr__(self) -> str:
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"


Device.__name__ = "device"


class _TorchClass:
    """A torch class named by the pickle (a storage class, ``torch.Tensor``): a marker."""

    def __init__(self, name: str, dtype: Dtype | None = None) -> None:
        self.name, self.dtype = name, dtype


_DTYPES = {name: Dtype(name) for name in _ITEMSIZE}


def _size(dims: Any = ()) -> Size:
    return Size(allowlist.nonnegative_ints(dims, "torch.Size"))


def _device(kind: Any, index: Any = None) -> Device:
    if isinstance(kind, str) and index is None and ":" in kind:
        kind, _, number = kind.partition(":")
        index = int(number) if number.isdigit() else -1
    if kind not in _DEVICE_TYPES or not (index is None or (type(index) is int and index >= 0)):
        raise RestrictedArgumentError("a torch.device ckptport does not describe")
    return Device(kind, index)


class Recorders:
    """Rebuilders (see ``restricted.TorchRebuilders``) that record instead of building.

    A storage is the ``StorageInfo`` its loader located; a tensor, a
    parameter or an allowed tensor subclass is a ``TensorInfo``. The
    restricted unpickler has checked every view against its storage first.
    """

    def __init__(self) -> None:
        self.tensor_class = _TorchClass("torch.Tensor")
        self.parameter_class = _TorchClass("torch.nn.parameter.Parameter")

    def values(self) -> dict[str, Any]:
        values: dict[str, Any] = {f"torch.{name}": dtype for name, dtype in _DTYPES.items()}
        values.update({f"torch.{alias}": _DTYPES[name] for alias, name in _DTYPE_ALIASES.items()})
        values.update({f"torch.{name}": _TorchClass(f"torch.{name}", _DTYPES[dtype])
                       for name, dtype in _STORAGE_DTYPES.items()})
        for name in ("torch.UntypedStorage", "torch.storage.UntypedStorage"):
            values[name] = _TorchClass(name, _DTYPES["uint8"])
        values["torch.Tensor"] = self.tensor_class
        values["torch.nn.parameter.Parameter"] = self.parameter_class
        values["torch.Size"] = Allowed("torch.Size", _size)
        values["torch.device"] = Allowed("torch.device", _device)
        return values

    def storage_dtype(self, value: Any) -> Any:
        return value.dtype if isinstance(value, _TorchClass) else None

    def itemsize(self, dtype: Dtype) -> int:
        return dtype.itemsize

    def typed(self, untyped: StorageInfo, dtype: Dtype) -> StorageInfo:
        return untyped

    def tensor(self, storage: StorageInfo, offset: int, size: tuple[int, ...],
               stride: tuple[int, ...], requires_grad: bool, metadata: Any) -> TensorInfo:
        return TensorInfo(storage.dtype, size, stride, offset, storage, requires_grad)

    def legacy_tensor(self, storage: StorageInfo, offset: int, size: tuple[int, ...],
                      stride: tuple[int, ...]) -> TensorInfo:
        return TensorInfo(storage.dtype, size, stride, offset, storage)

    def is_plain_tensor(self, value: Any) -> bool:
        return isinstance(value, TensorInfo)

    def parameter(self, data: TensorInfo, requires_grad: bool, state: Any) -> TensorInfo:
        return TensorInfo(data.dtype, data.shape, data.strides, data.offset, data.storage,
                          requires_grad)

    def tensor_types(self) -> tuple[Any, ...]:
        return self.tensor_class, self.parameter_class

    def from_type(self, func: Allowed, new_type: Any, args: tuple[Any, ...],
                  state: Any) -> Any:
        return func.call(*args)




# -- the readers -----------------------------------------------------------------


def describe(path: str | os.PathLike[str]) -> Checkpoint:
    """Describe any checkpoint without torch, or raise ``NotDescribable``.

    Errors in a safetensors header or a shard index are the tensor readers'
    own (the same checks run first there), so they are raised as they are.
    """
    source, _ = resolve(path)
    if source.is_dir():
        raise NotDescribable("a DCP folder")
    if source.name.endswith(".index.json"):
        from .shards import read_shards

        return read_shards(source, read_part=describe_file)
    return describe_file(source)


def describe_file(path: Path) -> Checkpoint:
    """Describe one checkpoint file (zip or safetensors)."""
    fmt = sniff(path)
    if fmt is Format.SAFETENSORS:
        return _describe_safetensors(path)
    if fmt is not Format.TORCH_ZIP:
        raise NotDescribable(f"a {fmt.value} file")
    return _describe_zip(path)


def _describe_safetensors(path: Path) -> Checkpoint:
    from .safetensors import read_safetensors

    return read_safetensors(path, _describe_entries)


def _describe_entries(path: Path, header: Any) -> dict[str, Any]:
    """Descriptions of a safetensors file's tensors, from its header alone."""
    from ..dtypes import _TORCH_NAMES

    tensors: dict[str, Any] = {}
    for name, entry in sorted(header.entries.items(), key=lambda item: item[1].start):
        dtype = _DTYPES.get(_TORCH_NAMES[entry.dtype])
        if dtype is None:
            raise NotDescribable(f"dtype {entry.dtype}")
        storage = StorageInfo(path, name, "cpu", dtype, dtype.itemsize, entry.nbytes)
        tensors[name] = TensorInfo(dtype, entry.shape, _contiguous(entry.shape), 0, storage)
    return tensors


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _zip_records(path: Path) -> tuple[zipfile.ZipFile, dict[str, zipfile.ZipInfo]]:
    """The archive's records by name below its one top folder, as torch's reader sees them."""
    try:
        archive = zipfile.ZipFile(path)
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError,
            NotImplementedError) as exc:
        raise NotDescribable(f"zipfile: {exc}") from None
    names = [info.filename for info in infos]
    if not infos or len(set(names)) != len(names) or not all(n.isascii() for n in names):
        raise NotDescribable("duplicate or non-ASCII record names")
    top, slash, _ = names[0].partition("/")
    if not slash or not all(n.startswith(f"{top}/") for n in names):
        raise NotDescribable("records outside one top folder")
    records = {info.filename[len(top) + 1:]: info for info in infos}
    if ("data.pkl" not in records or "constants.pkl" in records
            or not ({"version", ".data/version"} & records.keys())):
        raise NotDescribable("not a plain torch checkpoint archive")
    if any(info.compress_type != zipfile.ZIP_STORED for info in records.values()):
        raise NotDescribable("compressed records")
    return archive, records


def _describe_zip(path: Path) -> Checkpoint:
    archive, records = _zip_records(path)
    try:
        with archive:
            data = archive.read(records["data.pkl"])
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise NotDescribable(f"zipfile: {exc}") from None

    def locate(pid: Any, nbytes: int) -> StorageInfo:
        info = records.get(f"data/{pid.key}")
        if info is None or info.file_size < nbytes:
            raise NotDescribable(f"storage record data/{pid.key} missing or short")
        return StorageInfo(path, pid.key, pid.location, pid.dtype, pid.dtype.itemsize, nbytes)

    seen: dict[str, None] = {}
    refused: dict[str, None] = {}
    try:
        tree, locations = unpickle_zip_data(data, locate, lenient=True, seen=seen,
                                            refused=refused, rebuilders=Recorders())
        tree = settle(tree)
        check_tensor_sizes(tree)
    except (Refused, CkptportError, RecursionError) as exc:  # the torch path words the error
        raise NotDescribable(str(exc)) from None
    unsupported = [name for name in seen if name in TORCH_DEFAULT_NAMES
                   and name not in _described_names()]
    if unsupported:
        raise NotDescribable(f"{unsupported[0]} is built by torch's weights-only loader")
    found = scan_globals_of(data)
    if found != tuple(seen):  # the scan and the unpickler name the globals differently
        if not (data[:1] == b"\x80" and data[1:2] >= b"\x04"):
            raise NotDescribable("globals named differently by the scan and the unpickler")
        found = tuple(seen)  # torch's weights-only loader refuses protocol 4+: the unpickler's
    _refuse_torch_values(tree)
    return Checkpoint(tree, SourceFacts(
        path=path, format=Format.TORCH_ZIP, size=path.stat().st_size,
        storage_locations=dict(sorted(locations.items())), globals=found,
        shared_storages=shared_storages(tree), refused_globals=tuple(refused)))


def scan_globals_of(data: bytes) -> tuple[str, ...]:
    import io

    try:
        return scan_globals(io.BytesIO(data))
    except (ValueError, EOFError) as exc:
        raise NotDescribable(str(exc)) from None


def _described_names() -> frozenset[str]:
    global _NAMES
    if _NAMES is None:
        from .restricted import REBUILD_NAMES

        _NAMES = frozenset(allowlist.restricted_table([], Recorders().values())) | REBUILD_NAMES
    return _NAMES


_NAMES: frozenset[str] | None = None


def _refuse_torch_values(tree: Any) -> None:
    """Storages or torch classes as values: the tensor readers show torch objects there."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (_TorchClass, StorageInfo)):
            raise NotDescribable(f"a {type(node).__name__} value in the tree")
        if isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend(node)
        elif hasattr(node, "__dataclass_fields__") and not isinstance(node, TensorInfo):
            stack.extend(vars(node).values())


def is_allowed(qualname: str) -> bool:
    """``allowlist.is_allowed`` without importing torch."""
    return qualname in TORCH_DEFAULT_NAMES or qualname in _described_names()
