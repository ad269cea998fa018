"""torch's globals as a pickle may use them, answered without torch.

Tensors come back as ``TensorInfo`` descriptions over the storages the
container located, after every view is checked to lie inside its storage;
dtypes as ``DType``; ``torch.Size`` and ``torch.device`` as stand-ins;
storage and tensor classes as markers, which cannot be called, so a pickle
that asks torch to allocate (``UntypedStorage(4.5e9)``,
``FloatTensor(1.1e9)``) is refused before anything is allocated. Tensors
of kinds ckptport does not convert (sparse, nested, quantized, meta,
device-specific) become ``Unsupported`` records, refused with their key.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .. import dtypes
from ..dtypes import DType
from ..tensors import Pending, TensorInfo
from ..tree import Tree
from .snapshots import TENSOR_ATTRIBUTES
from .values import Allowed, Device, Marker, Refusal, Size, StorageRef, Unsupported

__all__ = ["torch_table", "MAX_TENSOR_BYTES_OVER_STORAGE", "storage_class"]

MAX_TENSOR_BYTES_OVER_STORAGE = 1 << 30  # an expanded view may outgrow its storage by this
_DEVICE_TYPES = frozenset({"cpu", "cuda", "meta", "mps", "xpu", "hpu", "mtia", "xla", "lazy",
                           "ipu", "ort", "vulkan", "ve", "fpga", "maia", "privateuseone"})
_LAYOUTS = frozenset({"torch.strided", "torch.sparse_coo", "torch.sparse_csr",
                      "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc",
                      "torch._mkldnn", "torch.jagged"})
_LEGACY_TENSORS = ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int",
                   "Long", "Short")
_UNSUPPORTED = {
    "_rebuild_sparse_tensor": "a sparse tensor", "_rebuild_sparse_csr_tensor": "a sparse CSR "
    "tensor", "_rebuild_nested_tensor": "a nested tensor", "_rebuild_qtensor": "a quantized "
    "tensor", "_rebuild_meta_tensor_no_storage": "a meta tensor (no data)",
    "_rebuild_wrapper_subclass": "a tensor subclass (DTensor or the like)",
    "_rebuild_device_tensor_from_numpy": "a device tensor rebuilt from numpy",
    "_rebuild_device_tensor_from_cpu_tensor": "a device tensor rebuilt from a CPU copy",
    "_rebuild_xla_tensor": "an XLA tensor", "_rebuild_mtia_tensor": "an MTIA tensor",
}


def storage_class(name: str) -> Marker | None:
    """A storage class by its attribute name, as torch resolves any name with "Storage" in it."""
    if name == "UntypedStorage":
        return Marker("torch.UntypedStorage", "storage", dtypes.DTYPES["uint8"])
    dtype = dtypes.STORAGE_CLASSES.get(name)
    return None if dtype is None else Marker(f"torch.{name}", "storage", dtype)


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0
                                                       for v in value):
        raise Refusal(f"{what} must be a tuple of non-negative ints")
    return tuple(value)


def _size(dims: object = ()) -> Size:
    return Size(_ints(dims, "torch.Size"))


def _device(kind: object, index: object = None) -> Device:
    if isinstance(kind, str) and index is None and ":" in kind:
        kind, _, number = kind.partition(":")
        if not number.isdigit():
            raise Refusal(f"torch.device({kind}:{number}) names no device index")
        index = int(number)
    if not isinstance(kind, str) or kind not in _DEVICE_TYPES or not (
            index is None or (type(index) is int and 0 <= index < 1 << 16)):
        raise Refusal("torch.device takes a device type and an index")
    return Device(kind, index)


def _layout(name: object) -> Marker:
    if name not in _LAYOUTS:
        raise Refusal(f"torch.serialization._get_layout({name!r}) names no layout")
    return Marker(name, "layout")  # one of _LAYOUTS


def _view(storage: object, offset: object, size: object, stride: object, dtype: DType
          ) -> TensorInfo:
    """A ``TensorInfo`` after checking the view lies inside its storage."""
    if not isinstance(storage, StorageRef):
        raise Refusal("a tensor over something that is not a storage")
    offset = _ints((offset,), "storage offset")[0]
    size, stride = _ints(size, "size"), _ints(stride, "stride")
    if len(size) != len(stride):
        raise Refusal(f"size {size} and stride {stride} differ in length")
    itemsize = dtype.itemsize
    available = storage.info.declared_bytes // itemsize
    numel = math.prod(size)
    if numel and offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) >= \
            available:
        raise Refusal(f"a tensor of size {size}, stride {stride} at offset {offset} reaches "
                      f"past its storage of {available} elements")
    if numel * itemsize > max(available * itemsize, MAX_TENSOR_BYTES_OVER_STORAGE):
        raise Refusal(f"a tensor of size {size} would need {numel * itemsize} bytes from a "
                      f"storage of {available * itemsize}; refused before allocating")
    return TensorInfo(dtype, size, stride, offset, storage.info)


def _flags(requires_grad: object, hooks: object) -> bool:
    """``requires_grad``, once the rest is known to be data: no backward hooks (``None``,
    as legacy files write, or an empty dict; torch accepts both)."""
    if hooks is not None and not isinstance(hooks, dict):
        raise Refusal("malformed tensor flags: backward hooks that are not a dict")
    if hooks:
        raise Refusal("tensors with backward hooks are not data")
    if type(requires_grad) is not bool:
        raise Refusal("malformed tensor flags")
    return requires_grad


_METADATA_BITS = ("conj", "neg")  # torch.save's get_tensor_metadata: lazy views' bits


def _transform(metadata: object, dtype: DType) -> tuple[str, ...]:
    """What torch applies on load: a key present sets its bit, whatever its value (torch's
    ``_set_tensor_metadata`` does so), so the tensor reads conjugated or negated."""
    if metadata is None:
        return ()
    if not (isinstance(metadata, dict) and all(
            isinstance(k, str) and type(v) is bool for k, v in metadata.items())):
        raise Refusal("malformed tensor metadata")
    unknown = [key for key in metadata if key not in _METADATA_BITS]
    if unknown:
        raise Refusal(f"tensor metadata {unknown[0]!r}, which ckptport does not know how "
                      "torch applies")
    if "conj" in metadata and not dtype.is_complex:
        raise Refusal("tensor metadata marks a real tensor as a conjugate view")
    return tuple(key for key in _METADATA_BITS if key in metadata)


def _finish(info: TensorInfo, requires_grad: object, hooks: object, metadata: object
            ) -> TensorInfo | Pending:
    """The tensor as torch gives it: flags checked, a lazy view's transform deferred."""
    info = _with_grad(info, _flags(requires_grad, hooks))
    steps = _transform(metadata, info.dtype)
    return Pending(info, info.dtype, steps) if steps else info


def _rebuild_v2(storage: object, offset: object, size: object, stride: object,
                requires_grad: object, hooks: object, metadata: object = None
                ) -> TensorInfo | Pending:
    if not isinstance(storage, StorageRef):
        raise Refusal("a tensor over something that is not a storage")
    info = _view(storage, offset, size, stride, storage.dtype)
    return _finish(info, requires_grad, hooks, metadata)


def _rebuild_v3(storage: object, offset: object, size: object, stride: object,
                requires_grad: object, hooks: object, dtype: object, metadata: object = None
                ) -> TensorInfo | Pending:
    if not isinstance(dtype, DType) or not isinstance(storage, StorageRef) or \
            storage.dtype.name != "uint8":
        raise Refusal("_rebuild_tensor_v3 takes an untyped storage and a dtype")
    return _finish(_view(storage, offset, size, stride, dtype), requires_grad, hooks, metadata)


def _rebuild_legacy(storage: object, offset: object, size: object, stride: object
                    ) -> TensorInfo:
    if not isinstance(storage, StorageRef):
        raise Refusal("a tensor over something that is not a storage")
    return _view(storage, offset, size, stride, storage.dtype)


def _with_grad(info: TensorInfo, requires_grad: bool) -> TensorInfo:
    if not requires_grad:
        return info
    return TensorInfo(info.dtype, info.shape, info.strides, info.offset, info.storage, True)


def _plain_state(state: object) -> None:
    """A tensor's pickled state sets attributes: never one that rewrites the tensor.

    ``data``, ``real``, ``grad`` and every other tensor attribute would
    replace or rewrite the tensor the file declared; dunders reach the
    interpreter. Custom attributes (Megatron's ``partition_dim``) are data.
    """
    if state is None or state == {}:
        return
    parts = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
    for part in parts:
        if part is None:
            continue
        if not isinstance(part, dict):
            raise Refusal("a tensor's state must be a dict of attribute names")
        for key in part:
            if not isinstance(key, str) or key.startswith("__") or key in TENSOR_ATTRIBUTES:
                raise Refusal(f"a tensor's pickled state sets {key!r}, which would rewrite the "
                              "tensor itself")


def _parameter(data: object, requires_grad: object = True, hooks: object = None,
               state: object = None) -> TensorInfo:
    if not isinstance(data, TensorInfo) or data.parameter or type(requires_grad) is not bool:
        raise Refusal("a Parameter of something that is not a tensor")
    if hooks is not None:
        _flags(requires_grad, hooks)
    _plain_state(state)
    return TensorInfo(data.dtype, data.shape, data.strides, data.offset, data.storage,
                      requires_grad, parameter=True)


_REBUILDS: dict[str, Callable[..., TensorInfo | Pending]] = {
    "torch._utils._rebuild_tensor_v2": _rebuild_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_v3,
    "torch._utils._rebuild_tensor": _rebuild_legacy,
}


def _from_type(func: object, new_type: object, args: object, state: object) -> Tree:
    """``_rebuild_from_type_v2``: a plain tensor or a Parameter, nothing else."""
    if not (isinstance(func, Allowed) and func.name in _REBUILDS and isinstance(args, tuple)
            and isinstance(new_type, Marker)
            and new_type.name in ("torch.Tensor", "torch.nn.parameter.Parameter")):
        raise Refusal("a tensor subclass outside the allow-list")
    _plain_state(state)
    tensor = func(*args)
    if new_type.name == "torch.Tensor":
        return tensor
    if not isinstance(tensor, TensorInfo):  # a lazy view (conj, neg) is no Parameter's data
        raise Refusal("a Parameter of something that is not a tensor")
    return _parameter(tensor, tensor.requires_grad)


def _unsupported(kind: str) -> Callable[..., Unsupported]:
    def record(*args: object) -> Unsupported:
        return Unsupported(kind)

    return record


def torch_table() -> dict[str, object]:
    """Qualified name -> what a pickle gets for it (no torch import)."""
    table: dict[str, object] = {f"torch.{name}": dtype for name, dtype in dtypes.all_names()}
    for name in (*dtypes.STORAGE_CLASSES, "UntypedStorage"):
        marker = storage_class(name)
        assert marker is not None
        table[f"torch.{name}"] = marker
    table["torch.storage.UntypedStorage"] = storage_class("UntypedStorage")
    table["torch.storage.TypedStorage"] = Marker("torch.storage.TypedStorage", "storage-class")
    for prefix in ("torch.", "torch.cuda.", "torch.sparse.", "torch.cuda.sparse."):
        table.update({f"{prefix}{kind}Tensor": Marker(f"{prefix}{kind}Tensor", "tensor-class")
                      for kind in _LEGACY_TENSORS})
    table["torch.Tensor"] = Marker("torch.Tensor", "tensor-class")
    table["torch.nn.parameter.Parameter"] = Marker("torch.nn.parameter.Parameter",
                                                   "tensor-class")
    table["torch.Size"] = Allowed("torch.Size", _size)
    table["torch.device"] = Allowed("torch.device", _device)
    table["torch.serialization._get_layout"] = Allowed("torch.serialization._get_layout",
                                                       _layout)
    table.update({name: Marker(name, "layout") for name in _LAYOUTS})
    table.update({f"torch.{name}": Marker(f"torch.{name}", "qscheme") for name in (
        "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
        "per_channel_symmetric", "per_channel_affine_float_qparams")})
    table.update({f"torch.{name}": Marker(f"torch.{name}", "memory-format") for name in (
        "contiguous_format", "channels_last", "channels_last_3d", "preserve_format")})
    table.update({name: Allowed(name, func) for name, func in _REBUILDS.items()})
    table["torch._utils._rebuild_parameter"] = Allowed("torch._utils._rebuild_parameter",
                                                       _parameter)
    table["torch._utils._rebuild_parameter_with_state"] = Allowed(
        "torch._utils._rebuild_parameter_with_state", _parameter)
    table["torch._tensor._rebuild_from_type_v2"] = Allowed(
        "torch._tensor._rebuild_from_type_v2", _from_type)
    table.update({f"torch._utils.{name}": Allowed(f"torch._utils.{name}", _unsupported(kind))
                  for name, kind in _UNSUPPORTED.items()})
    return table
