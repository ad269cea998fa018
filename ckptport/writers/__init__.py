"""Writers: ``.pth``, ``.safetensors``, shard sets and DCP folders, one shape for all.

A destination is planned first (``plan``: DST and options turned into a
``Destination``, checked before anything is read); the writer for its
target takes the checkpoint, writes it into a staged temp file or folder
(``staging``), fsyncs it while it reads it back and compares every tensor
bit for bit with an independent read of the source (``verify``: the bytes
verified are the page cache's, which fsync writes), and only then
publishes it once both succeeded.

To add a writer: write a module with a class that has ``target`` and
``write(checkpoint, destination, options)``, and add it to ``_WRITERS``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from ..checkpoint import Checkpoint
from ..errors import OutputError, VerificationError
from ..progress import Progress, no_progress
from ..tensors import nbytes, view_key
from ..tree import iter_tensors
from .plan import (
    ANCHOR_PATTERN,
    Destination,
    Target,
    check_destination,
    parse_size,
    plan_destination,
    same_file,
)
from .staging import StagedFile, os_error, staged_file

if TYPE_CHECKING:
    from .safetensors import MetadataValue

__all__ = ["Target", "OutputFormat", "Destination", "WriteOptions", "WriteResult", "Writer",
           "write", "write_to", "writer_for", "emit", "plan_destination", "check_destination",
           "same_file", "count_tensors", "unique_bytes", "parse_size", "ANCHOR_PATTERN"]

OutputFormat = Target  # the name round 1 exported


def _nothing() -> None:
    return None


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
    metadata: Mapping[str, MetadataValue] = field(default_factory=dict)
    progress: Progress = no_progress
    precommit: Callable[[], None] = _nothing
    dcp_key: str | None = None
    # sees each tensor's pieces as a file writer writes them (``normalize --manifest``)
    tap: Callable[[Any, Iterable[memoryview]], Iterable[Any]] | None = None
    jobs: int | None = None  # threads for verification (default: every core)


@dataclass(frozen=True)
class WriteResult:
    path: Path
    format: Target
    tensors: int
    bytes: int
    verified: bool
    files: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()  # what the writer had to do that the rules did not

    def __post_init__(self) -> None:
        if not self.files:
            object.__setattr__(self, "files", (self.path,))


class Writer(Protocol):
    target: Target

    def write(self, checkpoint: Checkpoint, destination: Destination,
              options: WriteOptions) -> WriteResult: ...


def count_tensors(tree: Any) -> int:
    return sum(1 for _ in iter_tensors(tree))


def unique_bytes(tree: Any) -> int:
    seen: dict[Any, int] = {}
    for _, tensor in iter_tensors(tree):
        seen[view_key(tensor)] = nbytes(tensor)
    return sum(seen.values())


class FileFormat(Protocol):
    """One single-file format: write a tree into an open file, then check what was written.

    ``write`` returns what ``verify`` needs from the writing (a layout plan).
    To add one: a module with such a class, one entry in ``FILE_FORMATS``, and
    the ``Target`` member ``--to`` names it by.
    """

    def write(self, tree: Any, file: BinaryIO, dst: Path, options: WriteOptions,
              advance: Callable[[int], None]) -> Any: ...

    def verify(self, path: Path, tree: Any, written: Any, options: WriteOptions,
               advance: Callable[[int], None]) -> None: ...


# target -> "module:class", imported when used (the .pth writer needs torch)
FILE_FORMATS: dict[Target, str] = {
    Target.PTH: "ckptport.writers.pth:PthFile",
    Target.SAFETENSORS: "ckptport.writers.safetensors:SafetensorsFile",
}


def file_format(target: Target, dst: Path) -> FileFormat:
    where = FILE_FORMATS.get(target)
    if where is None:
        raise OutputError(f"{target.value} is not a single-file format", dst)
    module, _, name = where.partition(":")
    made: FileFormat = getattr(importlib.import_module(module), name)()
    return made


def emit(target: Target, tree: Any, out: StagedFile, options: WriteOptions) -> None:
    """Write ``tree`` into ``out``'s temp file, fsync it and verify it (not yet published)."""
    name, total = out.dst.name, unique_bytes(tree)
    fmt = file_format(target, out.dst)
    try:
        written = fmt.write(tree, out.file, out.dst, options,
                            options.progress(f"writing {name}", total))
        out.file.flush()
        with ThreadPoolExecutor(max_workers=1) as pool:  # the disk writes while the CPU verifies
            synced = pool.submit(out.sync)
            if options.verify:
                fmt.verify(out.tmp, tree, written, options,
                           options.progress(f"verifying {name}", total))
            synced.result()
    except VerificationError as exc:  # name the destination, not its temp file
        raise VerificationError(exc.message, out.dst) from exc


class FileWriter:
    """A single ``.pth`` or ``.safetensors`` file."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def write(self, checkpoint: Checkpoint, destination: Destination,
              options: WriteOptions) -> WriteResult:
        path = destination.path
        try:
            with staged_file(path, overwrite=options.overwrite) as out:
                emit(self.target, checkpoint.tree, out, options)
                options.precommit()
                out.publish()
        except OSError as exc:
            raise os_error(exc, path) from exc
        return WriteResult(path, self.target, count_tensors(checkpoint.tree),
                           unique_bytes(checkpoint.tree), options.verify)


def writer_for(destination: Destination) -> Writer:
    """The writer of a planned destination."""
    if destination.sharded:
        from .shards import ShardsWriter

        return ShardsWriter(destination.target)
    if destination.target is Target.DCP:
        from .dcp import DcpWriter

        return DcpWriter()
    return FileWriter(destination.target)


def write_to(checkpoint: Checkpoint, destination: Destination,
             options: WriteOptions) -> WriteResult:
    check_destination(checkpoint.source.files, destination, options.overwrite)
    return writer_for(destination).write(checkpoint, destination, options)


def write(checkpoint: Checkpoint, dst: str | os.PathLike[str], *, to: str | None = None,
          max_shard_size: int | str | None = None, fmt: str | None = None,
          **options: Any) -> WriteResult:
    """Write ``checkpoint.tree`` to ``dst``; ``dst`` appears only once complete and verified.

    ``to`` is ``pth``, ``safetensors`` or ``dcp`` (default: from DST's
    extension; ``fmt`` is its round-1 name); ``options`` are ``WriteOptions``
    fields. An unknown or impossible format is an ``OutputError`` naming it.
    """
    destination = plan_destination(dst, to or fmt, max_shard_size)
    return write_to(checkpoint, destination, WriteOptions(**options))
