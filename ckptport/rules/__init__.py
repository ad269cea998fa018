"""Normalize rules: small named transforms, each returning what it changed.

The order matters and is fixed: pick the weights first (so later rules see
only what will be written), turn objects into plain data, strip wrapper
prefixes, cast, then compact storages (which must see the final tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint
from .base import Change, Rule, RuleResult
from .device import MapToCPU
from .objects import ConvertObjects
from .prefixes import StripPrefixes, strip_key
from .select import Select, is_state_dict
from .tensors import CAST_CHOICES, CastDtype, CompactTensors

__all__ = [
    "NormalizeOptions",
    "Normalized",
    "normalize",
    "build_rules",
    "Change",
    "Rule",
    "RuleResult",
    "CAST_CHOICES",
    "strip_key",
    "is_state_dict",
]


@dataclass(frozen=True)
class NormalizeOptions:
    """The options ``normalize`` and ``diff`` share (see ``ckptport normalize --help``)."""

    select: str = "auto"
    ema: bool = False
    strip_prefixes: tuple[str, ...] = ()
    keep_prefixes: bool = False
    dtype: str = "keep"

    def __post_init__(self) -> None:
        if self.dtype not in CAST_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(CAST_CHOICES)}, not {self.dtype!r}")


@dataclass(frozen=True)
class Normalized:
    checkpoint: Checkpoint
    results: tuple[RuleResult, ...]


def build_rules(options: NormalizeOptions, *, lazy: bool = False) -> list[Rule]:
    """The rules in order; ``lazy`` leaves copies to the writers (``ckptport.lazy``)."""
    return [
        Select(options.select, options.ema),
        MapToCPU(),
        ConvertObjects(),
        StripPrefixes(tuple(options.strip_prefixes), wrappers=not options.keep_prefixes),
        CastDtype(options.dtype, lazy=lazy),
        CompactTensors(lazy=lazy),
    ]


def normalize(checkpoint: Checkpoint, options: NormalizeOptions | None = None, *,
              lazy: bool = False) -> Normalized:
    """Apply every rule in order; the source checkpoint is left as it was.

    ``lazy=True`` (for writing) defers every copy to the writers, one tensor
    at a time; the default gives real, compact tensors.
    """
    results = []
    for rule in build_rules(options or NormalizeOptions(), lazy=lazy):
        checkpoint, result = rule(checkpoint)
        results.append(result)
    return Normalized(checkpoint, tuple(results))
