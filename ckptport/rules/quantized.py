"""Quantized weights in the rules: dequantized on request, never cast as numbers.

``--dequantize DTYPE`` replaces each quantized weight's tensors (codes,
scales, zero points, …) with the one plain tensor its scheme's reference
library computes, under the name that library's dequantized model uses; the
value is a ``Computed`` leaf, made one weight at a time when written.
``--dtype`` runs after it and refuses to touch codes or scales that are
still there: what it would write is a wrong weight with exit 0.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..checkpoint import Checkpoint
from ..dtypes import DTYPES, DType, dtype_of
from ..errors import CkptportError, OptionError
from ..quant import (
    DEQUANTIZE_CHOICES,
    QuantError,
    QuantizedWeight,
    Recognition,
    Stepped,
    config_of,
    recognize,
)
from ..quant.torchao_layout import torchao_config
from ..remote.urls import Where
from ..tensors import Computed, to_torch
from ..tree import (
    KeyPath,
    StateDict,
    TensorLeaf,
    Tree,
    format_path,
    is_tensor,
    iter_tensors,
    rebuild_dict,
    replace_state_dicts,
    state_dicts,
)
from .base import Change, RuleResult

if TYPE_CHECKING:
    import torch

__all__ = ["Dequantize", "Dequantizer", "recognized", "refuse_cast", "quantization_of",
           "plain_config", "quantization_steps"]


def recognized(checkpoint: Checkpoint) -> list[tuple[str, Recognition]]:
    """Each state dict's quantized weights (by its path), with the checkpoint's config."""
    config = config_of(checkpoint.source.path)
    found = []
    for path, state in state_dicts(checkpoint.tree):
        recognition = recognize(state, torchao_config(config, checkpoint.source.metadata,
                                                      _prefix(path)), checkpoint.source.path)
        if recognition:
            found.append((_prefix(path), recognition))
    return found


def quantization_of(checkpoint: Checkpoint) -> dict[str, object]:
    """What reports and manifests record of a checkpoint's quantized weights: per scheme the
    count, per weight its tensors and parameters; a report of a file that cannot be
    dequantized says why instead of failing."""
    try:
        found = recognized(checkpoint)
    except CkptportError as exc:
        return {"error": exc.message}
    weights = [{**w.describe(), "weight": f"{prefix}.{w.name}" if prefix else w.name}
               for prefix, recognition in found for w in recognition.weights]
    schemes: dict[str, int] = {}
    for _, recognition in found:
        for scheme, count in recognition.counts().items():
            schemes[scheme] = schemes.get(scheme, 0) + count
    return {"schemes": schemes, "weights": weights} if weights else {}


def refuse_cast(checkpoint: Checkpoint, target: DType, dtypes: Mapping[str, DType],
                casts: set[str]) -> None:
    """Raise ``QuantError`` when ``casts`` (tensor paths, of ``dtypes``: every tensor's) touch
    a quantized part.

    Codes and scales of a recognized scheme are refused by name; a dtype
    that only means something through a scheme (E8M0, packed FP4/FP6) is
    refused wherever it is.
    """
    if not casts:
        return
    for prefix, recognition in recognized(checkpoint):
        for name, weight in recognition.owner.items():
            where = f"{prefix}.{name}" if prefix else name
            if where in casts:
                raise QuantError(
                    f"{where}: --dtype {target.name} would cast the {dtypes[where]} part of "
                    f"{weight.scheme.name} weight {weight.name} as numbers; dequantize it "
                    f"with --dequantize {target.name} (its scheme's reference values)",
                    checkpoint.source.path)
    unknown_parts = unrecognized_parts(dtypes)
    for where in sorted(casts):
        dtype = dtypes[where]
        unknown = unknown_parts.get(where)
        if unknown:
            raise QuantError(f"{where}: --dtype {target.name} would cast it, but its module "
                             f"also holds {unknown}: the parts of a quantized weight of a "
                             "scheme ckptport does not dequantize; cast nothing (--dtype "
                             "keep)", checkpoint.source.path)
        if dtype.is_code:
            raise QuantError(f"{where}: --dtype {target.name} would cast {dtype} codes as "
                             "numbers (they only mean something through a quantization "
                             "scheme); keep them (--dtype keep) or --dequantize a scheme "
                             "ckptport recognizes", checkpoint.source.path)


MODEL_CONFIG = "config.json"


def plain_config(source: Where | None, results: Iterable[RuleResult]) -> bytes | None:
    """The model folder's ``config.json`` without its ``quantization_config``, when
    ``--dequantize`` made quantized weights plain (None otherwise, or with no config there):
    what a dequantized model folder needs for ``from_pretrained`` to load it as a plain
    model. ModelOpt's ``hf_quant_config.json`` has no place in it.

    Raises ``QuantError`` when the config is there but not a JSON object: the output
    would not load as a plain model, and nothing has been written yet."""
    if not isinstance(source, Path) or not any(  # None, or remote
            r.rule == "dequantize" and r.details.get("schemes") for r in results):
        return None
    path = (source if source.is_dir() else source.parent) / MODEL_CONFIG
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise QuantError(f"cannot be read as JSON ({exc}); the dequantized folder needs it "
                         "without its quantization_config", path) from None
    if not isinstance(doc, dict):
        raise QuantError("is not a JSON object; the dequantized folder needs it without its "
                         "quantization_config", path)
    doc.pop("quantization_config", None)
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


_QPARAM_WORDS = ("scale", "zero_point", "absmax", "SCB", "qzeros", "quant_state", "quant_map")


def unrecognized_parts(tensors: Mapping[str, DType]) -> dict[str, str]:
    """The tensors that look like parts of a quantized weight no scheme claimed, each with
    why: its module holds both quantization parameters (a scale, zero points) and
    low-precision codes (FP8 or integers), as HQQ's layout and every scheme's parts do.
    One pass over the names, grouped by module."""
    modules: dict[str, list[str]] = {}
    with_codes: dict[str, str] = {}  # module -> its first low-precision tensor
    for name, dtype in tensors.items():
        module = name.rpartition(".")[0]
        modules.setdefault(module, []).append(name)
        if module not in with_codes and (dtype.kind in "iu" or dtype.name.startswith("float8")):
            with_codes[module] = name
    found: dict[str, str] = {}
    for module, first_code in with_codes.items():
        names = modules[module]
        qparams = [n for n in names if any(w in n.rpartition(".")[2] for w in _QPARAM_WORDS)]
        if qparams:
            codes = [n for n in names if tensors[n].kind in "iu"
                     or tensors[n].name.startswith("float8")]
            found.update((n, f"{qparams[0]} and {first_code}") for n in (*qparams, *codes))
    return found


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_OWN_PAGES = 1 << 20


@cache
def _return_freed_weights() -> None:
    """Have glibc give each dequantized weight's memory back when it is freed.

    Its mmap threshold grows to the largest block freed, so after the first
    weight every weight-sized buffer comes from the heap, and the heap of
    each thread keeps them: measured, verification on two threads then holds
    twice the memory of the weights it computes. A fixed 1 MiB threshold
    maps every larger buffer on its own. Elsewhere (no glibc), nothing.
    """
    try:
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, _OWN_PAGES)
    except (OSError, AttributeError):
        pass


def _prefix(path: KeyPath) -> str:
    return format_path(path) if path else ""


@dataclass(frozen=True)
class Dequantizer:
    """A ``Computed`` leaf's recipe for one quantized weight: kept as data, so that what
    reads the leaf (``diff``'s error in quantization steps) knows the weight it makes."""

    weight: QuantizedWeight
    dtype: torch.dtype

    def __call__(self, *parts: torch.Tensor) -> torch.Tensor:
        return self.weight.scheme.dequantize(self.weight, parts, self.dtype)


def quantization_steps(a: TensorLeaf, b: TensorLeaf) -> float | None:
    """The largest ``|a - b|`` in units of the quantization step of each element, where
    ``--dequantize`` computed ``a`` (else ``b``); None when neither side was. Two NaNs
    count as equal, one NaN as infinitely far."""
    made = next((leaf for leaf in (a, b) if isinstance(leaf, Computed)
                 and isinstance(leaf.compute, Dequantizer)), None)
    if made is None:
        return None
    import torch

    recipe = made.compute
    assert isinstance(recipe, Dequantizer)
    scheme = recipe.weight.scheme
    if not isinstance(scheme, Stepped):
        return None
    parts = tuple(to_torch(part) for part in made.inputs)
    step = scheme.step(recipe.weight, parts)
    x, y = (to_torch(leaf).to(torch.float64) for leaf in (a, b))
    ratio = (x - y).abs() / step
    ratio = torch.where(x.isnan() & y.isnan(), 0.0, ratio.nan_to_num(nan=torch.inf))
    return float(ratio.max()) if ratio.numel() else 0.0


@dataclass(frozen=True)
class Dequantize:
    """``--dequantize DTYPE``: every recognized quantized weight becomes one plain tensor."""

    dtype: str | None = None
    lazy: bool = False
    name: str = "dequantize"

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DEQUANTIZE_CHOICES:
            raise OptionError(f"--dequantize must be one of {', '.join(DEQUANTIZE_CHOICES)}, "
                              f"not {self.dtype!r}")

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        if self.dtype is None:
            return checkpoint, RuleResult(self.name, summary="quantized weights kept")
        target = DTYPES[self.dtype]
        found = dict(recognized(checkpoint))
        if found:
            _return_freed_weights()
        changes: list[Change] = []
        counts: dict[str, int] = {}
        guessed_at: list[str] = []

        def edit(path: KeyPath, state: StateDict) -> Tree:
            prefix = _prefix(path)
            recognition = found.get(prefix)
            if recognition is None:
                return state
            made: dict[str, tuple[str, Tree]] = {}
            for weight in recognition.weights:
                parts = tuple(state[n] for n in weight.parts.values())
                assert all(is_tensor(p) for p in parts)  # recognize names tensors only
                made[weight.parts[next(iter(weight.parts))]] = (weight.name, self._leaf(
                    weight, target, cast("tuple[TensorLeaf, ...]", parts)))
                counts[weight.scheme.name] = counts.get(weight.scheme.name, 0) + 1
                where = f"{prefix}.{weight.name}" if prefix else weight.name
                guessed = f" (guessed: {weight.guess})" if weight.guess else ""
                if guessed:
                    guessed_at.append(where)
                changes.append(Change(where, "dequantized",
                                      f"{weight.scheme.name} {', '.join(weight.tensors)} -> "
                                      f"{target}{list(weight.shape)}{guessed}"))
            items: list[tuple[str, Tree]] = []
            for key, value in state.items():
                if key in made:
                    items.append(made[key])
                elif key not in recognition.owner:
                    items.append((key, value))
            names = [k for k, _ in items]
            if len(set(names)) != len(names):
                clash = next(n for n in names if names.count(n) > 1)
                raise QuantError(f"{clash}: a dequantized weight would replace a tensor of the "
                                 "same name", checkpoint.source.path)
            return rebuild_dict(state, items)

        tree = replace_state_dicts(checkpoint.tree, edit)
        dtypes = {format_path(path): dtype_of(value) for path, value in iter_tensors(tree)}
        for name, unknown in unrecognized_parts(dtypes).items():
            raise QuantError(f"{name}: --dequantize cannot make it plain: its module holds "
                             f"{unknown}, the parts of a quantized weight of a scheme "
                             "ckptport does not dequantize (docs/quantized.md)",
                             checkpoint.source.path)
        if not counts:
            return checkpoint, RuleResult(self.name, summary="no quantized weights found")
        summary = "dequantized " + ", ".join(f"{n} {s} weights" for s, n in counts.items()) + \
            f" to {self.dtype}"
        if guessed_at:
            summary += f"; {len(guessed_at)} of them guessed: {', '.join(guessed_at[:3])}" + \
                (", …" if len(guessed_at) > 3 else "")
        return checkpoint.with_tree(tree), RuleResult(
            self.name, tuple(changes), summary,
            {"schemes": counts, "dtype": self.dtype,
             **({"guessed": guessed_at} if guessed_at else {})})

    def _leaf(self, weight: QuantizedWeight, target: DType, parts: tuple[TensorLeaf, ...]
              ) -> TensorLeaf:
        leaf = Computed(target, weight.shape, parts, Dequantizer(weight, target.to_torch()))
        return leaf if self.lazy else to_torch(leaf)
