"""FP8 block-scaled weights (DeepSeek-V3/R1, Qwen3-FP8, transformers' ``fp8`` quant method).

Layout: ``X.weight`` in ``float8_e4m3fn`` (or another FP8 format) of shape
``(..., N, K)`` beside ``X.weight_scale_inv`` of shape
``(..., ceil(N / bm), ceil(K / bn))`` for blocks of ``bm x bn``
(``quantization_config.weight_block_size``, 128 x 128 in every released
model), or a single element for a per-tensor scale. The scale is float32,
bfloat16, ``float8_e8m0fnu`` or ``uint8`` E8M0 exponents (``2 ** (byte -
127)``, as transformers reads MXFP8 checkpoints). ``X.activation_scale``
(static activation quantization) is consumed too.

Dequantized: each code times its block's scale, in float32, then rounded
once to the target dtype; the weight keeps its name and shape. This is
transformers' ``Fp8Dequantize`` (``integrations/finegrained_fp8.py``,
``from_pretrained(..., quantization_config=FineGrainedFP8Config(dequantize=
True))``); blocks cut short at the edge of a weight whose shape the block
does not divide are scaled as DeepSeek's ``weight_dequant`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import dtype_of
from ..tree import TensorLeaf
from . import Config, QuantError, QuantizedWeight, Tensors, ceil_div, register, spread

if TYPE_CHECKING:
    import torch

FP8 = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})
SCALES = frozenset({"float32", "bfloat16", "float16", "float8_e8m0fnu", "uint8"})
SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)
CHUNK_ELEMENTS = 1 << 22  # dequantized 16 MiB of float32 at a time: memory stays near the output


@dataclass(frozen=True)
class Fp8Block:
    name: str = "fp8-block"
    reference: str = "transformers.integrations.finegrained_fp8.Fp8Dequantize"

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        block = _configured_block(config)
        for scale_name, scale in tensors.items():
            if not scale_name.endswith(SUFFIX):
                continue
            name = scale_name[:-len(SUFFIX)]
            weight = tensors.get(name)
            if weight is None:
                raise QuantError(f"{scale_name}: an FP8 block scale without its weight {name!r}")
            yield self._weight(name, weight, scale_name, scale, block, tensors)

    def _weight(self, name: str, weight: TensorLeaf, scale_name: str, scale: TensorLeaf,
                block: tuple[int, int] | None, tensors: Tensors) -> QuantizedWeight:
        codes, scales = dtype_of(weight), dtype_of(scale)
        if codes.name not in FP8:
            raise QuantError(f"{name}: has a {SUFFIX} scale but is {codes}, not an FP8 dtype")
        if scales.name not in SCALES:
            raise QuantError(f"{scale_name}: an FP8 block scale of dtype {scales} (expected "
                             "float32, bfloat16, float16 or E8M0)")
        shape, grid = tuple(weight.shape), tuple(scale.shape)
        if len(shape) < 2 and not _single(grid):
            raise QuantError(f"{name}: a block-scaled FP8 weight of shape {list(shape)} "
                             "(expected at least 2 dimensions)")
        params: dict[str, object] = {"format": codes.name, "scale_dtype": scales.name}
        if _single(grid):
            params["block_size"] = None
        else:
            found = _block(shape, grid, block)
            if found is None:
                want = block or DEFAULT_BLOCK
                tiles = [*shape[:-2], ceil_div(shape[-2], want[0]), ceil_div(shape[-1], want[1])]
                raise QuantError(
                    f"{name}: scale {scale_name} of shape {list(grid)} does not tile the "
                    f"weight's {list(shape)} in {want[0]}x{want[1]} blocks (expected {tiles})")
            params["block_size"] = list(found)
        prefix = name.rsplit(".", 1)[0] + "." if "." in name else ""
        extra = tuple(n for n in (f"{prefix}activation_scale",) if n in tensors)
        return QuantizedWeight(self, name, shape, {"codes": name, "scale": scale_name},
                               params, extra)

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        block = weight.params["block_size"]
        factor = _factor(parts[1])
        return factor.double().reshape(()) if block is None else \
            spread(factor, block, weight.shape)

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:
        import torch

        codes, scale = parts
        factor = _factor(scale)
        block = weight.params["block_size"]
        if block is None:
            return (codes.to(torch.float32) * factor.reshape(())).to(dtype)
        out = torch.empty(codes.shape, dtype=dtype)
        rows = codes.shape[-2]
        bm = block[0]
        step = bm * max(1, CHUNK_ELEMENTS // (bm * max(1, codes[..., :1, :].numel())))
        for start in range(0, rows, step):  # 16 MiB of float32 at a time, not the weight
            stop = min(rows, start + step)
            grid = factor[..., start // bm:-(-stop // bm), :]
            out[..., start:stop, :].copy_(_scaled(codes[..., start:stop, :], grid, block))
        return out


def _factor(scale: torch.Tensor) -> torch.Tensor:
    """The blocks' scales in float32 (uint8 E8M0 exponents as ``2 ** (byte - 127)``)."""
    import torch

    return (scale.to(torch.float32) - 127.0).exp2() if scale.dtype == torch.uint8 \
        else scale.to(torch.float32)


def _scaled(codes: torch.Tensor, grid: torch.Tensor, block: list[int]) -> torch.Tensor:
    """Codes times their blocks' scales, in float32 (rows starting at a block boundary)."""
    import torch

    values = codes.to(torch.float32)
    *lead, rows, cols = values.shape
    grid_rows, grid_cols = grid.shape[-2:]
    bm, bn = block
    if rows == grid_rows * bm and cols == grid_cols * bn:  # whole blocks: one broadcast
        blocks = values.view(*lead, grid_rows, bm, grid_cols, bn)
        blocks.mul_(grid.reshape(*lead, grid_rows, 1, grid_cols, 1))
        return values
    spread = grid.repeat_interleave(bm, dim=-2)[..., :rows, :]
    return values.mul_(spread.repeat_interleave(bn, dim=-1)[..., :cols])


def _single(grid: tuple[int, ...]) -> bool:
    return all(n == 1 for n in grid)


def _configured_block(config: Config | None) -> tuple[int, int] | None:
    if not config or config.get("quant_method") != "fp8":
        return None
    block = config.get("weight_block_size")
    if block is None:
        return None
    if not (isinstance(block, list) and len(block) == 2
            and all(type(n) is int and n > 0 for n in block)):
        raise QuantError(f"config.json quantization_config.weight_block_size {block!r} is not "
                         "two positive integers")
    return (block[0], block[1])


def _block(shape: tuple[int, ...], grid: tuple[int, ...],
           configured: tuple[int, int] | None) -> tuple[int, int] | None:
    """The block size the scale grid tiles the weight with: the configured one, else 128x128,
    else the one whole blocks of the grid give (as transformers derives it)."""
    if len(grid) != len(shape) or grid[:-2] != shape[:-2]:
        return None
    rows, cols = shape[-2:]
    bm, bn = configured or DEFAULT_BLOCK
    if grid[-2:] == (ceil_div(rows, bm), ceil_div(cols, bn)):
        return (bm, bn)
    if configured is None and all(grid[-2:]) and rows % grid[-2] == 0 and cols % grid[-1] == 0:
        return (rows // grid[-2], cols // grid[-1])
    return None


register(Fp8Block())
