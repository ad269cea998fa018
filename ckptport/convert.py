"""``ckptport normalize`` as a library call: read, normalize, write, verify.

The source's sha256 goes into safetensors metadata; hashing costs as much
as reading the file, so it runs in a worker thread (hashlib releases the
GIL) while the checkpoint is read and normalized.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import SourceFacts
from .errors import InputError
from .progress import Progress, no_progress
from .readers import read
from .rules import NormalizeOptions, RuleResult, normalize
from .writers import WriteResult, check_destination, output_format, write

__all__ = ["ConvertReport", "convert", "sha256_file"]

_CHUNK = 1 << 22


@dataclass(frozen=True)
class ConvertReport:
    source: SourceFacts
    source_sha256: str
    rules: tuple[RuleResult, ...]
    output: WriteResult


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    return digest.hexdigest()


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    options: NormalizeOptions | None = None,
    *,
    to: str | None = None,
    anchor: str = "cpu",
    overwrite: bool = False,
    verify: bool = True,
    trust: bool = False,
    progress: Progress = no_progress,
) -> ConvertReport:
    source, target = Path(src), Path(dst)
    output_format(target, to)  # fail on a bad extension before reading gigabytes
    check_destination(source, target, overwrite)
    with ThreadPoolExecutor(max_workers=1) as pool:
        digest = pool.submit(sha256_file, source)
        checkpoint = read(source, trust=trust)
        normalized = normalize(checkpoint, options)
        sha256 = digest.result()
    metadata = _provenance(sha256, normalized.results)
    written = write(normalized.checkpoint, target, fmt=to, anchor=anchor, overwrite=overwrite,
                    verify=verify, metadata=metadata, progress=progress)
    return ConvertReport(checkpoint.source, sha256, normalized.results, written)


def _provenance(sha256: str, results: tuple[RuleResult, ...]) -> Mapping[str, str]:
    import json

    applied = {r.rule: r.summary for r in results if r.changed or r.rule == "select"}
    return {"ckptport.source_sha256": sha256,
            "ckptport.rules": json.dumps(applied, sort_keys=True, separators=(",", ":"))}
