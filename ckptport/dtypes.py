"""safetensors dtype codes and their torch dtypes.

Only codes that this torch build has a dtype for are listed, so a writer
can tell up front which tensors a safetensors file cannot hold.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from .safetensors_layout import ITEMSIZE

if TYPE_CHECKING:
    import torch

__all__ = ["torch_dtype", "dtype_code"]

_TORCH_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
assert set(_TORCH_NAMES) == set(ITEMSIZE)  # a code table edited in one place only


@cache
def _table() -> dict[str, torch.dtype]:
    import torch

    return {code: getattr(torch, name) for code, name in _TORCH_NAMES.items()
            if hasattr(torch, name)}


def torch_dtype(code: str) -> torch.dtype:
    return _table()[code]


def dtype_code(dtype: torch.dtype) -> str | None:
    """The safetensors code of ``dtype``, or None where the format has none."""
    for code, candidate in _table().items():
        if candidate == dtype:
            return code
    return None
