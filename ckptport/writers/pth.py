"""Write torch ``.pth`` files that load anywhere with ``weights_only=True``.

``torch.save`` writes through an open file object: saved to a path, it
names the zip's inner folder after the file (a temp name would change the
bytes); through a file object it is always ``archive/``, so output is
deterministic. Storages are recorded as ``cpu``, or as ``--anchor cuda:N``
without any GPU, by a storage tagger that torch consults before its own and
that answers only inside ``anchored`` (scoped, not process-wide).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any, BinaryIO

__all__ = ["write_pth", "anchored"]

_ANCHOR: contextvars.ContextVar[str | None] = contextvars.ContextVar("ckptport_anchor",
                                                                     default=None)


@cache
def _register_tagger() -> None:
    import torch

    def tag(storage: Any) -> str | None:
        anchor = _ANCHOR.get()
        return anchor if anchor and storage.device.type == "cpu" else None

    torch.serialization.register_package(0, tag, lambda storage, location: None)


@contextlib.contextmanager
def anchored(anchor: str) -> Iterator[None]:
    """Within the block, ``torch.save`` records every CPU storage as ``anchor``."""
    _register_tagger()
    token = _ANCHOR.set(anchor)
    try:
        yield
    finally:
        _ANCHOR.reset(token)


class _Counting:
    """A write-only file wrapper that reports bytes written, for the progress bar.

    torch's zip writer turns an ``OSError`` from ``write`` (disk full) into
    an opaque ``RuntimeError``; the wrapper keeps the real cause.
    """

    def __init__(self, file: BinaryIO, advance: Callable[[int], None]) -> None:
        self._file, self._advance = file, advance
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            written = self._file.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self._advance(len(memoryview(data)))
        return written

    def flush(self) -> None:
        self._file.flush()


def write_pth(tree: Any, file: BinaryIO, anchor: str, advance: Callable[[int], None]) -> None:
    import torch

    counting = _Counting(file, advance)
    with anchored(anchor):
        try:
            torch.save(tree, counting)  # type: ignore[arg-type]
        except RuntimeError:
            if counting.error is not None:
                raise counting.error from None
            raise
