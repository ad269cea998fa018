"""Where and how to write: a destination and options turned into one plan, checked up front.

The plan is made before a byte of the source is read, so a bad extension,
an unknown format, a destination that is the source (under any spelling)
or one that exists without ``--overwrite`` fail at once.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import OutputError

__all__ = ["Target", "Destination", "plan_destination", "check_destination", "same_file",
           "parse_size", "FILE_EXTENSIONS", "DEFAULT_SHARD_SIZE", "ANCHOR_PATTERN"]

ANCHOR_PATTERN = r"cpu|cuda:\d+"
DEFAULT_SHARD_SIZE = 5 * 10**9  # the hub's default
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class Target(str, enum.Enum):
    """What ckptport writes: a torch ``.pth``, a ``.safetensors`` file, a DCP folder."""

    PTH = "pth"
    SAFETENSORS = "safetensors"
    DCP = "dcp"


FILE_EXTENSIONS = {".pth": Target.PTH, ".pt": Target.PTH, ".bin": Target.PTH,
                   ".ckpt": Target.PTH, ".pth.tar": Target.PTH, ".pt.tar": Target.PTH,
                   ".safetensors": Target.SAFETENSORS}


@dataclass(frozen=True)
class Destination:
    """A planned output: the path, what to write there, and whether it is a shard set."""

    path: Path
    target: Target
    shard_size: int | None = None  # a shard set of shards of at most this many bytes

    @property
    def sharded(self) -> bool:
        return self.shard_size is not None


def parse_size(text: str | int) -> int:
    """``5GB`` (decimal, as the hub counts), ``2GiB`` (binary) or a byte count."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).upper() not in _UNITS:
            raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB, 2GiB)")
        size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if size <= 0:
        raise ValueError(f"shard size must be positive, not {text!r}")
    return size


def file_extension(path: Path) -> str:
    """The checkpoint-file extension ``path`` ends with (``.pth.tar`` whole), or ``""``."""
    name = path.name.lower()
    for extension in sorted(FILE_EXTENSIONS, key=len, reverse=True):
        if name.endswith(extension):
            return extension
    return ""


def _extension(path: Path) -> str:
    return file_extension(path) or path.suffix.lower()


def plan_destination(dst: str | os.PathLike[str], to: str | Target | None = None,
                     max_shard_size: int | str | None = None) -> Destination:
    """The output ``dst`` names, with ``to`` and ``max_shard_size``; ``OutputError`` if none."""
    path = Path(dst)
    target = None
    if to is not None:
        try:
            target = Target(to)
        except ValueError:
            known = ", ".join(t.value for t in Target)
            raise OutputError(f"unknown output format {str(to)!r} (known: {known})",
                              path) from None
    extension = _extension(path)
    if target is Target.DCP:
        if extension in FILE_EXTENSIONS or path.is_file():
            raise OutputError("a DCP checkpoint is a folder; name a folder, not a "
                              f"{extension or 'file'} path", path)
        if max_shard_size is not None:
            raise OutputError("--max-shard-size writes a shard set, not DCP", path)
        return Destination(path, Target.DCP)
    folder = path.is_dir() or str(dst).endswith((os.sep, "/"))
    if max_shard_size is not None or folder:
        size = DEFAULT_SHARD_SIZE if max_shard_size is None else _size(max_shard_size, path)
        return Destination(path, target or Target.SAFETENSORS, size)
    if target is None:
        try:
            target = FILE_EXTENSIONS[extension]
        except KeyError:
            known = ", ".join(FILE_EXTENSIONS)
            raise OutputError(f"cannot tell the output format from the extension "
                              f"{extension or '(none)'!r} (known: {known}); pass --to",
                              path) from None
    return Destination(path, target)


def _size(value: int | str, path: Path) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise OutputError(str(exc), path) from None


def same_file(a: Path, b: Path) -> bool:
    """One file under two spellings: symlinks, ``..``, hard links."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_destination(sources: Iterable[Path], destination: Destination,
                      overwrite: bool) -> None:
    """Refuse a destination that is a source (under any spelling) or exists."""
    dst = destination.path
    if destination.sharded or destination.target is Target.DCP:
        if dst.exists() and not dst.is_dir():
            raise OutputError("exists and is not a folder; this output is a folder", dst)
        for source in sources:
            if same_file(source, dst) or same_file(source.parent, dst) and \
                    destination.target is Target.DCP:
                raise OutputError(f"holds the source {source.name}; write elsewhere", dst)
        if destination.target is Target.DCP and dst.exists() and not overwrite:
            raise OutputError("exists; pass --overwrite to replace it", dst)
        return
    if dst.is_dir():
        raise OutputError("is a directory; name an output file", dst)
    for source in sources:
        if same_file(source, dst):
            raise OutputError(f"is the source file {source}; write somewhere else", dst)
    if (dst.exists() or dst.is_symlink()) and not overwrite:
        raise OutputError("exists; pass --overwrite to replace it", dst)
