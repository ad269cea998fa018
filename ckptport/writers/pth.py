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
import sys
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from typing import Any, BinaryIO

from ..checkpoint import rebuild_dict

__all__ = ["write_pth", "anchored", "canonical"]

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


def canonical(value: Any) -> Any:
    """``value`` rebuilt so its pickle depends on values, not object identity.

    Pickle writes a back-reference for an object it has seen before: two
    equal strings or dicts pickle differently when they are one object than
    when they are two. Fresh containers and interned strings make the bytes
    the same whichever reader produced the tree (a file, a shard set).
    """
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, Mapping):
        rebuilt = rebuild_dict(value, [(canonical(k), canonical(v)) for k, v in value.items()])
        versions = getattr(value, "_metadata", None)
        if versions is not None:
            rebuilt._metadata = canonical(versions)  # type: ignore[attr-defined]
        return rebuilt
    if isinstance(value, list):
        return [canonical(v) for v in value]
    if type(value) is tuple:
        return tuple(canonical(v) for v in value)
    return value


def write_pth(tree: Any, file: BinaryIO, anchor: str, advance: Callable[[int], None]) -> None:
    import torch

    counting = _Counting(file, advance)
    with anchored(anchor):
        try:
            torch.save(canonical(tree), counting)  # type: ignore[arg-type]
        except RuntimeError:
            if counting.error is not None:
                raise counting.error from None
            raise
