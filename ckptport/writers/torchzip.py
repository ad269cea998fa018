"""Write a zip archive in the layout ``torch.save`` produces, streaming each record.

torch's own archive writer needs a record's bytes in memory all at once; a
500 MB embedding would then cost 500 MB of memory. This writer streams a
record in pieces, exactly as torch lays it out, so ``torch.load``, Python's
``zipfile`` and ckptport's strict parser all read it:

- members stored (uncompressed) under ``archive/``, each local header
  padded with an ``FB`` extra field so its data starts on a 64-byte
  boundary (what ``torch.load(mmap=True)`` maps), sizes and CRC in a data
  descriptor after the data (general-purpose flags ``0x0808``), zip64
  fields where a size or offset needs them;
- a central directory, a zip64 end record and locator, an end record, no
  comment, no timestamps: the same records give the same bytes.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from ..tensors import CHUNK_BYTES
from .copy import RangeCopier

if TYPE_CHECKING:
    from ..sources import SourceFile

__all__ = ["ZipWriter", "ALIGNMENT"]

ALIGNMENT = 64
_FLAGS = 0x0808  # sizes in a data descriptor; UTF-8 names
_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class _Member:
    name: bytes
    offset: int
    size: int
    crc32: int


@dataclass
class _Behind:
    """A range the kernel copies on a thread while the CRC pass reads it."""

    future: Future[bool]
    source: SourceFile
    offset: int
    size: int
    at: int

    def wait(self) -> None:
        self.future.exception()

    def finish(self, file: BinaryIO) -> None:
        """Raise what the copy raised; write the range here if the kernel declined it."""
        if self.future.result():
            return
        file.seek(self.at)
        for start in range(0, self.size, CHUNK_BYTES):
            file.write(self.source.read(self.offset + start, min(CHUNK_BYTES, self.size - start)))


class ZipWriter:
    """Append records to ``file``; ``close`` writes the directory and end records."""

    def __init__(self, file: BinaryIO, top: str = "archive") -> None:
        self.file, self.top = file, top
        self.position = 0
        self.members: list[_Member] = []
        self.copier = RangeCopier(file)

    def _write(self, data: bytes | memoryview) -> None:
        self.file.write(data)
        self.position += len(data)

    def record(self, name: str, pieces: Iterable[bytes | memoryview],
               source: tuple[SourceFile, int, int] | None = None) -> None:
        """One member, its bytes given piece by piece (never all held at once).

        ``source`` is where those bytes lie verbatim in a source file
        (``tensors.file_range``): the pieces then only feed the CRC, and the
        kernel copies the bytes file to file where it can: the first piece in
        line (which shows that it can), the rest on a thread while the CRC reads
        them, so on two cores the copy costs no wall time.
        """
        full = f"{self.top}/{name}".encode()
        offset = self.position
        start = offset + 30 + len(full) + 4
        padding = -start % ALIGNMENT
        extra = b"FB" + struct.pack("<H", padding) + b"Z" * padding
        self._write(struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 0, _FLAGS, 0, 0, 0, 0, 0, 0,
                                len(full), len(extra)) + full + extra)
        crc, size, behind = 0, 0, None
        try:
            for piece in pieces:
                crc = zlib.crc32(piece, crc)
                if behind is None:
                    behind = self._append(piece, source, size)
                size += len(piece)
        finally:  # never leave a copy running into a file that is closed next
            if behind is not None:
                behind.wait()
        if behind is not None:
            behind.finish(self.file)
            self.file.seek(self.position)
        if size >= _U32 or offset >= _U32:
            self._write(struct.pack("<4sIQQ", b"PK\x07\x08", crc, size, size))
        else:
            self._write(struct.pack("<4sIII", b"PK\x07\x08", crc, size, size))
        self.members.append(_Member(full, offset, size, crc))

    def _append(self, piece: bytes | memoryview, source: tuple[SourceFile, int, int] | None,
                done: int) -> _Behind | None:
        """Append one piece; once the kernel has copied one, the rest of ``source`` goes
        behind, on a thread, while the caller's loop only computes the CRC."""
        if source is None or not self.copier.copy(source[0], source[1] + done, len(piece)):
            self._write(piece)
            return None
        self.position += len(piece)
        rest = source[2] - done - len(piece)
        if not rest:
            return None
        file, start = source[0], source[1] + done + len(piece)
        behind = _Behind(self.copier.copy_behind(file, start, rest, self.position), file, start,
                         rest, self.position)
        self.position += rest
        return behind

    def bound(self, sizes: Iterable[int], names: int = 64) -> int:
        """At most how many bytes the archive takes: records of ``sizes`` (and the few small
        ones torch adds) with names up to ``names`` bytes, directory and end records."""
        sizes = list(sizes)
        per_record = 2 * (46 + len(self.top) + names + 28) + ALIGNMENT + 24
        return sum(sizes) + (len(sizes) + 8) * per_record + 1024

    def close(self) -> None:
        self.record(".data/serialization_id", [self._serialization_id()])
        directory_start = self.position
        for member in self.members:
            big = member.size >= _U32 or member.offset >= _U32
            extra = struct.pack("<HHQQQ", 1, 24, member.size, member.size, member.offset) \
                if big else b""
            size32 = _U32 if big else member.size
            self._write(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 0, 0, _FLAGS, 0, 0, 0,
                                    member.crc32, size32, size32, len(member.name), len(extra),
                                    0, 0, 0, 0, _U32 if big else member.offset)
                        + member.name + extra)
        directory_size = self.position - directory_start
        end64 = self.position
        count = len(self.members)
        self._write(struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 0, 0, 0, 0, count, count,
                                directory_size, directory_start))
        self._write(struct.pack("<4sIQI", b"PK\x06\x07", 0, end64, 1))
        self._write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, min(count, 0xFFFF),
                                min(count, 0xFFFF), min(directory_size, _U32),
                                min(directory_start, _U32), 0))

    def _serialization_id(self) -> bytes:
        """40 digits from the record names and CRCs: unique per content, the same every time."""
        digest = hashlib.sha256()
        for member in self.members:
            digest.update(member.name + struct.pack("<IQ", member.crc32, member.size))
        number = int.from_bytes(digest.digest()[:16], "little")
        return f"{number % 10**40:040d}".encode()
