"""Progress reporting as a callback, so the library never prints.

The core calls ``progress(description, total)`` to start a task and gets a
function to advance it; the CLI plugs in tqdm on stderr, the Python API
defaults to nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["Progress", "Advance", "no_progress"]

Advance = Callable[[int], None]


class Progress(Protocol):
    def __call__(self, description: str, total: int) -> Advance: ...


def no_progress(description: str, total: int) -> Advance:
    return lambda n: None
