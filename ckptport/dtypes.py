"""The one dtype table: torch names, sizes, safetensors codes and numpy equivalents.

Readers, rules, writers and reports all speak of dtypes, and most of them
must do so without importing torch (``import torch`` costs seconds; inspect,
check, diff and the safetensors path never need it). A ``DType`` is
ckptport's own value for a torch dtype: it prints as torch does
(``torch.float32``), knows its item size, its safetensors code and the numpy
dtype holding the same bits, and converts to the real ``torch.dtype`` only
where torch is needed anyway (``to_torch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from .sealed import sealed

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["DType", "DTYPES", "by_name", "by_safetensors", "dtype_of", "STORAGE_CLASSES"]


@sealed
@dataclass(frozen=True, slots=True)
class DType:
    """A torch dtype by name: ``str()`` and ``repr()`` as torch prints them.

    Sub-byte elements are packed along the last dimension, as torch packs
    them: ``float4_e2m1fn_x2`` is one byte holding two FP4 values, and a
    tensor's shape counts bytes there (torch's meaning), while a safetensors
    header counts the FP4 values (``packing`` of them per unit). FP6
    (safetensors ``F6_E2M3``/``F6_E3M2``) has no torch dtype (``in_torch``
    false): ckptport carries it as units of four values in three bytes,
    copied and compared as bytes, never given to torch.

    ``kind``: ``f`` real floating point, ``c`` complex, ``i`` signed and ``u``
    unsigned integers, ``b`` bool, ``q`` quantized, ``x`` bit and sub-byte
    types torch stores one byte per element. ``numpy`` is the numpy dtype
    with the same bytes, for comparing or hashing them (``None`` where numpy
    has none: bfloat16, float8 and the like are compared as raw bytes).
    """

    name: str
    itemsize: int
    kind: str
    safetensors: str | None = None
    numpy: str | None = None
    packing: int = 1
    in_torch: bool = True

    def __str__(self) -> str:
        return f"torch.{self.name}" if self.in_torch else self.name

    __repr__ = __str__

    @property
    def is_floating_point(self) -> bool:
        return self.kind == "f"

    @property
    def is_complex(self) -> bool:
        return self.kind == "c"

    @property
    def is_code(self) -> bool:
        """Values that only mean something through a quantization scheme (an exponent-only
        scale, packed sub-byte elements): never cast as numbers."""
        return self.name in _CODES

    @property
    def has_values(self) -> bool:
        """Whether torch computes this dtype's values (compare them, cast them); packed and
        bit types are compared as their bytes."""
        return self.in_torch and self.kind in "fciub" and self.packing == 1

    def to_torch(self) -> torch.dtype:
        if not self.in_torch:
            raise ValueError(f"torch has no dtype for {self.name} (safetensors "
                             f"{self.safetensors})")
        import torch

        made: torch.dtype = getattr(torch, self.name)
        return made

    def to_numpy(self) -> np.dtype[np.generic]:
        """The numpy dtype of the same width and meaning; raw bytes where numpy has none."""
        import numpy as np

        return np.dtype(self.numpy or f"V{self.itemsize}")


def _table() -> dict[str, DType]:
    rows = [
        ("float64", 8, "f", "F64", "<f8"), ("float32", 4, "f", "F32", "<f4"),
        ("float16", 2, "f", "F16", "<f2"), ("bfloat16", 2, "f", "BF16", None),
        ("float8_e4m3fn", 1, "f", "F8_E4M3", None), ("float8_e5m2", 1, "f", "F8_E5M2", None),
        ("float8_e4m3fnuz", 1, "f", "F8_E4M3FNUZ", None),
        ("float8_e5m2fnuz", 1, "f", "F8_E5M2FNUZ", None),
        ("float8_e8m0fnu", 1, "f", "F8_E8M0", None),
        ("complex128", 16, "c", None, "<c16"), ("complex64", 8, "c", "C64", "<c8"),
        ("complex32", 4, "c", None, None),
        ("int64", 8, "i", "I64", "<i8"), ("int32", 4, "i", "I32", "<i4"),
        ("int16", 2, "i", "I16", "<i2"), ("int8", 1, "i", "I8", "i1"),
        ("uint64", 8, "u", "U64", "<u8"), ("uint32", 4, "u", "U32", "<u4"),
        ("uint16", 2, "u", "U16", "<u2"), ("uint8", 1, "u", "U8", "u1"),
        ("bool", 1, "b", "BOOL", "?"),
        ("qint32", 4, "q", None, None), ("qint8", 1, "q", None, None),
        ("quint8", 1, "q", None, None), ("quint4x2", 1, "q", None, None),
        ("quint2x4", 1, "q", None, None),
        ("bits16", 2, "x", None, None), ("bits8", 1, "x", None, None),
        ("bits1x8", 1, "x", None, None), ("bits2x4", 1, "x", None, None),
        ("bits4x2", 1, "x", None, None),
    ]
    rows += [(f"int{n}", 1, "x", None, None) for n in range(1, 8)]
    rows += [(f"uint{n}", 1, "x", None, None) for n in range(1, 8)]
    table = {name: DType(name, size, kind, code, np_name)
             for name, size, kind, code, np_name in rows}
    table["float4_e2m1fn_x2"] = DType("float4_e2m1fn_x2", 1, "f", "F4", packing=2)
    for name, code in (("float6_e2m3fn_x4", "F6_E2M3"), ("float6_e3m2fn_x4", "F6_E3M2")):
        table[name] = DType(name, 3, "f", code, packing=4, in_torch=False)
    return table


DTYPES: dict[str, DType] = _table()
_CODES = frozenset({"float8_e8m0fnu", "float4_e2m1fn_x2", "float6_e2m3fn_x4",
                    "float6_e3m2fn_x4"})
_ALIASES = {"bit": "uint1", "cdouble": "complex128", "cfloat": "complex64",
            "chalf": "complex32", "double": "float64", "float": "float32", "half": "float16",
            "int": "int32", "long": "int64", "short": "int16"}
_BY_CODE = {d.safetensors: d for d in DTYPES.values() if d.safetensors}

# torch's legacy typed storage classes and the dtype each holds (pickles name them)
STORAGE_CLASSES: dict[str, DType] = {
    f"{prefix}Storage": DTYPES[name] for prefix, name in (
        ("BFloat16", "bfloat16"), ("Bool", "bool"), ("Byte", "uint8"), ("Char", "int8"),
        ("ComplexDouble", "complex128"), ("ComplexFloat", "complex64"), ("Double", "float64"),
        ("Float", "float32"), ("Half", "float16"), ("Int", "int32"), ("Long", "int64"),
        ("QInt32", "qint32"), ("QInt8", "qint8"), ("QUInt2x4", "quint2x4"),
        ("QUInt4x2", "quint4x2"), ("QUInt8", "quint8"), ("Short", "int16"), ("", "float32"))
}


def by_name(name: str) -> DType | None:
    """The dtype torch calls ``name`` (``float32``, or an alias such as ``float``), or one of
    ckptport's own (FP6)."""
    return DTYPES.get(_ALIASES.get(name, name))


def by_safetensors(code: str) -> DType | None:
    return _BY_CODE.get(code)


def all_names() -> Iterator[tuple[str, DType]]:
    """Every attribute name of ``torch`` that is a dtype, aliases included."""
    yield from ((name, d) for name, d in DTYPES.items() if d.in_torch)
    for alias, name in _ALIASES.items():
        yield alias, DTYPES[name]


@cache
def _from_torch(dtype: object) -> DType:
    name = str(dtype).removeprefix("torch.")
    found = by_name(name)
    if found is None:
        raise ValueError(f"unknown dtype {dtype}")
    return found


def dtype_of(value: object) -> DType:
    """The ``DType`` of a tensor leaf or a dtype (ckptport's or torch's)."""
    dtype = getattr(value, "dtype", value)
    return dtype if isinstance(dtype, DType) else _from_torch(dtype)
