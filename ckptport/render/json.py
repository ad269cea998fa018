"""Machine-readable reports: stable keys, every change of every rule."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .._version import __version__

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from ..analysis.diffing import DiffReport
    from ..analysis.manifests import Manifest
    from ..analysis.survey import InspectReport
    from ..commands.check import CheckReport
    from ..commands.normalize import FolderReport, NormalizeReport
    from .protocol import Failure

__all__ = ["JsonFormatter", "jsonable", "json_fields"]


def jsonable(value: object) -> object:
    """Dataclasses, enums, paths and mappings as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_fields(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (Path, os.PathLike)):  # a RemotePath prints its redacted URL
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def json_fields(value: DataclassInstance) -> dict[str, object]:
    """A dataclass as a JSON object: its fields given at init (one whose metadata says
    ``omit_none`` left out when None), each ``jsonable``."""
    return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
            if f.init and not (f.metadata.get("omit_none") and getattr(value, f.name) is None)}


class JsonFormatter:
    name = "json"
    commands = frozenset({"normalize", "diff", "inspect", "check", "manifest"})

    def folder(self, report: FolderReport) -> str:
        doc = {"ckptport": __version__, "command": "normalize", "src": report.src,
               "dst": report.dst, "part": report.part, "exit_code": report.exit_code,
               "counts": report.counts, "bytes_in": report.bytes_in,
               "bytes_out": report.bytes_out, "seconds": round(report.seconds, 3),
               "files": report.files, "notes": list(report.notes),
               "not_checkpoints": [{"path": p, "reason": r} for p, r in report.not_checkpoints]}
        return json.dumps(jsonable(doc), indent=2)

    def manifest(self, made: Manifest, path: Path | None) -> str:
        if path is not None and _network():  # the report of -o FILE, not the manifest's bytes
            return json.dumps({**json.loads(made.to_json()), **_network()}, indent=2)
        return made.to_json().rstrip("\n")

    def normalize(self, report: NormalizeReport) -> str:
        source = json_fields(report.source)
        source["sha256"] = report.source_sha256
        selected = report.rule("select")
        doc = {
            "ckptport": __version__,
            "command": "normalize",
            "source": source,
            "selection": jsonable(dict(selected.details)) if selected else {},
            "rules": [jsonable(r) for r in report.rules],
            "map_sha256": report.map_sha256,
            "metadata_kept": list(report.metadata_kept),
            "output": jsonable(report.output),
            **_network(),
        }
        return json.dumps(doc, indent=2)

    def diff(self, report: DiffReport, limit: int | None = None) -> str:
        """Every difference, never limited; ``inf``/``nan`` as strings to stay strict JSON."""
        doc = {
            "ckptport": __version__,
            "command": "diff",
            "equal": report.equal,
            "summary": report.summary(),
            "tensors_differing": report.tensors_differing,
            **json_fields(report),
            **_network(),
        }
        return json.dumps(_strict(doc), indent=2, allow_nan=False)


    def inspect(self, report: InspectReport) -> str:
        doc = {"ckptport": __version__, "command": "inspect", **json_fields(report),
               "tensor_bytes": report.tensor_bytes, **_network()}
        return json.dumps(doc, indent=2)

    def error(self, failure: Failure) -> str:
        """An object a tool can tell from a report by its ``error`` key."""
        doc = {"ckptport": __version__, "command": failure.command,
               "exit_code": failure.exit_code,
               "error": {"message": failure.line, "path": failure.path, "kind": failure.kind}}
        return json.dumps(doc, indent=2)

    def check(self, report: CheckReport) -> str:
        doc = {
            "ckptport": __version__,
            "command": "check",
            "exit_code": report.exit_code,
            "findings": report.findings,
            "rules": list(report.codes),
            "files": [{"path": str(f.path), "unreadable": f.unreadable,
                       "findings": [{"code": x.code, "severity": x.severity, "key": x.key,
                                     "message": x.message} for x in f.findings]}
                      for f in report.files],
            "skipped": [{"path": str(s.path), "reason": s.reason} for s in report.skipped],
            **_network(),
        }
        return json.dumps(doc, indent=2)


def _network() -> dict[str, object]:
    """``transferred``: what the command fetched over the network, when a source was remote."""
    from ..remote import meter

    made = meter.transferred()
    return {} if made is None else {"transferred": jsonable(made)}


def _strict(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return value
