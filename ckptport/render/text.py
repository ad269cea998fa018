"""Human-readable reports: a headline, one line per rule, the first changes."""

from __future__ import annotations

from ..convert import ConvertReport
from ..rules import RuleResult
from ..tensorops import human_bytes

__all__ = ["TextFormatter"]

SHOWN_CHANGES = 5


class TextFormatter:
    def convert(self, report: ConvertReport) -> str:
        out = report.output
        src = report.source
        verified = "verified" if out.verified else "not verified (--no-verify)"
        lines = [
            f"wrote {out.path} ({out.format.value}, {out.tensors} tensors, "
            f"{human_bytes(out.bytes)}, {verified})",
            f"  source {src.path}: {src.format.value}, {human_bytes(src.size)}, "
            f"sha256 {report.source_sha256[:16]}…",
        ]
        for result in report.rules:
            lines += _rule_lines(result)
        return "\n".join(lines)


def _rule_lines(result: RuleResult) -> list[str]:
    lines = [f"  {result.rule}: {result.summary}"]
    lines += [f"      {c.detail}" if c.action == "renamed" else f"      {c.key}: {c.detail}"
              for c in result.changes[:SHOWN_CHANGES]]
    hidden = len(result.changes) - SHOWN_CHANGES
    if hidden > 0:
        lines.append(f"      … and {hidden} more (--format json lists all)")
    return lines
