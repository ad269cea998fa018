"""compressed-tensors checkpoints (llm-compressor, vLLM's format): three layouts per module ``X``.

- ``float-quantized`` / ``int-quantized`` / ``naive-quantized``:
  ``X.weight`` holds FP8 (or int8) codes, ``X.weight_scale`` one scale per
  tensor ``(1,)``, per row ``(N, 1)``, per group ``(N, K / g)`` or per block
  ``(ceil(N / bm), ceil(K / bn))``, and ``X.weight_zero_point`` the zero
  points of an asymmetric scheme;
- ``pack-quantized`` (W4A16, W8A16, …): ``X.weight_packed`` (int32) holds
  ``b``-bit integers densely, element ``i`` of a row at bit ``i * b`` (little
  endian), offset by ``2 ** (b - 1)``; ``X.weight_shape`` the unpacked shape;
  zero points are packed the same way along the rows;
- ``nvfp4-pack-quantized``: ``X.weight_packed`` (uint8, two FP4 E2M1 values
  per byte, low nibble first), ``X.weight_scale`` (FP8, one per 16 values)
  and ``X.weight_global_scale`` (float32).

The layout and its parameters come from the tensors (dtypes and shapes fix
the bits, the group and the block); a model folder's ``quantization_config``
is checked against them, and a contradiction is refused. Activation qparams
(``X.input_scale`` and the like) are consumed.

Dequantized: compressed-tensors' own arithmetic, operation for operation
(``compressors.*.decompress`` then ``.to(dtype)``, as its
``CompressedTensorsDequantizer`` does): codes and zero points in the scale's
dtype, ``(codes - zero_point) * scale`` there (the NVFP4 scale divided by
the global scale first), then cast. The weight is ``X.weight``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import dtype_of
from ..tree import TensorLeaf
from . import (
    FLOAT_SCALES,
    Config,
    Params,
    QuantError,
    QuantizedWeight,
    Tensors,
    ceil_div,
    contradiction,
    register,
    spread,
)

if TYPE_CHECKING:
    import torch

ACTIVATION_QPARAMS = ("input_scale", "input_zero_point", "input_global_scale",
                      "output_scale", "output_zero_point")
FLOAT_CODES = frozenset({"float8_e4m3fn", "float8_e5m2"})
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_GROUP = 16
MX_GROUP = 32


@dataclass(frozen=True)
class CompressedTensors:
    name: str = "compressed-tensors"
    reference: str = ("compressed_tensors.entrypoints.convert.CompressedTensorsDequantizer "
                      "(compressors' decompress)")

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        for name, scale in tensors.items():
            module, _, local = name.rpartition(".")
            if local != "weight_scale":
                continue
            weight = self._weight(module, scale, tensors, _configured_weights(config))
            if weight is not None:
                yield weight

    def _weight(self, module: str, scale: TensorLeaf, tensors: Tensors,
                configured: Config | None) -> QuantizedWeight | None:
        def part(local: str) -> TensorLeaf | None:
            return tensors.get(f"{module}.{local}")

        extra = tuple(f"{module}.{n}" for n in ACTIVATION_QPARAMS if part(n) is not None)
        roles: tuple[str, ...]
        packed, codes, zero = part("weight_packed"), part("weight"), part("weight_zero_point")
        if part("weight_scale_2") is not None or codes is not None and \
                dtype_of(codes).name == "uint8":  # ModelOpt's NVFP4 (modelopt.py)
            return None
        if packed is not None and part("weight_global_scale") is not None:
            made = _nvfp4(module, packed, scale)
            roles = ("weight_packed", "weight_scale", "weight_global_scale")
        elif packed is not None and dtype_of(packed).name == "uint8":
            made = _mxfp4(module, packed, scale)
            roles = ("weight_packed", "weight_scale")
        elif packed is not None:
            made = _packed(module, packed, scale, part("weight_shape"), zero,
                           (configured or {}).get("num_bits"))
            roles = ("weight_packed", "weight_scale", "weight_zero_point")
        elif codes is not None:
            made = _naive(module, codes, scale, zero)
            roles = ("weight", "weight_scale", "weight_zero_point")
        else:
            raise QuantError(f"{module}.weight_scale: a weight scale without its weight "
                             f"({module}.weight or {module}.weight_packed)")
        shape, params = made
        if configured is not None:
            _agrees(module, params, configured)
        parts = {role: f"{module}.{role}" for role in roles if part(role) is not None}
        if part("weight_shape") is not None:
            extra = (f"{module}.weight_shape", *extra)
        return QuantizedWeight(self, f"{module}.weight", shape, parts, params, extra)

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch

        named = dict(zip(weight.parts, parts, strict=True))
        params, scale = weight.params, named["weight_scale"]
        if params["format"] == "nvfp4-pack-quantized":
            return nvfp4_step(scale, named["weight_global_scale"])
        if params["format"] in ("mxfp4-pack-quantized", "mxfp8-quantized"):
            scale = 2.0 ** (scale.to(torch.int32) - 127).to(torch.float64)
        wide = scale.to(torch.float64)
        strategy = params["strategy"]
        if strategy == "group":
            return wide.repeat_interleave(params["group_size"], dim=-1)
        if strategy == "block":
            return spread(wide, tuple(params["block_structure"]), weight.shape)
        return wide.reshape(()) if strategy == "tensor" else wide  # a row's: (N, 1)

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:
        import torch

        named = dict(zip(weight.parts, parts, strict=True))
        params = weight.params
        scale = named["weight_scale"]
        if params["format"] == "nvfp4-pack-quantized":
            return nvfp4_dequantized(named["weight_packed"], scale,
                                     named["weight_global_scale"]).to(dtype)
        if params["format"] == "mxfp4-pack-quantized":
            values = _unpack_fp4(named["weight_packed"])
            scale = (2.0 ** (scale.to(torch.int32) - 127).to(torch.bfloat16)).to(torch.bfloat16)
            grouped = values.reshape(*values.shape[:-1], -1, MX_GROUP)
            made = (grouped.to(scale.dtype) * scale.unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
            return made.to(dtype)
        if params["format"] == "pack-quantized":
            codes = _unpack_ints(named["weight_packed"], params["num_bits"], weight.shape[-1])
            zero = named.get("weight_zero_point")
            if zero is not None:
                zero = _unpack_ints(zero.transpose(0, 1), params["num_bits"],
                                    scale.shape[0]).transpose(0, 1)
        else:
            codes, zero = named["weight"], named.get("weight_zero_point")
            if params["format"] == "mxfp8-quantized":  # E8M0 exponents, as bfloat16 scales
                scale = 2.0 ** (scale.to(torch.int32) - 127).to(torch.bfloat16)
        return _affine(codes, scale, zero, params).to(dtype)


def nvfp4_step(scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Each NVFP4 value's scale, as ``nvfp4_dequantized`` multiplies it (float64)."""
    import torch

    grid = scale.to(torch.bfloat16) / global_scale
    return grid.to(torch.float64).repeat_interleave(NVFP4_GROUP, dim=-1)


def nvfp4_dequantized(packed: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor
                      ) -> torch.Tensor:
    """NVFP4 as compressed-tensors' ``NVFP4PackedCompressor.decompress`` computes it, in
    bfloat16: each E2M1 value times its group's FP8 scale divided by the global scale (the
    division's dtype is torch's promotion of the two, as the global scale is stored)."""
    import torch

    values = _unpack_fp4(packed)
    grid = scale.to(torch.bfloat16).unsqueeze(-1) / global_scale
    grouped = values.reshape(*values.shape[:-1], -1, NVFP4_GROUP)
    return (grouped.to(grid.dtype) * grid).flatten(-2).to(torch.bfloat16)


def _affine(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
            params: Params) -> torch.Tensor:
    """``(codes - zero) * scale`` in the scale's dtype, each element with its own scale."""
    rows, cols = codes.shape[-2:]
    strategy = params["strategy"]
    if strategy == "group":
        size = params["group_size"]
        values = codes.reshape(*codes.shape[:-1], cols // size, size).to(scale.dtype)
        if zero is not None:
            values = values - zero.unsqueeze(-1).to(scale.dtype)
        return (values * scale.unsqueeze(-1)).flatten(-2)
    if strategy == "block":
        bm, bn = params["block_structure"]
        scale = scale.repeat_interleave(bm, 0)[:rows].repeat_interleave(bn, 1)[:, :cols]
        if zero is not None:
            zero = zero.repeat_interleave(bm, 0)[:rows].repeat_interleave(bn, 1)[:, :cols]
    values = codes.to(scale.dtype)
    if zero is not None:
        values = values - zero.to(scale.dtype)
    return values * scale


def _unpack_ints(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The ``count`` first ``bits``-bit integers of each row, offset back to signed int8."""
    import torch

    rows = packed.shape[0]
    raw = packed.contiguous().view(torch.uint8).reshape(rows, -1)  # little-endian words
    shifts = torch.arange(8, dtype=torch.uint8)
    stream = ((raw.unsqueeze(-1) >> shifts) & 1).reshape(rows, -1)[:, :count * bits]
    weights = torch.tensor([1 << i for i in range(bits)], dtype=torch.int32)
    values = (stream.reshape(rows, count, bits).to(torch.int32) * weights).sum(-1)
    return (values - (1 << (bits - 1))).to(torch.int8)


def _unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    import torch

    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)
    magnitude = torch.tensor(E2M1, dtype=torch.float32)[(codes & 0x07).long()]
    signed = magnitude * torch.where((codes & 0x08).bool(), -1.0, 1.0)
    return signed.to(torch.bfloat16)


def _naive(module: str, weight: TensorLeaf, scale: TensorLeaf, zero: TensorLeaf | None
           ) -> tuple[tuple[int, ...], dict[str, object]]:
    codes = dtype_of(weight).name
    if codes not in FLOAT_CODES and codes != "int8":
        raise QuantError(f"{module}.weight: has a weight_scale but is {dtype_of(weight)}, not "
                         "FP8 or int8 codes")
    exponents = codes in FLOAT_CODES and dtype_of(scale).name == "uint8"  # MXFP8's E8M0
    if not exponents:
        _scale_dtype(module, scale)
    shape = tuple(weight.shape)
    if len(shape) != 2:
        raise QuantError(f"{module}.weight: quantized codes of shape {list(shape)} (expected "
                         "2 dimensions)")
    kind = "mxfp8-quantized" if exponents else \
        "float-quantized" if codes in FLOAT_CODES else "int-quantized"
    params: dict[str, object] = {"format": kind, "type": "float" if codes in FLOAT_CODES else
                              "int", "num_bits": 8, **_strategy(module, shape, scale)}
    if exponents and params.get("group_size") != MX_GROUP:
        raise QuantError(f"{module}.weight_scale: MXFP8 exponents of shape "
                         f"{list(scale.shape)} for a {list(shape)} weight (expected one per "
                         f"{MX_GROUP} values)")
    _zero_points(module, zero, tuple(scale.shape), params)
    return shape, params


def _packed(module: str, packed: TensorLeaf, scale: TensorLeaf, shape_leaf: TensorLeaf | None,
            zero: TensorLeaf | None, configured_bits: object
            ) -> tuple[tuple[int, ...], dict[str, object]]:
    if dtype_of(packed).name != "int32":
        raise QuantError(f"{module}.weight_packed: pack-quantized codes of dtype "
                         f"{dtype_of(packed)} (expected torch.int32)")
    if shape_leaf is None or dtype_of(shape_leaf).name not in ("int64", "int32") or \
            tuple(shape_leaf.shape) != (2,):
        raise QuantError(f"{module}.weight_shape: pack-quantized weights need their unpacked "
                         "shape as two integers")
    _scale_dtype(module, scale)
    rows, cols = _shape_values(shape_leaf)
    words = tuple(packed.shape)
    fits = [b for b in range(1, 9) if len(words) == 2 and words == (rows, ceil_div(cols * b, 32))]
    if not fits:
        raise QuantError(f"{module}.weight_packed: {list(words)} int32 words cannot hold a "
                         f"densely packed [{rows}, {cols}] weight of 1 to 8 bits")
    if isinstance(configured_bits, int) and configured_bits in fits:
        bits = configured_bits
    elif len(fits) == 1:
        bits = fits[0]
    else:
        raise QuantError(f"{module}.weight_packed: {list(words)} words fit {fits[0]} to "
                         f"{fits[-1]} bits; config.json's quantization_config must say which")
    params: dict[str, object] = {"format": "pack-quantized", "type": "int", "num_bits": bits,
                              **_strategy(module, (rows, cols), scale)}
    if params["strategy"] == "block":
        raise QuantError(f"{module}.weight_scale: pack-quantized weights have no block scales")
    if zero is not None:
        grid = tuple(scale.shape)
        if dtype_of(zero).name != "int32" or tuple(zero.shape) != (ceil_div(grid[0] * bits, 32),
                                                                   grid[1]):
            raise QuantError(f"{module}.weight_zero_point: packed zero points of "
                             f"{dtype_of(zero)}{list(zero.shape)} do not match scales "
                             f"{list(grid)} of {bits} bits")
    params["symmetric"] = zero is None
    return (rows, cols), params


def _nvfp4(module: str, packed: TensorLeaf, scale: TensorLeaf
           ) -> tuple[tuple[int, ...], dict[str, object]]:
    if dtype_of(packed).name != "uint8" or len(packed.shape) != 2:
        raise QuantError(f"{module}.weight_packed: NVFP4 codes of "
                         f"{dtype_of(packed)}{list(packed.shape)} (expected 2-D torch.uint8)")
    rows, cols = packed.shape[0], packed.shape[1] * 2
    if dtype_of(scale).name != "float8_e4m3fn" or tuple(scale.shape) != (
            rows, ceil_div(cols, NVFP4_GROUP)) or cols % NVFP4_GROUP:
        raise QuantError(f"{module}.weight_scale: NVFP4 scales of "
                         f"{dtype_of(scale)}{list(scale.shape)} for a [{rows}, {cols}] weight "
                         f"(expected float8_e4m3fn [{rows}, {cols // NVFP4_GROUP}])")
    return (rows, cols), {"format": "nvfp4-pack-quantized", "type": "float", "num_bits": 4,
                          "strategy": "tensor_group", "group_size": NVFP4_GROUP,
                          "symmetric": True}


def _mxfp4(module: str, packed: TensorLeaf, scale: TensorLeaf
           ) -> tuple[tuple[int, ...], dict[str, object]]:
    if len(packed.shape) != 2:
        raise QuantError(f"{module}.weight_packed: MXFP4 codes of shape {list(packed.shape)} "
                         "(expected 2-D)")
    rows, cols = packed.shape[0], packed.shape[1] * 2
    if dtype_of(scale).name != "uint8" or cols % MX_GROUP or \
            tuple(scale.shape) != (rows, cols // MX_GROUP):
        raise QuantError(f"{module}.weight_scale: MXFP4 scales of "
                         f"{dtype_of(scale)}{list(scale.shape)} for a [{rows}, {cols}] weight "
                         f"(expected uint8 exponents [{rows}, {cols // MX_GROUP}])")
    return (rows, cols), {"format": "mxfp4-pack-quantized", "type": "float", "num_bits": 4,
                          "strategy": "group", "group_size": MX_GROUP, "symmetric": True}


def _shape_values(leaf: TensorLeaf) -> tuple[int, int]:
    from ..tensors import to_numpy

    rows, cols = (int(n) for n in to_numpy(leaf).tolist())
    return rows, cols


def _scale_dtype(module: str, scale: TensorLeaf) -> None:
    if dtype_of(scale).name not in FLOAT_SCALES:
        raise QuantError(f"{module}.weight_scale: a scale of dtype {dtype_of(scale)} (expected "
                         "float32, bfloat16 or float16)")


def _strategy(module: str, shape: tuple[int, ...], scale: TensorLeaf) -> dict[str, object]:
    """How the scale grid tiles a (rows, cols) weight: tensor, channel, group or block."""
    rows, cols = shape
    grid = tuple(scale.shape)
    if all(n == 1 for n in grid) and len(grid) <= 2 and rows != 1:
        return {"strategy": "tensor"}
    if grid == (rows, 1):
        return {"strategy": "channel"}
    if len(grid) == 2 and grid[0] == rows and grid[1] and cols % grid[1] == 0:
        return {"strategy": "group", "group_size": cols // grid[1]}
    if len(grid) == 2 and all(grid):
        bm, bn = ceil_div(rows, grid[0]), ceil_div(cols, grid[1])
        if (ceil_div(rows, bm), ceil_div(cols, bn)) == grid:
            return {"strategy": "block", "block_structure": [bm, bn]}
    raise QuantError(f"{module}.weight_scale: scales of shape {list(grid)} do not tile the "
                     f"[{rows}, {cols}] weight per tensor, row, group or block")


def _zero_points(module: str, zero: TensorLeaf | None, grid: tuple[int, ...],
                 params: dict[str, object]) -> None:
    params["symmetric"] = zero is None
    if zero is not None and tuple(zero.shape) != grid:
        raise QuantError(f"{module}.weight_zero_point: zero points of shape "
                         f"{list(zero.shape)} for scales {list(grid)}")


def _configured_weights(config: Config | None) -> Config | None:
    """The weights' arguments of a compressed-tensors config with one config group."""
    if not config or config.get("quant_method") != "compressed-tensors":
        return None
    found = config_group(config)
    if found is None:
        return None
    group, weights = found
    return {**weights, "format": group.get("format") or config.get("format")}


def config_group(config: Config) -> tuple[Config, Config] | None:
    """The one group of a ``config_groups`` config (compressed-tensors' layout, which
    ModelOpt's ``config.json`` follows) and its ``weights`` arguments; None where there are
    several (they target different modules: the tensors decide) or no weights."""
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        return None
    (group,) = groups.values()
    weights = group.get("weights") if isinstance(group, dict) else None
    return (group, weights) if isinstance(weights, dict) else None


def _agrees(module: str, found: Config, configured: Config) -> None:
    """The config's claims the tensors can be held to: a contradiction is refused (one group
    per row is a channel scale either way)."""
    kinds: dict[object, object] = {"group": "channel"}
    for key in ("num_bits", "type", "strategy", "symmetric", "format", "group_size"):
        claim, have = configured.get(key), found.get(key)
        if claim is None or have is None or (key == "format" and claim == "naive-quantized"):
            continue
        if key == "strategy":
            claim, have = kinds.get(claim, claim), kinds.get(have, have)
        if key == "group_size" and found["strategy"] != "group":
            continue
        if claim != have:
            raise contradiction(module, key, claim, found[key])


register(CompressedTensors())
