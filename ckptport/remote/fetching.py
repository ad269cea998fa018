"""Fetching ranges of one pinned remote object: the backend interface, retries, faults.

Every transport (``http``, ``hub``, ``s3``) implements ``Backend`` and
raises ``Transient`` for a fault worth retrying (a timeout, a dropped
connection, 429, 5xx); ``retrying`` retries it with backoff a bounded number
of times. Everything else is an ``InputError`` naming the (redacted) URL.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..errors import InputError

if TYPE_CHECKING:
    from .urls import RemotePath

__all__ = ["ATTEMPTS", "Backend", "NotFound", "Transient", "missing_extra", "retrying"]

ATTEMPTS = int(os.environ.get("CKPTPORT_REMOTE_ATTEMPTS", "5"))  # per range, first try included
BACKOFF = 0.25  # seconds before the first retry; doubles each time, with jitter
MAX_BACKOFF = 8.0

T = TypeVar("T")


class Transient(Exception):
    """A fault worth retrying: a timeout, a dropped connection, 429, 5xx."""

    def __init__(self, message: str, wait: float | None = None) -> None:
        super().__init__(message)
        self.wait = wait  # the server's Retry-After, when it gave one


class NotFound(InputError):
    """The object does not exist (404, NoSuchKey): a hub repository root tries the next name."""


def missing_extra(scheme: str) -> InputError:
    return InputError(f"reading {scheme}:// sources needs ckptport's remote extra "
                      "(huggingface_hub, boto3): pip install 'ckptport[remote]', or '.[remote]' "
                      "in a clone")


def retrying(fetch: Callable[[], T], where: RemotePath) -> T:
    """``fetch()``, tried up to ``ATTEMPTS`` times while it fails transiently."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return fetch()
        except Transient as exc:  # noqa: PERF203 - the retry loop is the point
            if attempt == ATTEMPTS:
                raise InputError(f"{exc} (gave up after {ATTEMPTS} attempts)", where) from None
            delay = exc.wait if exc.wait is not None else BACKOFF * 2 ** (attempt - 1)
            time.sleep(min(MAX_BACKOFF, delay) * (1 + random.random() / 4))
    raise AssertionError("unreachable")


class Backend(Protocol):
    """One remote object at one pinned version."""

    size: int
    version: str  # the pinned ETag / version id / commit, compared by ``changed``

    def fetch_into(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` from ``offset`` of the pinned version (retried; errors named)."""

    def current_version(self) -> str | None:
        """The version the server holds now (one small request); None when it is gone."""

    def close(self) -> None: ...
