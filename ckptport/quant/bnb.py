"""bitsandbytes 4-bit (NF4, FP4, nested statistics) and 8-bit (LLM.int8()) weights.

4-bit, as ``Linear4bit`` saves it (``QuantState.as_dict(packed=True)``):
``X.weight`` (uint8, two 4-bit codes per byte, the high nibble first),
``X.weight.absmax`` (one float32 per block of ``blocksize`` values, or
uint8 codes of them when nested), ``X.weight.quant_map`` (the 16-value
table), ``X.weight.nested_absmax`` and ``X.weight.nested_quant_map`` (the
blockwise 8-bit quantization of the absmax, plus an offset), and
``X.weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``): the JSON of the
rest (quant type, block sizes, dtype, shape, offset) as bytes.

8-bit, as ``Linear8bitLt`` saves it: ``X.weight`` (int8, row-major),
``X.SCB`` (one float32 absmax per row) and ``X.weight_format`` (0: row).

Dequantized: 4-bit, ``table[code] * absmax`` of the code's block in float32
(the absmax first dequantized from its nested codes, plus the offset), then
cast: ``bitsandbytes.functional.dequantize_4bit`` on CPU, bit for bit, in the
dtype the state records; another ``--dequantize`` dtype is that float32
result cast. 8-bit: ``codes * SCB[row] * (1/127)`` in float32, then cast
(``int8_vectorwise_dequant``, what transformers' ``dequantize_bnb_weight``
calls).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dtypes import dtype_of
from ..tree import TensorLeaf
from . import Config, QuantError, QuantizedWeight, Tensors, register

if TYPE_CHECKING:
    import torch

STATE = ".quant_state.bitsandbytes__"
MAX_STATE = 1 << 16  # the JSON of a few fields
TABLES = {  # bitsandbytes' built-in 4-bit tables (what its CPU kernels use), exactly; FP4's
    # code 8 is the encoding's negative zero: -0.0 as bitsandbytes' CUDA and scalar CPU
    # kernels give it (its AVX-512 kernel and pure-torch table give +0.0)
    "nf4": ("-0x1p+0", "-0x1.647362p-1", "-0x1.0cd66p-1", "-0x1.94654p-2", "-0x1.23449ap-2",
            "-0x1.7a6a7ep-3", "-0x1.74f0e2p-4", "0x0p+0", "0x1.45f5fep-4", "0x1.4995c6p-3",
            "0x1.f809bap-3", "0x1.5a0674p-2", "0x1.c3497p-2", "0x1.200f56p-1", "0x1.722766p-1",
            "0x1p+0"),
    "fp4": ("0x0p+0", "0x1.555556p-8", "0x1.555556p-1", "0x1p+0", "0x1.555556p-2", "0x1p-1",
            "0x1.555556p-3", "0x1p-2", "-0x0p+0", "-0x1.555556p-8", "-0x1.555556p-1", "-0x1p+0",
            "-0x1.555556p-2", "-0x1p-1", "-0x1.555556p-3", "-0x1p-2"),
}
INT8_SCALE = 7.874015718698502e-3  # bitsandbytes' 1/127
FLOATS = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Bitsandbytes:
    name: str = "bitsandbytes"
    reference: str = ("bitsandbytes.functional.dequantize_4bit / int8_vectorwise_dequant "
                      "(CPU)")

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        for name in tensors:
            if STATE in name:
                yield _four_bit(self, name, tensors)
            elif name.endswith(".SCB"):
                yield _eight_bit(self, name, tensors)
            elif name.endswith(".weight.absmax") and not any(
                    f"{name[:-len('.absmax')]}{STATE}{kind}" in tensors for kind in TABLES):
                raise QuantError(f"{name}: a bitsandbytes absmax without its quant_state")

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """A row's ``SCB / 127`` (8-bit); a block's absmax (4-bit: the table spans ±1)."""
        import torch

        named = dict(zip(weight.parts, parts, strict=True))
        if weight.params["bits"] == 8:
            return (named["SCB"].view(-1, 1) * INT8_SCALE).to(torch.float64)
        per_value = _absmax(weight, named).to(torch.float64).repeat_interleave(
            weight.params["blocksize"])
        return per_value[:math.prod(weight.shape)].reshape(weight.shape)

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:
        import torch

        named = dict(zip(weight.parts, parts, strict=True))
        params = weight.params
        if params["bits"] == 8:
            scaled = named["weight"] * named["SCB"].view(-1, 1) * INT8_SCALE
            return scaled.to(dtype)
        absmax = _absmax(weight, named)
        packed = named["weight"].contiguous().view(torch.uint8).reshape(-1)
        count = math.prod(weight.shape)
        codes4 = torch.empty(packed.numel() * 2, dtype=torch.int32)
        codes4[1::2] = packed & 0xF
        codes4[::2] = packed >> 4
        table = torch.tensor([float.fromhex(v) for v in TABLES[params["quant_type"]]],
                             dtype=torch.float32)
        values = _blockwise(table[codes4][:count], absmax.to(torch.float32),
                            params["blocksize"])
        return values.reshape(weight.shape).to(dtype)


def _absmax(weight: QuantizedWeight, named: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Each block's absmax (nested: the absmax codes dequantized blockwise, plus the
    offset, in float32)."""
    import torch

    params, absmax = weight.params, named["absmax"]
    if not params["nested"]:
        return absmax
    codes = named["nested_quant_map"].to(torch.float32)[absmax.view(torch.uint8).long()]
    nested = _blockwise(codes, named["nested_absmax"].to(torch.float32),
                        params["nested_blocksize"])
    return nested + torch.tensor(float(params["nested_offset"]))


def _blockwise(values: torch.Tensor, absmax: torch.Tensor, size: int) -> torch.Tensor:
    """Each value times its block's absmax, in float32 (the last block may be short)."""
    import torch

    count = values.numel()
    full = count - count % size
    out = torch.empty(count, dtype=torch.float32)
    out[:full] = (values[:full].view(-1, size) * absmax[:full // size].view(-1, 1)).reshape(-1)
    if full < count:
        out[full:] = values[full:] * absmax[full // size]
    return out


def _integer(leaf: TensorLeaf) -> int | None:
    from ..tensors import to_numpy

    if dtype_of(leaf).kind not in "iu" or math.prod(leaf.shape) != 1:
        return None
    return int(to_numpy(leaf).reshape(-1)[0])


def _state_of(name: str, leaf: TensorLeaf) -> dict[str, object]:
    from ..tensors import chunks

    if dtype_of(leaf).name != "uint8" or len(leaf.shape) != 1 or leaf.shape[0] > MAX_STATE:
        raise QuantError(f"{name}: a bitsandbytes quant_state of {dtype_of(leaf)}"
                         f"{list(leaf.shape)} (expected the uint8 bytes of a JSON object)")
    raw = b"".join(bytes(piece) for piece in chunks(leaf))
    try:
        state = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise QuantError(f"{name}: a bitsandbytes quant_state that is not JSON") from None
    if not isinstance(state, dict):
        raise QuantError(f"{name}: a bitsandbytes quant_state that is not a JSON object")
    return state


# Any: a quant_state field is what its check lets through (an int, a name, a list of ints),
# used as such by the caller that chose the check
def _field(name: str, state: Mapping[str, object], key: str,
           check: Callable[[Any], object]) -> Any:
    value = state.get(key)
    if not check(value):
        raise QuantError(f"{name}: quant_state field {key!r} is {value!r}")
    return value


def _four_bit(scheme: Bitsandbytes, state_name: str, tensors: Tensors) -> QuantizedWeight:
    base, _, kind = state_name.partition(STATE)
    state = _state_of(state_name, tensors[state_name])
    quant_type = _field(state_name, state, "quant_type", lambda v: v in TABLES)
    if quant_type != kind:
        raise QuantError(f"{state_name}: names {kind} but its quant_type is {quant_type}")
    blocksize = _field(state_name, state, "blocksize",
                       lambda v: type(v) is int and v in (32, 64, 128, 256, 512, 1024, 2048, 4096))
    _field(state_name, state, "dtype", lambda v: v in FLOATS)
    shape = tuple(_field(state_name, state, "shape",
                         lambda v: isinstance(v, list) and v and all(type(n) is int and n > 0
                                                                     for n in v)))
    nested = f"{base}.nested_absmax" in tensors
    count = math.prod(shape)
    roles = {"weight": base, "absmax": f"{base}.absmax", "quant_map": f"{base}.quant_map"}
    if nested:
        roles.update(nested_absmax=f"{base}.nested_absmax",
                     nested_quant_map=f"{base}.nested_quant_map")
    missing = [n for n in roles.values() if n not in tensors]
    if missing:
        raise QuantError(f"{base}: bitsandbytes 4-bit weight without its {missing[0]}")
    codes, absmax = tensors[base], tensors[f"{base}.absmax"]
    if math.prod(codes.shape) * dtype_of(codes).itemsize != -(-count // 2):
        raise QuantError(f"{base}: {math.prod(codes.shape) * dtype_of(codes).itemsize} bytes "
                         f"of 4-bit codes for a {list(shape)} weight (expected "
                         f"{-(-count // 2)})")
    blocks = -(-count // blocksize)
    if math.prod(absmax.shape) != blocks or dtype_of(absmax).name != (
            "uint8" if nested else "float32"):
        raise QuantError(f"{base}.absmax: {dtype_of(absmax)}{list(absmax.shape)} for "
                         f"{blocks} blocks of {blocksize}")
    params: dict[str, object] = {"bits": 4, "quant_type": quant_type, "blocksize": blocksize,
                              "nested": nested, "dtype": state["dtype"]}
    if nested:
        params["nested_blocksize"] = _field(state_name, state, "nested_blocksize",
                                            lambda v: type(v) is int and v > 0)
        params["nested_offset"] = _field(state_name, state, "nested_offset",
                                         lambda v: type(v) in (int, float) and math.isfinite(v))
        outer = tensors[f"{base}.nested_absmax"]
        if math.prod(outer.shape) != -(-blocks // params["nested_blocksize"]) or \
                dtype_of(outer).name != "float32" or \
                math.prod(tensors[f"{base}.nested_quant_map"].shape) != 256:
            raise QuantError(f"{base}.nested_absmax: {dtype_of(outer)}{list(outer.shape)} "
                             f"for {blocks} absmax codes in blocks of "
                             f"{params['nested_blocksize']}")
    if math.prod(tensors[f"{base}.quant_map"].shape) != 16:
        raise QuantError(f"{base}.quant_map: {list(tensors[f'{base}.quant_map'].shape)} values "
                         "(a 4-bit table has 16)")
    return QuantizedWeight(scheme, base, shape, roles, params, (state_name,))


def _eight_bit(scheme: Bitsandbytes, scb_name: str, tensors: Tensors) -> QuantizedWeight:
    module = scb_name[:-len(".SCB")]
    weight_name = f"{module}.weight"
    weight, scb = tensors.get(weight_name), tensors[scb_name]
    if weight is None:
        raise QuantError(f"{scb_name}: a bitsandbytes SCB without its weight {weight_name!r}")
    if dtype_of(weight).name != "int8" or len(weight.shape) != 2:
        raise QuantError(f"{weight_name}: has an SCB but is {dtype_of(weight)}"
                         f"{list(weight.shape)}, not 2-D int8 codes")
    if dtype_of(scb).name != "float32" or tuple(scb.shape) != (weight.shape[0],):
        raise QuantError(f"{scb_name}: {dtype_of(scb)}{list(scb.shape)} for "
                         f"{weight.shape[0]} rows (expected float32, one per row)")
    layout = tensors.get(f"{module}.weight_format")
    if layout is not None and _integer(layout) != 0:
        raise QuantError(f"{module}.weight_format: {_integer(layout)}, not 0 (row-major), the "
                         "only layout bitsandbytes loads")
    extra = tuple(n for n in (f"{module}.weight_format",) if n in tensors)
    return QuantizedWeight(scheme, weight_name, tuple(weight.shape),
                           {"weight": weight_name, "SCB": scb_name}, {"bits": 8}, extra)


register(Bitsandbytes())
