"""AutoAWQ GEMM checkpoints (``quant_method: awq``, 4-bit, ``version: gemm``).

Layout per linear ``X`` of ``K`` inputs and ``N`` outputs, groups of ``g``
inputs: ``X.qweight`` (int32 ``(K, N / 8)``: eight 4-bit codes per word,
the word's nibble ``i`` holding output ``8w + [0, 2, 4, 6, 1, 3, 5, 7][i]``),
``X.qzeros`` (int32 ``(K / g, N / 8)``, packed the same way) and
``X.scales`` (float16 ``(K / g, N)``). GPTQ's ``qweight`` is packed along the
other dimension (``(K / 8, N)``, with ``g_idx``): not this scheme.

Dequantized: ``X.weight`` of ``(N, K)`` (as ``nn.Linear`` holds it),
``(code - zero) * scale`` in the scales' dtype, then cast: what
compressed-tensors computes for the checkpoint its ``AutoAWQConverter``
makes (the unpacking and reordering above, then the pack-quantized
decompressor); AutoAWQ's own CUDA kernels are not runnable here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import (
    Config,
    QuantError,
    QuantizedWeight,
    Tensors,
    contradiction,
    int32_packs,
    packed_linears,
    register,
)

if TYPE_CHECKING:
    import torch

ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output j of a word lies in nibble ORDER[j]


@dataclass(frozen=True)
class Awq:
    name: str = "awq"
    reference: str = ("compressed_tensors AutoAWQConverter + PackedQuantizationCompressor."
                      "decompress")

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        for module, qweight, scales in packed_linears(tensors, config, "awq"):
            if f"{module}.g_idx" in tensors or qweight.shape[1] * 8 != scales.shape[1]:
                continue  # not AWQ's layout (GPTQ packs the inputs)
            yield _weight(self, module, tensors, config)

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch

        scales = parts[1]  # (K / g, N)
        return scales.to(torch.float64).repeat_interleave(weight.params["group_size"], 0).T

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:

        qweight, scales, qzeros = parts
        codes = _unpack(qweight)                      # (K, N), 0..15
        zeros = _unpack(qzeros)                       # (K / g, N)
        size = weight.params["group_size"]
        outputs, inputs = codes.shape[1], codes.shape[0]
        values = codes.T.reshape(outputs, inputs // size, size).to(scales.dtype)
        values = values - zeros.T.unsqueeze(-1).to(scales.dtype)
        made = (values * scales.T.unsqueeze(-1)).flatten(-2)
        return made.to(dtype)


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    import torch

    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF          # (rows, words, 8)
    return nibbles[..., list(ORDER)].reshape(packed.shape[0], -1).to(torch.int8)


def _weight(scheme: Awq, module: str, tensors: Tensors, config: Config | None
            ) -> QuantizedWeight:
    qweight, qzeros, scales = int32_packs("AWQ", module, tensors)
    inputs, outputs = qweight.shape[0], scales.shape[1]
    groups = scales.shape[0]
    if not groups or inputs % groups or tuple(qzeros.shape) != (groups, outputs // 8):
        raise QuantError(f"{module}.scales: {list(scales.shape)} scales and "
                         f"{list(qzeros.shape)} zeros do not group the {inputs} inputs "
                         f"(qweight {list(qweight.shape)})")
    size = inputs // groups
    if config and config.get("quant_method") == "awq":
        claims = {"bits": 4, "group_size": size, "version": "gemm", "zero_point": True}
        for key, have in claims.items():
            if key in config and config[key] != have:
                raise contradiction(module, key, config[key], have)
    return QuantizedWeight(scheme, f"{module}.weight", (outputs, inputs),
                           {"qweight": f"{module}.qweight", "scales": f"{module}.scales",
                            "qzeros": f"{module}.qzeros"},
                           {"bits": 4, "group_size": size, "version": "gemm"})


register(Awq())
