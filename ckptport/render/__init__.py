"""Report formats: each a formatter object with one method per report kind.

The CLI picks a formatter from ``--format`` and prints what it returns on
stdout; progress and errors go to stderr, so ``--format json`` output is
always parseable.
"""

from __future__ import annotations

import enum
from typing import Protocol

from ..convert import ConvertReport

__all__ = ["ReportFormat", "Formatter", "formatter"]


class ReportFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"


class Formatter(Protocol):
    def convert(self, report: ConvertReport) -> str: ...


def formatter(fmt: ReportFormat | str) -> Formatter:
    from .json import JsonFormatter
    from .text import TextFormatter

    formatters: dict[ReportFormat, Formatter] = {
        ReportFormat.TEXT: TextFormatter(),
        ReportFormat.JSON: JsonFormatter(),
    }
    return formatters[ReportFormat(fmt)]
