"""``ckptport check``: the CI gate on exported checkpoints.

Each rule has a stable code, a severity, and a one-line message naming the
file and the key it concerns; ``RULES`` documents what each finds, why it
matters and how to fix it (the README's table is made from it). Files are
read for a report: a file with a dangerous global is a finding that names
it, and nothing in it runs. Without ``finite`` or ``against`` no tensor
byte is needed, and files are described without importing torch
(``inspect.describe_for_report``); with them, read by the tensor readers
(``inspect.read_for_report``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import Checkpoint, format_path
from .errors import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, CkptportError
from .inspect import InspectReport, describe_for_report, inspect, read_for_report
from .tensorops import human_bytes

__all__ = ["Rule", "RULES", "Finding", "FileResult", "CheckReport", "check",
           "CHECKPOINT_SUFFIXES"]

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
_FINITE_CHUNK = 1 << 22  # elements checked at once: bounded memory on huge tensors


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str  # "error" or "warning"; both fail the gate (exit 1)
    finds: str
    why: str
    fix: str


RULES = {rule.code: rule for rule in (
    Rule("CKP001", "device-bound", "warning",
         "storages the file records on a device other than the CPU (cuda:3)",
         "torch.load without map_location fails on a machine without that device",
         "ckptport normalize SRC DST (maps to cpu; --anchor cpu)"),
    Rule("CKP002", "globals-beyond-weights-only", "warning",
         "globals plain torch.load(weights_only=True) refuses (argparse.Namespace, numpy, "
         "custom classes), each named",
         "since PyTorch 2.6 consumers must pass weights_only=False, which runs any code",
         "ckptport normalize SRC DST (turns objects into plain data)"),
    Rule("CKP003", "dangerous-global", "error",
         "globals that run code, import or touch files (os.system, builtins.eval, "
         "subprocess.*, …), each named",
         "loading the file with full unpickling runs that code",
         "do not load the file; rebuild it from a trusted source"),
    Rule("CKP004", "wrapper-prefix", "warning",
         "state-dict keys wrapped by DDP/DataParallel (module.), torch.compile (_orig_mod.), "
         "FSDP, activation checkpointing",
         "load_state_dict into the bare model fails with missing/unexpected keys",
         "ckptport normalize SRC DST (strips them)"),
    Rule("CKP005", "storage-bloat", "warning",
         "storages larger than the bytes their tensors use (a saved slice of a big tensor)",
         "the file carries bytes nobody uses; downloads and loads cost more",
         "ckptport normalize SRC DST (compacts every storage)"),
    Rule("CKP006", "non-finite", "error",
         "NaN or infinite values in floating-point tensors (with --finite)",
         "a diverged run exported as if it were good",
         "export from the last good step"),
    Rule("CKP007", "format", "error",
         "a container format other than --require-format",
         "consumers expect one format (safetensors loads without unpickling)",
         "ckptport normalize SRC DST.safetensors"),
    Rule("CKP008", "unreadable", "error",
         "a file that cannot be read: corrupt, truncated, not a checkpoint, hostile pickle",
         "nothing can load it",
         "re-export it; the message says what is wrong"),
    Rule("CKP009", "disagrees-with-reference", "error",
         "tensors or values that differ from --against REF beyond --atol/--rtol",
         "the exported artifact is not the model that was validated",
         "export again from the reference, or compare with ckptport diff"),
)}


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str
    path: Path
    key: str | None
    message: str


@dataclass(frozen=True)
class FileResult:
    path: Path
    findings: tuple[Finding, ...]
    unreadable: bool = False


@dataclass(frozen=True)
class CheckReport:
    files: tuple[FileResult, ...]
    codes: tuple[str, ...]  # the rules that ran
    findings: int = field(init=False)
    exit_code: int = field(init=False)

    def __post_init__(self) -> None:
        count = sum(len(f.findings) for f in self.files)
        code = EXIT_ERROR if any(f.unreadable for f in self.files) else (
            EXIT_FINDINGS if count else EXIT_OK)
        object.__setattr__(self, "findings", count)
        object.__setattr__(self, "exit_code", code)


def check(
    paths: Iterable[str | os.PathLike[str]],
    *,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    finite: bool = False,
    require_format: Iterable[str] = (),
    against: str | os.PathLike[str] | None = None,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> CheckReport:
    """Run the rules on every file (directories searched recursively).

    ``select``/``ignore`` take rule codes; an unknown code is a ``ValueError``.
    ``CKP006`` runs only with ``finite``, ``CKP007`` only with
    ``require_format``, ``CKP009`` only with ``against``.
    """
    codes = _codes(select, ignore, finite=finite, formats=tuple(require_format),
                   against=against is not None)
    reference = None
    if against is not None and "CKP009" in codes:
        from .readers import read

        reference = read(against)  # an unreadable reference is the caller's error: raises
    files = tuple(_check_file(path, codes, tuple(require_format), reference, atol, rtol)
                  for path in _expand(paths))
    return CheckReport(files, codes)


def _codes(select: Iterable[str], ignore: Iterable[str], *, finite: bool,
           formats: tuple[str, ...], against: bool) -> tuple[str, ...]:
    chosen, skipped = [c.upper() for c in select], [c.upper() for c in ignore]
    unknown = [c for c in (*chosen, *skipped) if c not in RULES]
    if unknown:
        raise ValueError(f"unknown rule code {', '.join(unknown)} (known: {', '.join(RULES)})")
    optional = {"CKP006": finite, "CKP007": bool(formats), "CKP009": against}
    return tuple(c for c in RULES if (c in chosen if chosen else optional.get(c, True))
                 and c not in skipped)


def _expand(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir() and not _is_checkpoint_folder(path):
            found = sorted(p for p in path.rglob("*")
                           if p.is_file() and p.name.endswith(CHECKPOINT_SUFFIXES))
            yield from found or [path]  # an empty folder is reported as unreadable
        else:
            yield path


def _is_checkpoint_folder(path: Path) -> bool:
    """A shard set or DCP folder is one checkpoint, not a tree to search."""
    return any(path.glob("*.index.json")) or (path / ".metadata").is_file()


def _check_file(path: Path, codes: tuple[str, ...], formats: tuple[str, ...],
                reference: Checkpoint | None, atol: float, rtol: float) -> FileResult:
    try:  # tensor bytes only for --finite and --against; else no torch at all
        needs_bytes = "CKP006" in codes or reference is not None
        checkpoint = read_for_report(path) if needs_bytes else describe_for_report(path)
        report = inspect(checkpoint)
        findings = list(_static_findings(report, formats))
        if "CKP006" in codes:
            findings += _non_finite(checkpoint)
        if reference is not None and not report.dangerous_globals:
            findings += _against(checkpoint, reference, atol, rtol)
    except CkptportError as exc:
        finding = Finding("CKP008", "error", path, None, " ".join(exc.message.split()))
        return FileResult(path, (finding,) if "CKP008" in codes else (), unreadable=True)
    return FileResult(path, tuple(f for f in findings if f.code in codes))


def _finding(code: str, report: InspectReport | Checkpoint, key: str | None,
             message: str) -> Finding:
    path = report.path if isinstance(report, InspectReport) else report.source.path
    return Finding(code, RULES[code].severity, path, key, message)


def _static_findings(report: InspectReport, formats: tuple[str, ...]) -> Iterator[Finding]:
    """Every rule that needs only the pickle and the storage table, no tensor bytes."""
    for location, count in report.storage_locations.items():
        if location != "cpu":
            yield _finding("CKP001", report, None,
                           f"{count} storages recorded on {location}; torch.load without "
                           "map_location fails without that device")
    where = {o.global_name: o.key for o in report.blocking_objects}
    for name in report.globals_beyond_weights_only:
        yield _finding("CKP002", report, where.get(name),
                       f"needs {name}, which torch.load(weights_only=True) refuses")
    for name in report.dangerous_globals:
        yield _finding("CKP003", report, where.get(name),
                       f"dangerous global {name}: loading this file with full unpickling "
                       "runs it (nothing was run)")
    for prefix, count in report.wrapper_prefixes.items():
        yield _finding("CKP004", report, report.wrapper_examples.get(prefix),
                       f"{count} keys carry the wrapper prefix {prefix!r}")
    for bloat in report.storage_bloat:
        yield _finding("CKP005", report, bloat.key,
                       f"storage of {human_bytes(bloat.storage_bytes)} holds "
                       f"{human_bytes(bloat.used_bytes)} of tensor data")
    if formats and report.format.value not in formats:
        yield _finding("CKP007", report, None,
                       f"format {report.format.value}, required: {', '.join(formats)}")


def _non_finite(checkpoint: Checkpoint) -> list[Finding]:
    import torch

    findings = []
    for key_path, tensor in checkpoint.tensors():
        if not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        flat = tensor.reshape(-1)
        widen = tensor.element_size() == 1  # float8: torch has no isfinite for it
        bad = sum(int((~torch.isfinite(chunk.float() if widen else chunk)).sum())
                  for chunk in flat.split(_FINITE_CHUNK))
        if bad:
            findings.append(_finding("CKP006", checkpoint, format_path(key_path),
                                     f"{bad} of {flat.numel()} values are NaN or infinite"))
    return findings


def _against(checkpoint: Checkpoint, reference: Checkpoint, atol: float,
             rtol: float) -> list[Finding]:
    """Differences from the reference, both sides normalized alike (``ckptport diff``)."""
    from .diff import diff

    try:
        report = diff(reference, checkpoint, atol=atol, rtol=rtol)
    except CkptportError as exc:  # e.g. no state dict to compare
        return [_finding("CKP009", checkpoint, None, f"cannot compare with the reference: "
                                                     f"{' '.join(exc.message.split())}")]
    rows: list[tuple[str | None, str]] = [
        *((k, "missing (in the reference only)") for k in report.only_in_a),
        *((k, "not in the reference") for k in report.only_in_b),
        *((m.key, f"shape {m.shape_b} vs {m.shape_a} in the reference")
          for m in report.shape_mismatches),
        *((d.key, f"{d.differing} values differ, max |a-b| {d.max_abs:.3g}")
          for d in report.value_mismatches),
        *((m.key, f"{m.b} vs {m.a} in the reference") for m in report.leaf_mismatches),
    ]
    if not report.tolerance.cast:
        rows += [(m.key, f"dtype {m.dtype_b} vs {m.dtype_a} in the reference")
                 for m in report.dtype_mismatches]
    name = reference.source.path.name
    return [_finding("CKP009", checkpoint, key, f"{what} ({name})") for key, what in rows]
