"""torchao tensor subclasses: ``Int8Tensor``, ``Float8Tensor``, ``IntxUnpackedToInt8Tensor``.

Read in torchao's flattened layout (``quant.torchao_layout``: ``M._W_qdata``,
``M._W_scale``, ... and each weight's class and attributes as JSON metadata), whether the
file was a ``.pth`` of the subclasses or torchao's safetensors.

Dequantized, ``M.W`` is torchao's own ``dequantize()`` on the CPU:
``Int8Tensor`` and ``IntxUnpackedToInt8Tensor`` by ``dequantize_affine``
(``(code - zero_point)`` in the output dtype, times the block's scale, cast);
``Float8Tensor`` by ``_dequantize_affine_float8`` (code in float32 times the
block's scale, cast). ``Int8Tensor`` and ``Float8Tensor`` take the output dtype
(``dequantize(output_dtype)``); ``IntxUnpackedToInt8Tensor.dequantize()`` gives
its recorded ``dtype`` only, so other dtypes are that result cast.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import dtype_of
from ..tree import TensorLeaf
from . import FLOAT_SCALES, Config, QuantError, QuantizedWeight, Tensors, register
from .torchao_layout import CONSUMED_PARTS, DATA_PARTS, described, inner_part, part_name

if TYPE_CHECKING:
    import torch

__all__ = ["Torchao"]

_FP8 = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})
_AFFINE = frozenset({"Int8Tensor", "IntxUnpackedToInt8Tensor"})
_OUTPUTS = frozenset({"float32", "bfloat16", "float16"})  # what dequantize_affine accepts


# -- the scheme ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Torchao:
    name: str = "torchao"
    reference: str = ("torchao.quantization Int8Tensor / Float8Tensor / "
                      "IntxUnpackedToInt8Tensor .dequantize()")

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        docs, prefix = (config or {}).get("torchao"), (config or {}).get("torchao_prefix")
        for qname in tensors:
            inner = inner_part(qname)
            if inner is None:
                continue
            if inner[1] != "qdata":
                codes = part_name(inner[0], "qdata")
                if isinstance(docs, dict) and codes not in tensors:
                    raise QuantError(f"{qname}: the {inner[1]} of torchao weight {inner[0]} "
                                     f"without its codes {codes}")
                continue
            doc = described(inner[0], docs, str(prefix or "")) if isinstance(docs, dict) \
                else None
            yield _weight(self, inner[0], tensors, doc)

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:
        import torch

        qdata, scale, *rest = parts
        block = tuple(weight.params["block_size"])
        if weight.params["class"] == "Float8Tensor":
            return _float8(qdata, scale, block, dtype)
        zero = rest[0] if "zero_point" in weight.parts else None
        if weight.params["class"] == "IntxUnpackedToInt8Tensor":  # dequantize(): its dtype only
            own = getattr(torch, weight.params["dtype"])
            return _affine(qdata, scale, zero, block, own).to(dtype)
        return _affine(qdata, scale, zero, block, dtype)


def _weight(scheme: Torchao, weight: str, tensors: Mapping[str, TensorLeaf],
            doc: Mapping[str, object] | None) -> QuantizedWeight:
    """The parts of ``weight`` and its parameters, held to what torchao's classes hold."""
    names = {p: part_name(weight, p) for p in (*DATA_PARTS, *CONSUMED_PARTS)}
    present = {p: n for p, n in names.items() if n in tensors}
    if "scale" not in present:
        raise QuantError(f"{names['qdata']}: a torchao weight's codes without their scale "
                         f"{names['scale']}")
    qdata, scale = tensors[present["qdata"]], tensors[present["scale"]]
    codes, scales = dtype_of(qdata), dtype_of(scale)
    found = doc.get("_data") if doc else None
    data: Mapping[str, object] = found if isinstance(found, dict) else {}
    kind = str(doc["_type"]) if doc else ("Float8Tensor" if codes.name in _FP8 else "Int8Tensor")
    want = "an FP8 dtype" if kind == "Float8Tensor" else "int8"
    if (codes.name in _FP8) != (kind == "Float8Tensor") or (kind in _AFFINE
                                                            and codes.name != "int8"):
        raise QuantError(f"{present['qdata']}: a torchao {kind}'s codes are {codes}, not {want}")
    if scales.name not in FLOAT_SCALES:
        raise QuantError(f"{present['scale']}: a torchao {kind}'s scale is {scales}, not "
                         "float32, bfloat16 or float16")
    shape = tuple(qdata.shape)
    block = _block(weight, kind, shape, tuple(scale.shape), data.get("block_size"))
    if kind in _AFFINE:
        _zero_point(weight, kind, tensors, present, tuple(scale.shape))
    elif "zero_point" in present:
        raise QuantError(f"{present['zero_point']}: a torchao Float8Tensor has no zero point")
    params: dict[str, object] = {"class": kind, "block_size": list(block), "codes": codes.name,
                              "scale_dtype": scales.name}
    dtype = _own_dtype(weight, kind, data.get("dtype"))
    if dtype is not None:
        params["dtype"] = dtype
    if doc is None:  # a guess the report must show (QuantizedWeight.guess)
        params["guess"] = (f"no torchao metadata: read as a {kind} from its codes' dtype (an "
                           "IntxUnpackedToInt8Tensor of another dtype differs by one rounding)")
    for key in ("act_quant_kwargs", "activation_quantization"):
        if data.get(key):
            params["activation"] = _activation(data[key])
    parts = {p: present[p] for p in DATA_PARTS if p in present}
    extra = tuple(present[p] for p in CONSUMED_PARTS if p in present)
    return QuantizedWeight(scheme, weight, shape, parts, params, extra)


def _block(weight: str, kind: str, shape: tuple[int, ...], grid: tuple[int, ...],
           claimed: object) -> tuple[int, ...]:
    """The block the scale grid tiles the codes with: each dimension of the codes a whole
    number of the scale's (a scale of one element: the whole tensor), and the block size
    torchao recorded, where it did, that one."""
    if math.prod(grid) == 1:
        found = shape
    elif len(grid) != len(shape) or any(g == 0 or n % g for n, g in zip(shape, grid,
                                                                        strict=True)):
        raise QuantError(f"{weight}: a torchao {kind}'s scale of shape {list(grid)} does not "
                         f"tile its codes' {list(shape)}")
    else:
        found = tuple(n // g for n, g in zip(shape, grid, strict=True))
    if claimed is None:
        return found
    if not (isinstance(claimed, list) and len(claimed) == len(shape)
            and all(type(b) is int and b > 0 for b in claimed)):
        raise QuantError(f"{weight}: a torchao {kind} whose block_size {claimed!r} is not one "
                         f"positive integer per dimension of its codes {list(shape)}")
    if tuple(claimed) != found:
        raise QuantError(f"{weight}: a torchao {kind} with block_size {claimed} whose scale of "
                         f"shape {list(grid)} tiles its codes {list(shape)} in blocks of "
                         f"{list(found)}")
    return found


def _zero_point(weight: str, kind: str, tensors: Mapping[str, TensorLeaf],
                present: Mapping[str, str],
                grid: tuple[int, ...]) -> None:
    name = present.get("zero_point")
    if name is None:
        if kind == "IntxUnpackedToInt8Tensor":
            raise QuantError(f"{weight}: a torchao {kind} without its zero point "
                             f"{part_name(weight, 'zero_point')}")
        return
    zero = tensors[name]
    if tuple(zero.shape) != grid or dtype_of(zero).kind not in "iuf":
        raise QuantError(f"{name}: a torchao {kind}'s zero point of {dtype_of(zero)}"
                         f"{list(zero.shape)} does not match its scale's {list(grid)}")


def _own_dtype(weight: str, kind: str, value: object) -> str | None:
    """The dtype a subclass dequantizes to by default, as its metadata records it; held to
    what torchao can give where ``dequantize()`` gives that dtype only."""
    name = value.get("_data") if isinstance(value, dict) else None
    if kind != "IntxUnpackedToInt8Tensor":
        return name if isinstance(name, str) else None
    if name is None:
        raise QuantError(f"{weight}: a torchao {kind} whose metadata records no dtype "
                         "(its dequantize() gives that dtype only)")
    if name not in _OUTPUTS:
        raise QuantError(f"{weight}: a torchao {kind} of dtype {name!r} (torchao dequantizes "
                         f"to {', '.join(sorted(_OUTPUTS))})")
    return str(name)


def _activation(value: object) -> str:
    """How the weight's activations are quantized, for reports: the kwargs' class or name."""
    return str(value.get("_type")) if isinstance(value, dict) else str(value)


def _affine(qdata: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
            block: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torchao's ``_dequantize_affine_no_dtype_check``, step by step (its roundings)."""
    split, after = [], []
    for n, b in zip(qdata.shape, block, strict=True):
        if b != n and b > 1:
            split += [n // b, b]
            after += [n // b, 1]
        else:
            split.append(n)
            after.append(1 if b != 1 else n)
    values = qdata.reshape(split).to(dtype, copy=True)
    if zero is not None:
        values = values - zero.reshape(after).to(dtype)
    values = values * scale.reshape(after)
    return values.reshape(qdata.shape).to(dtype)


def _float8(qdata: torch.Tensor, scale: torch.Tensor, block: tuple[int, ...],
            dtype: torch.dtype) -> torch.Tensor:
    """torchao's ``_dequantize_affine_float8``: codes in float32 times the block's scale
    (broadcast, as its ``_maybe_expand_scale_to_tensor_shape`` expands it), cast."""
    import torch

    values = qdata.to(torch.float32)
    if scale.numel() == 1:
        return (values * scale.reshape([1] * qdata.dim())).to(dtype)
    split = [d for n, b in zip(qdata.shape, block, strict=True) for d in (n // b, b)]
    spread = [d for n, b in zip(qdata.shape, block, strict=True) for d in (n // b, 1)]
    return (values.reshape(split) * scale.reshape(spread)).reshape(qdata.shape).to(dtype)


register(Torchao())
