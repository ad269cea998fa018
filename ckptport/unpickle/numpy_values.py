"""numpy's pickle helpers, answered with records that check every argument.

numpy trusts what it is given: a dtype state naming an object field under
flags that deny holding objects makes ``multiarray.scalar`` or an array
rebuild read pointers from the file's bytes (memory corruption), and
``copy=False`` hands out numpy's process-wide builtin dtypes for ``BUILD``
to rewrite. So the pickle never touches a real numpy object: it gets
records whose ``__setstate__`` accepts only the states numpy itself writes
for plain (non-object, unstructured) dtypes, and real numpy values are
built from the checked records once the pickle has finished (``finalize``).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, TypeAlias

from ..tree import Tree
from .values import Allowed, Marker, Refusal

if TYPE_CHECKING:
    import numpy as np

    _Dtype: TypeAlias = np.dtype[np.generic]  # numpy is imported only when a pickle needs it

__all__ = ["numpy_table", "NumpyValue", "finalize"]

# dtype specs numpy writes for plain dtypes: numbers, bytes/str/void of a size,
# datetimes (their unit travels in the BUILD state)
_PLAIN_DTYPE = re.compile(r"b1|[iu][1248]|f(2|4|8|12|16)|c(8|16|24|32)|[SUV]\d{1,9}|[Mm]8")
_DATETIME_UNITS = frozenset({b"Y", b"M", b"W", b"D", b"h", b"m", b"s", b"ms", b"us", b"ns",
                             b"ps", b"fs", b"as", b"generic"})
_SCALAR_TYPES = ("bool_", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float16", "float32", "float64", "longdouble", "complex64",
                 "complex128", "clongdouble", "str_", "bytes_", "void", "datetime64",
                 "timedelta64")


class NumpyValue:
    """Base of the numpy records; ``finalize`` turns each into the real numpy value."""

    __slots__ = ()


class NumpyDtype(NumpyValue):
    """``numpy.dtype(spec, align, copy)`` then its ``BUILD`` state, checked."""

    __slots__ = ("spec", "dtype")

    def __init__(self, spec: str, dtype: _Dtype) -> None:
        self.spec, self.dtype = spec, dtype

    def __setstate__(self, state: object) -> None:
        self.dtype = _checked_dtype(self.dtype, state)


class NumpyArray(NumpyValue):
    """``_reconstruct(ndarray, (0,), code)`` or ``_frombuffer``: shape, dtype and bytes."""

    __slots__ = ("shape", "dtype", "fortran", "data")

    def __init__(self, shape: tuple[int, ...] = (0,), dtype: _Dtype | None = None,
                 fortran: bool = False, data: bytes = b"") -> None:
        self.shape, self.dtype, self.fortran, self.data = shape, dtype, fortran, data

    def __setstate__(self, state: object) -> None:
        if not isinstance(state, tuple) or len(state) not in (4, 5) or (
                len(state) == 5 and state[0] != 1):
            raise Refusal("malformed numpy array state")
        shape, kind, fortran, raw = state[-4:]
        dims = _ints(shape, "numpy shape")
        dtype = _plain(kind)
        if type(fortran) is not bool or not isinstance(raw, bytes) or \
                len(raw) != math.prod(dims) * dtype.itemsize:
            raise Refusal("numpy array shape does not match its data (object arrays are refused)")
        self.shape, self.dtype, self.fortran, self.data = dims, dtype, fortran, raw


class NumpyScalar(NumpyValue):
    __slots__ = ("dtype", "data")

    def __init__(self, dtype: _Dtype, data: bytes) -> None:
        self.dtype, self.data = dtype, data

    def __setstate__(self, state: object) -> None:
        raise Refusal("a numpy scalar's data rewritten after it was built")


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0
                                                       for v in value):
        raise Refusal(f"{what} must be a tuple of non-negative ints")
    return tuple(value)


def _bytes(value: object, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):  # protocol 2 writes bytes as latin-1 text
        return value.encode("latin-1")
    raise Refusal(f"{what} takes bytes, not {type(value).__name__}")


def _plain(kind: object) -> _Dtype:
    """The genuine numpy dtype of a checked record, if it holds no objects or fields."""
    dtype = kind.dtype if isinstance(kind, NumpyDtype) else None
    if dtype is None or dtype.hasobject or dtype.names is not None or dtype.subdtype is not None:
        raise Refusal("numpy data of an object or structured dtype is refused")
    return dtype


def _flag(value: object) -> bool:
    return type(value) in (bool, int) and value in (0, 1)


def _plain_data(value: object) -> bool:
    """Only what numpy's own dtype states hold, so comparing them runs no file-made ``==``."""
    if isinstance(value, tuple):
        return all(_plain_data(v) for v in value)
    return value is None or type(value) in (int, str, bytes)


def _checked_dtype(target: _Dtype, state: object) -> _Dtype:
    """The dtype ``state`` describes, if it is a state numpy writes for a plain dtype.

    Compared with the states of genuine dtypes of the same kind in each byte
    order; the matching genuine dtype is returned, so numpy's own
    ``__setstate__`` never sees the file's state.
    """
    import numpy as np

    refused = Refusal("a numpy dtype state that is not a plain dtype's (forged, structured or "
                      "object dtypes are refused)")
    if not isinstance(state, tuple) or len(state) not in (8, 9) or not _plain_data(state):
        raise refused
    spec = f"{target.kind}{target.itemsize}" if target.kind not in "SUV" else target.str[1:]
    if target.kind in "Mm":
        metadata = state[8] if len(state) == 9 else None
        unit = metadata[1] if isinstance(metadata, tuple) and len(metadata) == 2 else None
        if not (isinstance(unit, tuple) and len(unit) == 4 and unit[0] in _DATETIME_UNITS
                and type(unit[1]) is int and 0 < unit[1] < 1 << 31):
            raise refused
        name = unit[0].decode()
        spec = f"{target.kind}8" if name == "generic" else f"{target.kind}8[{unit[1]}{name}]"
    genuine = np.dtype(spec)
    for variant in (genuine.newbyteorder("<"), genuine.newbyteorder(">"),
                    genuine.newbyteorder("|"), genuine):
        if state == variant.__reduce__()[2]:
            return variant
    raise refused


def _dtype(spec: object, align: object = False, copy: object = False) -> NumpyDtype:
    import numpy as np

    # copy=False would share numpy's builtin dtype; numpy 1 wrote the flags as ints
    if not (isinstance(spec, str) and _PLAIN_DTYPE.fullmatch(spec)) or not (
            _flag(align) and _flag(copy) and copy):
        raise Refusal(f"numpy.dtype{(spec, align, copy)!r} is not a plain dtype as numpy "
                      "pickles one (object, structured and shared dtypes are refused)")
    return NumpyDtype(spec, np.dtype(spec))


def _reconstruct(subtype: object, shape: object, code: object) -> NumpyArray:
    if not (isinstance(subtype, Marker) and subtype.name == "numpy.ndarray") or \
            _ints(shape, "shape") != (0,):
        raise Refusal("numpy _reconstruct takes (ndarray, (0,), code)")
    _bytes(code, "code")
    return NumpyArray()


def _scalar(kind: object, data: object = None) -> NumpyScalar:
    raw = _bytes(data, "numpy scalar")
    dtype = _plain(kind)
    if len(raw) != dtype.itemsize:
        raise Refusal("numpy scalar data does not match its dtype's size")
    return NumpyScalar(dtype, raw)


def _frombuffer(buffer: object, kind: object, shape: object, order: object = "C"
                ) -> NumpyArray:
    data, dims, dtype = _bytes(buffer, "numpy buffer"), _ints(shape, "shape"), _plain(kind)
    if order not in ("C", "F") or math.prod(dims) * dtype.itemsize != len(data):
        raise Refusal("numpy array shape does not match its bytes")
    return NumpyArray(dims, dtype, order == "F", data)


def finalize(value: NumpyValue) -> Tree:
    """The real numpy value of a checked record (after the pickle has finished)."""
    import numpy as np

    dtype = getattr(value, "dtype", None)
    if isinstance(value, (NumpyScalar, NumpyArray)) and value.dtype is not None and not (
            isinstance(dtype, np.dtype) and not dtype.hasobject):
        raise Refusal("numpy data of an object dtype is refused")
    if isinstance(value, NumpyScalar):
        return np.frombuffer(value.data, dtype=value.dtype)[0]
    if isinstance(value, NumpyArray):
        if value.dtype is None:
            raise Refusal("a numpy array that was never given its data")
        flat = np.frombuffer(value.data, dtype=value.dtype)
        return flat.reshape(value.shape, order="F" if value.fortran else "C").copy()
    assert isinstance(value, NumpyDtype)
    return value.dtype


def numpy_table() -> dict[str, object]:
    """Qualified name -> what a pickle gets for numpy's names (both 1.x and 2.x spellings)."""
    table: dict[str, object] = {"numpy.ndarray": Marker("numpy.ndarray", "numpy-class"),
                             "numpy.dtype": Allowed("numpy.dtype", _dtype)}
    for core in ("numpy.core", "numpy._core"):
        for name, func in (("multiarray._reconstruct", _reconstruct),
                           ("multiarray.scalar", _scalar), ("numeric._frombuffer", _frombuffer)):
            table[f"{core}.{name}"] = Allowed(f"{core}.{name}", func)
    for name in _SCALAR_TYPES:
        table[f"numpy.{name}"] = Marker(f"numpy.{name}", "numpy-class")
    for name in ("Float16DType", "Float32DType", "Float64DType", "LongDoubleDType",
                 "Complex64DType", "Complex128DType", "CLongDoubleDType", "BoolDType",
                 "Int8DType", "Int16DType", "Int32DType", "Int64DType", "UInt8DType",
                 "UInt16DType", "UInt32DType", "UInt64DType", "ByteDType", "UByteDType",
                 "ShortDType", "UShortDType", "IntDType", "UIntDType", "LongDType",
                 "ULongDType", "LongLongDType", "ULongLongDType", "BytesDType", "StrDType",
                 "VoidDType", "DateTime64DType", "TimeDelta64DType"):
        table[f"numpy.dtypes.{name}"] = Marker(f"numpy.dtypes.{name}", "numpy-class")
    return table
