"""Writers: ``.pth``, ``.safetensors``, shard sets and DCP folders, one shape for all.

A destination is planned first (``plan``: DST and options turned into a
``Destination``, checked before anything is read); the writer for its
target takes the checkpoint, writes it into a staged temp file or folder
(``staging``), fsyncs it while it reads it back and compares every tensor
bit for bit with an independent read of the source (``verify``: the bytes
verified are the page cache's, which fsync writes), and only then
publishes it once both succeeded.

To add an output format: a module with its writer and one ``register`` call
in ``writers.formats`` (see there for the two kinds, file and folder); what
every writer shares (options, result, ``emit``) is ``writers.base``'s.
"""

from __future__ import annotations

import os
from typing import Any, cast

from ..checkpoint import Checkpoint
from .base import (
    FileFormat,
    Tap,
    WriteOptions,
    Writer,
    WriteResult,
    count_tensors,
    emit,
    unique_bytes,
)
from .formats import FORMATS, Kind, OutputFormat, register
from .plan import (
    ANCHOR_PATTERN,
    Destination,
    check_destination,
    parse_size,
    plan_destination,
    same_file,
)
from .staging import os_error, staged_file

__all__ = ["OutputFormat", "FORMATS", "Kind", "register", "Destination", "WriteOptions",
           "WriteResult", "Writer", "FileFormat", "Tap",
           "write", "write_to", "writer_for", "emit", "plan_destination", "check_destination",
           "same_file", "count_tensors", "unique_bytes", "parse_size", "ANCHOR_PATTERN"]


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
