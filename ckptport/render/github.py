"""GitHub Actions output: one workflow command (``::error file=…::``) per finding.

Actions turns these lines into annotations on the pull request, pointing at
the checkpoint file. Only ``check`` has findings; every other report is the
plain text one, which is what a CI log should show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..escape import printable
from .text import TextFormatter, check_summary

if TYPE_CHECKING:
    from ..commands.check import CheckReport
    from .protocol import Failure

__all__ = ["GithubFormatter"]


def _escape(text: str, property_value: bool = False) -> str:
    """Workflow-command escaping: ``%``, CR, LF always; ``:`` and ``,`` in properties; any
    other control character from the file escaped, so an annotation stays one valid line."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    text = printable(text)
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


class GithubFormatter(TextFormatter):
    name = "github"
    commands = frozenset({"check"})

    def error(self, failure: Failure) -> str:
        """An annotation, so a check that could not run shows on the pull request too."""
        where = f" file={_escape(failure.path, True)}," if failure.path else " "
        return f"::error{where}title=ckptport {failure.kind}::{_escape(failure.line)}"

    def check(self, report: CheckReport) -> str:
        lines = []
        for result in report.files:
            for f in result.findings:
                title = _escape(f"{f.code} {f.key}" if f.key else f.code, property_value=True)
                lines.append(f"::{f.severity} file={_escape(str(f.path), True)},"
                             f"title={title}::{_escape(f.message)}")
        return "\n".join([*lines, printable(check_summary(report))])
