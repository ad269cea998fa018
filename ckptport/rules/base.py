"""What every normalize rule returns: the new checkpoint and what it changed.

Reports, ``--format json`` and tests all read the same ``RuleResult``, so a
rewrite that the report does not show cannot happen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..checkpoint import Checkpoint

__all__ = ["Change", "RuleResult", "Rule"]


@dataclass(frozen=True)
class Change:
    """One edit: where, what kind, and the before -> after in words."""

    key: str
    action: str
    detail: str


@dataclass(frozen=True)
class RuleResult:
    rule: str
    changes: tuple[Change, ...] = ()
    summary: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


class Rule(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]: ...
