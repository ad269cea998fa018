"""Markdown reports, for a pull-request comment or a CI job summary.

Same tables as the text report (``text.diff_sections``), as GitHub tables,
with the verdict in the heading so a reviewer sees it without scrolling.
Only ``diff`` has a markdown form; every other report is the text one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .text import DIFF_LIMIT, Section, TextFormatter, diff_context, diff_sections, joined

if TYPE_CHECKING:
    from ..analysis.diffing import DiffReport

__all__ = ["MarkdownFormatter"]


class MarkdownFormatter(TextFormatter):
    name = "markdown"
    commands = frozenset({"diff"})

    def diff(self, report: DiffReport, limit: int | None = None) -> str:
        verdict = "equal" if report.equal else "different"
        lines = [f"### ckptport diff: {verdict}", "", f"**{_escape(report.summary())}**", "",
                 "<details><summary>What was compared</summary>", "", "```",
                 *diff_context(report), "```", "", "</details>"]
        for section in diff_sections(report):
            lines += _table(section, DIFF_LIMIT if limit is None else limit)
        return joined(lines)


def _table(section: Section, limit: int) -> list[str]:
    lines = ["", f"#### {_escape(section.title)} ({len(section.rows)})", "",
             _row(section.header), "|" + "---|" * len(section.header)]
    lines += [_row((f"`{row[0]}`", *row[1:])) for row in section.rows[:limit]]
    hidden = len(section.rows) - limit
    if hidden > 0:
        lines += ["", f"… and {hidden} more (`ckptport diff --format json` lists all)"]
    return lines


def _row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(_escape(cell) for cell in cells) + " |"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")
