"""What every writer shares: the options, the result, the two shapes of a writer, ``emit``.

A folder format's writer is a ``Writer`` (it stages and publishes its folder);
a file format's is a ``FileFormat``, and ``emit`` writes one of its files into
a staged temp file, fsyncs it while it verifies it, for whoever publishes it
(one file, a shard set, a remote upload). The writers' modules import these
from here, and the package's face (``writers``) hands them on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol, TypeVar, cast

from ..checkpoint import Checkpoint
from ..errors import OutputError, VerificationError
from ..progress import Progress, no_progress
from ..tensors import ViewKey, nbytes, view_key
from ..tree import TensorLeaf, Tree, iter_tensors
from .formats import Kind, OutputFormat
from .plan import Destination
from .staging import StagedFile

if TYPE_CHECKING:
    from ..remote.urls import RemotePath
    from .provenance import Provenance
    from .streamed import StreamedCrcs

__all__ = ["WriteOptions", "WriteResult", "Writer", "FileFormat", "Tap", "LatePatch", "emit",
           "count_tensors", "unique_bytes"]


def _nothing() -> None:
    return None


Tap = Callable[[TensorLeaf, Iterable[memoryview]], Iterable[bytes | memoryview]]
"""Sees a tensor's pieces as a file writer writes them, and passes them on."""


@dataclass(frozen=True)
class LatePatch:
    """Bytes of a written file not known until the whole source is read: a safetensors
    header holding the source's sha256, left as a placeholder of the same length.

    A writer patches them itself before its file is verified, waiting for the
    value, unless ``WriteOptions.defer`` takes them: then the file is verified
    with the placeholder and whoever took them writes ``value()`` over bytes
    ``offset`` to ``offset + length`` later (an S3 upload sends that part last,
    so a shard set is not held back while the rest of the source is hashed).
    """

    offset: int
    length: int
    value: Callable[[], bytes]


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
    # takes the ``LatePatch`` a file writer would otherwise wait for and write itself
    defer: Callable[[LatePatch], None] | None = None
    # verify against the CRC-32 of the bytes streamed, not a second read of the source
    # (a remote source to a remote DST: ``writers.streamed``)
    streamed: StreamedCrcs | None = None

    @property
    def taps(self) -> Tap | None:
        """What sees each tensor's pieces as a file writer writes them: ``tap``, and
        ``streamed``'s record of them."""
        tap, streamed = self.tap, self.streamed
        if streamed is None:
            return tap
        if tap is None:
            return streamed.tap
        return lambda leaf, pieces: streamed.tap(leaf, tap(leaf, pieces))


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
