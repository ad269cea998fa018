"""The training repo's own classes in the pickle-heavy benchmark (torch.load imports them)."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field


@dataclass
class Atom:
    element: int
    formal_charge: int
    coords: list[float] = field(default_factory=list)


Entry = namedtuple("Entry", ["key", "index", "weight"])
