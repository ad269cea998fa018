"""``check --finite``: count NaN and infinite values, reading bytes by position, no torch.

floats numpy knows are tested with ``isfinite``; bfloat16 and the float8
formats, which numpy does not know, are tested on their bit patterns (an
all-ones exponent for bfloat16 and e5m2; the NaN codes of e4m3fn, the
``fnuz`` formats and e8m0). By default only the weights ``--select`` picks
are checked, so a Lightning callback's ``kth_value=inf`` is not a finding;
``--finite-all`` checks every tensor. A quantized weight whose codes and scales
are finite is also checked dequantized (``analysis.quantized``: torch, one
weight at a time), since their product can overflow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeAlias

from ..checkpoint import Checkpoint, format_path
from ..dtypes import DType, dtype_of
from ..parallel import run_all
from ..progress import Progress, no_progress
from ..rules import NormalizeOptions
from ..rules.select import Select
from ..tensors import chunks, nbytes
from ..tree import KeyPath, TensorLeaf, iter_tensors

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# a test of raw words (the bit patterns of one dtype), true where a value is not finite
BitTest: TypeAlias = "Callable[[npt.NDArray[np.uint8 | np.uint16]], npt.NDArray[np.bool_]]"

__all__ = ["non_finite", "count_non_finite"]


def _bits(mask: int, value: int) -> BitTest:
    return lambda words: (words & mask) == value


_BIT_TESTS: dict[str, tuple[str, BitTest]] = {
    "bfloat16": ("<u2", _bits(0x7F80, 0x7F80)),
    "float8_e5m2": ("u1", _bits(0x7C, 0x7C)),
    "float8_e4m3fn": ("u1", _bits(0x7F, 0x7F)),
    "float8_e4m3fnuz": ("u1", _bits(0xFF, 0x80)),
    "float8_e5m2fnuz": ("u1", _bits(0xFF, 0x80)),
    "float8_e8m0fnu": ("u1", _bits(0xFF, 0xFF)),
}


def count_non_finite(leaf: TensorLeaf) -> int:
    """How many of a floating-point leaf's values are NaN or infinite."""
    import numpy as np

    dtype: DType = dtype_of(leaf)
    bad = 0
    for piece in chunks(leaf):
        if dtype.name in _BIT_TESTS:
            word, test = _BIT_TESTS[dtype.name]
            bad += int(test(np.frombuffer(piece, dtype=word)).sum())
        elif dtype.numpy is not None:
            bad += int((~np.isfinite(np.frombuffer(piece, dtype=dtype.to_numpy()))).sum())
    return bad


def non_finite(checkpoint: Checkpoint, options: NormalizeOptions, scope: str,
               progress: Progress = no_progress, jobs: int | None = None
               ) -> Iterator[tuple[str, str]]:
    """(key, message) for every tensor with non-finite values, in the chosen scope;
    tensors are read on ``jobs`` threads (numpy releases the GIL)."""
    tree = checkpoint.tree
    prefix: KeyPath = ()
    if scope == "weights":
        picked, result = Select(options.select, options.ema)(checkpoint)
        tree = picked.tree
        chosen = str(result.details["picked"])
        prefix = () if chosen == "<root>" else (chosen,)
    floats = [(path, leaf) for path, leaf in iter_tensors(tree)
              if dtype_of(leaf).is_floating_point or dtype_of(leaf).is_complex]
    advance = progress(f"checking {checkpoint.source.path.name}",
                       sum(nbytes(leaf) for _, leaf in floats))

    def count(item: tuple[KeyPath, TensorLeaf]) -> int:
        bad = count_non_finite(item[1])
        advance(nbytes(item[1]))
        return bad

    counts = run_all(count, floats, jobs=jobs, size=lambda item: nbytes(item[1]))
    for (path, leaf), bad in zip(floats, counts, strict=True):
        if bad:
            yield (format_path((*prefix, *path)),
                   f"{bad} of {leaf.numel()} values are NaN or infinite")
