"""Fetching ranges of one pinned remote object: the backend interface, retries, faults.

Every transport (``http``, ``hub``, ``s3``) implements ``Backend`` and
raises ``Transient`` for a fault worth retrying (a timeout, a dropped
connection, 429, 5xx); ``retrying`` retries it with backoff a bounded number
of times, all within the request's deadline (``deadline.Transfers``), which
the backoff counts against. Everything else is an ``InputError`` naming the
(redacted) URL. A range is fetched in ``pieces`` of at most ``PIECE`` bytes,
one request each, so the request deadline bounds a piece, never a whole read.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..errors import InputError, InputNotFoundError

if TYPE_CHECKING:
    from .deadline import Transfers
    from .urls import RemotePath

__all__ = ["ATTEMPTS", "Backend", "NotFound", "PIECE", "Transient", "missing_extra", "pieces",
           "retrying"]

ATTEMPTS = int(os.environ.get("CKPTPORT_REMOTE_ATTEMPTS", "5"))  # per range, first try included
BACKOFF = 0.25  # seconds before the first retry; doubles each time, with jitter
MAX_BACKOFF = 8.0
PIECE = 64 << 20  # bytes per request at most: within ``Timeout.request`` at 220 KB/s and up
RANGE = 1 << 20  # the least a split or read-ahead request fetches, unless a backend says more

T = TypeVar("T")


class Transient(Exception):
    """A fault worth retrying: a timeout, a dropped connection, 429, 5xx."""

    def __init__(self, message: str, wait: float | None = None) -> None:
        super().__init__(message)
        self.wait = wait  # the server's Retry-After, when it gave one


class NotFound(InputNotFoundError):
    """The object does not exist (404, NoSuchKey): a hub repository root tries the next name."""


def missing_extra(scheme: str) -> InputError:
    return InputError(f"reading {scheme}:// sources needs ckptport's remote extra "
                      "(huggingface_hub, boto3): pip install 'ckptport[remote]', or '.[remote]' "
                      "in a clone")


def retrying(fetch: Callable[[float], T], where: RemotePath, transfers: Transfers) -> T:
    """``fetch(ends)``, tried up to ``ATTEMPTS`` times while it fails transiently, until
    ``ends``, the request's deadline (``fetch`` bounds its own waits by it)."""
    ends = transfers.request_ends()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return fetch(ends)
        except Transient as exc:  # noqa: PERF203 - the retry loop is the point
            if transfers.left(ends) <= 0:
                raise transfers.expired(ends, where) from None
            if attempt == ATTEMPTS:
                raise InputError(f"{exc} (gave up after {ATTEMPTS} attempts)", where) from None
            delay = exc.wait if exc.wait is not None else BACKOFF * 2 ** (attempt - 1)
            pause = min(MAX_BACKOFF, delay) * (1 + random.random() / 4)
            if pause >= transfers.left(ends):
                raise transfers.expired(ends, where) from None
            time.sleep(pause)
    raise AssertionError("unreachable")


def pieces(offset: int, buffer: memoryview) -> Iterator[tuple[int, memoryview]]:
    """``buffer`` (to be filled from ``offset``) as the ranges of one request each."""
    for start in range(0, len(buffer), PIECE):
        yield offset + start, buffer[start:start + PIECE]


class Backend(Protocol):
    """One remote object at one pinned version."""

    size: int
    version: str  # the pinned ETag / version id / commit, compared by ``changed``
    # the least one request of a split read or a read-ahead fetches (``RANGE``; S3: 8 MiB)
    least: int
    # what one read-ahead request fetches (``RANGE``; S3: 16 MiB): the read-ahead's window
    # stays two ``least`` per connection, in fewer, larger requests where each costs more
    piece: int

    def fetch_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` from ``offset`` of the pinned version (retried; errors named)."""

    def current_version(self) -> str | None:
        """The version the server holds now (one small request); None when it is gone."""

    def close(self) -> None: ...
