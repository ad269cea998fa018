"""Checkpoints where they live: ``hf://``, ``s3://`` and ``http(s)://`` sources, read by range.

``resolve_remote`` is the one hook ``readers.resolve`` calls for a URL: it
decides what the URL names (a checkpoint file, a shard index, a hub
repository's weights) and opens it as a ``RemoteFile`` (a ``SourceFile``),
after which every reader, rule, writer and report works as on a local
file and cannot tell the difference. Only what a command reads is
transferred: a safetensors header, a zip's directory and pickle, the
tensors it hashes, compares or writes.

Importing this package costs nothing: the HTTP client, huggingface_hub and
boto3 load when a URL is opened.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..errors import InputError
from .urls import KEEP_FETCHED, RemotePath, RemoteURL, is_remote, location, parse_url, redact

if TYPE_CHECKING:
    from ..readers.base import Source

__all__ = ["RemotePath", "RemoteURL", "is_remote", "location", "parse_url", "redact",
           "resolve_remote"]

_HUB_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def resolve_remote(path: RemotePath) -> Source:
    """What the URL names, opened: a ``Source`` exactly as ``resolve`` makes for a file."""
    from ..containers.shard_index import parse_index
    from ..containers.sniff import sniff
    from ..readers import check_named
    from ..readers.base import Source, SourceKind
    from ..sources import rereads_expected

    if rereads_expected():  # kept for this file and the shards next to it
        path.pins[KEEP_FETCHED] = True
    remote = _weights(path)
    # a RemotePath stands where a Path does: path-like, it prints its (redacted) URL
    target = cast(Path, remote)
    if target.name.endswith(".index.json"):
        index = remote.opened()
        parsed = parse_index(target, data=index.read(0, _index_size(index)))
        return Source(target, SourceKind.SHARDS, target, (target, *parsed.shards),
                      parsed.format, index=parsed)
    file = remote.opened()
    fmt = sniff(file)
    check_named(target, fmt)
    return Source(target, SourceKind.FILE, target, (target,), fmt, file)


def _index_size(file: object) -> int:
    from ..containers.shard_index import MAX_INDEX_BYTES

    size = getattr(file, "size", 0)
    if size > MAX_INDEX_BYTES:
        raise InputError(f"shard index larger than {MAX_INDEX_BYTES >> 20} MiB",
                         getattr(file, "path", None))
    return int(size)


def _weights(path: RemotePath) -> RemotePath:
    """A hub repository (or a folder in one) read as the model folder it is; other folders
    are refused, since a bucket or a web server cannot be listed the same way everywhere."""
    url = path.url
    if url.key and not url.key.endswith("/"):
        return path
    if url.scheme != "hf":
        raise InputError("names a folder; folder mode reads local folders only: name a "
                         "checkpoint file or a *.index.json", path)
    from .hub import repo_files

    folder = url.key.strip("/")
    prefix = f"{folder}/" if folder else ""
    names = [f[len(prefix):] for f in repo_files(path) if f.startswith(prefix)
             and "/" not in f[len(prefix):]]
    indexes = sorted(n for n in names if n.endswith(".index.json"))
    if len(indexes) > 1:
        raise InputError(f"holds several shard indexes ({', '.join(indexes)}); name one", path)
    chosen = indexes or [n for n in _HUB_WEIGHTS if n in names]
    if not chosen:
        raise InputError("is a repository folder with no checkpoint in it (no *.index.json "
                         f"shard index, no {' or '.join(_HUB_WEIGHTS)})", path)
    return RemotePath(replace(url, key=prefix + chosen[0]), path.pins)
