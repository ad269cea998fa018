"""What a report format is (``Formatter``), and what it shows for a command that failed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..analysis.diffing import DiffReport
    from ..analysis.manifests import Manifest
    from ..analysis.survey import InspectReport
    from ..commands.check import CheckReport
    from ..commands.normalize import FolderReport, NormalizeReport


__all__ = ["Formatter", "Failure"]


@dataclass(frozen=True)
class Failure:
    """A command that ended in an error instead of a report (the CLI shows ``line`` on
    stderr whatever the format; a format may also put it on stdout, where a tool reads)."""

    command: str
    line: str  # the message as shown: the file it names, then the cause
    path: str | None  # the file, when the error names one
    kind: str  # the error's class (InputNotFoundError, …), UsageError or InternalError
    exit_code: int


class Formatter(Protocol):
    """One report format: its ``--format`` name, the commands it renders, and a method
    per report. To add one: a module with such a class and one entry in ``FORMATTERS``."""

    name: str
    commands: frozenset[str]

    def normalize(self, report: NormalizeReport) -> str: ...

    def diff(self, report: DiffReport, limit: int | None = None) -> str:
        """``limit``: rows per section in human formats; json always lists all."""
        ...

    def inspect(self, report: InspectReport) -> str: ...

    def check(self, report: CheckReport) -> str: ...

    def manifest(self, made: Manifest, path: Path | None) -> str:
        """A manifest written to ``path`` (None: it went to stdout)."""
        ...

    def folder(self, report: FolderReport) -> str:
        """``normalize SRC_DIR DST_DIR``: the summary, then one line per file that failed."""
        ...

    def error(self, failure: Failure) -> str | None:
        """What stdout shows for a command that failed (None: nothing, the stderr line
        says it)."""
        ...
