"""Checkpoints where they live: ``hf://``, ``s3://`` and ``http(s)://`` sources, read by range.

A URL becomes a ``RemotePath`` (``location``), the path-like that prints
its redacted URL; ``folder_names`` lists a hub or bucket folder for the readers' layouts
(a hub repository reads as its weights, as a local Hugging Face folder does), and
``folder_files`` every file below one for folder mode's walk; opening a location
gives a ``RemoteFile``, a ``SourceFile``, after which every reader, rule,
writer and report works as on a local file and cannot tell the difference.
``readers.resolve`` calls ``readers.remote`` for a URL, which uses this
package, so this package knows nothing of readers. Only what a command
reads is transferred: a safetensors header, a zip's directory and pickle,
the tensors it hashes, compares or writes.

Importing this package costs nothing: the HTTP client, huggingface_hub and
boto3 load when a URL is opened.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from .deadline import Timeout, Transfers
from .urls import KEEP_FETCHED, RemotePath, RemoteURL, Where, is_remote, parse_url, redact

__all__ = ["RemotePath", "RemoteURL", "Where", "Timeout", "Transfers", "is_remote", "location",
           "parse_url", "redact", "folder_names", "folder_files"]


def location(raw: str | os.PathLike[str], transfers: Transfers | None = None
             ) -> Path | RemotePath:
    """A local ``Path``, or a ``RemotePath`` for a URL: the one place paths are told apart.

    ``transfers`` is the command's clock over its remote transfers (one per command,
    shared by every URL it reads); by default a new one over ``Timeout.from_env()``."""
    if isinstance(raw, (Path, RemotePath)):
        return raw
    text = os.fspath(raw)
    if not is_remote(text):
        return Path(text)
    from .objects import open_remote

    return RemotePath(parse_url(text), opener=open_remote, transfers=transfers)


def folder_names(path: RemotePath) -> frozenset[str] | None:
    """The names in the folder ``path`` names (files as named, folders with a trailing
    ``/``), for the readers' layouts to decide from; None when it names an object.

    A hub repository (or a folder of one) and a bucket folder are listed; a web server
    cannot be listed. When the command will read its source again
    (``sources.read_more_than_once``), the objects keep what they fetch, this one and the
    shards next to it (they share ``pins``).
    """
    from ..sources import rereads_expected

    if rereads_expected():
        path.pins[KEEP_FETCHED] = rereads_expected()  # True, or the most bytes to keep
    url = path.url
    if url.key and not url.key.endswith("/"):
        return None
    if url.scheme == "s3":
        from .s3 import folder_names as bucket_names

        return bucket_names(path)
    return frozenset(n if "/" not in n else n.split("/", 1)[0] + "/" for n in _hub_files(path))


def folder_files(path: RemotePath) -> tuple[str, ...]:
    """Every file below the folder ``path`` names (a bucket folder, a hub repository or a
    folder of one), relative to it, in name order: what folder mode walks, as ``os.walk``
    walks a local folder."""
    if path.url.scheme == "s3":
        from .s3 import folder_files as bucket_files

        return bucket_files(path)
    return tuple(sorted(_hub_files(path)))


def _hub_files(path: RemotePath) -> list[str]:
    """Every file below the hub folder ``path`` names, relative to it (the repository's
    listing is whole, so both views come from it); a web server cannot be listed."""
    if path.url.scheme != "hf":
        raise InputError("names a folder, and a web server cannot be listed: name a "
                         "checkpoint file or a *.index.json", path)
    from .hub import repo_files

    folder = path.url.key.strip("/")
    prefix = f"{folder}/" if folder else ""
    return [f[len(prefix):] for f in repo_files(path) if f.startswith(prefix)]
