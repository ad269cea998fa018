"""NVIDIA ModelOpt's NVFP4 (``export_hf_checkpoint``, ``quant_algo: NVFP4``).

Layout per linear ``X`` of ``N`` outputs and ``K`` inputs: ``X.weight``
(``uint8`` ``(N, K / 2)``: two FP4 E2M1 values a byte, the low nibble
first), ``X.weight_scale`` (``float8_e4m3fn`` ``(N, K / 16)``: one scale per
16 values), ``X.weight_scale_2`` (``float32``, one element: the per-tensor
scale) and ``X.input_scale`` (the static activation scale, consumed), with
``self_attn.{k,v}_proj.{k,v}_scale`` for an FP8 KV cache (consumed). The
model folder says so in ``hf_quant_config.json`` (``quantization.quant_algo:
NVFP4``, ``group_size: 16``) and, from ModelOpt 0.29 on, in ``config.json``'s
``quantization_config`` (``quant_method: modelopt``); compressed-tensors'
NVFP4 names the same parts ``weight_packed`` / ``weight_global_scale``
(``compressed.py``).

Dequantized: what compressed-tensors computes for the checkpoint its
``ModelOptNvfp4Converter`` makes (``weight_global_scale = 1 / weight_scale_2``,
as vLLM reads ModelOpt's scales; the weight renamed ``weight_packed``), then
its NVFP4 decompressor, in bfloat16, then cast (``compressed.nvfp4_dequantized``).
transformers has no ModelOpt integration to compare with (5.24's ``nvfp4`` method
quantizes on load with a CUDA Hub kernel).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dtypes import dtype_of
from . import Config, QuantError, QuantizedWeight, Tensors, register
from .compressed import NVFP4_GROUP, config_group, nvfp4_dequantized, nvfp4_step

if TYPE_CHECKING:
    import torch

CONSUMED = ("input_scale", "k_scale", "v_scale")


def modelopt_config(config: Config | None) -> Config | None:
    """The config when ModelOpt wrote it: ``quant_method: modelopt`` (``config.json`` of
    0.29 on, or ``hf_quant_config.json`` as ``config_of`` reads it), or ``quant_library``
    / ``producer.name`` saying so (the exports in between)."""
    if not config:
        return None
    producer = config.get("producer")
    name = producer.get("name") if isinstance(producer, dict) else None
    if "modelopt" in (config.get("quant_method"), config.get("quant_library"), name):
        return config
    return None


@dataclass(frozen=True)
class ModelOptNvfp4:
    name: str = "modelopt-nvfp4"
    reference: str = ("compressed_tensors ModelOptNvfp4Converter + NVFP4PackedCompressor."
                      "decompress")

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]:
        claimed = modelopt_config(config)
        for name in tensors:
            module, _, local = name.rpartition(".")
            if local == "weight_scale_2":
                yield self._weight(module, tensors, claimed)
            elif local == "weight_scale" and f"{module}.weight_scale_2" not in tensors:
                weight = tensors.get(f"{module}.weight")
                if weight is not None and dtype_of(weight).name == "uint8":
                    raise QuantError(f"{module}.weight: NVFP4 codes and their weight_scale "
                                     f"without {module}.weight_scale_2 (the per-tensor scale)")

    def _weight(self, module: str, tensors: Tensors, config: Config | None
                ) -> QuantizedWeight:
        codes, scale = tensors.get(f"{module}.weight"), tensors.get(f"{module}.weight_scale")
        second = tensors[f"{module}.weight_scale_2"]
        if codes is None or scale is None:
            raise QuantError(f"{module}.weight_scale_2: an NVFP4 per-tensor scale without "
                             f"its {module}.weight and {module}.weight_scale")
        if f"{module}.pre_quant_scale" in tensors:
            raise QuantError(f"{module}.pre_quant_scale: NVFP4_AWQ's activation pre-scale, "
                             "which a plain weight would have to absorb; ckptport does not "
                             "dequantize it (no reference library does)")
        if dtype_of(codes).name != "uint8" or len(codes.shape) != 2:
            raise QuantError(f"{module}.weight: NVFP4 codes of {dtype_of(codes)}"
                             f"{list(codes.shape)} (expected 2-D torch.uint8, two values a "
                             "byte)")
        rows, cols = codes.shape[0], codes.shape[1] * 2
        if dtype_of(scale).name != "float8_e4m3fn" or cols % NVFP4_GROUP or \
                tuple(scale.shape) != (rows, cols // NVFP4_GROUP):
            raise QuantError(f"{module}.weight_scale: NVFP4 scales of {dtype_of(scale)}"
                             f"{list(scale.shape)} for a [{rows}, {cols}] weight (expected "
                             f"float8_e4m3fn [{rows}, {cols // NVFP4_GROUP}])")
        count = 1
        for n in second.shape:
            count *= n
        if dtype_of(second).name != "float32" or count != 1:
            raise QuantError(f"{module}.weight_scale_2: a per-tensor scale of "
                             f"{dtype_of(second)}{list(second.shape)} (expected one float32)")
        if config is not None:
            _agrees(module, config)
        prefix = f"{module}."
        return QuantizedWeight(
            self, f"{module}.weight", (rows, cols),
            {"weight": f"{module}.weight", "weight_scale": f"{module}.weight_scale",
             "weight_scale_2": f"{module}.weight_scale_2"},
            {"quant_algo": "NVFP4", "num_bits": 4, "group_size": NVFP4_GROUP,
             "scale_dtype": "float8_e4m3fn"},
            tuple(prefix + n for n in CONSUMED if prefix + n in tensors))

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        _, scale, second = parts
        return nvfp4_step(scale, 1 / second)

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor:
        codes, scale, second = parts
        return nvfp4_dequantized(codes, scale, 1 / second).to(dtype)


def _agrees(module: str, config: Config) -> None:
    """The algorithm and group size ModelOpt's config claims for ``module`` are NVFP4's
    (a ``MIXED_PRECISION`` export says so per layer, under ``quantized_layers``)."""
    claims: Config = config
    layers = config.get("quantized_layers")
    if config.get("quant_algo") == "MIXED_PRECISION" and isinstance(layers, dict):
        layer = layers.get(module)
        if not isinstance(layer, dict):
            return  # a layer the config does not list: the tensors decide
        claims = layer
    algo = claims.get("quant_algo")
    if algo is not None and algo != "NVFP4":
        raise QuantError(f"{module}: ModelOpt's config says quant_algo {algo!r}, the tensors "
                         "are NVFP4 (weight, weight_scale, weight_scale_2)")
    size = claims.get("group_size", _group_size(claims))
    if size is not None and size != NVFP4_GROUP:
        raise QuantError(f"{module}: ModelOpt's config says group_size {size!r}, the tensors "
                         f"say {NVFP4_GROUP}")


def _group_size(config: Config) -> object:
    """The weights' group size of a ``config.json`` ModelOpt wrote (one config group)."""
    found = config_group(config)
    return None if found is None else found[1].get("group_size")


register(ModelOptNvfp4())
