"""A URL source: what ``resolve`` does for a local path, for an object over the network.

The object is opened as a ``RemoteFile`` (a ``SourceFile`` reading by
range) and then goes through the same sniff, the same name check and the
same shard-index parse as a local file: a remote source is untrusted
exactly like a local one. A ``RemotePath`` stands where ``Path`` does in
``Source`` and ``SourceFacts``: it is path-like and prints its redacted URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from ..containers.shard_index import MAX_INDEX_BYTES, parse_index
from ..containers.sniff import sniff
from ..errors import InputError
from ..remote import RemotePath, target
from ..sources import SourceFile
from .base import Source, SourceKind
from .folders import WEIGHT_FILES

__all__ = ["resolve_url"]


def resolve_url(path: RemotePath) -> Source:
    from . import check_named

    remote = target(path, WEIGHT_FILES)
    named = cast(Path, remote)
    file = cast(SourceFile, remote.opened())  # a RemoteFile: a SourceFile
    if remote.name.endswith(".index.json"):
        if file.size > MAX_INDEX_BYTES:
            raise InputError(f"shard index larger than {MAX_INDEX_BYTES >> 20} MiB", remote)
        parsed = parse_index(named, data=file.read(0, file.size))
        return Source(named, SourceKind.SHARDS, named, (named, *parsed.shards), parsed.format,
                      index=parsed)
    fmt = sniff(file)
    check_named(named, fmt)
    return Source(named, SourceKind.FILE, named, (named,), fmt, file)
