"""Remote destinations (``s3://BUCKET/KEY``, ``s3://BUCKET/PREFIX/``, ``hf://ORG/REPO[@BRANCH]
[/PATH]``): written, verified, then made visible, local disk holding one output file at a time.

Each output file (the file, or one shard of a set) is written into a local
spool folder exactly as a local output is, and verified there against an
independent read of the source (``writers.verify``), or, the source being
remote too, against what was streamed from it (``writers.streamed``: a
second read would be a second download). Then it is uploaded
and what the server stored is read back and compared bit for bit with it
(``remote.upload``); the local copy is deleted before the next shard is
written. Only when every file of the output is uploaded (and, on S3,
verified on the server) do they appear under their names: S3 copies each
from its staging key (a shard set's index last, ``remote.upload``), the hub
makes one commit or pull request with them all (``remote.commit``).

A safetensors file's header holds the source's sha256, known only once the
whole source is read: the writer leaves its placeholder (``LatePatch``) for
the store, which sends that part last (S3, at the commit) or writes it in
before uploading (the hub names an upload by its sha256), so a shard set's
first shard is not held back while the rest of the source is fetched and
hashed a second time.

Why a local spool of one file, not parts streamed as the writer writes
them: the writers patch what they wrote (a zip's local headers, a
safetensors header), and the verifying
readers (``torch.load``, the safetensors library) read a file, not a
stream. The spool is one shard (``--max-shard-size``), so peak local disk is
the largest shard, never the output (a remote source's spool is a window in
memory: ``remote.spool``); the temporary folder (``TMPDIR``) must hold it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import Checkpoint
from ..errors import OutputError, VerificationError
from ..remote import location
from ..remote.urls import RemotePath
from .base import LatePatch, WriteOptions, WriteResult, count_tensors, emit, unique_bytes
from .formats import FORMATS, Kind
from .plan import Destination, file_extension, plan_destination
from .shards import ShardNames, ShardsWriter
from .staging import os_error, staged_file

if TYPE_CHECKING:
    from ..remote.commit import HubStore
    from ..remote.upload import S3Store

__all__ = ["RemoteDestination", "Message", "plan_remote", "check_remote", "write_remote",
           "OFF_THE_HUB"]


WRITTEN = ("s3", "hf")  # the schemes written
# --create-pr given for a DST that is not a hub repository (a bucket, a local path)
OFF_THE_HUB = "--create-pr opens a pull request on the hub: DST must be hf://…"


@dataclass(frozen=True)
class RemoteDestination:
    """A remote output: its URL and the same output planned for the local spool."""

    url: RemotePath
    local: Destination

    @property
    def name(self) -> str:
        """The file's name (a single file), or ``""`` (a folder: a shard set)."""
        return "" if self.local.sharded else self.url.name


def plan_remote(dst: str | os.PathLike[str], to: str | None = None,
                max_shard_size: int | str | None = None) -> RemoteDestination:
    """``dst`` (a URL) planned: its format and whether it is a shard set, as for a local DST
    (a key ending in ``/`` is a folder)."""
    url = location(dst)
    if not isinstance(url, RemotePath):
        raise OutputError("is not a URL", dst)
    if url.url.scheme not in WRITTEN:
        raise OutputError(f"{url.url.scheme}:// destinations are not written (ckptport writes "
                          f"local paths and {', '.join(s + '://' for s in WRITTEN)})", url)
    key = url.url.key
    folder = not key or key.endswith("/") or url.url.scheme == "hf" and not file_extension(
        Path(url.name))  # a hub folder named without its '/' (hf://ORG/REPO/PATH): no extension
    stand_in = Path(tempfile.gettempdir(), f".ckptport-plan-{secrets.token_hex(4)}",
                    url.name or "set")
    chosen = FORMATS.get(str(to)) if to is not None else None
    if chosen is not None and chosen.kind is Kind.FOLDER:
        raise OutputError(f"a {chosen.name} checkpoint is written to a local folder only", url)
    try:
        local = plan_destination(f"{stand_in}{os.sep if folder else ''}", to, max_shard_size)
    except OutputError as exc:  # name the URL, not the stand-in
        raise OutputError(exc.message, url) from None
    if local.sharded and not folder:
        raise OutputError("a shard set is a folder: end the URL with '/' "
                          "(s3://BUCKET/PREFIX/)", url)
    return RemoteDestination(url, local)


def _store(destination: RemoteDestination, create_pr: bool) -> S3Store | HubStore:
    if destination.url.url.scheme == "hf":
        from ..remote.commit import HubStore

        return HubStore(destination.url, destination.local.sharded, create_pr)
    if create_pr:
        raise OutputError(OFF_THE_HUB, destination.url)
    from ..remote.upload import S3Store

    return S3Store(destination.url)  # parts in flight: the command's ``--connections``


def check_remote(sources: tuple[object, ...], destination: RemoteDestination,
                 overwrite: bool, create_pr: bool = False) -> S3Store | HubStore:
    """Before the source is read: the bucket (repository, branch) is there, DST is not a
    source, DST (a file, or a set's files) does not exist unless ``overwrite``. Returns the
    store to write with (``write_remote``)."""
    store = _store(destination, create_pr)
    store.check_bucket()
    url = destination.url.url
    remote = [s for s in sources if isinstance(s, RemotePath) and s.url.scheme == url.scheme
              and s.url.host == url.host]
    if destination.name:
        if any(s.url.key == store.folder + destination.name for s in remote):
            raise OutputError("is the source; write somewhere else", destination.url)
        if not overwrite and store.exists(destination.name):
            raise OutputError("exists; pass --overwrite to replace it", destination.url)
        return store
    names = ShardNames.of(destination.local.format)
    for source in remote:
        folder = source.url.key.rsplit("/", 1)[0] + "/" if "/" in source.url.key else ""
        if folder == store.folder and names.is_ours(source.name):
            raise OutputError(f"holds the source {source.name}; write the set elsewhere",
                              destination.url)
    if not overwrite:
        existing = sorted(n for n in store.names() if names.is_ours(n))
        if existing:
            raise OutputError(f"already holds {', '.join(existing[:3])}; pass --overwrite "
                              "to replace the set", destination.url)
    return store


@dataclass(frozen=True)
class Message:
    """What a hub commit says: a summary line and a description (source, options, rules)."""

    summary: str = ""
    description: str = ""


class _Upload:
    """A ``shards.Sink`` that uploads each verified file and publishes the set on the server."""

    def __init__(self, store: S3Store | HubStore, spool: Path, options: WriteOptions,
                 message: Message) -> None:
        self.store, self.spool, self.options, self.message = store, spool, options, message
        self.location: Path | RemotePath = store.path
        # Any: name -> what the store's stage made (S3: a Staged, the hub: an Uploaded), which
        # its commit takes back
        self.uploaded: dict[str, Any] = {}
        self.late: LatePatch | None = None  # what the file being written left to patch

    def later(self, patch: LatePatch) -> None:
        """``WriteOptions.defer``: the store writes these bytes in when it can (S3: its
        first part sent last, at the commit; the hub: before the upload)."""
        self.late = patch

    def check(self, checkpoint: Checkpoint, names: ShardNames, overwrite: bool) -> None:
        """Done by ``check_remote`` before the source was read."""

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        with tempfile.TemporaryDirectory(prefix="shards-", dir=self.spool) as folder:
            yield Path(folder)

    def staged(self, path: Path) -> None:
        late, self.late = self.late, None
        self.uploaded[path.name] = self.store.stage(path, path.name, self.options.verify, late)
        path.unlink()  # local disk holds one file at a time

    def publish(self, staging: Path, files: list[str], names: ShardNames) -> None:
        self.commit(files, [n for n in self.store.names() if names.is_ours(n) and n not in files])

    def commit(self, files: list[str], stale: list[str]) -> None:
        self.location = self.store.commit([self.uploaded[n] for n in files], stale,
                                          self.options.overwrite, self.message.summary,
                                          self.message.description)


def write_remote(checkpoint: Checkpoint, destination: RemoteDestination,
                 options: WriteOptions, store: S3Store | HubStore | None = None,
                 message: Message = Message()) -> WriteResult:
    """Write ``checkpoint`` to the remote ``destination`` (with the store ``check_remote``
    returned); it appears only once every file is uploaded and verified, and a failure or
    Ctrl-C leaves nothing there (``remote.upload``, ``remote.commit``)."""
    if store is None:
        store = check_remote(checkpoint.source.files, destination, options.overwrite)
    fmt = destination.local.format
    try:
        with tempfile.TemporaryDirectory(prefix="ckptport-upload-") as spool, store:
            local = replace(destination.local, path=Path(spool) / destination.local.path.name)
            sink = _Upload(store, Path(spool), options, message)
            options = replace(options, defer=sink.later)
            if local.sharded:
                result = ShardsWriter(fmt, sink).write(checkpoint, local, replace(
                    options, overwrite=False))
            else:
                with staged_file(local.path, overwrite=False) as out:
                    emit(fmt, checkpoint.tree, out, options)
                    out.publish()
                sink.staged(local.path)
                options.precommit()
                sink.commit([destination.name], [])
                result = WriteResult(destination.url, fmt.name, count_tensors(checkpoint.tree),
                                     unique_bytes(checkpoint.tree), options.verify)
    except VerificationError as exc:  # name what it was written for, not its local spool
        name = Path(exc.path).name if exc.path and destination.local.sharded else ""
        raise VerificationError(exc.message, destination.url / name if name else
                                destination.url) from exc
    except OSError as exc:
        raise os_error(exc, Path(tempfile.gettempdir())) from exc
    notes = tuple(f"{what}: {url}" for what, url in (
        ("commit", getattr(store, "commit_url", None)),
        ("pull request", getattr(store, "pr_url", None))) if url)
    return replace(result, notes=(*result.notes, *notes))
