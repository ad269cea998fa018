"""Open source files safely and read them by position.

Everything ckptport reads from a checkpoint goes through ``SourceFile``:

- only regular files are opened: a FIFO or a device given as SRC would
  block forever or never end, so it is refused before it is opened (and
  checked again on the open descriptor, in case the path was swapped);
- reads are positional (``pread``), so threads share one descriptor, and a
  read that comes back short (the file was truncated meanwhile) is an
  ``InputError``, never a crash: ckptport does not touch memory maps of
  the source in its commands, so a truncated source cannot raise SIGBUS;
- the file's identity, size and modification time are kept, so a command
  can tell whether the file changed while it was read.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import hashlib
import io
import os
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Protocol

from .errors import InputError, InputIsADirectoryError

__all__ = ["SourceFile", "MemorySource", "open_source", "check_regular", "Snapshot",
           "sha256_files", "read_more_than_once", "rereads_expected", "libc_fallocate"]

Snapshot = tuple[int, int, int, int]  # device, inode, size, mtime_ns
_REREADS: contextvars.ContextVar[bool | int] = contextvars.ContextVar("rereads", default=False)


@contextlib.contextmanager
def read_more_than_once(limit: int | None = None) -> Iterator[None]:
    """Sources resolved inside will be read more than once (``normalize`` hashes its
    source and verifies its output against it): a source that fetches its bytes over
    the network keeps them (at most ``limit`` bytes of them, the most recent: a remote
    DST holds one shard on local disk, and so does the source), one on disk has nothing
    to do."""
    token = _REREADS.set(True if limit is None else max(1, limit))
    try:
        yield
    finally:
        _REREADS.reset(token)


def rereads_expected() -> bool | int:
    """False, True, or the most bytes of one source to keep (``read_more_than_once``)."""
    return _REREADS.get()


@functools.cache
def libc_fallocate() -> Callable[[int, int, int, int], int] | None:
    """Linux's ``fallocate(fd, mode, offset, length)`` (None elsewhere): reserves blocks
    for a file being written (``writers.staging``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):  # pragma: no cover - a libc without it
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    call.restype = ctypes.c_int
    return call


def check_regular(path: Path) -> os.stat_result:
    """``stat`` of ``path``, refusing anything that is not a regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputIsADirectoryError("is a directory, not a checkpoint file", path)
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"is not a regular file ({_kind(st.st_mode)}); ckptport reads "
                         "checkpoint files and folders only", path)
    return st


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


class SourceFile:
    """One open source file: positional reads, its size, and whether it changed."""

    path: os.PathLike[str]  # a Path; a remote object's RemotePath (``remote.objects``)

    def __init__(self, path: Path, fd: int, st: os.stat_result) -> None:
        self.path, self.fd, self.size = path, fd, st.st_size
        self.snapshot: Snapshot = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._lock = threading.Lock()
        self._mapped: object = None

    def read(self, offset: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``offset``; a short read means the file was cut."""
        if n <= 0:
            return b""
        try:
            data = os.pread(self.fd, n, offset)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", self.path) from None
        if len(data) != n:
            raise InputError(f"ends at byte {offset + len(data)} although {offset + n} bytes "
                             "were expected (truncated, or changed while it was read)",
                             self.path)
        return data

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the bytes at ``offset`` (no allocation: streams reuse one)."""
        done = 0
        while done < len(buffer):
            try:
                n = os.preadv(self.fd, [buffer[done:]], offset + done)
            except OSError as exc:
                raise InputError(f"cannot read: {exc.strerror or exc}", self.path) from None
            if n == 0:
                raise InputError(f"ends at byte {offset + done} although "
                                 f"{offset + len(buffer)} bytes were expected (truncated, or "
                                 "changed while it was read)", self.path)
            done += n

    def expect(self, ranges: list[tuple[int, int]]) -> None:
        """The byte ranges about to be read, in order (``tensors.announce``): a file that
        fetches ahead (``remote.objects``) fetches these; a local one needs no telling."""

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self.snapshot

    def torch_storage(self) -> object:
        """The whole file as one private (copy-on-write) torch storage, made once.

        Only ``ckptport.read`` hands out tensors that are views of the file,
        as ``torch.load(mmap=True)`` does; commands read by position instead.
        """
        with self._lock:
            if self._mapped is None:
                import torch

                self._mapped = torch.UntypedStorage.from_file(str(self.path), False, self.size)
            return self._mapped

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # descriptors of trees nobody holds any more
        try:
            self.close()
        except OSError:
            pass


class MemorySource(SourceFile):
    """Bytes held in memory, read like a file (a checkpoint saved inside a DCP item)."""

    path: Path

    def __init__(self, path: Path, data: bytes) -> None:  # noqa: D107 - no descriptor
        self.path, self.fd, self.size, self.data = path, -1, len(data), bytes(data)
        self.snapshot = (0, 0, len(data), 0)
        self._lock = threading.Lock()
        self._mapped = None

    def read(self, offset: int, n: int) -> bytes:
        if offset + n > self.size:
            raise InputError(f"ends at byte {self.size} although {offset + n} bytes were "
                             "expected (truncated)", self.path)
        return self.data[offset:offset + n]

    def read_into(self, offset: int, buffer: memoryview) -> None:
        buffer[:] = self.read(offset, len(buffer))

    def changed(self) -> bool:
        return False

    def torch_storage(self) -> object:
        with self._lock:
            if self._mapped is None:
                import torch

                self._mapped = torch.frombuffer(bytearray(self.data), dtype=torch.uint8
                                                ).untyped_storage() if self.data else \
                    torch.UntypedStorage(0)  # type: ignore[no-untyped-call]
            return self._mapped


def open_source(path: Path) -> SourceFile:
    """Open a regular file for positional reads (a FIFO is refused without blocking)."""
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"is not a regular file ({_kind(st.st_mode)})", path)
    return SourceFile(path, fd, st)


_HASH_CHUNK = 1 << 22


class _Hashed(Protocol):
    """A file whose bytes are hashed: a ``Path``, or a ``remote.RemotePath`` (which reads
    its pinned object; that package sits above this module, so it is named by what it does)."""

    def open(self, mode: str) -> IO[bytes] | io.RawIOBase: ...

    def __fspath__(self) -> str: ...


def sha256_files(paths: tuple[_Hashed, ...]) -> str:
    """sha256 of the files' bytes in order (a shard set: its index, then its shards).

    What ``inspect --hash`` shows, safetensors outputs record as
    ``ckptport.source_sha256`` and folder mode's journal compares.
    """
    digest = hashlib.sha256()
    for path in paths:
        _hash_into(digest, path)
    return digest.hexdigest()


def _hash_into(digest: hashlib._Hash, path: _Hashed) -> None:
    try:
        with path.open("rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None
