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

import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...analysis.manifests import WrittenDigests, build_manifest, write_manifest
from ...checkpoint import Format, SourceFacts
from ...errors import InputError, OutputError, RuleError
from ...progress import Progress, no_progress
from ...readers import Source, open_checkpoint, resolve
from ...remote.urls import is_remote, location
from ...rules import NormalizeOptions, RuleResult, apply_rules
from ...rules.keys import KEY_MAP_SHA256
from ...sources import read_more_than_once, sha256_files
from ...tree import KEY_RULES, KEY_SOURCE_SHA256
from ...writers import WriteOptions, WriteResult, write_to
from ...writers.hashname import publish_hashed, staging_destination
from ...writers.plan import check_destination, plan_destination, same_file
from ...writers.safetensors import MetadataValue, Pending

__all__ = ["NormalizeReport", "normalize_file",
           "carried_metadata", "METADATA_CHOICES"]

_CHUNK = 1 << 22
METADATA_CHOICES = ("keep", "drop")
SHA256_HEX_WIDTH = 64


@dataclass(frozen=True)
class NormalizeReport:
    source: SourceFacts
    source_sha256: str | None  # computed for safetensors output, which records it
    rules: tuple[RuleResult, ...]
    output: WriteResult
    manifest: Path | None = None  # --manifest: where the manifest of the output went
    digest: str | None = None  # its weights digest
    metadata_kept: tuple[str, ...] = ()  # the source's own safetensors metadata keys carried
    map_sha256: str | None = None  # --map: the sha256 of the recipe file

    def rule(self, name: str) -> RuleResult | None:
        return next((r for r in self.rules if r.rule == name), None)


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
    applied: dict[str, str] = {}
    for r in (r for r in results if r.changed):  # a rule may run more than once (renames)
        applied[r.rule] = f"{applied[r.rule]}; {r.summary}" if r.rule in applied else r.summary
    return {KEY_SOURCE_SHA256: sha256,
            KEY_RULES: json.dumps(applied, sort_keys=True, separators=(",", ":"))}


def carried_metadata(source: SourceFacts, keep: bool = True) -> dict[str, str]:
    """A safetensors source's own ``__metadata__`` (modelspec, kohya ``ss_*``, notes), for
    safetensors outputs: never ``format`` (always ``pt``) nor a ``ckptport.*`` key, which
    ckptport writes itself and never takes from a source."""
    if not keep or source.format != Format.SAFETENSORS:
        return {}
    return {key: value for key, value in sorted(source.metadata.items())
            if key != "format" and not key.startswith("ckptport.") and isinstance(value, str)}


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
    metadata: str = "keep",
    hash_name: bool = False,
    max_expansion: float | None = None,
    progress: Progress = no_progress,
) -> NormalizeReport:
    """Normalize ``src`` into ``dst``: a file, a shard set when ``dst`` is a folder (an
    existing one, or a path ending in a separator) or ``max_shard_size`` is given, or
    a DCP folder with ``to="dcp"``.

    ``manifest`` also writes the manifest of the output (``ckptport manifest``) from the
    bytes as they are written; ``jobs`` threads verify (default: every core);
    ``hash_source`` computes the source's sha256 whatever the output (folder mode
    records it to resume). ``metadata="drop"`` leaves a safetensors source's own
    metadata out of a safetensors output (``keep``: carried). ``hash_name`` names
    the output ``STEM-<first 8 hex of its sha256>.EXT`` (torch.hub's check_hash)."""
    if metadata not in METADATA_CHOICES:
        raise RuleError(f"--metadata {metadata}: choose one of {', '.join(METADATA_CHOICES)}")
    if is_remote(os.fspath(dst)):
        raise OutputError("is a URL; DST is written locally (upload it with your own tools)",
                          location(dst))
    destination = plan_destination(dst, to, max_shard_size)
    final_dst = destination.path
    if hash_name:
        destination = staging_destination(destination)
    with read_more_than_once():  # hashed, read and verified: fetched bytes are kept
        source = src if isinstance(src, Source) else resolve(src)
    check_destination(source.files, destination, overwrite or hash_name)
    if manifest is not None and any(same_file(Path(manifest), p)
                                    for p in (*source.files, destination.path)):
        raise OutputError("is the source or DST; write the manifest elsewhere", manifest)
    before = _snapshot(source.files)

    def unchanged() -> None:
        if _snapshot(source.files) != before:
            raise InputError("changed while it was read; nothing was written, run again",
                             source.path)

    records_hash = destination.format.name == "safetensors"
    digests = WrittenDigests() if manifest is not None else None
    with ThreadPoolExecutor(max_workers=1) as pool:  # hashing overlaps reading and writing
        digest = pool.submit(sha256_files, source.files) \
            if records_hash or hash_source else None
        checkpoint = open_checkpoint(source, trust=trust, max_expansion=max_expansion)
        normalized = apply_rules(checkpoint, options, lazy=True)
        recipe = (options or NormalizeOptions()).loaded_recipe
        carried = carried_metadata(checkpoint.source, metadata == "keep") if records_hash else {}
        header: Mapping[str, Any] = {} if digest is None or not records_hash else {
            **carried, **_provenance(Pending(digest, SHA256_HEX_WIDTH), normalized.results),
            **({KEY_MAP_SHA256: recipe.sha256} if recipe else {})}
        written = write_to(normalized.checkpoint, destination, WriteOptions(
            anchor=anchor, overwrite=overwrite or hash_name, verify=verify, metadata=header,
            progress=progress, precommit=unchanged, dcp_key=dcp_key, jobs=jobs,
            tap=None if digests is None else digests.tap))
        sha256 = None if digest is None else digest.result()
    if hash_name:
        final = publish_hashed(written.path, final_dst, overwrite)
        written = replace(written, path=final, files=(final,))
    made = None
    if manifest is not None and digests is not None:
        # the manifest describes DST, which every step already made (selected, stripped,
        # renamed, cast): checking DST against it must apply none of them again
        given = options or NormalizeOptions()
        made = build_manifest(normalized.checkpoint, NormalizeOptions(
            select="all" if given.select == "all" else "auto",
            keep_prefixes=given.keep_prefixes), jobs=jobs, known=digests.done,
            progress=progress)
        write_manifest(made, manifest)
    return NormalizeReport(checkpoint.source, sha256, normalized.results, written,
                           None if manifest is None else Path(manifest),
                           None if made is None else made.digest, tuple(carried),
                           None if recipe is None else recipe.sha256)
