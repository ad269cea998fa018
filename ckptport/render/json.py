"""Machine-readable reports: stable keys, every change of every rule."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..convert import ConvertReport

__all__ = ["JsonFormatter", "jsonable"]


def jsonable(value: Any) -> Any:
    """Dataclasses, enums, paths and mappings as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.init}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


class JsonFormatter:
    def convert(self, report: ConvertReport) -> str:
        source = jsonable(report.source)
        source["sha256"] = report.source_sha256
        doc = {
            "ckptport": __version__,
            "command": "normalize",
            "source": source,
            "selection": dict(report.rules[0].details) if report.rules else {},
            "rules": [jsonable(r) for r in report.rules],
            "output": jsonable(report.output),
        }
        return json.dumps(doc, indent=2)
