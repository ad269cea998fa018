"""Report formats: each a formatter object with one method per report kind.

The CLI picks a formatter from ``--format`` and prints what it returns on
stdout; progress and errors go to stderr, so ``--format json`` output is
always parseable.
"""

from __future__ import annotations

import enum
from typing import Protocol

from ..check import CheckReport
from ..convert import ConvertReport
from ..diff import DiffReport
from ..inspect import InspectReport

__all__ = ["ReportFormat", "Formatter", "formatter"]


class ReportFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"
    GITHUB = "github"  # GitHub Actions annotations for check; other reports as text


class Formatter(Protocol):
    def convert(self, report: ConvertReport) -> str: ...

    def diff(self, report: DiffReport, limit: int | None = None) -> str:
        """``limit``: rows per section in human formats; json always lists all."""
        ...

    def inspect(self, report: InspectReport) -> str: ...

    def check(self, report: CheckReport) -> str: ...


def formatter(fmt: ReportFormat | str) -> Formatter:
    from .github import GithubFormatter
    from .json import JsonFormatter
    from .markdown import MarkdownFormatter
    from .text import TextFormatter

    formatters: dict[ReportFormat, Formatter] = {
        ReportFormat.TEXT: TextFormatter(),
        ReportFormat.JSON: JsonFormatter(),
        ReportFormat.MARKDOWN: MarkdownFormatter(),
        ReportFormat.GITHUB: GithubFormatter(),
    }
    return formatters[ReportFormat(fmt)]
