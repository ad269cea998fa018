"""Publish a file all at once or not at all.

Bytes go to a temp file in the destination's folder (same filesystem, so
the final rename is atomic), are fsynced and verified there, and only then
appear under the destination's name. On any error, Ctrl-C or SIGTERM (the
CLI turns it into an exception) the temp file is removed and the
destination is untouched. Without ``overwrite`` the publish step is a hard
link, which fails rather than replace a file another process made first.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import OutputError

__all__ = ["AtomicFile", "atomic_file", "fsync_dir", "TEMP_SUFFIX"]

TEMP_SUFFIX = ".ckptport-tmp"


class AtomicFile:
    """A temp file beside ``dst``; ``publish`` moves it into place."""

    def __init__(self, dst: Path, file: BinaryIO, tmp: Path, overwrite: bool) -> None:
        self.dst, self.file, self.tmp, self.overwrite = dst, file, tmp, overwrite

    def sync(self) -> None:
        """Flush and fsync, so what is verified is what the disk holds."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def publish(self) -> None:
        if self.overwrite:
            os.replace(self.tmp, self.dst)
        else:
            try:
                os.link(self.tmp, self.dst)
            except FileExistsError:
                raise OutputError("exists (appeared while writing); pass --overwrite to replace "
                                  "it", self.dst) from None
            except OSError as exc:  # filesystems without hard links
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                if self.dst.exists():
                    raise OutputError("exists; pass --overwrite to replace it", self.dst) from None
                os.rename(self.tmp, self.dst)
            else:
                self.tmp.unlink()
        fsync_dir(self.dst.parent)


@contextlib.contextmanager
def atomic_file(dst: Path, *, overwrite: bool) -> Iterator[AtomicFile]:
    """Yield an ``AtomicFile``; anything escaping the block removes the temp file."""
    try:
        fd, name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=TEMP_SUFFIX)
    except FileNotFoundError:
        raise OutputError("folder does not exist", dst.parent) from None
    except PermissionError:
        raise OutputError("permission denied creating a file in this folder", dst.parent) from None
    tmp = Path(name)
    os.fchmod(fd, _mode_for(dst))
    file = os.fdopen(fd, "wb")
    try:
        yield AtomicFile(dst, file, tmp, overwrite)
    except BaseException:
        tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # flushing a full disk fails again
            file.close()
        raise
    file.close()
    tmp.unlink(missing_ok=True)


def _mode_for(dst: Path) -> int:
    """The replaced file's mode, else what ``open()`` would give (mkstemp uses 0600)."""
    try:
        return dst.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
