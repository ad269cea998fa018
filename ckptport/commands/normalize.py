"""``ckptport normalize SRC DST`` as a library call: read, normalize, write, verify.

``normalize_file`` is the CLI command's twin (``convert`` is its round-1
name). The destination is planned and checked before a byte of the source
is read; the source is read once (tensors described, bytes read by
position as they are written); the rules run lazily, so casts and
compactions are computed one tensor at a time by the writer.

The source's sha256 goes into safetensors metadata (``ckptport.source_sha256``;
other outputs have no place for it, and it is not computed for them). It is
always the hash of the file actually read — a ``source_sha256`` that the
source itself claims is never copied, since ckptport cannot verify it.
Hashing costs as much as reading the file, so it runs in a worker thread
(hashlib releases the GIL) while the checkpoint is read, normalized and
written; the header's placeholder is patched once it is known.
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

from ..checkpoint import SourceFacts
from ..errors import InputError, OutputError
from ..progress import Progress, no_progress
from ..readers import Source, open_checkpoint, resolve
from ..remote.urls import is_remote, location
from ..rules import NormalizeOptions, RuleResult, apply_rules
from ..sources import read_more_than_once
from ..tree import KEY_RULES, KEY_SOURCE_SHA256
from ..writers import WriteOptions, WriteResult, write_to
from ..writers.plan import Target, check_destination, plan_destination, same_file
from ..writers.safetensors import MetadataValue, Pending
from .manifest import WrittenDigests, build_manifest, write_manifest

__all__ = ["NormalizeReport", "ConvertReport", "normalize_file", "convert", "sha256_files"]

_CHUNK = 1 << 22
SHA256_HEX_WIDTH = 64


@dataclass(frozen=True)
class NormalizeReport:
    source: SourceFacts
    source_sha256: str | None  # computed for safetensors output, which records it
    rules: tuple[RuleResult, ...]
    output: WriteResult
    manifest: Path | None = None  # --manifest: where the manifest of the output went
    digest: str | None = None  # its weights digest

    def rule(self, name: str) -> RuleResult | None:
        return next((r for r in self.rules if r.rule == name), None)


ConvertReport = NormalizeReport  # the round-1 name


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


def _provenance(sha256: Pending, results: tuple[RuleResult, ...]
                ) -> Mapping[str, MetadataValue]:
    """The file this run read, and what this run's rules did to it."""
    applied = {r.rule: r.summary for r in results if r.changed}
    return {KEY_SOURCE_SHA256: sha256,
            KEY_RULES: json.dumps(applied, sort_keys=True, separators=(",", ":"))}


def normalize_file(
    src: str | os.PathLike[str] | Source,
    dst: str | os.PathLike[str],
    options: NormalizeOptions | None = None,
    *,
    to: str | None = None,
    anchor: str = "cpu",
    overwrite: bool = False,
    verify: bool = True,
    trust: bool = False,
    max_shard_size: int | str | None = None,
    dcp_key: str | None = None,
    manifest: str | os.PathLike[str] | None = None,
    jobs: int | None = None,
    hash_source: bool = False,
    progress: Progress = no_progress,
) -> NormalizeReport:
    """Normalize ``src`` into ``dst``: a file, a shard set when ``dst`` is a folder (an
    existing one, or a path ending in a separator) or ``max_shard_size`` is given, or
    a DCP folder with ``to="dcp"``.

    ``manifest`` also writes the manifest of the output (``ckptport manifest``) from the
    bytes as they are written; ``jobs`` threads verify (default: every core);
    ``hash_source`` computes the source's sha256 whatever the output (folder mode
    records it to resume)."""
    if is_remote(os.fspath(dst)):
        raise OutputError("is a URL; DST is written locally (upload it with your own tools)",
                          location(dst))
    destination = plan_destination(dst, to, max_shard_size)
    with read_more_than_once():  # hashed, read and verified: fetched bytes are kept
        source = src if isinstance(src, Source) else resolve(src)
    check_destination(source.files, destination, overwrite)
    if manifest is not None and any(same_file(Path(manifest), p)
                                    for p in (*source.files, destination.path)):
        raise OutputError("is the source or DST; write the manifest elsewhere", manifest)
    before = _snapshot(source.files)

    def unchanged() -> None:
        if _snapshot(source.files) != before:
            raise InputError("changed while it was read; nothing was written, run again",
                             source.path)

    records_hash = destination.target is Target.SAFETENSORS
    digests = WrittenDigests() if manifest is not None else None
    with ThreadPoolExecutor(max_workers=1) as pool:  # hashing overlaps reading and writing
        digest = pool.submit(sha256_files, source.files) \
            if records_hash or hash_source else None
        checkpoint = open_checkpoint(source, trust=trust)
        normalized = apply_rules(checkpoint, options, lazy=True)
        metadata: Mapping[str, Any] = {} if digest is None or not records_hash else \
            _provenance(Pending(digest, SHA256_HEX_WIDTH), normalized.results)
        written = write_to(normalized.checkpoint, destination, WriteOptions(
            anchor=anchor, overwrite=overwrite, verify=verify, metadata=metadata,
            progress=progress, precommit=unchanged, dcp_key=dcp_key, jobs=jobs,
            tap=None if digests is None else digests.tap))
        sha256 = None if digest is None else digest.result()
    made = None
    if manifest is not None and digests is not None:
        made = build_manifest(normalized.checkpoint, options or NormalizeOptions(), jobs=jobs,
                              known=digests.done, progress=progress)
        write_manifest(made, manifest)
    return NormalizeReport(checkpoint.source, sha256, normalized.results, written,
                           None if manifest is None else Path(manifest),
                           None if made is None else made.digest)


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str],
            options: NormalizeOptions | None = None, **kwargs: Any) -> NormalizeReport:
    """Round 1's name for ``normalize_file``, kept so existing code runs."""
    return normalize_file(src, dst, options, **kwargs)
