"""Human-readable reports: a headline, one line per rule, the first changes.

Every line is passed through ``printable``: keys, class names and metadata
come from the file, and a control character in them must not reach a
terminal or a CI log as itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..escape import printable
from ..tensors import human_bytes

if TYPE_CHECKING:
    from ..analysis.diffing import DiffReport, TensorDelta
    from ..analysis.manifests import Manifest
    from ..analysis.survey import InspectReport, LayoutNode
    from ..commands.check import CheckReport
    from ..commands.normalize import FolderReport, NormalizeReport
    from ..rules import RuleResult
    from .protocol import Failure

__all__ = ["TextFormatter", "Section", "diff_sections", "diff_context", "inspect_lines",
           "check_summary"]

SHOWN_CHANGES = 5
DIFF_LIMIT = 20


def joined(lines: list[str]) -> str:
    """Lines as one text, every file-derived control character escaped."""
    return "\n".join(printable(line) for line in lines)


class TextFormatter:
    name = "text"
    commands = frozenset({"normalize", "diff", "inspect", "check", "manifest"})

    def error(self, failure: Failure) -> str | None:
        """Nothing: the ``ckptport: error:`` line on stderr is the human report."""
        return None

    def folder(self, report: FolderReport) -> str:
        counts = report.counts
        part = f" (part {report.part[0]}/{report.part[1]})" if report.part else ""
        if counts["planned"]:
            lines = [f"{report.src} -> {report.dst}{part}: {counts['planned']} checkpoints "
                     "would be converted"]
            lines += [f"  {f.source} -> {f.output}" for f in report.files
                      if f.status == "planned"]
        else:
            lines = [f"{report.src} -> {report.dst}{part}: {counts['converted']} converted, "
                     f"{counts['skipped']} skipped (done before), {counts['failed']} failed"
                     + (f", {counts['no weights']} training state without model weights "
                        "(--select all converts them)" if counts["no weights"] else "")
                     + "; "
                     f"{human_bytes(report.bytes_in)} in, {human_bytes(report.bytes_out)} out, "
                     f"{report.seconds:.1f} s"]
        lines += [f"  failed {f.source}: {f.reason}" for f in report.files
                  if f.status == "failed"]
        lines += [f"  note: {note}" for note in report.notes]
        if report.not_checkpoints:
            lines.append(f"  {len(report.not_checkpoints)} files are not checkpoints (--format "
                         "json lists them)")
        return joined(lines)

    def manifest(self, made: Manifest, path: Path | None) -> str:
        where = f"wrote {path}: " if path is not None else ""
        return (f"{where}{len(made.tensors)} tensors, {human_bytes(made.total_bytes)}, "
                f"weights digest sha256:{made.digest}")

    def normalize(self, report: NormalizeReport) -> str:
        out = report.output
        src = report.source
        verified = "verified" if out.verified else "not verified (--no-verify)"
        lines = [
            f"wrote {out.path} ({out.format}, {out.tensors} tensors, "
            f"{human_bytes(out.bytes)}, {verified})",
            f"  source {src.path}: {src.format.value}, {human_bytes(src.size)}"
            + (f", sha256 {report.source_sha256[:16]}…" if report.source_sha256 else ""),
        ]
        for result in report.rules:
            lines += _rule_lines(result)
        if report.map_sha256:
            lines.append(f"  map: recipe sha256 {report.map_sha256}")
        if report.attestation is not None:
            lines.append(f"  signed: {report.attestation}, weights attestation of sha256:"
                         f"{report.digest}")
        if report.metadata_kept:
            lines.append(f"  metadata: carried the source's {', '.join(report.metadata_kept)}")
        lines += [f"  note: {note}" for note in (*src.notes, *out.notes)]
        return joined(lines)

    def diff(self, report: DiffReport, limit: int | None = None) -> str:
        lines = [report.summary(), *(f"  {line}" for line in diff_context(report))]
        for section in diff_sections(report):
            lines += _section_lines(section, DIFF_LIMIT if limit is None else limit)
        return joined(lines)

    def inspect(self, report: InspectReport) -> str:
        return joined(inspect_lines(report))

    def check(self, report: CheckReport) -> str:
        lines = [f"{f.path}: {f.code} [{f.severity}] {f.key + ': ' if f.key else ''}{f.message}"
                 for result in report.files for f in result.findings]
        if report.skipped:
            lines.append(f"not checked: {len(report.skipped)} files no checkpoint loader can "
                         "open (--format json lists them)")
        return joined([*lines, check_summary(report)])


def check_summary(report: CheckReport) -> str:
    """The last line of a check report: the verdict in words."""
    files = len(report.files)
    unreadable = sum(1 for f in report.files if f.unreadable)
    if not report.findings and not unreadable:
        return f"ckptport check: {files} files pass ({', '.join(report.codes)})"
    return (f"ckptport check: {report.findings} findings in {files} files"
            + (f", {unreadable} unreadable" if unreadable else ""))


def inspect_lines(report: InspectReport) -> list[str]:
    """The headline, one line per fact that is present, then the layout tree."""
    head = f"{report.path}: {report.format.value}, {human_bytes(report.size)}"
    lines = [head + (f", sha256 {report.sha256}" if report.sha256 else "")]
    weights = f" in {report.weights}" if report.weights else ""
    lines.append(f"  tensors: {report.tensors} ({human_bytes(report.tensor_bytes)}), "
                 f"parameters: {report.parameters:,}{weights}")
    facts = [
        ("bytes by dtype", [f"{k} {human_bytes(v)}" for k, v in report.bytes_by_dtype.items()]),
        ("recorded storage locations",
         [f"{k} ({v} storages)" for k, v in report.storage_locations.items()]),
        ("wrapper prefixes", [f"{k} ({v} keys)" for k, v in report.wrapper_prefixes.items()]),
        ("shared storages", [" = ".join(group) for group in report.shared_storages]),
        ("storage bloat", [f"{b.key}: storage {human_bytes(b.storage_bytes)}, tensors use "
                           f"{human_bytes(b.used_bytes)}" for b in report.storage_bloat]),
        ("globals beyond weights-only", [_spelled(report, g)
                                         for g in report.globals_beyond_weights_only]),
        ("DANGEROUS globals (never run)", [_spelled(report, g)
                                           for g in report.dangerous_globals]),
        ("called, not provably classes", [_spelled(report, g)
                                          for g in report.unproven_callables]),
        ("objects blocking weights-only loading",
         [f"{o.key}: {o.global_name}" + (f" (and {o.count - 1} more)" if o.count > 1 else "")
          for o in report.blocking_objects]),
    ]
    lines += [f"  {title}: {', '.join(items)}" for title, items in facts if items]
    lines += quantization_lines(report.quantization)
    lines += [f"  note: {note}" for note in report.notes]
    if report.metadata:
        lines.append("  metadata:")
        lines += [f"    {key}: {_clip(value)}" for key, value in report.metadata.items()]
    lines.append("  layout:")
    lines += _layout_lines(report.layout, 2)
    return lines


QUANTIZED_SHOWN = 20  # quantized weights listed by name; the JSON report lists all


# Any: ``InspectReport.quantization``, the JSON-shaped summary rules.quantized makes
def quantization_lines(quantization: Mapping[str, Any]) -> list[str]:
    """The schemes found, their parameters, and which tensors make each quantized weight."""
    if "error" in quantization:
        return [f"  quantization: cannot be dequantized: {quantization['error']}"]
    if not quantization:
        return []
    counts = ", ".join(f"{scheme} ({n} weights)" for scheme, n in quantization["schemes"].items())
    lines = [f"  quantization: {counts} (--dequantize makes them plain tensors)"]
    weights = quantization["weights"]
    for weight in weights[:QUANTIZED_SHOWN]:
        params = ", ".join(f"{k} {v}" for k, v in weight["params"].items())
        parts = " + ".join(weight["tensors"].values())
        lines.append(f"    {weight['weight']}: {weight['scheme']} ({params}) <- {parts}")
    if len(weights) > QUANTIZED_SHOWN:
        lines.append(f"    … {len(weights) - QUANTIZED_SHOWN} more (--format json lists all)")
    return lines


def _spelled(report: InspectReport, name: str) -> str:
    raw = report.spellings.get(name)
    return f"{name} (named {raw})" if raw else name


def _clip(text: str, width: int = 100) -> str:
    return text if len(text) <= width else f"{text[:width]}… ({len(text)} characters)"


def _layout_lines(node: LayoutNode, indent: int) -> list[str]:
    pad = "  " * indent
    if not node.container:
        kind = "" if node.kind == "tensor" else f"{node.kind} "
        return [f"{pad}{node.key}: {kind}{node.summary}"]
    holds = f", {node.tensors} tensors, {human_bytes(node.nbytes)}" if node.tensors else ""
    lines = [f"{pad}{node.key}: {node.kind} ({node.summary}{holds})"]
    for child in node.children:
        lines += _layout_lines(child, indent + 1)
    if node.hidden and not node.children:
        lines.append(f"{pad}  … {node.hidden} entries below --depth")
    elif node.hidden:
        lines.append(f"{pad}  … {node.hidden} more entries of plain data")
    return lines


def _rule_lines(result: RuleResult) -> list[str]:
    lines = [f"  {result.rule}: {result.summary}"]
    lines += [f"      {c.before} -> {c.after}" if c.action == "renamed" else
              f"      {c.key}: {c.detail}" for c in result.changes[:SHOWN_CHANGES]]
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
    dtype_note = ("compared by value, --cast" if report.tolerance.cast
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
        Section("content differs (sha256)", ("key", "A", "B"), tuple(
            (m.key, m.sha256_a[:16] + "…", m.sha256_b[:16] + "…")
            for m in report.hash_mismatches)),
    ]
    return [s for s in sections if s.rows]


_DELTA_HEADER = ("key", "dtype", "differing", "max |Δ|", "max rel", "at", "A", "B")


def _delta_row(delta: TensorDelta) -> tuple[str, ...]:
    from ..analysis.diffing import format_number

    dtype = delta.dtype_a if delta.dtype_a == delta.dtype_b else f"{delta.dtype_a}/{delta.dtype_b}"
    steps = "" if delta.max_steps is None else f" ({delta.max_steps:.3g} steps)"
    return (delta.key, dtype, f"{delta.differing} of {delta.numel}",
            format_number(delta.max_abs) + steps, format_number(delta.max_rel),
            str(list(delta.index)),
            _value(delta.a), _value(delta.b))


def _value(value: object) -> str:
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
