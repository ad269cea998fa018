"""Copy a source file's byte range into the output inside the kernel (``copy_file_range``).

A tensor stored contiguously in the source is, byte for byte, what the
output holds: the kernel can move it from page cache to page cache without
a trip through this process. On this project's machines that costs a fifth
of the system time of ``pread`` + ``write`` (2 GB: 0.5 s against 2.7-3.9 s;
bench/README.md). Where the kernel cannot (another OS, another filesystem,
a file object that is not a file) the caller writes the bytes it read, as
before. The bytes copied are checked like any others: verification reads
the output back and compares it with an independent read of the source.
"""

from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import Future
from typing import BinaryIO

from ..errors import InputError
from ..sources import SourceFile

__all__ = ["RangeCopier"]

_UNSUPPORTED = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF}


class RangeCopier:
    """Appends source ranges to ``file`` by ``copy_file_range`` until the kernel refuses."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.fd: int | None
        try:
            seekable = file.seekable() and hasattr(os, "copy_file_range")
            self.fd = file.fileno() if seekable else None
        except (AttributeError, OSError, ValueError):  # io.BytesIO and the like
            self.fd = None

    def copy(self, source: SourceFile, offset: int, size: int) -> bool:
        """Append ``size`` bytes at ``offset`` of ``source``; False (nothing appended) where
        the kernel cannot copy them, so the caller writes them itself."""
        if self.fd is None or source.fd < 0:
            return False
        self.file.flush()
        at = self.file.tell()
        if not self._copy(source, offset, size, at):
            return False
        self.file.seek(at + size)
        return True

    def copy_behind(self, source: SourceFile, offset: int, size: int, at: int
                    ) -> Future[bool]:
        """Copy ``size`` bytes at ``offset`` of ``source`` to ``at`` of the output on a
        thread, so the caller's own pass over the same bytes (the zip CRC) runs meanwhile.

        The kernel copy and ``zlib.crc32`` both release the GIL: on two cores the copy
        costs no wall time. The caller must not write to the file until the future is
        done, and must already have copied one range here (so the kernel is known to
        copy on this filesystem); a refusal after that is an error, not a fallback.
        """
        self.file.flush()
        future: Future[bool] = Future()

        def run() -> None:
            try:
                future.set_result(self._copy(source, offset, size, at))
            except BaseException as exc:  # handed to the caller, who waits for it
                future.set_exception(exc)

        # a thread of its own, not a pool's: a pool made before a fork has no thread after it
        threading.Thread(target=run, name="ckptport-copy", daemon=True).start()
        return future

    def _copy(self, source: SourceFile, offset: int, size: int, at: int) -> bool:
        done = 0
        while done < size:
            try:
                n = os.copy_file_range(source.fd, self.fd, size - done,  # type: ignore[arg-type]
                                       offset + done, at + done)
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED or done:
                    raise
                self.fd = None  # not on this filesystem: write from here on
                return False
            if n == 0 and not done:  # nothing there, or a filesystem that copies nothing:
                self.fd = None  # the caller's own read tells which
                return False
            if n == 0:
                raise InputError(f"ends at byte {offset + done} although {offset + size} bytes "
                                 "were expected (truncated, or changed while it was read)",
                                 source.path)
            done += n
        return True

