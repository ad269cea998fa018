"""Human-readable reports: a headline, one line per rule, the first changes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..convert import ConvertReport
from ..diff import DiffReport, TensorDelta, format_number
from ..rules import RuleResult
from ..tensorops import human_bytes

__all__ = ["TextFormatter", "Section", "diff_sections", "diff_context"]

SHOWN_CHANGES = 5
DIFF_LIMIT = 20


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

    def diff(self, report: DiffReport, limit: int | None = None) -> str:
        lines = [report.summary(), *(f"  {line}" for line in diff_context(report))]
        for section in diff_sections(report):
            lines += _section_lines(section, DIFF_LIMIT if limit is None else limit)
        return "\n".join(lines)


def _rule_lines(result: RuleResult) -> list[str]:
    lines = [f"  {result.rule}: {result.summary}"]
    lines += [f"      {c.detail}" if c.action == "renamed" else f"      {c.key}: {c.detail}"
              for c in result.changes[:SHOWN_CHANGES]]
    hidden = len(result.changes) - SHOWN_CHANGES
    if hidden > 0:
        lines.append(f"      … and {hidden} more (--format json lists all)")
    return lines


@dataclass(frozen=True)
class Section:
    """One kind of difference as a table, shared by the text and markdown reports."""

    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def diff_context(report: DiffReport) -> list[str]:
    """What was compared: both sides, what normalizing did, the tolerance."""
    lines: list[str] = []
    for name, side in (("A", report.a), ("B", report.b)):
        lines.append(f"{name} {side.path} ({side.format}, {side.tensors} tensors)")
        lines += [f"    {note}" for note in side.notes]
    tol = report.tolerance
    exact = "exact" if tol.exact else f"atol {tol.atol:g}, rtol {tol.rtol:g}"
    cast = "; --cast: dtypes compared by value" if tol.cast else ""
    stored = "; --raw: compared as stored" if report.raw else ""
    lines.append(f"tolerance: {exact} (NaN equals NaN, -0.0 equals 0.0){cast}{stored}")
    return lines


def diff_sections(report: DiffReport) -> list[Section]:
    """The non-empty difference tables, most structural first."""
    dtype_note = ("compared by value (--cast)" if report.tolerance.cast
                  else "values not compared; --cast compares them by value")
    sections = [
        Section("only in A", ("key",), tuple((k,) for k in report.only_in_a)),
        Section("only in B", ("key",), tuple((k,) for k in report.only_in_b)),
        Section("shapes differ", ("key", "A", "B"), tuple(
            (m.key, f"{m.dtype_a}{list(m.shape_a)}", f"{m.dtype_b}{list(m.shape_b)}")
            for m in report.shape_mismatches)),
        Section(f"dtypes differ ({dtype_note})", ("key", "shape", "A", "B"), tuple(
            (m.key, str(list(m.shape)), m.dtype_a, m.dtype_b) for m in report.dtype_mismatches)),
        Section("values differ", _DELTA_HEADER, tuple(map(_delta_row, report.value_mismatches))),
        Section("equal within tolerance, not exactly", _DELTA_HEADER,
                tuple(map(_delta_row, report.within_tolerance))),
        Section("non-tensor values differ", ("key", "A", "B"), tuple(
            (m.key, m.a, m.b) for m in report.leaf_mismatches)),
    ]
    return [s for s in sections if s.rows]


_DELTA_HEADER = ("key", "dtype", "differing", "max |Δ|", "max rel", "at", "A", "B")


def _delta_row(delta: TensorDelta) -> tuple[str, ...]:
    dtype = delta.dtype_a if delta.dtype_a == delta.dtype_b else f"{delta.dtype_a}/{delta.dtype_b}"
    return (delta.key, dtype, f"{delta.differing} of {delta.numel}",
            format_number(delta.max_abs), format_number(delta.max_rel), str(list(delta.index)),
            _value(delta.a), _value(delta.b))


def _value(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _section_lines(section: Section, limit: int) -> list[str]:
    rows = [section.header, *section.rows[:limit]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(section.header))]
    lines = [f"{section.title} ({len(section.rows)}):"]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    hidden = len(section.rows) - limit
    if hidden > 0:
        lines.append(f"  … and {hidden} more (--limit, or --format json lists all)")
    return lines
