"""Output bounded by the input: what a checkpoint's tensors may claim, relative to its size.

A pickle describes each tensor as a view of a storage: size, stride, offset.
A stride-0 view of a 32-byte record can claim 1 GiB, and six of them 6 GiB
from a 2 KB file; overlapping views of one storage multiply it. Every
command that reads tensor values (normalize, manifest, diff, ``check
--finite``) would then write or hash that much. So the bytes the tensors
stand for, each view on its own (``SourceFacts.materialized``), may be at
most ``ratio`` times the source's size plus a fixed allowance; beyond it a
strict read is an ``InputError`` naming the biggest tensors, and ``check``
reports CKP014. ``--max-expansion RATIO`` (or ``CKPTPORT_MAX_EXPANSION``)
raises the ratio for a file the user knows to be fine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..checkpoint import Checkpoint
from ..errors import InputError, OptionError
from ..tensors import human_bytes
from ..unpickle.settle import LARGEST_SHOWN

__all__ = ["DEFAULT_RATIO", "ALLOWANCE", "ENV", "budget", "ratio_of", "over_budget",
           "enforce"]

DEFAULT_RATIO = 2.0  # a cast aside, normalizing never writes more than the file holds
ALLOWANCE = 64 << 20  # small files: empty or expanded buffers (position ids) stay fine
ENV = "CKPTPORT_MAX_EXPANSION"


def ratio_of(max_expansion: float | None) -> float:
    """The ratio in force: the argument, else ``CKPTPORT_MAX_EXPANSION``, else the default."""
    if max_expansion is None:
        raw = os.environ.get(ENV)
        if not raw:
            return DEFAULT_RATIO
        try:
            max_expansion = float(raw)
        except ValueError:
            raise OptionError(f"{ENV}={raw!r} is not a number") from None
    if not max_expansion > 0:  # also refuses NaN
        raise OptionError(f"the maximum expansion must be a positive ratio, not {max_expansion}")
    return max_expansion


def largest(items: Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """The biggest tensors of several pickles or files, as one error names them."""
    return tuple(sorted(items, key=lambda item: -item[1])[:LARGEST_SHOWN])


def budget(size: int, ratio: float) -> int:
    return int(size * ratio) + ALLOWANCE


def over_budget(checkpoint: Checkpoint, ratio: float) -> str | None:
    """Why the checkpoint's tensors exceed the budget, naming the biggest; None if they fit."""
    facts = checkpoint.source
    limit = budget(facts.size, ratio)
    if facts.materialized <= limit:
        return None
    biggest = ", ".join(f"{path} ({human_bytes(size)})" for path, size in facts.largest)
    return (f"its tensors stand for {human_bytes(facts.materialized)} from a "
            f"{human_bytes(facts.size)} file, more than the budget of {human_bytes(limit)} "
            f"({ratio:g}x the file + {human_bytes(ALLOWANCE)}): views that repeat their "
            f"storage's bytes (stride 0, overlapping); biggest: {biggest}; if the file is "
            f"yours, raise the budget with --max-expansion RATIO or {ENV}")


def enforce(checkpoint: Checkpoint, ratio: float) -> None:
    why = over_budget(checkpoint, ratio)
    if why is not None:
        raise InputError(why, checkpoint.source.path)
