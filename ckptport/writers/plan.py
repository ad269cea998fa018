"""Where and how to write: a destination and options turned into one plan, checked up front.

The plan is made before a byte of the source is read, so a bad extension,
an unknown format, a destination that is the source (under any spelling)
or one that exists without ``--overwrite`` fail at once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import OutputError, OutputExistsError, OutputIsADirectoryError
from ..remote.urls import Where
from .formats import FORMATS, Kind, OutputFormat, by_extension

__all__ = ["Destination", "plan_destination", "check_destination", "same_file", "parse_size",
           "file_extension", "DEFAULT_SHARD_SIZE", "ANCHOR_PATTERN"]

ANCHOR_PATTERN = r"cpu|cuda:\d+"
DEFAULT_SHARD_SIZE = 5 * 10**9  # the hub's default
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass(frozen=True)
class Destination:
    """A planned output: the path, the format to write there, and whether it is a shard set."""

    path: Path
    format: OutputFormat
    shard_size: int | None = None  # a shard set of shards of at most this many bytes

    @property
    def sharded(self) -> bool:
        return self.shard_size is not None

    @property
    def folder(self) -> bool:
        """Whether DST is a folder (a shard set, a DCP checkpoint) rather than one file."""
        return self.sharded or self.format.kind is Kind.FOLDER


def parse_size(text: str | int) -> int:
    """``5GB`` (decimal, as the hub counts), ``2GiB`` (binary) or a byte count (from text,
    1024 and up: a bare small number is a unit left out)."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).upper() not in _UNITS:
            raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB, 2GiB)")
        size = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
        if not match.group(2) and size < 1024:  # "2" meant 2GB, not 2 one-byte shards
            raise ValueError(f"{text!r} without a unit is {size} bytes: name the unit "
                             f"({match.group(1)}GB, {match.group(1)}MB, or {match.group(1)}B "
                             "if bytes are meant)")
    if size <= 0:
        raise ValueError(f"shard size must be positive, not {text!r}")
    return size


def file_extension(path: Path) -> str:
    """The extension of a file format ``path`` ends with (``.pth.tar`` whole), or ``""``."""
    found = by_extension(path.name)
    return found[0] if found else ""


def _known(kind: Kind | None = None) -> str:
    return ", ".join(name for name, fmt in FORMATS.items() if kind is None or fmt.kind is kind)


def plan_destination(dst: str | os.PathLike[str], to: str | None = None,
                     max_shard_size: int | str | None = None) -> Destination:
    """The output ``dst`` names, with ``to`` and ``max_shard_size``; ``OutputError`` if none.

    ``to`` names a format of ``writers.formats``; without it the format comes from
    DST's extension. A folder DST (an existing one, or a path ending in a separator)
    or ``max_shard_size`` writes a shard set of a file format (safetensors by default).
    """
    path = Path(dst)
    fmt = None
    if to is not None:
        fmt = FORMATS.get(str(to))
        if fmt is None:
            raise OutputError(f"unknown output format {str(to)!r} (known: {_known()})", path)
    extension = file_extension(path)
    if fmt is not None and fmt.kind is Kind.FOLDER:
        if extension or path.is_file():
            raise OutputError(f"a {fmt.name} checkpoint is a folder; name a folder, not a "
                              f"{extension or 'file'} path", path)
        if max_shard_size is not None:
            raise OutputError(f"--max-shard-size writes a shard set, not {fmt.name}", path)
        return Destination(path, fmt)
    folder = path.is_dir() or str(dst).endswith((os.sep, "/"))
    if max_shard_size is not None or folder:
        size = DEFAULT_SHARD_SIZE if max_shard_size is None else _size(max_shard_size, path)
        fmt = fmt or FORMATS["safetensors"]
        if fmt.shard_stem is None:
            raise OutputError(f"{fmt.name} files have no shard-set naming; write one file",
                              path)
        return Destination(path, fmt, size)
    if fmt is None:
        found = by_extension(path.name)
        if found is None:
            known = ", ".join(ext for f in FORMATS.values() for ext in f.extensions)
            raise OutputError(f"cannot tell the output format from the extension "
                              f"{path.suffix.lower() or '(none)'!r} (known: {known}); pass "
                              "--to", path)
        fmt = found[1]
    return Destination(path, fmt)


def _size(value: int | str, path: Path) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise OutputError(str(exc), path) from None


def same_file(a: Where, b: Where) -> bool:
    """One file under two spellings: symlinks, ``..``, hard links. A remote location is only
    ever itself: never the local path its redacted URL would spell to ``os.path``."""
    if not (isinstance(a, Path) and isinstance(b, Path)):
        return a == b
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_destination(sources: Iterable[Where], destination: Destination,
                      overwrite: bool) -> None:
    """Refuse a destination that is a source (under any spelling) or exists."""
    dst = destination.path
    if destination.folder:
        whole = not destination.sharded  # a folder format replaces DST whole
        if dst.exists() and not dst.is_dir():
            raise OutputExistsError("exists and is not a folder; this output is a folder", dst)
        for source in sources:
            if same_file(source, dst) or same_file(source.parent, dst) and whole:
                raise OutputError(f"holds the source {source.name}; write elsewhere", dst)
        if whole and dst.exists() and not overwrite:
            raise OutputExistsError("exists; pass --overwrite to replace it", dst)
        return
    if dst.is_dir():
        raise OutputIsADirectoryError("is a directory; name an output file", dst)
    for source in sources:
        if same_file(source, dst):
            raise OutputError(f"is the source file {source}; write somewhere else", dst)
    if (dst.exists() or dst.is_symlink()) and not overwrite:
        raise OutputExistsError("exists; pass --overwrite to replace it", dst)
