"""Map storages to the CPU, and say which devices the file recorded.

The mapping itself happens while reading (a GPU-saved file cannot be read
on a CPU-only machine otherwise); this rule makes it part of the record.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint
from .base import Change, RuleResult

__all__ = ["MapToCPU"]


@dataclass(frozen=True)
class MapToCPU:
    name: str = "map-to-cpu"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        moved = {loc: n for loc, n in checkpoint.source.storage_locations.items() if loc != "cpu"}
        changes = tuple(Change(loc, "mapped", f"{n} storages -> cpu")
                        for loc, n in moved.items())
        summary = ", ".join(f"{n} storages {loc} -> cpu" for loc, n in moved.items())
        summary = summary or "all storages on cpu"
        return checkpoint, RuleResult(self.name, changes, summary,
                                      {"recorded": dict(checkpoint.source.storage_locations)})
