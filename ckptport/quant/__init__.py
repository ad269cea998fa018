"""Quantization schemes are codecs: recognized from names, dtypes and ``quantization_config``.

A quantized checkpoint stores a weight as several tensors (FP8 codes and a
block scale, packed FP4 blocks and E8M0 exponents, …) whose values mean
nothing alone: casting the codes as numbers, or the scales, silently gives
wrong weights. Each scheme is one module in this package that knows its
names, its dtypes and its reference dequantization, and registers itself
(``register``); nothing else lists them. ``recognize`` asks every scheme
which tensors of a state dict are its parts, and refuses a tensor two
schemes claim.

A scheme's ``find`` returns ``QuantizedWeight`` records (which tensors make
one weight, the scheme's parameters, the dequantized name and shape) and
raises ``QuantError`` for parts that cannot be dequantized correctly (a
scale whose shape does not tile its weight, a scale without its weight);
``dequantize`` computes the weight from real tensors exactly as the
scheme's reference library does on CPU.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

from ..dtypes import dtype_of
from ..errors import InputError
from ..remote.urls import Where
from ..tree import StateDict, TensorLeaf, is_tensor

if TYPE_CHECKING:
    import torch

__all__ = ["Scheme", "Stepped", "QuantizedWeight", "Recognition", "QuantError", "register",
           "SCHEMES", "recognize", "config_of", "packed_linears", "int32_packs", "spread",
           "contradiction", "ceil_div", "DEQUANTIZE_CHOICES", "FLOAT_SCALES", "Tensors",
           "Config", "Params"]

DEQUANTIZE_CHOICES = ("bfloat16", "float16", "float32")
FLOAT_SCALES = frozenset({"float16", "bfloat16", "float32"})
"""The dtypes a scheme's float scales are stored in (FP8 and E8M0 scales are a scheme's own)."""

Tensors: TypeAlias = Mapping[str, TensorLeaf]
"""A state dict's tensors by name: what a scheme looks for its parts in."""

Config: TypeAlias = Mapping[str, object]
"""A model folder's ``quantization_config`` (JSON values: each scheme narrows what it reads)."""

# Any: each scheme's own parameters (ints, strings, lists and flags of its layout), which
# only that scheme reads back, in find's and dequantize's arithmetic
Params: TypeAlias = Mapping[str, Any]
_MAX_CONFIG = 1 << 20  # a model's config.json is kilobytes


class QuantError(InputError):
    """A quantized checkpoint that cannot be dequantized correctly (or cast at all)."""


def contradiction(module: str, key: str, claim: object, have: object) -> QuantError:
    """A ``quantization_config`` claim about ``module`` that its tensors refute: refused in
    the same words by every scheme that holds the config to its tensors."""
    return QuantError(f"{module}: config.json quantization_config says {key} {claim!r}, the "
                      f"tensors say {have!r}")


def ceil_div(a: int, b: int) -> int:
    """How many blocks of ``b`` cover ``a`` (the last one cut short)."""
    return -(-a // b)


@dataclass(frozen=True)
class QuantizedWeight:
    """One quantized weight: the tensors it is made of and what it dequantizes to.

    ``parts`` maps each role (``codes``, ``scale``, …) to a tensor name of
    the state dict, in the order ``dequantize`` takes them; ``extra`` names
    tensors the scheme consumes without needing them (activation scales).
    ``name`` and ``shape`` are what the reference library's dequantized
    model calls and shapes the weight.
    """

    scheme: Scheme
    name: str
    shape: tuple[int, ...]
    parts: Mapping[str, str]
    params: Params = field(default_factory=dict)
    extra: tuple[str, ...] = ()

    @property
    def tensors(self) -> tuple[str, ...]:
        return (*self.parts.values(), *self.extra)

    @property
    def guess(self) -> str | None:
        """What the scheme had to assume for this weight (``params["guess"]``), which every
        report of its dequantization states: a guess is never silent."""
        guess = self.params.get("guess")
        return guess if isinstance(guess, str) else None

    def describe(self) -> dict[str, object]:
        return {"scheme": self.scheme.name, "weight": self.name, "shape": list(self.shape),
                "params": dict(self.params), "tensors": dict(self.parts),
                **({"consumed": list(self.extra)} if self.extra else {})}


class Scheme(Protocol):
    """A quantization scheme: how its weights are recognized and dequantized."""

    @property
    def name(self) -> str: ...

    @property
    def reference(self) -> str:
        """The library function whose output ``dequantize`` equals."""

    def find(self, tensors: Tensors, config: Config | None) -> Iterator[QuantizedWeight]: ...

    def dequantize(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...],
                   dtype: torch.dtype) -> torch.Tensor: ...


@runtime_checkable
class Stepped(Scheme, Protocol):
    """A scheme whose codes are multiplied by a scale: ``diff --dequantize`` reports errors
    in units of it (a scheme without one gets the usual figures only)."""

    def step(self, weight: QuantizedWeight, parts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The quantization step of each element of the dequantized weight: the scale its
        code is multiplied by (a block's, a group's, a row's), float64, broadcastable to
        the weight's shape."""


SCHEMES: dict[str, Scheme] = {}


def register(scheme: Scheme) -> Scheme:
    SCHEMES[scheme.name] = scheme
    return scheme


@dataclass(frozen=True)
class Recognition:
    """Every quantized weight of a state dict, and which tensor belongs to which."""

    weights: tuple[QuantizedWeight, ...] = ()
    owner: Mapping[str, QuantizedWeight] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.weights)

    def counts(self) -> dict[str, int]:
        counted: dict[str, int] = {}
        for weight in self.weights:
            counted[weight.scheme.name] = counted.get(weight.scheme.name, 0) + 1
        return counted

    def describe(self) -> dict[str, object]:
        """What reports and manifests record: per scheme, its weights and their parts."""
        return {"schemes": self.counts(), "weights": [w.describe() for w in self.weights]}


def recognize(state: StateDict, config: Config | None = None,
              path: str | os.PathLike[str] | None = None) -> Recognition:
    """The quantized weights among a state dict's tensors (its other values are no part).

    Raises ``QuantError`` naming the file, the weight and the cause when a
    scheme's parts cannot be dequantized correctly, or when two schemes
    claim one tensor (a mixed checkpoint ckptport cannot tell apart).
    """
    tensors = {name: value for name, value in state.items() if is_tensor(value)}
    weights: list[QuantizedWeight] = []
    owner: dict[str, QuantizedWeight] = {}
    for scheme in SCHEMES.values():
        try:
            found = list(scheme.find(tensors, config))
        except QuantError as exc:
            raise QuantError(exc.message, path) from None
        for weight in found:
            for name in weight.tensors:
                other = owner.get(name)
                if other is not None:
                    raise QuantError(f"tensor {name!r} is part of a {other.scheme.name} weight "
                                     f"({other.name}) and of a {weight.scheme.name} weight "
                                     f"({weight.name}): mixed schemes", path)
                owner[name] = weight
            weights.append(weight)
    return Recognition(tuple(weights), owner)


def packed_linears(tensors: Tensors, config: Config | None,
                   method: str) -> Iterator[tuple[str, TensorLeaf, TensorLeaf]]:
    """(module, qweight, scales) for each 2-D ``X.qweight`` beside a 2-D ``X.scales``: the
    candidates of the int32-pack schemes (AWQ, GPTQ), which tell themselves apart by which
    dimension the pack shrinks. None when the config names another ``quant_method``."""
    if config and config.get("quant_method") not in (None, method):
        return
    for name in tensors:
        if not name.endswith(".qweight"):
            continue
        module = name[:-len(".qweight")]
        qweight, scales = tensors[name], tensors.get(f"{module}.scales")
        if scales is not None and len(qweight.shape) == 2 and len(scales.shape) == 2:
            yield module, qweight, scales


def int32_packs(scheme: str, module: str, tensors: Tensors
                ) -> tuple[TensorLeaf, TensorLeaf, TensorLeaf]:
    """``module``'s ``qweight``, ``qzeros`` and ``scales`` once an int32-pack scheme (AWQ,
    GPTQ: ``scheme`` names it in messages) has claimed its layout, held to what both
    require: zero points present, both packs int32, the scales a float dtype."""
    qweight, scales = tensors[f"{module}.qweight"], tensors[f"{module}.scales"]
    qzeros = tensors.get(f"{module}.qzeros")
    if qzeros is None:
        raise QuantError(f"{module}.qweight: {scheme} codes without their {module}.qzeros")
    if dtype_of(qweight).name != "int32" or dtype_of(qzeros).name != "int32":
        raise QuantError(f"{module}.qweight: {scheme} packs of {dtype_of(qweight)} and "
                         f"{dtype_of(qzeros)} (expected torch.int32)")
    if dtype_of(scales).name not in FLOAT_SCALES:
        raise QuantError(f"{module}.scales: {scheme} scales of dtype {dtype_of(scales)}")
    return qweight, qzeros, scales


def config_of(path: Where | None) -> Config | None:
    """The quantization config of the model folder beside (or holding) a local checkpoint.

    ``config.json``'s ``quantization_config``; where it has none, ModelOpt's
    ``hf_quant_config.json`` (its ``quantization`` entry, marked ``quant_method:
    modelopt``, as ModelOpt's newer exports write into ``config.json`` themselves). A
    remote source's config is not fetched (a request the transfer report would not
    count, for a claim the tensors must make anyway): its tensors alone decide."""
    if not isinstance(path, Path):  # None, or remote
        return None
    folder = path if path.is_dir() else path.parent
    found = _json_entry(folder / "config.json", "quantization_config")
    if found is None:
        modelopt = _json_entry(folder / "hf_quant_config.json", "quantization")
        found = None if modelopt is None else {**modelopt, "quant_method": "modelopt"}
    return found


def _json_entry(path: Path, key: str) -> dict[str, object] | None:
    """``key`` of the JSON object in ``path``, when both are there (else the tensors decide)."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_CONFIG:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None  # not a model's config: the tensors alone decide
    found = doc.get(key) if isinstance(doc, dict) else None
    return found if isinstance(found, dict) else None


def spread(grid: torch.Tensor, block: tuple[int, int], shape: tuple[int, ...]
           ) -> torch.Tensor:
    """A grid of per-block values (the last two dimensions, ``block`` rows by columns) laid
    over each element of ``shape`` (edge blocks cut short), as float64."""
    import torch

    rows, cols = shape[-2:]
    wide = grid.to(torch.float64)
    wide = wide.repeat_interleave(block[0], dim=-2)[..., :rows, :]
    return wide.repeat_interleave(block[1], dim=-1)[..., :cols]


def _load_schemes() -> None:
    """The scheme modules, each registering itself: a new scheme is one module and one line."""
    from . import awq, bnb, compressed, fp8_block, gptq, modelopt, mxfp4, torchao  # noqa: F401


_load_schemes()
