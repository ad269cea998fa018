"""Read a written file back and prove it holds exactly what the source holds.

Both sides are read afresh, by readers other than the ones that wrote:

- the output as its consumers read it: a ``.pth`` with plain
  ``torch.load(weights_only=True)`` and no allow-list (if that fails here it
  fails for every user); a ``.safetensors`` file's names, dtypes and shapes
  through the ``safetensors`` library itself, its bytes by position;
- the source's tensor bytes again from disk — a zip checkpoint's records
  where Python's ``zipfile`` locates them (its own parse of the central
  directory and local headers, so a record ckptport's parser misplaced
  would show; only stored records are ever read, as torch reads them),
  other files by position — not the view the writer streamed from, and
  casts computed again from those bytes.

Every tensor is compared bit for bit, piece by piece, and ties must survive.
A remote source written to a remote DST is the exception: its tensors are
compared with the CRC-32 of the bytes the writer streamed (``streamed``:
a second read there is a second download), its zip records' placement
still proven by zipfile.
"""

from __future__ import annotations

import struct
import threading
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..compare import tree_mismatches
from ..containers.safetensors import Entry
from ..containers.sniff import SourceStream
from ..dtypes import dtype_of
from ..errors import InputError, VerificationError
from ..progress import Advance
from ..sources import SourceFile
from ..tensors import Blob, Computed, Pending, TensorInfo, chunks, nbytes, realize
from ..tree import TensorLeaf, Tree

if TYPE_CHECKING:
    import torch

    from .streamed import StreamedCrcs

__all__ = ["verify_pth", "verify_safetensors", "Independent"]


class Independent:
    """The source's tensor bytes read again, through other readers than the writer's."""

    def __init__(self) -> None:
        self.archives: dict[int, zipfile.ZipFile] = {}
        self.lock = threading.Lock()  # tensors are compared on several threads

    def close(self) -> None:
        for archive in self.archives.values():
            archive.close()

    def __call__(self, leaf: TensorLeaf) -> Iterator[bytes | memoryview]:
        if isinstance(leaf, Pending):
            if leaf.dtype == dtype_of(leaf.source) and not leaf.transform:
                yield from self(leaf.source)
                return
            yield from chunks(_cast(self._whole(leaf.source), leaf))
            return
        if isinstance(leaf, Computed):  # computed again from its inputs read afresh
            yield from chunks(leaf.value(tuple(_values(self._whole(i), i) for i in leaf.inputs)))
            return
        if isinstance(leaf, TensorInfo) and leaf.storage.blob.member is not None:
            yield from self._from_zip(leaf)
            return
        yield from chunks(leaf)

    def _whole(self, leaf: TensorLeaf) -> bytearray:
        """The leaf's bytes in one buffer, filled piece by piece (no joined copies)."""
        whole = bytearray(nbytes(leaf))
        at = 0
        for piece in self(leaf):
            whole[at:at + len(piece)] = piece
            at += len(piece)
        if at != len(whole):
            raise VerificationError(f"a source tensor read back {at} bytes, not {len(whole)}")
        return whole

    def _archive(self, source: SourceFile) -> zipfile.ZipFile:
        with self.lock:
            return self._open(source)

    def _open(self, source: SourceFile) -> zipfile.ZipFile:
        archive = self.archives.get(id(source))
        if archive is None:
            try:
                archive = zipfile.ZipFile(SourceStream(source))
            except (zipfile.BadZipFile, OSError, ValueError) as exc:
                raise InputError(f"Python's zipfile cannot open the archive: {exc}",
                                 source.path) from None
            self.archives[id(source)] = archive
        return archive

    def _from_zip(self, leaf: TensorInfo) -> Iterator[bytes | memoryview]:
        """The member's bytes where Python's zipfile locates them, read by position."""
        storage = replace(leaf.storage, blob=self._located(leaf))
        yield from chunks(replace(leaf, storage=storage))

    def _located(self, leaf: TensorInfo) -> Blob:
        """The member's bytes as Python's zipfile places them (its own parse of the central
        directory and the local header)."""
        blob = leaf.storage.blob
        assert blob.file is not None and blob.member is not None
        source = blob.file
        try:
            info = self._archive(source).getinfo(blob.member)
            header = source.read(info.header_offset, 30)
            if header[:4] != b"PK\x03\x04" or info.compress_type != zipfile.ZIP_STORED:
                raise ValueError("not a stored member")
            name_length, extra_length = struct.unpack("<HH", header[26:30])
            name = source.read(info.header_offset + 30, name_length)
            if name.decode("utf-8", "replace") != info.filename or info.file_size != blob.size:
                raise ValueError("its local header or size disagrees")
        except (zipfile.BadZipFile, KeyError, ValueError) as exc:
            raise InputError(f"record {blob.member} does not read back through Python's "
                             f"zipfile ({exc}); torch and zipfile would disagree on it",
                             source.path) from None
        data_offset = info.header_offset + 30 + name_length + extra_length
        return Blob(source, data_offset, info.file_size, name=f"record {blob.member}")

    def placed(self, leaf: TensorLeaf) -> None:
        """What a fresh read would prove of a leaf known by its streamed bytes' CRC-32: the
        zip record it was read from lies where Python's zipfile places it."""
        if isinstance(leaf, Pending):
            self.placed(leaf.source)
        elif isinstance(leaf, TensorInfo) and leaf.storage.blob.member is not None:
            blob, located = leaf.storage.blob, self._located(leaf).offset
            if located != blob.offset and blob.file is not None:
                raise InputError(f"record {blob.member} was read at byte {blob.offset}, but "
                                 f"Python's zipfile places it at byte {located}; torch and "
                                 "zipfile would disagree on it", blob.file.path)

    def __enter__(self) -> Independent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _streamed(leaf: TensorLeaf) -> int | None:
    """A computed tensor's CRC-32 as the writer streamed it (not computed a second time)."""
    return leaf.streamed[0] if isinstance(leaf, Computed) and leaf.streamed else None


def _values(raw: bytearray, leaf: TensorLeaf) -> torch.Tensor:
    """A tensor of ``leaf``'s dtype and shape over the canonical bytes ``raw`` (not copied)."""
    import torch

    dtype = dtype_of(leaf).to_torch()
    values = torch.frombuffer(raw, dtype=dtype) if raw else \
        torch.empty(0, dtype=dtype)
    return values.reshape(leaf.shape)


def _cast(raw: bytearray, leaf: Pending) -> torch.Tensor:
    return realize(_values(raw, leaf.source), leaf)


def _expect_same(path: Path, expected: Tree, actual: Tree, advance: Advance,
                 jobs: int | None, streamed: StreamedCrcs | None) -> None:
    with Independent() as independent:

        def crc(leaf: TensorLeaf) -> int | None:
            known = None if streamed is None else streamed.expected(leaf)
            if known is None:
                return _streamed(leaf)
            independent.placed(leaf)
            return known

        problems = tree_mismatches(expected, actual, on_tensor=advance,
                                   expected_pieces=independent, jobs=jobs, expected_crc=crc)
    if problems:
        raise VerificationError("written file reads back different: " + "; ".join(problems),
                                path)


def verify_pth(path: Path, expected: Tree, anchor: str, advance: Advance,
               jobs: int | None = None, streamed: StreamedCrcs | None = None) -> None:
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = torch.load(path, weights_only=True, mmap=True,
                                map_location="cpu" if anchor != "cpu" else None)
    except OSError:
        raise  # the file went away or the disk failed: an output error, not a bad file
    except Exception as exc:  # any failure to load is the finding itself
        raise VerificationError(f"written file does not load with weights_only=True: {exc}",
                                path) from exc
    _expect_same(path, expected, actual, advance, jobs, streamed)


def verify_safetensors(path: Path, entries: Mapping[str, Entry], expected: Tree,
                       advance: Advance, jobs: int | None = None,
                       streamed: StreamedCrcs | None = None) -> None:
    """The file's names, dtypes and shapes as the safetensors library reads them against the
    planned ``entries``, then every tensor's bytes against the source's."""
    from safetensors import safe_open

    from ..readers import open_checkpoint

    try:
        with safe_open(str(path), framework="numpy") as f:
            if set(f.keys()) != set(entries):
                raise VerificationError("tensor names in the written file differ from the plan",
                                        path)
            for name, entry in entries.items():
                stored = f.get_slice(name)  # header only: the bytes are compared below
                if stored.get_dtype() != entry.code or \
                        tuple(stored.get_shape()) != entry.header_shape:
                    raise VerificationError(f"tensor {name!r} reads back as {stored.get_dtype()} "
                                            f"{stored.get_shape()}", path)
    except VerificationError:
        raise
    except Exception as exc:  # the official reader rejecting our bytes is the finding
        raise VerificationError(f"safetensors rejects the written file: {exc}", path) from exc
    written = open_checkpoint(path)
    if written.source.notes:
        raise VerificationError("; ".join(written.source.notes), path)
    _expect_same(path, expected, written.tree, advance, jobs, streamed)
