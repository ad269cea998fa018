"""What a command transferred over the network, for its report.

One counter per process: a CLI command is one process, and it resets the
counter when it starts (``reset``), so the figure a report gives is that
command's. Counted are the body bytes received, the requests made, the
connections allowed at once (``Transfers.connections``, the most any object
used) and the seconds from the first request to the last byte, which give
the throughput.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

__all__ = ["Transferred", "add", "reset", "transferred", "uses"]

_lock = threading.Lock()
_counts = [0, 0, 0, 0]  # bytes, requests, objects opened, connections
_times: list[float] = []  # the first and the latest count


@dataclass(frozen=True)
class Transferred:
    bytes: int
    requests: int
    objects: int
    connections: int = 1
    seconds: float = 0.0
    throughput: float = 0.0  # bytes per second over ``seconds``


def add(nbytes: int, requests: int = 1, objects: int = 0) -> None:
    now = time.monotonic()
    with _lock:
        _counts[0] += nbytes
        _counts[1] += requests
        _counts[2] += objects
        _times[1:] = [now]
        if len(_times) == 1:
            _times.insert(0, now)


def uses(connections: int) -> None:
    """An object reads with up to ``connections`` requests at once."""
    with _lock:
        _counts[3] = max(_counts[3], connections)


def reset() -> None:
    with _lock:
        _counts[:] = [0, 0, 0, 0]
        _times.clear()


def transferred() -> Transferred | None:
    """The counts since ``reset``; None when no remote object was opened."""
    with _lock:
        if not _counts[2]:
            return None
        seconds = _times[-1] - _times[0] if _times else 0.0
        return Transferred(_counts[0], _counts[1], _counts[2], max(1, _counts[3]),
                           round(seconds, 3),
                           round(_counts[0] / seconds) if seconds > 0 else 0.0)
