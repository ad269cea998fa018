"""Writers: ``.pth``, ``.safetensors``, shard sets and DCP folders, one shape for all.

A destination is planned first (``plan``: DST and options turned into a
``Destination``, checked before anything is read); the writer for its
target takes the checkpoint, writes it into a staged temp file or folder
(``staging``), fsyncs it while it reads it back and compares every tensor
bit for bit with an independent read of the source (``verify``: the bytes
verified are the page cache's, which fsync writes), and only then
publishes it once both succeeded.

To add an output format: a module with its writer and one ``register`` call
in ``writers.formats`` (see there for the two kinds, file and folder).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, TypeVar, cast

from ..checkpoint import Checkpoint
from ..errors import OutputError, VerificationError
from ..progress import Progress, no_progress
from ..tensors import ViewKey, nbytes, view_key
from ..tree import TensorLeaf, Tree, iter_tensors
from .formats import FORMATS, Kind, OutputFormat, register
from .plan import (
    ANCHOR_PATTERN,
    Destination,
    check_destination,
    parse_size,
    plan_destination,
    same_file,
)
from .staging import StagedFile, os_error, staged_file

if TYPE_CHECKING:
    from ..remote.urls import RemotePath
    from .provenance import Provenance

__all__ = ["OutputFormat", "FORMATS", "Kind", "register", "Destination", "WriteOptions",
           "WriteResult", "Writer", "FileFormat", "Tap",
           "write", "write_to", "writer_for", "emit", "plan_destination", "check_destination",
           "same_file", "count_tensors", "unique_bytes", "parse_size", "ANCHOR_PATTERN"]

def _nothing() -> None:
    return None


Tap = Callable[[TensorLeaf, Iterable[memoryview]], Iterable[bytes | memoryview]]
"""Sees a tensor's pieces as a file writer writes them, and passes them on."""


@dataclass(frozen=True)
class WriteOptions:
    """How to write: every writer takes the same options.

    ``precommit`` runs after verification, just before DST appears; an error
    it raises leaves DST untouched (the source changed meanwhile).
    ``dcp_key`` nests the tree under one key in a DCP folder.
    """

    anchor: str = "cpu"
    overwrite: bool = False
    verify: bool = True
    provenance: Provenance | None = None  # for formats that record it (OutputFormat.metadata)
    progress: Progress = no_progress
    precommit: Callable[[], None] = _nothing
    dcp_key: str | None = None
    # sees each tensor's pieces as a file writer writes them (``normalize --manifest``)
    tap: Tap | None = None
    jobs: int | None = None  # threads for verification (default: every core)


@dataclass(frozen=True)
class WriteResult:
    path: Path | RemotePath  # a URL for a remote destination (``writers.remote``)
    format: str  # the output format's name
    tensors: int
    bytes: int
    verified: bool
    files: tuple[Path | RemotePath, ...] = ()
    notes: tuple[str, ...] = ()  # what the writer had to do that the rules did not

    def __post_init__(self) -> None:
        if not self.files:
            object.__setattr__(self, "files", (self.path,))


class Writer(Protocol):
    """Writes a checkpoint to a planned destination: staged, verified, then published."""

    def write(self, checkpoint: Checkpoint, destination: Destination,
              options: WriteOptions) -> WriteResult: ...


def count_tensors(tree: Tree) -> int:
    return sum(1 for _ in iter_tensors(tree))


def unique_bytes(tree: Tree) -> int:
    seen: dict[ViewKey, int] = {}
    for _, tensor in iter_tensors(tree):
        seen[view_key(tensor)] = nbytes(tensor)
    return sum(seen.values())


_Written = TypeVar("_Written")


class FileFormat(Protocol[_Written]):
    """One single-file format: write a tree into an open file, then check what was written.

    ``write`` returns what ``verify`` needs from the writing (a layout plan), of the
    format's own type: to ``emit`` it is an ``object`` passed from one to the other.
    """

    def write(self, tree: Tree, file: BinaryIO, dst: Path, options: WriteOptions,
              advance: Callable[[int], None]) -> _Written: ...

    def verify(self, path: Path, tree: Tree, written: _Written, options: WriteOptions,
               advance: Callable[[int], None]) -> None: ...


def emit(fmt: OutputFormat, tree: Tree, out: StagedFile, options: WriteOptions) -> None:
    """Write ``tree`` into ``out``'s temp file, fsync it and verify it (not yet published)."""
    name, total = out.dst.name, unique_bytes(tree)
    if fmt.kind is not Kind.FILE:
        raise OutputError(f"{fmt.name} is not a single-file format", out.dst)
    writer = cast("FileFormat[object]", fmt.make())  # a FILE format makes one
    try:
        written = writer.write(tree, out.file, out.dst, options,
                               options.progress(f"writing {name}", total))
        out.file.flush()
        with ThreadPoolExecutor(max_workers=1) as pool:  # the disk writes while the CPU verifies
            synced = pool.submit(out.sync)
            if options.verify:
                writer.verify(out.tmp, tree, written, options,
                              options.progress(f"verifying {name}", total))
            synced.result()
    except VerificationError as exc:  # name the destination, not its temp file
        raise VerificationError(exc.message, out.dst) from exc


class FileWriter:
    """One file of a file format."""

    def __init__(self, fmt: OutputFormat) -> None:
        self.format = fmt

    def write(self, checkpoint: Checkpoint, destination: Destination,
              options: WriteOptions) -> WriteResult:
        path = destination.path
        try:
            with staged_file(path, overwrite=options.overwrite) as out:
                emit(self.format, checkpoint.tree, out, options)
                options.precommit()
                out.publish()
        except OSError as exc:
            raise os_error(exc, path) from exc
        return WriteResult(path, self.format.name, count_tensors(checkpoint.tree),
                           unique_bytes(checkpoint.tree), options.verify)


def writer_for(destination: Destination) -> Writer:
    """The writer of a planned destination: a shard set, a folder format's, or one file."""
    if destination.sharded:
        from .shards import ShardsWriter

        return ShardsWriter(destination.format)
    if destination.format.kind is Kind.FOLDER:
        return cast("Writer", destination.format.make())  # a FOLDER format makes one
    return FileWriter(destination.format)


def write_to(checkpoint: Checkpoint, destination: Destination,
             options: WriteOptions) -> WriteResult:
    check_destination(checkpoint.source.files, destination, options.overwrite)
    return writer_for(destination).write(checkpoint, destination, options)


def write(checkpoint: Checkpoint, dst: str | os.PathLike[str], *, to: str | None = None,
          max_shard_size: int | str | None = None,
          **options: Any) -> WriteResult:  # Any: each WriteOptions field has its own type
    """Write ``checkpoint.tree`` to ``dst``; ``dst`` appears only once complete and verified.

    Args:
        checkpoint: what to write (``ckptport.read`` and ``ckptport.normalize`` make one).
        dst: a file, or a folder for a shard set or a folder format.
        to: a format of ``writers.formats.FORMATS`` (``pth``, ``safetensors``, ``dcp``);
            default: from DST's extension.
        max_shard_size: write a Hugging Face shard set of shards of at most this size.
        **options: ``WriteOptions`` fields (``overwrite``, ``verify``, ``anchor``, …).

    Returns:
        A ``WriteResult``: where, which format, how many tensors and bytes.

    Raises:
        OutputError: an unknown or impossible format, DST exists, is the source, cannot
            be written.
        VerificationError: the written file does not read back bit for bit.
    """
    destination = plan_destination(dst, to, max_shard_size)
    return write_to(checkpoint, destination, WriteOptions(**options))
