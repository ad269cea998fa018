"""``ckptport normalize`` as a library call: read, normalize, write, verify.

The source's sha256 goes into safetensors metadata (other outputs have no
place for it, and it is not computed for them); hashing costs as much
as reading the file, so it runs in a worker thread (hashlib releases the
GIL) while the checkpoint is read, normalized and written; the header's
placeholder is patched once it is known.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import SourceFacts
from .errors import InputError
from .progress import Progress, no_progress
from .readers import read, resolve
from .rules import NormalizeOptions, RuleResult, normalize
from .writers import OutputFormat, WriteResult, check_destination, output_format, write
from .writers.dcp import write_dcp
from .writers.safetensors import MetadataValue, Pending
from .writers.shards import write_shards

__all__ = ["ConvertReport", "convert", "sha256_files"]

_CHUNK = 1 << 22
DEFAULT_SHARD_SIZE = 5 * 10**9  # the hub's default
SHA256_HEX_WIDTH = 64


@dataclass(frozen=True)
class ConvertReport:
    source: SourceFacts
    source_sha256: str | None  # computed for safetensors output, which records it
    rules: tuple[RuleResult, ...]
    output: WriteResult


def sha256_files(paths: tuple[Path, ...]) -> str:
    """sha256 of the files' bytes in order (a shard set: its index, then its shards)."""
    digest = hashlib.sha256()
    for path in paths:
        _hash_into(digest, path)
    return digest.hexdigest()


def _hash_into(digest: Any, path: Path) -> None:
    try:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None


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
    max_shard_size: int | None = None,
    progress: Progress = no_progress,
) -> ConvertReport:
    """Normalize ``src`` into ``dst``: a file, or a shard set when ``dst`` is a folder
    (an existing one, or a path ending in a separator) or ``max_shard_size`` is given."""
    target = Path(dst)
    to_dcp = to == OutputFormat.DCP.value
    sharded = not to_dcp and (max_shard_size is not None or target.is_dir()
                              or str(dst).endswith(os.sep))
    source, files = resolve(src)
    if to_dcp:
        kind = OutputFormat.DCP
    elif sharded:
        kind = OutputFormat(to or OutputFormat.SAFETENSORS.value)
    else:
        kind = output_format(target, to)  # fail on a bad extension before reading gigabytes
        check_destination(files, target, overwrite)
    before = _snapshot(files)

    def unchanged() -> None:
        if _snapshot(files) != before:
            raise InputError("changed while it was read; nothing was written, run again",
                             source)

    with ThreadPoolExecutor(max_workers=1) as pool:  # hashing overlaps reading and writing
        # only safetensors records the hash; it costs a full read of the source
        digest = pool.submit(sha256_files, files) if kind is OutputFormat.SAFETENSORS else None
        checkpoint = read(source, trust=trust)
        normalized = normalize(checkpoint, options, lazy=True)
        metadata = {} if digest is None else _provenance(
            Pending(digest, SHA256_HEX_WIDTH), checkpoint.source.metadata, normalized.results)
        common: dict[str, Any] = {"anchor": anchor, "overwrite": overwrite, "verify": verify,
                                  "metadata": metadata, "progress": progress,
                                  "precommit": unchanged}
        if to_dcp:
            written = write_dcp(normalized.checkpoint, target, overwrite=overwrite,
                                verify=verify, progress=progress, precommit=unchanged)
        elif sharded:
            written = write_shards(normalized.checkpoint, target, kind=kind,
                                   max_shard_size=max_shard_size or DEFAULT_SHARD_SIZE, **common)
        else:
            written = write(normalized.checkpoint, target, fmt=kind.value, **common)
        sha256 = None if digest is None else digest.result()
    return ConvertReport(checkpoint.source, sha256, normalized.results, written)


def _snapshot(files: tuple[Path, ...]) -> list[tuple[int, int, int]]:
    """Identity, size and modification time of each source file, to notice a rewrite."""
    stats = []
    for path in files:
        try:
            st = path.stat()
        except OSError as exc:
            raise InputError.from_os_error(exc, path) from None
        stats.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return stats


SOURCE_SHA256_KEY = "ckptport.source_sha256"
RULES_KEY = "ckptport.rules"


def _provenance(sha256: Pending, source_metadata: Mapping[str, str],
                results: tuple[RuleResult, ...]) -> Mapping[str, MetadataValue]:
    """Where the weights came from and what was done to them, across re-normalizations.

    A source that ckptport wrote already names the original checkpoint and
    the rules applied to it; those carry over, so normalizing an output
    again writes the same bytes, and the hash still names the file the
    weights were trained into.
    """
    try:
        prior = json.loads(source_metadata.get(RULES_KEY, "{}"))
    except ValueError:
        prior = {}
    applied = {**(prior if isinstance(prior, dict) else {}),
               **{r.rule: r.summary for r in results if r.changed}}
    return {SOURCE_SHA256_KEY: source_metadata.get(SOURCE_SHA256_KEY, sha256),
            RULES_KEY: json.dumps(applied, sort_keys=True, separators=(",", ":"))}
