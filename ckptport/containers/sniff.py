"""Tell a file's container from its bytes, and refuse files that are two at once.

Users rename files freely, so the extension is never trusted. Loaders try
containers in their own order — ``torch.load`` a zip (``PK\\x03\\x04`` at
byte 0), then a tar archive, then a pickle; Python's ``zipfile`` looks for
a directory at the end; the safetensors library reads a length and JSON —
so a file that more than one of them accepts is read differently by each
(a polyglot). Such files are refused: ckptport never picks one reading of
an ambiguous file.
"""

from __future__ import annotations

import io
import struct
import tarfile
from typing import overload

from ..checkpoint import Format
from ..errors import CkptportError, InputError
from ..sources import SourceFile
from ..unpickle.scan import ScanError, executes_before, scan

__all__ = ["sniff", "SourceStream", "is_tar", "torch_would_unpickle"]

_ZIP = b"PK\x03\x04"
_WHITESPACE = b" \t\r\n"


class SourceStream(io.RawIOBase):
    """A read-only, seekable file object over ``SourceFile`` (for ``tarfile``, ``zipfile``)."""

    def __init__(self, source: SourceFile) -> None:
        self.source, self.position = source, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.source.size}
        self.position = max(0, base[whence] + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = max(0, min(len(buffer), self.source.size - self.position))
        data = self.source.read(self.position, n)
        buffer[:n] = data
        self.position += n
        return n


def is_tar(source: SourceFile) -> bool:
    """Whether ``tarfile.open(mode="r:")`` — what ``torch.load`` tries first — accepts it."""
    try:
        with tarfile.open(fileobj=io.BufferedReader(SourceStream(source)), mode="r:"):
            return True
    except CkptportError:  # the source failed a read: not an answer about its bytes
        raise
    except (tarfile.TarError, OSError, ValueError, EOFError, UnicodeError, OverflowError):
        return False


def _has_zip_directory(source: SourceFile) -> bool:
    """Whether Python's ``zipfile`` would find an end-of-directory record (it searches the tail)."""
    start = max(0, source.size - (1 << 16) - 22)
    return b"PK\x05\x06" in source.read(start, source.size - start)


_HEAD = 1 << 12  # where a file that is no pickle stops being one (a safetensors length)


class _WholeFile:
    """The file as the bytes-like ``scan`` walks (``scan.Opcodes``), read in blocks as the
    walk reaches them.

    ``torch.load`` reads a pickle as far as it goes, so the verdict must too; but a
    pickle that skips a giant string needs none of the string's bytes, so only the
    blocks opcodes land in are read (not the whole of a 70 GB file).
    """

    _BLOCK = 1 << 16

    def __init__(self, source: SourceFile) -> None:
        self.source, self.blocks = source, dict[int, bytes]()

    def __len__(self) -> int:
        return self.source.size

    def _block(self, number: int) -> bytes:
        block = self.blocks.get(number)
        if block is None:
            if len(self.blocks) > 64:
                self.blocks.clear()
            start = number * self._BLOCK
            block = self.blocks[number] = self.source.read(
                start, min(self._BLOCK, self.source.size - start))
        return block

    @overload
    def __getitem__(self, item: int) -> int: ...

    @overload
    def __getitem__(self, item: slice) -> bytes: ...

    def __getitem__(self, item: int | slice) -> int | bytes:
        if isinstance(item, int):
            if not 0 <= item < self.source.size:
                raise IndexError(item)
            return self._block(item // self._BLOCK)[item % self._BLOCK]
        start, stop, _ = item.indices(self.source.size)
        return self.source.read(start, max(0, stop - start))

    def find(self, needle: bytes, start: int = 0, end: int | None = None) -> int:
        end = self.source.size if end is None else min(end, self.source.size)
        position = start
        while position < end:
            chunk = self[position:min(end, position + self._BLOCK + len(needle))]
            found = chunk.find(needle)
            if found >= 0:
                return position + found
            position += self._BLOCK
        return -1

    def index(self, needle: bytes, start: int = 0) -> int:
        found = self.find(needle, start)
        if found < 0:
            raise ValueError("not found")
        return found


def torch_would_unpickle(source: SourceFile, head: bytes | None = None) -> bool:
    """Whether ``torch.load``'s pickle fallback would get past the file's first opcodes.

    True when the bytes start a complete pickle, or reach an opcode that
    imports or calls something before the first invalid one (a pickle runs
    opcode by opcode, so a broken tail does not stop what came before). The
    pickle is followed as far as the file goes (a 71 MB polyglot hid its
    payload past the first MiB), reading only what its opcodes land on.
    """
    if head is None:
        head = source.read(0, min(source.size, _HEAD))
    try:
        scan(head, 0)
        return True
    except ScanError as exc:
        if source.size <= len(head) or not exc.truncated:
            return executes_before(head, exc.position)
    data = _WholeFile(source)
    try:
        scan(data, 0)
        return True
    except ScanError as exc:
        return executes_before(data, exc.position)


def _safetensors_shaped(source: SourceFile, head: bytes) -> bool:
    if len(head) < 9:
        return False
    (length,) = struct.unpack("<Q", head[:8])
    if length > source.size - 8:
        return False
    body = head[8:8 + min(length, len(head) - 8)].lstrip(_WHITESPACE)
    return body[:1] == b"{"


def sniff(source: SourceFile) -> Format | None:
    """The built-in container of ``source``; None when it is none of them (another reader
    may claim it); an ``InputError`` when it is empty or two containers at once."""
    if source.size == 0:
        raise InputError("empty file (0 bytes), not a checkpoint", source.path)
    head = source.read(0, min(source.size, _HEAD))
    if head[:4] == _ZIP:
        return Format.TORCH_ZIP
    if is_tar(source):
        raise InputError("a tar archive: torch.load reads tar archives before pickles, so its "
                         "reading of this file differs from every other reader's; refused",
                         source.path)
    if _has_zip_directory(source):
        raise InputError("holds a zip directory at its end but does not start as a zip "
                         "archive: Python's zipfile and torch.load would read different files; "
                         "refused", source.path)
    if _safetensors_shaped(source, head):
        if torch_would_unpickle(source, head):
            raise InputError("is both a safetensors file and a pickle torch.load would run; "
                             "refused", source.path)
        return Format.SAFETENSORS
    if head[:1] == b"\x80" or torch_would_unpickle(source, head):
        return Format.TORCH_LEGACY
    return None
