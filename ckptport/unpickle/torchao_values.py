"""torchao's tensor subclasses as data: the class name, the inner tensors, the attributes.

``torch.save`` of a model ``torchao.quantization.quantize_`` changed pickles each
quantized weight as a wrapper subclass: ``_rebuild_from_type_v2(
_rebuild_wrapper_subclass, Int8Tensor, (Int8Tensor, dtype, size, ...), state)``,
where ``state`` is the instance's ``__dict__``: the inner tensors (``qdata``,
``scale``, ``zero_point``) and plain attributes (``block_size``, the
activation-quantization kwargs, enums like ``KernelPreference('auto')``).
Here that call becomes a ``SubclassRecord`` holding exactly those, checked
plain; torchao's classes are inert records (``DataRecord``), never imported
and never called. Whether the inner tensors make a weight torchao can
dequantize is the scheme's to judge (``ckptport.quant.torchao``). A torchao
class ckptport does not read (Int4's packed layouts, MX, NVFP4) is refused by
name, as any unread tensor subclass is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..tree import ObjectRecord, RecordKind, Tree
from .data_records import data_class, is_plain, slots_state
from .distributed_values import _from_type_distributed, _ints
from .values import Allowed, Device, Marker, Recorded, Refusal, Unsupported

__all__ = ["torchao_table", "SubclassRecord", "TENSOR_CLASSES", "ENUM_NAMES", "TUPLE_FIELDS"]

_WRAPPER = "torch._utils._rebuild_wrapper_subclass"
_FROM_TYPE = "torch._tensor._rebuild_from_type_v2"
_WORKFLOWS = "torchao.quantization.quantize_.workflows"
# the subclasses ckptport reads, each by the module its class names (torchao sets
# ``__module__ = "torchao.quantization"``) and by the module that defines it
TENSOR_CLASSES = {"Int8Tensor": "int8.int8_tensor", "Float8Tensor": "float8.float8_tensor",
                  "IntxUnpackedToInt8Tensor": "intx.intx_unpacked_to_int8_tensor"}
_TENSOR_NAMES = frozenset(
    name for short, module in TENSOR_CLASSES.items()
    for name in (f"torchao.quantization.{short}", f"{_WORKFLOWS}.{module}.{short}"))
# what their attributes hold: granularities, enums, the activation-quantization kwargs
_PARTS = (
    *(f"torchao.quantization.granularity.{g}" for g in (
        "PerRow", "PerTensor", "PerAxis", "PerGroup", "PerBlock", "PerToken")),
    "torchao.quantization.quant_primitives.MappingType",
    "torchao.quantization.quant_primitives.ZeroPointDomain",
    "torchao.quantization.quantize_.common.kernel_preference.KernelPreference",
    f"{_WORKFLOWS}.float8.float8_tensor.QuantizeTensorToFloat8Kwargs",
    f"{_WORKFLOWS}.int8.int8_tensor.QuantizeTensorToInt8Kwargs",
    "torchao.float8.inference.Float8MMConfig",
)


# what torchao's safetensors JSON names an attribute by, where its pickle holds something else:
# an enum member by name (the pickle calls the enum with its value), a named tuple by fields
ENUM_NAMES: dict[str, dict[object, str]] = {
    "MappingType": {1: "SYMMETRIC", 2: "SYMMETRIC_NO_CLIPPING_ERR", 3: "ASYMMETRIC"},
    "ZeroPointDomain": {1: "INT", 2: "FLOAT", 3: "NONE"},
    "KernelPreference": {"auto": "AUTO", "torch": "TORCH", "mslk": "MSLK",
                         "emulated": "EMULATED"},
}
TUPLE_FIELDS = {"Float8MMConfig": ("emulate", "use_fast_accum", "pad_inner_dim")}


@dataclass(eq=False)
class SubclassRecord(ObjectRecord):
    """A torchao tensor subclass as its pickle rebuilds it: ``name`` the class, ``state``
    its inner tensors and attributes by name, ``dtype`` and ``shape`` the outer tensor's
    (what ``dequantize()`` gives by default, and the weight's shape)."""

    dtype: DType | None = None
    shape: tuple[int, ...] = ()

    @property
    def short_name(self) -> str:
        return self.name.rpartition(".")[2]


def _torchao_class(value: object) -> str | None:
    """The torchao class a wrapper rebuild names, if it names one."""
    if isinstance(value, type) and issubclass(value, Recorded) and \
            value.record_name.startswith("torchao."):
        return value.record_name
    return None


def _from_type(func: object, new_type: object, args: object, state: object) -> Tree:
    """``_rebuild_from_type_v2``: a torchao subclass here, everything else as before."""
    wrapper = isinstance(func, Allowed) and func.name == _WRAPPER
    name = _torchao_class(args[0]) if wrapper and isinstance(args, tuple) and args else None
    if name is None or not isinstance(args, tuple):
        return _from_type_distributed(func, new_type, args, state)
    short = name.rpartition(".")[2]
    if name not in _TENSOR_NAMES:
        return Unsupported(f"a torchao {short} (ckptport reads torchao's "
                           f"{', '.join(TENSOR_CLASSES)})")
    if new_type is not args[0] or len(args) != 8:
        raise Refusal(f"a torchao {short} rebuilt as another class or from other arguments")
    _, dtype, size, stride, offset, layout, device, requires_grad = args
    if not (isinstance(dtype, DType) and type(requires_grad) is bool
            and isinstance(layout, Marker) and layout.name == "torch.strided"
            and isinstance(device, Device) and type(offset) is int):
        raise Refusal(f"a torchao {short} rebuilt from a wrapper without a dtype, a strided "
                      "layout, a device and flags")
    _ints(stride, f"a torchao {short}'s stride")
    state = slots_state(state)
    if not (isinstance(state, dict) and all(type(k) is str and not k.startswith("__")
                                            for k in state) and is_plain(state)):
        raise Refusal(f"the state of a torchao {short} must be plain attributes and tensors")
    return SubclassRecord(name, RecordKind.INSTANCE, state=dict(state), dtype=dtype,
                          shape=_ints(size, f"a torchao {short}'s size"))


def torchao_table() -> dict[str, object]:
    """Qualified name -> what a pickle gets for it; merged into ``allowed.table`` after the
    distributed table, whose ``_rebuild_from_type_v2`` this one hands everything else."""
    table: dict[str, object] = {name: data_class(name) for name in (*_TENSOR_NAMES, *_PARTS)}
    table[_FROM_TYPE] = Allowed(_FROM_TYPE, _from_type)
    return table
