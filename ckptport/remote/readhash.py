"""A remote source's sha256 from the bytes its reads fetch anyway, not a second download.

``normalize`` records the source's sha256 (``ckptport.source_sha256``). For
a local file a second read costs a page-cache pass, and it is hashed on a
thread beside the writer. For a remote one a second read is a second
download, and with a remote DST the fetched bytes cannot all be kept (local
disk holds one shard), so hashing beside the writer downloaded the source
twice. Here the hash is fed by the reads themselves: each read that starts
at or before the next unhashed byte and goes past it advances the hash, the
files of a set in order (its index, then its shards, as ``sha256_files``
hashes them). A read ahead of it (tensors written in another order than the
file holds them: a safetensors file sorted by dtype, regrouped into shards)
is kept, up to ``PENDING`` bytes in memory, until the hash gets there. What
the reads never covered (a gap, what did not fit) is fetched only when the
value is wanted, from the same pinned versions, without passing through the
spool.
"""

from __future__ import annotations

import hashlib
import threading

from .objects import RemoteFile, opened
from .urls import RemotePath

__all__ = ["ReadDigest"]

FILL_CHUNK = 32 << 20  # what one fetch of the unhashed rest asks for
CATCH_UP = 64 << 20  # the most held bytes hashed to catch up with a read ahead
FETCH_UP = 1 << 20  # the most bytes not held fetched to catch up (a header, an index)
PENDING = 256 << 20  # the most bytes read ahead of the hash kept until it gets there


class ReadDigest:
    """sha256 of ``files`` in order, advanced by every read of them (``RemoteFile.watch``)."""

    def __init__(self, files: tuple[RemotePath, ...]) -> None:
        self.files: tuple[RemoteFile, ...] = tuple(opened(p) for p in files)
        self.order = {id(f): i for i, f in enumerate(self.files)}
        self.digest = hashlib.sha256()
        self.index, self.position = 0, 0  # the next unhashed byte: file, offset
        self.lock = threading.Lock()  # the digest and the position
        self.once = threading.Lock()  # one caller fetches the rest
        self.value: str | None = None
        # reads ahead of the next unhashed byte, by file number: (offset, bytes)
        self.pending: dict[int, list[tuple[int, bytes]]] = {}
        self.pending_bytes = 0
        for file in self.files:
            file.watch = self.saw
        self._skip_ended()

    def saw(self, file: RemoteFile, offset: int, data: memoryview) -> None:
        """``data`` was read from ``file`` at ``offset``: hash what of it is next. A read
        ahead of the next unhashed byte advances the hash when the bytes between are held
        already (a header read before this digest existed, a set's index, a zip's local
        headers) or are few (fetched: without a spool); else it is left for the end, so
        nothing much is fetched here that the reads themselves may fetch later."""
        with self.lock:
            at = self.order.get(id(file), -1)
            if at < self.index or at == self.index and offset + len(data) <= self.position:
                return  # read again, or not one of these files
            between = self._between(at, offset)
            gap = sum(b - a for _, a, b in between)
            if gap > CATCH_UP or gap > FETCH_UP and not all(f.holds(a, b)
                                                            for f, a, b in between):
                if self.pending_bytes + len(data) <= PENDING:  # else left for ``hexdigest``
                    self.pending.setdefault(at, []).append((offset, bytes(data)))
                    self.pending_bytes += len(data)
                return
            while (self.index, self.position) < (at, offset):
                self._hash_next(offset if self.index == at else self.files[self.index].size)
            if self.index == at and self.position < offset + len(data):  # (not hashed from
                self._hash(data[self.position - offset:])  # what was kept meanwhile)

    def _hash(self, data: memoryview | bytes) -> None:
        """Hash ``data``, the bytes at the next unhashed one, then what was kept of the
        bytes after them."""
        self.digest.update(data)
        self.position += len(data)
        self._skip_ended()
        while self.index in self.pending:
            pieces = self.pending[self.index]
            kept = [(o, d) for o, d in pieces if o + len(d) > self.position]
            self.pending_bytes -= sum(len(d) for o, d in pieces if o + len(d) <= self.position)
            self.pending[self.index] = kept
            here = next(((o, d) for o, d in kept if o <= self.position), None)
            if here is None:
                break
            kept.remove(here)
            self.pending_bytes -= len(here[1])
            offset, piece = here
            self.digest.update(memoryview(piece)[self.position - offset:])
            self.position = offset + len(piece)
            self._skip_ended()

    def _skip_ended(self) -> None:
        while self.index < len(self.files) and self.position >= self.files[self.index].size:
            self.pending_bytes -= sum(len(d) for _, d in self.pending.pop(self.index, ()))
            self.index, self.position = self.index + 1, 0

    def _between(self, at: int, offset: int) -> list[tuple[RemoteFile, int, int]]:
        """The unhashed ranges before ``offset`` of the file numbered ``at``."""
        if at == self.index:
            return [(self.files[at], self.position, offset)] if offset > self.position else []
        return [(self.files[self.index], self.position, self.files[self.index].size),
                *((f, 0, f.size) for f in self.files[self.index + 1:at]),
                *([(self.files[at], 0, offset)] if offset else [])]

    def _hash_next(self, stop: int) -> None:
        """Fetch and hash the current file's bytes up to ``stop`` (at most ``FILL_CHUNK``)."""
        file = self.files[self.index]
        kept = [o for o, _ in self.pending.get(self.index, ()) if o > self.position]
        stop = min(stop, self.position + FILL_CHUNK, *kept)  # not the bytes kept
        piece = memoryview(bytearray(stop - self.position))
        file.fetch_unkept(self.position, piece)
        self._hash(piece)

    def hexdigest(self) -> str:
        """The files' sha256: what the reads hashed, and the rest fetched now."""
        with self.once:
            if self.value is None:
                for file in self.files:
                    file.watch = None  # reads from here on are this one's own
                with self.lock:  # a read still in ``saw`` finishes first
                    while self.index < len(self.files):
                        self._hash_next(self.files[self.index].size)
                self.value = self.digest.hexdigest()
            return self.value
