"""MXFP4 expert weights (gpt-oss, transformers' ``mxfp4`` quant method).

Layout: ``X_blocks`` (``uint8``, shape ``(experts, rows, groups, 16)``: 32
FP4 E2M1 values per group, two per byte, the low nibble first) beside
``X_scales`` (``uint8`` or ``float8_e8m0fnu``, shape ``(experts, rows,
groups)``: one power-of-two exponent per group, biased by 127).

Dequantized: each value from the E2M1 table in the target dtype,
``ldexp``'d by its group's exponent, then laid out as the model's
parameter ``X`` of shape ``(experts, groups * 32, rows)`` (transposed, as
gpt-oss's experts hold it). This is transformers'
``convert_moe_packed_tensors`` (``integrations/mxfp4.py``, what
``Mxfp4Config(dequantize=True)`` loads), step for step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import dtype_of
from ..tree import TensorLeaf
from . import Config, QuantError, QuantizedWeight, Tensors, register

if TYPE_CHECKING:
    import torch

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCKS, SCALES = "_blocks", "_scales"
EXPONENTS = frozenset({"uint8", "float8_e8m0fnu"})


@dataclass(frozen=True)
class Mxfp4:
    name: str = "mxfp4"
    reference: str = "transformers.integrations.mxfp4.convert_moe_packed_tensors"

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        for blocks_name, blocks in tensors.items():
            if not blocks_name.endswith(BLOCKS):
                continue
            name = blocks_name[:-len(BLOCKS)]
            scales = tensors.get(name + SCALES)
            if scales is None:
                if dtype_of(blocks).name == "uint8":
                    raise QuantError(f"{blocks_name}: MXFP4 blocks without their "
                                     f"{name + SCALES}")
                continue
            yield self._weight(name, blocks_name, blocks, scales)
        for scales_name in tensors:
            if scales_name.endswith(SCALES) and scales_name[:-len(SCALES)] + BLOCKS not in \
                    tensors and dtype_of(tensors[scales_name]).name in EXPONENTS \
                    and scales_name[:-len(SCALES)] not in tensors:
                raise QuantError(f"{scales_name}: MXFP4 scales without their blocks")

    def _weight(self, name: str, blocks_name: str, blocks: TensorLeaf, scales: TensorLeaf
                ) -> QuantizedWeight:
        scales_name = name + SCALES
        if dtype_of(blocks).name != "uint8":
            raise QuantError(f"{blocks_name}: MXFP4 blocks of dtype {dtype_of(blocks)} "
                             "(expected torch.uint8, two FP4 values per byte)")
        if dtype_of(scales).name not in EXPONENTS:
            raise QuantError(f"{scales_name}: MXFP4 scales of dtype {dtype_of(scales)} "
                             "(expected uint8 or float8_e8m0fnu exponents)")
        shape, grid = tuple(blocks.shape), tuple(scales.shape)
        if len(shape) != 4 or shape[:-1] != grid:
            raise QuantError(f"{blocks_name}: MXFP4 blocks of shape {list(shape)} with scales "
                             f"{list(grid)} (expected blocks (experts, rows, groups, bytes) "
                             "and scales (experts, rows, groups))")
        experts, rows, groups, width = shape
        return QuantizedWeight(self, name, (experts, groups * width * 2, rows),
                               {"blocks": blocks_name, "scales": scales_name},
                               {"group_size": width * 2, "layout": "experts, in, out"})

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch

        exponents = parts[1].view(torch.uint8).to(torch.float64) - 127
        per_value = exponents.exp2().repeat_interleave(weight.params["group_size"], dim=-1)
        return per_value.transpose(1, 2)  # (experts, groups * 32, rows), as the weight

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:
        import torch

        blocks, scales = parts
        codes = blocks.view(torch.uint8)
        exponents = scales.view(torch.uint8).to(torch.int32) - 127
        table = torch.tensor(E2M1, dtype=dtype)
        *lead, groups, width = codes.shape
        rows = codes.numel() // width
        codes = codes.reshape(rows, width)
        out = torch.empty(rows, width * 2, dtype=dtype)
        out[:, 0::2] = table[(codes & 0x0F).to(torch.int)]
        out[:, 1::2] = table[(codes >> 4).to(torch.int)]
        torch.ldexp(out, exponents.reshape(rows, 1), out=out)
        out = out.reshape(*lead, groups, width * 2).view(*lead, groups * width * 2)
        return out.transpose(1, 2).contiguous()


register(Mxfp4())
