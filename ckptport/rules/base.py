"""What every normalize rule returns: the new checkpoint and what it changed.

Reports, ``--format json`` and tests all read the same ``RuleResult``, so a
rewrite that the report does not show cannot happen. A change's fields are
typed (``before``/``after`` for renames): renderers read fields, never
parse the words of ``detail``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..checkpoint import Checkpoint

__all__ = ["Change", "RuleResult", "NormalizeRule"]


@dataclass(frozen=True)
class Change:
    """One edit: where, what kind, the before -> after in words, and the two values."""

    key: str
    action: str
    detail: str
    before: str | None = field(default=None, metadata={"omit_none": True})
    after: str | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class RuleResult:
    rule: str
    changes: tuple[Change, ...] = ()
    summary: str = ""
    details: Mapping[str, object] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.changes)


class NormalizeRule(Protocol):
    """A named transform of a checkpoint that says what it changed."""

    @property
    def name(self) -> str: ...

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]: ...
