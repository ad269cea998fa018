"""Publish a file or a folder all at once or not at all: the one staging helper.

Everything a writer makes goes into a temp file or temp folder beside the
destination (same filesystem, so the final rename is atomic), is fsynced
and verified there, and only then appears under the destination's name.
On any error, Ctrl-C or SIGTERM (the CLI turns it into an exception) the
temp file or folder is removed and the destination is untouched.

- A file is published with a hard link when there is no ``overwrite``,
  which fails rather than replace a file another process made first; with
  ``overwrite`` by an atomic rename over it.
- A folder (a DCP checkpoint) replaces an existing one by moving the old
  one aside, renaming the new one in and only then removing the old.
- A shard set is staged in a temp folder inside DST; its files move in
  one by one, the index last, so an index never names an incomplete shard.

New files and folders get the permissions ``open()`` and ``mkdir()`` would
give them (the umask), or those of the file they replace.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import (
    CkptportError,
    OutputError,
    OutputExistsError,
    OutputNotFoundError,
    OutputOSError,
    OutputPermissionError,
)
from ..sources import libc_fallocate

__all__ = ["StagedFile", "staged_file", "staged_folder", "publish_folder", "fsync_dir",
           "preallocate",
           "TEMP_SUFFIX", "os_error", "folder_error"]

TEMP_SUFFIX = ".ckptport-tmp"


def os_error(exc: OSError, path: Path) -> CkptportError:
    """An OS failure while writing, in the words users search for, as the standard
    exception it is (one of ours passes through as raised)."""
    if isinstance(exc, CkptportError):
        return exc
    if isinstance(exc, PermissionError):
        return OutputPermissionError("permission denied", path)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return OutputOSError(f"cannot write: {exc.strerror or exc} (disk full?)",
                             path).caused_by(exc)
    return OutputOSError(f"cannot write: {exc.strerror or exc}", path).caused_by(exc)


def folder_error(exc: OSError, folder: Path) -> CkptportError:
    """An OS failure creating a file or folder in ``folder``: its true cause (a folder
    that exists but takes no new files, like /proc, also answers "no such file")."""
    if isinstance(exc, FileNotFoundError):
        if folder.is_dir():
            return OutputOSError(f"cannot create a file in this folder ({exc.strerror}); "
                                 "write somewhere else", folder).caused_by(exc)
        missing = next(p for p in (folder, *folder.parents) if p.parent.is_dir() or p == p.parent)
        return OutputNotFoundError("folder does not exist", missing)
    if isinstance(exc, NotADirectoryError):
        return OutputOSError("is a file, not a folder", _first_file(folder)).caused_by(exc)
    if isinstance(exc, PermissionError):
        return OutputPermissionError("permission denied creating a file in this folder", folder)
    return os_error(exc, folder)


def _first_file(folder: Path) -> Path:
    """The ancestor of ``folder`` that is a file (why nothing can be created below it)."""
    return next((p for p in reversed((folder, *folder.parents)) if p.is_file()), folder)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _mode_for(dst: Path) -> int:
    """The replaced file's mode, else what ``open()`` would give (mkstemp uses 0600)."""
    try:
        return dst.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_umask()


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def preallocate(file: BinaryIO, size: int) -> bool:
    """Reserve ``size`` bytes for ``file`` before it is written (Linux ``fallocate``); True
    when reserved, and the file is then ``size`` bytes long until truncated.

    ext4 otherwise allocates blocks as the page cache fills, which costs
    kernel time on every write (2 GB written and fsynced, 4 rounds: 0.3-1.0 s
    of system time preallocated, 0.5-2.1 s without; bench/README.md). A full
    disk then fails here, before anything is written. Where there is no such
    call (another OS, a filesystem without it, a stream that is not a file)
    the file is written as before: ``posix_fallocate`` is not used, since
    glibc emulates it by writing every block.
    """
    fallocate = libc_fallocate()
    try:
        fd = file.fileno()
    except (AttributeError, OSError, ValueError):  # io.BytesIO and the like
        return False
    if fallocate is None or size <= 0:
        return False
    if fallocate(fd, 0, 0, size) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        raise OSError(code, os.strerror(code))
    return False


class StagedFile:
    """A temp file beside ``dst``: write ``file``, ``sync``, verify ``tmp``, then ``publish``."""

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
                raise OutputExistsError("exists (appeared while writing); pass --overwrite to "
                                        "replace "
                                  "it", self.dst) from None
            except OSError as exc:  # filesystems without hard links
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                if self.dst.exists():
                    raise OutputExistsError("exists; pass --overwrite to replace it",
                                            self.dst) from None
                os.rename(self.tmp, self.dst)
            else:
                self.tmp.unlink()
        fsync_dir(self.dst.parent)


def refuse_special(dst: Path) -> None:
    """A device, pipe or socket at ``dst`` is refused, never replaced: a file is published by
    renaming a temp file over its name, which for ``-o /dev/null`` run as root would put a
    regular file where the device was (every later write to it then fills the disk)."""
    try:
        mode = os.lstat(dst).st_mode
    except OSError:
        return  # nothing there (or unreadable: the write says why)
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
        raise OutputError("is a device, pipe or socket, not a file: ckptport writes a file "
                          "beside it and renames it into place, which would replace it; "
                          "name a file", dst)


@contextlib.contextmanager
def staged_file(dst: Path, *, overwrite: bool) -> Iterator[StagedFile]:
    """Yield a ``StagedFile``; anything escaping the block removes the temp file."""
    refuse_special(dst)
    try:
        fd, name = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=TEMP_SUFFIX)
    except OSError as exc:
        raise folder_error(exc, dst.parent) from None
    tmp = Path(name)
    os.fchmod(fd, _mode_for(dst))
    file = os.fdopen(fd, "wb")
    try:
        yield StagedFile(dst, file, tmp, overwrite)
    except BaseException:
        tmp.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # flushing a full disk fails again
            file.close()
        raise
    with contextlib.suppress(OSError):
        file.close()
    tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_folder(parent: Path, name: str) -> Iterator[Path]:
    """A temp folder in ``parent`` (normal permissions), removed however the block ends."""
    try:
        staging = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.", suffix=TEMP_SUFFIX))
    except OSError as exc:
        raise folder_error(exc, parent) from None
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish_folder(staging: Path, folder: Path) -> None:
    """Rename ``staging`` to ``folder``, moving an existing ``folder`` aside first."""
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old.",
                                    suffix=TEMP_SUFFIX))
        os.replace(folder, old / folder.name)
    os.rename(staging, folder)
    fsync_dir(folder.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
