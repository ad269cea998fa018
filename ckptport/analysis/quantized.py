"""``check``'s CKP016: a quantized checkpoint that cannot be dequantized correctly.

Static (names, dtypes, shapes, ``config.json``): whatever a scheme refuses
(a scale without its weight, scales that do not tile the weight, widths no
bit width fits, a config the tensors contradict, a tensor two schemes
claim), and FP8 weights left without a scale beside others that have one
(a scale lost in a conversion). With values readable: scales that are NaN,
infinite or zero, which turn every code of their block into NaN or 0. Scale
values are tested on their bits, without torch, as ``check --finite`` tests
floats.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..checkpoint import Checkpoint
from ..dtypes import dtype_of
from ..errors import CkptportError
from ..quant import Recognition, Tensors
from ..rules.quantized import recognized
from ..tensors import chunks, to_torch
from ..tree import TensorLeaf, format_path, is_tensor, iter_tensors, state_dicts
from .finite import count_non_finite

__all__ = ["quantization_findings", "dequantized_non_finite"]

# dtype -> (numpy word, mask of the bits that are zero exactly when the value is ±0)
_ZERO_BITS = {"float32": ("<u4", 0x7FFFFFFF), "float16": ("<u2", 0x7FFF),
              "bfloat16": ("<u2", 0x7FFF), "float8_e4m3fn": ("u1", 0x7F),
              "float8_e5m2": ("u1", 0x7F)}


def quantization_findings(checkpoint: Checkpoint, values: bool) -> Iterator[tuple[str, str]]:
    """(tensor, why) for each part that makes a quantized weight wrong or undecodable."""
    try:
        found = recognized(checkpoint)
    except CkptportError as exc:
        message = exc.message
        key, _, why = message.partition(": ")  # a scheme's message starts with its tensor
        yield key, why or message
        return
    yield from _unscaled(checkpoint, found)
    if not values:
        return
    for prefix, recognition in found:
        state = _state(checkpoint, prefix)
        for weight in recognition.weights:
            for role, name in weight.parts.items():
                if "scale" not in role:
                    continue
                leaf = state[name]
                where = f"{prefix}.{name}" if prefix else name
                bad = count_non_finite(leaf) if dtype_of(leaf).is_floating_point else 0
                zeros = _zeros(leaf)
                if bad or zeros:
                    what = ", ".join(f"{n} {kind}" for n, kind in
                                     ((bad, "NaN or infinite"), (zeros, "zero")) if n)
                    yield where, (f"{weight.scheme.name} scale of {weight.name} holds {what} "
                                  "values: the codes of those blocks dequantize to NaN or 0")


def dequantized_non_finite(checkpoint: Checkpoint, reported: set[str]
                           ) -> Iterator[tuple[str, str]]:
    """``check --finite`` on a quantized checkpoint: each weight as ``--dequantize float32``
    computes it, one at a time, where its codes and scales are finite (else they are the
    finding) but the weight is not: a finite scale times a finite code can overflow."""
    try:
        found = recognized(checkpoint)
    except CkptportError:
        return  # CKP016 says why it cannot be dequantized
    for prefix, recognition in found:
        state = _state(checkpoint, prefix)
        for weight in recognition.weights:
            where = [f"{prefix}.{n}" if prefix else n for n in (weight.name,
                                                                *weight.parts.values())]
            if any(name in reported for name in where):
                continue
            import torch

            made = weight.scheme.dequantize(
                weight, tuple(to_torch(state[n]) for n in weight.parts.values()), torch.float32)
            bad = int((~made.isfinite()).sum())
            if bad:
                yield where[0], (f"{bad} of {made.numel()} values are NaN or infinite once "
                                 f"dequantized ({weight.scheme.name}, as --dequantize float32 "
                                 "computes them), though its codes and scales are finite")


def _state(checkpoint: Checkpoint, prefix: str) -> Tensors:
    """The tensors of the state dict at ``prefix`` (where ``recognized`` found weights)."""
    for path, state in state_dicts(checkpoint.tree):
        if (format_path(path) if path else "") == prefix:
            return {name: value for name, value in state.items() if is_tensor(value)}
    raise KeyError(prefix)


def _unscaled(checkpoint: Checkpoint, found: list[tuple[str, Recognition]]
              ) -> Iterator[tuple[str, str]]:
    """FP8 weights with no scale in a checkpoint whose other FP8 weights have theirs."""
    owned = {f"{p}.{n}" if p else n for p, r in found for n in r.owner}
    scaled = sum(1 for _, recognition in found for weight in recognition.weights
                 if str(weight.params.get("format")).startswith("float8")
                 or weight.params.get("format") == "float-quantized")
    if not scaled:
        return
    for path, leaf in iter_tensors(checkpoint.tree):
        name = format_path(path)
        if name not in owned and name.endswith("weight") and \
                dtype_of(leaf).name.startswith("float8"):
            yield name, (f"an FP8 weight without a scale, beside {scaled} FP8 weights with "
                         "theirs: its scale is missing (it would load as raw codes)")


def _zeros(leaf: TensorLeaf) -> int:
    import numpy as np

    word, mask = _ZERO_BITS.get(dtype_of(leaf).name, (None, 0))
    if word is None:
        return 0
    return sum(int(((np.frombuffer(piece, dtype=word) & mask) == 0).sum())
               for piece in chunks(leaf))
