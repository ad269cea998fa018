"""Verification against what the writer streamed, for a source that cannot be read again.

``writers.verify`` compares a written file with its source read afresh. A
remote source written to a remote DST has no cheap second read: the output
goes to the server and local disk holds one shard, so the source's spool
is a window of the latest bytes, and reading a tensor again is downloading
it again (the whole source, once per run, for a set of shards). There the
writer records each tensor's CRC-32 as it streams the bytes fetched for it
(``StreamedCrcs.tap``) and verification compares the bytes read back from
the written file with it, as it does for a computed tensor
(``Computed.streamed``). What the fresh read proved besides the bytes is
kept: each zip record's placement is still taken from Python's zipfile,
which must find it where ckptport's parser read it (``Independent.placed``).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Iterable, Iterator

from ..tensors import ViewKey, view_key
from ..tree import TensorLeaf

__all__ = ["StreamedCrcs"]


class StreamedCrcs:
    """The CRC-32 of each tensor's bytes as a writer streamed them, by view."""

    def __init__(self) -> None:
        self.crcs: dict[ViewKey, int] = {}
        self._lock = threading.Lock()

    def tap(self, leaf: TensorLeaf, pieces: Iterable[bytes | memoryview]
            ) -> Iterator[bytes | memoryview]:
        crc = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
            yield piece
        with self._lock:  # only once the stream is whole
            self.crcs[view_key(leaf)] = crc

    def expected(self, leaf: TensorLeaf) -> int | None:
        """The CRC-32 written for ``leaf``'s bytes; None for a tensor never streamed whole."""
        return self.crcs.get(view_key(leaf))

