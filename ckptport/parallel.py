"""Work spread over the machine's cores: threads over tensors.

Reading by position, hashing, zlib's CRC and numpy's comparisons all
release the GIL on large buffers, so threads over tensors use every core
for what dominates ckptport's time (verification, manifests). Work is
started largest first, so one big tensor does not finish alone at the end.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["cpu_count", "workers", "run_all"]

T = TypeVar("T")
R = TypeVar("R")


def cpu_count() -> int:
    """The cores this process may run on (a CPU-limited container reports fewer)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def workers(jobs: int | None) -> int:
    """``jobs`` if given, else ``CKPTPORT_JOBS``, else every core."""
    if jobs is None:
        jobs = int(os.environ.get("CKPTPORT_JOBS", "0") or 0) or cpu_count()
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    return jobs


def run_all(work: Callable[[T], R], items: Sequence[T], *, jobs: int | None = None,
            size: Callable[[T], int] | None = None) -> list[R]:
    """``work`` over ``items`` on ``jobs`` threads; results in the order of ``items``.

    The first exception raised by any item is raised here, after the
    running items finish.
    """
    count = min(workers(jobs), len(items))
    if count <= 1:
        return [work(item) for item in items]
    order = sorted(range(len(items)), key=lambda i: -size(items[i])) if size else \
        list(range(len(items)))
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="ckptport") as pool:
        futures = {i: pool.submit(work, items[i]) for i in order}
        results = {i: future.result() for i, future in futures.items()}  # in the order started
    return [results[i] for i in range(len(items))]
