"""``ckptport normalize SRC DST`` as a library call: read, normalize, write, verify.

The destination is planned and checked before a byte of the source is read;
the source is read once (tensors described, bytes read by position as they
are written); the rules run lazily, so casts and compactions are computed
one tensor at a time by the writer. What an output records of its source
(the files' sha256, what the rules did) is handed to the writer as facts
(``writers.provenance``): formats with a place for it record it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ...analysis.manifests import WrittenDigests, build_manifest, write_manifest
from ...checkpoint import Checkpoint, Format, SourceFacts
from ...errors import (
    InputError,
    OutputError,
    OutputExistsError,
    RuleError,
    VerificationError,
)
from ...progress import Progress, no_progress
from ...quant.torchao_layout import output_metadata
from ...readers import Source, open_checkpoint, resolve
from ...remote.readhash import CATCH_UP
from ...remote.urls import RemotePath, Where, is_remote
from ...rules import Normalized, NormalizeOptions, RuleResult, apply_rules
from ...rules.quantized import MODEL_CONFIG, plain_config
from ...rules.recipes import KEY_MAP_SHA256, Recipe
from ...sources import read_more_than_once
from ...tree import KEY_PREFIX
from ...writers import WriteOptions, WriteResult, write_to
from ...writers.formats import refuse_untaken
from ...writers.hashname import publish_hashed, staging_destination
from ...writers.plan import Destination, check_destination, plan_destination, same_file
from ...writers.provenance import Provenance
from ...writers.remote import (
    OFF_THE_HUB,
    RemoteDestination,
    check_remote,
    plan_remote,
    write_remote,
)
from ...writers.staging import staged_file
from ...writers.streamed import StreamedCrcs
from .message import applied, commit_message

if TYPE_CHECKING:
    from model_signing._signing.signing import Signer

    from ...analysis.digest import Manifest
    from ...remote.commit import HubStore
    from ...remote.upload import S3Store
    from ...signing.keys import SigningKey

__all__ = ["NormalizeReport", "normalize_file",
           "carried_metadata", "METADATA_CHOICES"]

_CHUNK = 1 << 22
METADATA_CHOICES = ("keep", "drop")
# a remote source's latest bytes kept for a remote DST: what its sha256 catches up with
# (tensors read out of the file's order), verification asking nothing of them
KEPT_BEHIND = CATCH_UP


@dataclass(frozen=True)
class NormalizeReport:
    source: SourceFacts
    source_sha256: str | None  # computed for safetensors output, which records it
    rules: tuple[RuleResult, ...]
    output: WriteResult
    manifest: Path | None = None  # --manifest: where the manifest of the output went
    digest: str | None = None  # its weights digest
    attestation: Path | None = None  # --sign: the output's signed weights attestation
    metadata_kept: tuple[str, ...] = ()  # the source's own safetensors metadata keys carried
    map_sha256: str | None = None  # --map: the sha256 of the recipe file

    def rule(self, name: str) -> RuleResult | None:
        return next((r for r in self.rules if r.rule == name), None)


def _snapshot(files: tuple[Where, ...]) -> list[tuple[int, int, int]]:
    """Identity, size and modification time of each source file, to notice a rewrite."""
    stats = []
    for path in files:
        try:
            st = path.stat()
        except OSError as exc:
            raise InputError.from_os_error(exc, path) from None
        stats.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return stats


def carried_metadata(source: SourceFacts, keep: bool = True) -> dict[str, str]:
    """A safetensors source's own ``__metadata__`` (modelspec, kohya ``ss_*``, notes), for
    safetensors outputs: never ``format`` (always ``pt``) nor a ``ckptport.*`` key, which
    ckptport writes itself and never takes from a source."""
    if not keep or source.format != Format.SAFETENSORS:
        return {}
    return {key: value for key, value in sorted(source.metadata.items())
            if key != "format" and not key.startswith(KEY_PREFIX) and isinstance(value, str)}


@dataclass(frozen=True)
class _Plan:
    """DST planned before a byte of the source is read: what the writer writes (DST, a
    remote DST's local spool, or ``--hash-name``'s staging file) and the name it ends as."""

    destination: Destination
    final: Path  # the planned DST (``--hash-name``: the name its sha256 extends)
    remote: RemoteDestination | None = None
    hash_name: bool = False

    def published(self, written: WriteResult, overwrite: bool,
                  before: Callable[[Path], object] | None = None) -> WriteResult:
        """``--hash-name``: the staged file under its name by sha256 (a local file: refused
        for a URL when planned), ``before`` called with that name first."""
        if not self.hash_name:
            return written
        final = publish_hashed(Path(written.path), self.final, overwrite, before)
        return replace(written, path=final, files=(final,))


def _plan(dst: str | os.PathLike[str], to: str | None, max_shard_size: int | str | None, *,
          anchor: str, dcp_key: str | None, metadata: str, hash_name: bool,
          create_pr: bool) -> _Plan:
    """DST (local or remote, its format, a shard set or not) with the options that cannot
    apply to it refused, before the source is opened."""
    if metadata not in METADATA_CHOICES:
        raise RuleError(f"--metadata {metadata}: choose one of {', '.join(METADATA_CHOICES)}")
    remote = plan_remote(dst, to, max_shard_size) if is_remote(os.fspath(dst)) else None
    if remote is None and create_pr:
        raise OutputError(OFF_THE_HUB, os.fspath(dst))
    if remote is not None and hash_name:
        raise OutputError("--hash-name names a local file; name the remote object yourself",
                          remote.url)
    destination = remote.local if remote is not None else plan_destination(dst, to,
                                                                             max_shard_size)
    refuse_untaken(destination.format, anchor=anchor, dcp_key=dcp_key, metadata=metadata)
    return _Plan(staging_destination(destination) if hash_name else destination,
                 destination.path, remote, hash_name)


def _resolve_source(src: str | os.PathLike[str] | Source, tag: str | None,
                    plan: _Plan) -> Source:
    """``src`` resolved as a source read more than once (hashed, read and verified
    against): fetched bytes are kept; with a remote DST, a window of the latest
    ``KEPT_BEHIND`` bytes (verified by what was streamed: ``_streamed``), so local disk
    holds the file being written and little more."""
    with read_more_than_once(KEPT_BEHIND if plan.remote is not None else None):
        return src if isinstance(src, Source) else resolve(src, tag)


def _streamed(plan: _Plan, source: Source) -> StreamedCrcs | None:
    """A remote source written to a remote DST is verified against the CRC-32 of the bytes
    the writer streamed: its spool keeps only the latest bytes, and reading the source
    again would download it again (``writers.streamed``)."""
    if plan.remote is None or not any(isinstance(f, RemotePath) for f in source.files):
        return None
    return StreamedCrcs()


def _check_outputs(plan: _Plan, source: Source, manifest: str | os.PathLike[str] | None, *,
                   overwrite: bool, create_pr: bool) -> S3Store | HubStore | None:
    """What will be written checked against the source and what exists, before the source
    is read: DST (a remote one's store, to write with, is returned) and the manifest."""
    store = None
    if plan.remote is not None:
        store = check_remote(source.files, plan.remote, overwrite, create_pr)
    else:
        check_destination(source.files, plan.destination, overwrite or plan.hash_name)
    if manifest is not None and any(same_file(Path(manifest), p)
                                    for p in (*source.files, plan.destination.path)):
        raise OutputError("is the source or DST; write the manifest elsewhere", manifest)
    return store


def _change_guard(source: Source) -> Callable[[], None]:
    """The writer's last check before DST appears (its ``precommit``): the source's files
    are still the ones first seen, or nothing is written."""
    before = _snapshot(source.files)

    def unchanged() -> None:
        if _snapshot(source.files) != before:
            raise InputError("changed while it was read; nothing was written, run again",
                             source.path)

    return unchanged


@dataclass(frozen=True)
class _Signing:
    """``--sign`` made ready before anything is written: the key's signer (a bad key fails
    then) and the attestation's path (refused then if it exists without ``overwrite``).
    With ``--hash-name`` the path waits for the file's name (``at``, called as the file
    is named): the attestation lies beside that name, where ``verify`` looks."""

    key: SigningKey
    signer: Signer
    path: Path | None  # None until ``--hash-name``'s name is known

    @classmethod
    def ready(cls, key: SigningKey | None, dst: str | os.PathLike[str], plan: _Plan,
              overwrite: bool) -> _Signing | None:
        if key is None:
            return None
        signer = key.signer()
        return cls(key, signer, None if plan.hash_name else _attestation_path(
            dst, plan.final, plan.destination.folder, overwrite))

    def at(self, final: Path, overwrite: bool) -> _Signing:
        """The attestation beside ``final`` (the name ``--hash-name`` gave the file),
        refused if it exists without ``overwrite``."""
        return replace(self, path=_attestation_path(final, final, False, overwrite))

    def sign(self, made: Manifest, written: WriteResult, checkpoint: Checkpoint,
             options: NormalizeOptions, jobs: int | None) -> None:
        """Sign the output's manifest; its derivation records the source's weights digest
        and files, the options, the recipe's sha256 and the tool."""
        from ...signing import derivation_of, sign_weights

        assert self.path is not None  # ``at`` named it when the file was named
        sign_weights(made, self.key, self.path, Path(str(written.path)).name,
                     derivation_of(checkpoint, options, jobs=jobs), overwrite=True,
                     signer=self.signer)


def _dequantized_config(plan: _Plan, checkpoint: Checkpoint, results: tuple[RuleResult, ...],
                        *, beside: bool, overwrite: bool) -> tuple[Path, bytes] | None:
    """With ``--dequantize``: where the source folder's ``config.json`` without its
    ``quantization_config`` goes (a shard-set folder DST; beside a file DST if ``beside``;
    never a remote DST) and its bytes, refused before the write if there already."""
    destination = plan.destination
    if plan.remote is not None or not (destination.sharded or beside):
        return None
    config_at = (destination.path if destination.sharded else destination.path.parent) \
        / MODEL_CONFIG
    plain = plain_config(checkpoint.source.path, results)
    if plain is None:
        return None
    if config_at.exists() and not overwrite:
        raise OutputExistsError("exists; pass --overwrite to replace it (the dequantized "
                                "folder's config, without its quantization_config)", config_at)
    return config_at, plain


def _provenance(source: Source, checkpoint: Checkpoint, normalized: Normalized,
                recipe: Recipe | None, *, records: bool,
                keep: bool) -> tuple[Provenance, tuple[str, ...]]:
    """What the output records of its source (``writers.provenance``; a format that
    ``records`` metadata), and which of the source's own metadata keys it carries."""
    kept = carried_metadata(checkpoint.source, keep) if records else {}
    carried = output_metadata(kept, checkpoint.source.metadata, normalized.checkpoint.tree) \
        if records else {}  # torchao's entries made for the output, whatever the source
    provenance = Provenance(source.files, applied(normalized.results), carried,
                            {KEY_MAP_SHA256: recipe.sha256} if recipe else {})
    return provenance, tuple(k for k in kept if k in carried)


def _manifest_of(checkpoint: Checkpoint, given: NormalizeOptions, recipe: Recipe | None,
                 digests: WrittenDigests, *, jobs: int | None, progress: Progress) -> Manifest:
    """The written output's manifest, from the digests taken as its bytes were written."""
    # the manifest describes DST, which every step already made (selected, stripped,
    # renamed, cast): checking DST against it must apply none of them again
    made = build_manifest(checkpoint, NormalizeOptions(
        select="all" if given.select == "all" else "auto",
        keep_prefixes=given.keep_prefixes), jobs=jobs, known=digests.done, progress=progress)
    if recipe is None:
        return made
    # what made DST, as its metadata and the report record it
    return replace(made, made_with={"map": {"path": recipe.path, "sha256": recipe.sha256}})


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
    config_beside: bool = False,
    metadata: str = "keep",
    hash_name: bool = False,
    create_pr: bool = False,
    max_expansion: float | None = None,
    tag: str | None = None,
    sign: SigningKey | None = None,
    progress: Progress = no_progress,
) -> NormalizeReport:
    """Read ``src``, normalize it, write ``dst`` atomically and verify it bit for bit.

    What ``ckptport normalize SRC DST`` runs.

    Args:
        src: any checkpoint ckptport reads (a file, a shard set, a DCP, DeepSpeed, rank-file
            or model folder, a URL), or a ``Source`` already resolved.
        dst: a file (format from its extension), a folder (an existing one, or a path
            ending in a separator) for a shard set, or a folder with ``to="dcp"``; or an
            ``s3://BUCKET/KEY`` (``s3://BUCKET/PREFIX/`` for a shard set), uploaded and
            verified on the server before it appears (``writers.remote``).
        options: which weights and keys (``--select``, ``--strip-prefix``, key steps,
            ``--dtype``); default ``NormalizeOptions()``.
        to: an output format's name (``writers.formats``); default from DST.
        anchor: the device a ``.pth`` records (``cpu`` or ``cuda:N``).
        overwrite, verify, trust: as the CLI flags (``trust`` runs code from the file).
        max_shard_size: write a shard set of shards of at most this size.
        dcp_key: nest the tree under this key in a DCP folder.
        manifest: also write the output's manifest, hashed as the bytes are written.
        jobs: verification threads (default: every core).
        hash_source: compute the source's sha256 whatever the output (folder mode).
        config_beside: with ``--dequantize``, write the source folder's ``config.json``
            (without its ``quantization_config``) beside a file DST too (folder mode: DST
            mirrors the source's folder); a shard-set folder DST always gets it.
        metadata: ``keep`` a safetensors source's own metadata in a safetensors output, or
            ``drop`` it.
        hash_name: name the output ``STEM-<first 8 hex of its sha256>.EXT`` (torch.hub's
            ``check_hash``).
        create_pr: an ``hf://`` DST: open a pull request with the files instead of committing
            to the branch.
        max_expansion: the read budget's ratio (``readers.budget``).
        tag: a DeepSpeed save folder's tag (default: the one ``latest`` names).
        sign: sign the output's weights attestation with this key (``signing``): its
            derivation records the source's weights digest and files, the options, the
            recipe's sha256 and the tool, for ``verify --chain``.
        progress: a ``Progress`` callback (the CLI's tqdm bars).

    Returns:
        A ``NormalizeReport``: what the source held, what each rule did, what was written.

    Raises:
        InputError: the source cannot be read, or changed while it was read.
        OutputError: DST exists (without ``overwrite``), is the source, cannot be written.
        RuleError, SelectionError, OptionError: the options cannot apply to this file.
        VerificationError: the written file does not read back bit for bit (DST untouched).
    """
    plan = _plan(dst, to, max_shard_size, anchor=anchor, dcp_key=dcp_key, metadata=metadata,
                 hash_name=hash_name, create_pr=create_pr)
    source = _resolve_source(src, tag, plan)
    store = _check_outputs(plan, source, manifest, overwrite=overwrite, create_pr=create_pr)
    unchanged = _change_guard(source)
    signing = _Signing.ready(sign, dst, plan, overwrite)
    # reader -> Checkpoint -> rules (lazy: the writer computes each tensor as it writes it)
    checkpoint = open_checkpoint(source, trust=trust, max_expansion=max_expansion)
    normalized = apply_rules(checkpoint, options, lazy=True)
    config = _dequantized_config(plan, checkpoint, normalized.results, beside=config_beside,
                                 overwrite=overwrite)
    given = options or NormalizeOptions()
    recipe = given.loaded_recipe
    records = plan.destination.format.metadata
    provenance, kept = _provenance(source, checkpoint, normalized, recipe, records=records,
                                   keep=metadata == "keep")
    if hash_source:
        provenance.sha256()  # folder mode's journal wants it whatever the output
    digests = WrittenDigests() if manifest is not None or sign is not None else None
    write_options = WriteOptions(
        anchor=anchor, overwrite=overwrite or hash_name, verify=verify,
        provenance=provenance if records else None, progress=progress,
        precommit=unchanged, dcp_key=dcp_key, jobs=jobs,
        tap=None if digests is None else digests.tap, streamed=_streamed(plan, source))
    # -> writer
    written = write_to(normalized.checkpoint, plan.destination, write_options) \
        if plan.remote is None else write_remote(
            normalized.checkpoint, plan.remote, write_options, store,
            commit_message(source, plan.remote, options, normalized.results))
    # the after-steps, on the written and verified output
    if config is not None:
        _write_verified(*config)
    sha256 = provenance.known_sha256()
    written = plan.published(written, overwrite, None if signing is None else partial(
        signing.at, overwrite=overwrite))  # --hash-name: the attestation checked by its name
    if signing is not None and signing.path is None:
        signing = signing.at(Path(written.path), overwrite=True)  # checked as it was named
    made = None if digests is None else _manifest_of(normalized.checkpoint, given, recipe,
                                                     digests, jobs=jobs, progress=progress)
    if manifest is not None and made is not None:
        write_manifest(made, manifest)
    if signing is not None and made is not None:
        signing.sign(made, written, checkpoint, given, jobs)
    return NormalizeReport(checkpoint.source, sha256, normalized.results, written,
                           None if manifest is None else Path(manifest),
                           None if made is None else made.digest,
                           attestation=None if signing is None else signing.path,
                           metadata_kept=kept,
                           map_sha256=None if recipe is None else recipe.sha256)


def _write_verified(path: Path, data: bytes) -> None:
    """A small file published whole, once what the disk holds reads back as ``data``."""
    with staged_file(path, overwrite=True) as staged:
        staged.file.write(data)
        staged.sync()
        if staged.tmp.read_bytes() != data:
            raise VerificationError("did not read back as written; nothing was published",
                                    path)
        staged.publish()


def _attestation_path(dst: str | os.PathLike[str], final: Path, folder: bool,
                      overwrite: bool) -> Path:
    """Where ``normalize --sign`` puts the output's weights attestation (as ``sign`` would:
    beside a file, in a folder), refused up front if it exists without ``overwrite``."""
    from ...signing import signature_paths

    if is_remote(os.fspath(dst)):
        raise OutputError("--sign writes the attestation beside the output: a local one",
                          os.fspath(dst))
    path = signature_paths(final, folder=folder)[1]
    if path.exists() and not overwrite:
        raise OutputExistsError("exists; pass --overwrite to replace it", path)
    return path
