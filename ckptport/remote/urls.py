"""Remote locations: parse ``hf://``, ``s3://`` and ``http(s)://`` URLs, print them redacted.

``Path("https://host/x")`` folds ``//`` into ``/``, so a URL cannot travel
through code that holds ``Path`` objects. ``RemotePath`` is the small
path-like that does instead: it has the few ``Path`` members the commands
use on a source (``name``, ``suffix``, ``parent``, ``/``, ``stat``,
``open``), prints as its URL with credentials and query strings redacted
(``__str__`` and ``__fspath__``, so every message and report built from it
is safe), and holds the object it names once opened, so every read of one
command goes to the one version pinned at the first request.

This module imports only the standard library: ``location`` runs for every
path the CLI is given, and start-up must not pay for the network clients.
"""

from __future__ import annotations

import hashlib
import io
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeAlias
from urllib.parse import quote, unquote, urlsplit

from ..errors import InputError
from .deadline import Timeout, Transfers

__all__ = ["RemoteURL", "RemotePath", "Where", "Opened", "is_remote", "parse_url", "redact",
           "SCHEMES"]


class Opened(Protocol):
    """What opening a remote location gives (``remote.objects.RemoteFile``, a ``SourceFile``:
    ``remote.objects.opened`` says so to the readers)."""

    size: int
    version: str

    def read(self, offset: int, n: int) -> bytes: ...

    def stream(self) -> io.RawIOBase: ...

SCHEMES = ("http", "https", "hf", "s3")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_HUB_TYPES = {"datasets": "dataset", "spaces": "space", "models": "model"}
KEEP_FETCHED = "keep fetched bytes"  # in ``pins``: the command reads these objects again
_VERSION = "version"  # in ``pins``, with the URL: the version an object was first opened at


def is_remote(raw: object) -> bool:
    """Whether ``raw`` is spelled as a URL (``scheme://``), remote or not supported."""
    return isinstance(raw, RemotePath) or (isinstance(raw, str) and bool(_URL.match(raw)))


@dataclass(frozen=True)
class RemoteURL:
    """A parsed URL. ``key`` is the object's path: the S3 key, the file in the hub repo,
    or the HTTP path with its query; ``revision`` the hub revision as given."""

    scheme: str
    host: str  # http(s): netloc without credentials; s3: bucket; hf: repo id
    key: str
    userinfo: str = ""  # http(s) ``user:password@``, never printed
    query: str = ""  # http(s) query string, never printed (signed URLs carry secrets in it)
    repo_type: str = "model"  # hf
    revision: str | None = None  # hf

    def redacted(self) -> str:
        if self.scheme == "hf":
            prefix = "" if self.repo_type == "model" else f"{self.repo_type}s/"
            revision = "" if self.revision is None else "@" + quote(self.revision, safe="")
            return f"hf://{prefix}{self.host}{revision}/{self.key}".rstrip("/")
        user = "***@" if self.userinfo else ""
        query = "?***" if self.query else ""
        return f"{self.scheme}://{user}{self.host}/{self.key}{query}"

    def child(self, name: str) -> RemoteURL:
        folder = self.key.rsplit("/", 1)[0] + "/" if "/" in self.key else ""
        return replace(self, key=folder + name, query="")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]


def redact(text: str) -> str:
    """``text`` with every URL in it redacted (for messages that quote a library's words)."""
    def one(match: re.Match[str]) -> str:
        try:
            return parse_url(match.group(0)).redacted()
        except InputError:
            return "<url>"
    return re.sub(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>)]+", one, text)


def parse_url(text: str) -> RemoteURL:
    """The URL's parts; an ``InputError`` for a scheme ckptport does not read."""
    match = _URL.match(text)
    scheme = match.group(1).lower() if match else ""
    if scheme in ("http", "https"):
        parts = urlsplit(text)
        userinfo, _, host = parts.netloc.rpartition("@")
        if not host:
            raise InputError("has no host", _bare(text))
        return RemoteURL(scheme, host, parts.path.lstrip("/"), userinfo, parts.query)
    if scheme == "s3":
        bucket, _, key = text[len("s3://"):].partition("/")
        if not bucket:
            raise InputError("names no bucket (s3://BUCKET/KEY)", _bare(text))
        return RemoteURL("s3", bucket, key)
    if scheme == "hf":
        return _parse_hub(text[len("hf://"):])
    raise InputError(f"{scheme}:// sources are not read (ckptport reads local files, "
                     f"{', '.join(s + '://' for s in SCHEMES)})", _bare(text))


def _bare(text: str) -> str:
    """A URL that failed to parse, printed without anything that may be a secret."""
    return text.split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]


def _parse_hub(rest: str) -> RemoteURL:
    """``[datasets/|spaces/]ORG/REPO[@REVISION][/PATH]``, as huggingface_hub's HfFileSystem.

    A revision holding ``/`` is written URL-encoded (``@refs%2Fpr%2F3``);
    ``refs/pr/N`` and ``refs/convert/NAME`` are also taken as written.
    """
    parts = rest.split("/")
    repo_type = "model"
    if parts and parts[0] in _HUB_TYPES:
        repo_type = _HUB_TYPES[parts.pop(0)]
    if len(parts) < 2 or not parts[0] or not parts[1].split("@")[0]:
        raise InputError("names no repository: write hf://ORG/REPO[@REVISION]/PATH",
                         "hf://" + rest)
    org, name = parts[0], parts[1]
    revision = None
    tail = parts[2:]
    if "@" in name:
        name, revision = name.split("@", 1)
        if revision in ("refs",) and len(tail) >= 2 and tail[0] in ("pr", "convert"):
            revision, tail = f"refs/{tail[0]}/{tail[1]}", tail[2:]
        revision = unquote(revision)
        if not revision:
            raise InputError("has an empty revision after '@'", "hf://" + rest)
    # a trailing '/' kept, as in an s3:// key: the key names a folder of the repository
    key = "/".join(tail).lstrip("/")
    return RemoteURL("hf", f"{org}/{name}", key, repo_type=repo_type,
                     revision=revision)


@dataclass(frozen=True)
class RemoteStat:
    """What ``Path.stat()`` gives for a file, from the pinned object (no new request)."""

    st_size: int
    st_mtime_ns: int  # the pinned version's digest: a changed object is another file
    st_ino: int = 0
    st_dev: int = 0
    st_mode: int = stat.S_IFREG | 0o444


class RemotePath:
    """A remote object's location, usable where the commands hold a source ``Path``."""

    # Any: what each pin holds is its owner's (a hub revision's info, a version, a list)
    def __init__(self, url: RemoteURL, pins: dict[Any, Any] | None = None,
                 opener: Callable[[RemotePath], Opened] | None = None,
                 transfers: Transfers | None = None) -> None:
        self.url = url
        self.opener = opener  # how the object is opened (``remote.objects.open_remote``)
        # the command's deadlines, shared with the objects next to it (``deadline``)
        self.transfers = transfers if transfers is not None else Transfers()
        # what the first request pinned (a hub revision's commit), shared with the
        # objects next to it (the shards an index names), so they are read at one commit
        self.pins: dict[Any, Any] = {} if pins is None else pins  # Any: as above
        self._lock = threading.Lock()
        self._file: Opened | None = None

    def __str__(self) -> str:
        return self.url.redacted()

    __fspath__ = __str__

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __lt__(self, other: RemotePath) -> bool:
        return str(self) < str(other)

    @property
    def name(self) -> str:
        return self.url.name

    @property
    def suffix(self) -> str:
        return Path(self.name).suffix

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.url.child(""), self.pins, self.opener, self.transfers)

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(self.url.child(name), self.pins, self.opener, self.transfers)

    def is_dir(self) -> bool:
        # a remote folder is known by its listing (``remote.folder_names``, folder mode's
        # ``folder_files``), not by asking a path: what asks this reads a local folder
        return False

    def is_symlink(self) -> bool:
        return False

    def __reduce__(self) -> tuple[Callable[..., RemotePath], tuple[object, ...]]:
        """Pickled for a worker process (folder mode): the URL and ``pins``, so the worker
        reads each object at the version (and a hub repository at the commit) this process
        pinned; the open object, its lock and the command's clock stay here."""
        timeout, connections = self.transfers.timeout, self.transfers.connections
        return _unpickled, (self.url, self.pins, self.opener, timeout, connections)

    def reopened(self) -> RemotePath:
        """The same location, not yet opened, sharing ``pins`` (the versions pinned so far)
        and the clock: a new read of it (a spool, if the command asks) at the same version."""
        return RemotePath(self.url, self.pins, self.opener, self.transfers)

    def opened(self) -> Opened:
        """The object, opened (and its version pinned) on first use, then the same one.

        The version is pinned in ``pins`` too, shared by every location built from this one
        (its folder's, a worker's copy): an object opened again later must be that version,
        or the command refuses it, as a local file that changes while it is read."""
        with self._lock:
            if self._file is None:
                if self.opener is None:
                    raise InputError("a remote location made without a way to open it", self)
                file = self.opener(self)
                first = self.pins.setdefault((_VERSION, self.url), file.version)
                if first != file.version:
                    raise InputError("changed while it was read (its version is no longer "
                                     "the one pinned when it was first opened); nothing was "
                                     "written for it, run again", self)
                self._file = file
            return self._file

    def stat(self) -> RemoteStat:
        file = self.opened()
        digest = hashlib.sha256(file.version.encode()).digest()  # the same in every process
        return RemoteStat(file.size, int.from_bytes(digest[:8], "big") >> 1)

    def exists(self) -> bool:
        return True  # asked only of sources; opening one says plainly if it is missing

    def is_file(self) -> bool:
        return True

    def open(self, mode: str = "rb") -> io.RawIOBase:
        """A read-only binary stream over the pinned object (``sha256_files`` hashes it)."""
        if mode != "rb":
            raise InputError("remote sources are read-only", self)
        return self.opened().stream()

    def read_bytes(self) -> bytes:
        file = self.opened()
        return file.read(0, file.size)


Where: TypeAlias = "Path | RemotePath"
"""Where a source, a file it covers or a searched file is: on this machine, or remote
(path-like: ``name``, ``parent``, ``/``, ``stat``, ``open``; read by range, never by a local
``open``). Code that needs a file on this machine narrows with ``isinstance(x, Path)``."""


def _unpickled(url: RemoteURL, pins: dict[Any, Any],  # Any: as RemotePath.pins
               opener: Callable[[RemotePath], Opened]
               | None, timeout: Timeout, connections: int) -> RemotePath:
    return RemotePath(url, pins, opener, Transfers(timeout, connections=connections))
