"""GPTQ checkpoints (AutoGPTQ, GPTQModel, optimum: ``quant_method: gptq``), 2/3/4/8-bit.

Layout per linear ``X`` of ``K`` inputs and ``N`` outputs, ``G`` groups of
inputs: ``X.qweight`` (int32 ``(K * bits / 32, N)``: each column a dense
little-endian bit stream of its ``K`` codes, input ``k`` at bit
``k * bits``; 3-bit codes straddle words), ``X.qzeros`` (int32
``(G, N * bits / 32)``, each row the stream of its ``N`` zero points),
``X.scales`` (float16 ``(G, N)``) and ``X.g_idx`` (int32 ``(K,)``: the
group of each input; act-order, ``desc_act``, permutes it). AWQ's
``qweight`` is packed along the outputs instead: not this scheme.

Zero points: ``checkpoint_format: gptq`` (v1, AutoGPTQ's and the default
when the config does not say) stores each zero point minus one, and the
dequantizer adds it back after unpacking (a stored 15 of 4 bits is a zero
point of 16, not 0); ``gptq_v2`` (GPTQModel) stores it as is. Reading one
convention as the other shifts every weight by one step (vllm 38966).

Dequantized: ``X.weight`` of ``(N, K)`` (as ``nn.Linear`` holds it),
``scales[g_idx[k]] * (code - zero[g_idx[k]])`` with the difference taken in
integers, multiplied in the scales' dtype (one rounding), then cast: what
GPTQModel's pure-torch ``TorchLinear.dequantize_weight`` gives (the tests'
oracle, GPTQModel 7.6 on the CPU) and AutoGPTQ's formula, with ``g_idx``
honoured (dropping it scrambles act-order models: onnxruntime mobius 733).
Without ``g_idx``, input ``k`` is in group ``k // (K / G)``. A v1 zero
point stored as all ones is ``2**bits``, as AutoGPTQ's CUDA kernels read
it; GPTQModel wraps it to 0 (docs/quantized.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import dtype_of
from ..tree import TensorLeaf
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

BITS = (2, 3, 4, 8)
FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> what was subtracted when stored


@dataclass(frozen=True)
class Gptq:
    name: str = "gptq"
    reference: str = ("AutoGPTQ / GPTQModel dequantize_weight: scales[g_idx] * "
                      "(codes - zeros[g_idx]), v1 zeros stored minus one")

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        for module, qweight, scales in packed_linears(tensors, config, "gptq"):
            if qweight.shape[1] == scales.shape[1]:  # else AWQ's layout (it packs the outputs)
                yield _weight(self, module, tensors, config)

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        import torch

        scales = parts[2]
        return scales.T[:, _groups(parts, weight.shape[1])].to(torch.float64)

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:
        qweight, qzeros, scales, *_ = parts
        params = weight.params
        bits, (outputs, inputs) = params["bits"], weight.shape
        codes = _unpack(qweight.T, bits, inputs)                    # (N, K)
        zeros = _unpack(qzeros, bits, outputs) + FORMATS[params["checkpoint_format"]]
        groups = _groups(parts, inputs)
        steps = codes - zeros.T[:, groups]                            # (N, K), integers
        return (steps.to(scales.dtype) * scales.T[:, groups]).to(dtype)


def _groups(parts: tuple[torch.Tensor, ...], inputs: int) -> torch.Tensor:
    """The group of each input: ``g_idx`` where there is one, else in order."""
    import torch

    scales, rest = parts[2], parts[3:]
    return rest[0].long() if rest else torch.arange(inputs) // (inputs // scales.shape[0])


def _unpack(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first ``count`` ``bits``-wide codes of each row's little-endian bit stream."""
    import torch

    words = packed.to(torch.int64) & 0xFFFFFFFF
    pairs = words | (torch.nn.functional.pad(words[:, 1:], (0, 1)) << 32)
    offsets = torch.arange(count) * bits
    chosen = pairs[:, offsets // 32] >> (offsets % 32)
    return (chosen & ((1 << bits) - 1)).to(torch.int16)


def _weight(scheme: Gptq, module: str, tensors: Tensors, config: Config | None
            ) -> QuantizedWeight:
    qweight, qzeros, scales = int32_packs("GPTQ", module, tensors)
    g_idx, where = tensors.get(f"{module}.g_idx"), f"{module}.qweight"
    groups, outputs = scales.shape
    if len(qzeros.shape) != 2 or qzeros.shape[0] != groups or not groups or \
            (qzeros.shape[1] * 32) % outputs or (qzeros.shape[1] * 32) // outputs not in BITS:
        raise QuantError(f"{module}.qzeros: {list(qzeros.shape)} zeros do not pack the "
                         f"{list(scales.shape)} scales at 2, 3, 4 or 8 bits")
    bits = qzeros.shape[1] * 32 // outputs
    inputs, rest = divmod(qweight.shape[0] * 32, bits)
    if rest or groups > inputs:
        raise QuantError(f"{where}: {list(qweight.shape)} words of {bits}-bit codes do not "
                         f"hold whole inputs for {groups} groups (at the width "
                         f"{module}.qzeros packs)")
    parts = {"qweight": where, "qzeros": f"{module}.qzeros", "scales": f"{module}.scales"}
    if g_idx is not None:
        _check_groups(module, g_idx, inputs, groups)
        parts["g_idx"] = f"{module}.g_idx"
    elif inputs % groups:
        raise QuantError(f"{where}: {groups} groups do not divide the {inputs} inputs and "
                         f"there is no {module}.g_idx")
    size = inputs // groups if groups > 1 else -1
    checkpoint_format, desc_act = "gptq", False
    if config and config.get("quant_method") == "gptq":
        checkpoint_format, desc_act = _held_to(module, config, bits, inputs, groups,
                                               g_idx is not None)
        if config.get("sym") is True:
            _check_symmetric(module, qzeros, bits, checkpoint_format)
    params = {"bits": bits, "group_size": size, "desc_act": desc_act,
              "checkpoint_format": checkpoint_format}
    return QuantizedWeight(scheme, f"{module}.weight", (outputs, inputs), parts, params)


def _held_to(module: str, config: Config, bits: int, inputs: int, groups: int,
             indexed: bool) -> tuple[str, bool]:
    """The config's claims the tensors bear out (a contradiction is refused)."""
    if config.get("bits", bits) != bits:
        raise contradiction(module, "bits", config["bits"], bits)
    size = config.get("group_size", -1)
    expected = 1 if size in (-1, None) else (-(-inputs // size) if isinstance(size, int)
                                              and size > 0 else None)
    if expected != groups:
        # no group_size in the config means one group per row (GPTQ's -1)
        raise contradiction(module, "group_size", config.get("group_size", -1),
                            f"{groups} groups of {inputs} inputs")
    found = config.get("checkpoint_format", "gptq")
    if not isinstance(found, str) or found not in FORMATS:
        raise QuantError(f"{module}: config.json quantization_config checkpoint_format "
                         f"{found!r} (expected 'gptq' or 'gptq_v2')")
    desc_act = bool(config.get("desc_act", False))
    if desc_act and not indexed:
        raise QuantError(f"{module}: config.json says desc_act but there is no {module}.g_idx "
                         "(the inputs' groups are lost)")
    return found, desc_act


def _check_groups(module: str, g_idx: TensorLeaf, inputs: int, groups: int) -> None:
    import numpy as np

    from ..tensors import chunks

    name = f"{module}.g_idx"
    if dtype_of(g_idx).name != "int32" or tuple(g_idx.shape) != (inputs,):
        raise QuantError(f"{name}: a GPTQ g_idx of {dtype_of(g_idx)} {list(g_idx.shape)} "
                         f"(expected torch.int32 [{inputs}], one group per input)")
    index = np.frombuffer(b"".join(bytes(p) for p in chunks(g_idx)), dtype="<i4")
    if index.size and (int(index.min()) < 0 or int(index.max()) >= groups):
        raise QuantError(f"{name}: group indices {int(index.min())}..{int(index.max())} "
                         f"outside the {groups} groups of {module}.scales")


def _check_symmetric(module: str, qzeros: TensorLeaf, bits: int, checkpoint_format: str
                     ) -> None:
    """``sym: true``: every stored zero point is the midpoint (minus one in v1)."""
    import numpy as np

    from ..tensors import chunks

    stored = (1 << (bits - 1)) - FORMATS[checkpoint_format]
    stream = sum(stored << (bits * i) for i in range(32))      # 32 codes fill `bits` words
    pattern = np.array([(stream >> (32 * i)) & 0xFFFFFFFF for i in range(bits)], dtype="<u4")
    words = np.frombuffer(b"".join(bytes(p) for p in chunks(qzeros)), dtype="<u4")
    width = qzeros.shape[1]
    expected = np.resize(pattern, width)
    if words.size and not (words.reshape(-1, width) == expected).all():
        raise QuantError(f"{module}.qzeros: config.json says sym with checkpoint_format "
                         f"{checkpoint_format!r}, but the zero points are not all {stored} "
                         "as stored (the other GPTQ zero-point convention?)")


register(Gptq())
