"""What a command transferred over the network, for its report.

One counter per process: a CLI command is one process, and it resets the
counter when it starts (``reset``), so the figure a report gives is that
command's. Counted are the body bytes received and the requests made.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

__all__ = ["Transferred", "add", "reset", "transferred"]

_lock = threading.Lock()
_counts = [0, 0, 0]  # bytes, requests, objects opened


@dataclass(frozen=True)
class Transferred:
    bytes: int
    requests: int
    objects: int


def add(nbytes: int, requests: int = 1, objects: int = 0) -> None:
    with _lock:
        _counts[0] += nbytes
        _counts[1] += requests
        _counts[2] += objects


def reset() -> None:
    with _lock:
        _counts[:] = [0, 0, 0]


def transferred() -> Transferred | None:
    """The counts since ``reset``; None when no remote object was opened."""
    with _lock:
        return Transferred(*_counts) if _counts[2] else None
