"""A remote object read like a local file: ``RemoteFile`` is a ``SourceFile``.

Readers, rules, writers and reports see a ``SourceFile`` with ``read``,
``read_into`` and ``size``, and cannot tell where the bytes come from.
Underneath, a ``Backend`` (HTTP, the hub, S3) fetches byte ranges of one
version of the object, pinned at its first request, and says whether the
object is still that version. Every fetch is retried with backoff on
transient faults (timeouts, dropped connections, 429, 5xx) a bounded
number of times; everything else is an ``InputError`` naming the
(redacted) URL at once.

Small reads (zip local headers, the safetensors length prefix) read a
little ahead and keep that block per thread, so walking a zip's members
costs one request per member instead of two.

A command that reads its source more than once (``normalize`` hashes its
source and verifies the output against it; ``sources.read_more_than_once``)
keeps the bytes it fetched in a spool (an unlinked temporary file), so each
byte is transferred once. The spool is used when the temporary folder has
room for the whole object and 1 GiB more, and never with
``CKPTPORT_REMOTE_SPOOL=0``; commands that read each byte once (``manifest``,
``diff``, ``check``) do not spool at all.
"""

from __future__ import annotations

import bisect
import io
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING

from ..errors import InputError
from ..sources import SourceFile
from . import meter
from .fetching import ATTEMPTS, Backend, NotFound, Transient, missing_extra, retrying
from .spool import Spool
from .urls import KEEP_FETCHED

if TYPE_CHECKING:
    from .urls import RemotePath

__all__ = ["Backend", "RemoteFile", "RemoteStream", "Spool", "Transient", "NotFound",
           "open_remote", "opened", "retrying", "missing_extra", "ATTEMPTS", "READ_AHEAD"]

READ_AHEAD = 256  # a read smaller than this fetches this much (a zip local header + its name)
SPLIT_MIN = 1 << 20  # a read is split over the connections in ranges of at least this much
AHEAD_PIECE = 2 << 20  # what one prefetching connection fetches at a time
PREFETCH_MIN = 1 << 20  # reads this large are taken as streaming: the next range is prefetched
PLAN_GAP = 64 << 10  # a planned range this close after the one before joins it (headers)

def open_remote(path: RemotePath) -> RemoteFile:
    """Open ``path``: one request pins the object's version and size."""
    scheme = path.url.scheme
    backend: Backend
    if scheme in ("http", "https"):
        from .http import open_http

        backend = open_http(path)
    elif scheme == "hf":
        from .hub import open_hub

        backend = open_hub(path)
    else:
        from .s3 import open_s3

        backend = open_s3(path)
    return RemoteFile(path, backend)


def opened(path: RemotePath) -> RemoteFile:
    """``path.opened()`` as the ``SourceFile`` the readers read by position: every location
    a command makes opens with ``open_remote`` (``urls`` names only the ``Opened`` protocol,
    this module being one it cannot import)."""
    file = path.opened()
    if not isinstance(file, RemoteFile):
        raise InputError("a remote location opened by something other than open_remote", path)
    return file


class RemoteFile(SourceFile):
    """A remote object with ``SourceFile``'s interface (no descriptor; reads by range)."""

    path: RemotePath

    def __init__(self, path: RemotePath, backend: Backend) -> None:  # noqa: D107
        self.path, self.fd, self.size = path, -1, backend.size
        self.backend, self.version = backend, backend.version
        self.snapshot = (0, 0, backend.size, hash(backend.version))
        self._lock = threading.Lock()
        self._mapped = None
        self._ahead = threading.local()
        self._ahead_lock = threading.Lock()
        self._ahead_pool: ThreadPoolExecutor | None = None
        self._ahead_until = 0  # the prefetch has queued the bytes before this
        # the ranges a writer is about to read, in order (``expect``); the plan's bytes
        # before each range (and in all, last), the range last read in, and how far along
        # the plan's bytes the prefetch has queued
        self._plan: list[tuple[int, int]] = []
        self._plan_before: list[int] = [0]
        self._plan_index = 0
        self._planned = 0
        self.connections = path.transfers.connections
        self.split = max(SPLIT_MIN, backend.least)  # a split read's ranges are at least this
        self.ahead = max(AHEAD_PIECE, backend.piece)  # what one prefetch request fetches
        # what the prefetch holds ahead of a reader: two ``least`` ranges per connection,
        # and two of its requests at least (one connection: one fetched while one is read)
        self.window = max(2 * self.connections * max(AHEAD_PIECE, backend.least),
                          2 * self.ahead)
        keep = path.pins.get(KEEP_FETCHED)
        # a window of ``keep`` bytes holds that much behind the reader: the prefetch's
        # bytes ahead of it come on top (else they push out what is read again)
        self.spool = Spool.for_size(backend.size, None if keep is True else
                                    keep + self.window) if keep else None
        self._pool: ThreadPoolExecutor | None = None  # the connections' threads
        self._stuck = False  # a range outlived the command's deadline
        # told of every read (its offset, its bytes) once they are in: ``readhash``
        self.watch: Callable[[RemoteFile, int, memoryview], None] | None = None
        meter.uses(self.connections)

    def stream(self) -> RemoteStream:
        """The object as a read-only binary stream (``sha256_files`` hashes it so)."""
        return RemoteStream(self)

    def _bounds(self, offset: int, n: int) -> None:
        if offset < 0 or offset + n > self.size:
            raise InputError(f"ends at byte {self.size} although {offset + n} bytes were "
                             "expected (truncated)", self.path)

    def read(self, offset: int, n: int) -> bytes:
        if n <= 0:
            return b""
        self._bounds(offset, n)
        if n < READ_AHEAD:
            start, block = getattr(self._ahead, "block", (0, b""))
            if not start <= offset or offset + n > start + len(block):
                end = min(self.size, offset + READ_AHEAD)
                block = self._fetch(offset, end - offset)
                start = offset
                self._ahead.block = (start, block)
            return block[offset - start:offset - start + n]
        return self._fetch(offset, n)

    def _fetch(self, offset: int, n: int) -> bytes:
        buffer = bytearray(n)
        self._fill(offset, memoryview(buffer))
        return bytes(buffer)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        if len(buffer):
            self._bounds(offset, len(buffer))
            self._fill(offset, buffer)
            self._prefetch(offset, len(buffer))

    def expect(self, ranges: list[tuple[int, int]]) -> None:
        """A writer is about to read ``ranges`` in this order: the prefetch follows them (a
        read inside them queues the window of the next ones), not the bytes after each
        read, which in a file whose tensors are written in another order than stored are
        fetched for nothing and pushed out of the spool before they are read."""
        plan: list[tuple[int, int]] = []
        for start, stop in ranges:  # runs of the file read one after another: one range
            if plan and 0 <= start - plan[-1][1] <= PLAN_GAP:
                plan[-1] = (plan[-1][0], max(stop, plan[-1][1]))
            else:
                plan.append((start, stop))
        before = [0]
        for start, stop in plan:
            before.append(before[-1] + stop - start)
        with self._ahead_lock:
            self._plan, self._plan_before = plan, before
            self._plan_index = self._planned = 0

    def _prefetch(self, offset: int, n: int) -> None:
        """Fetch a sequential reader's next bytes while it works on these (spool only: they
        land there), so the network overlaps writing and hashing: a window of two
        ``least`` ranges per connection (``window``) in pieces of ``ahead``, each fetched by
        one of ``connections`` threads and claimed on its own (the reader waits only for the
        pieces it reads). A thread is taken as reading sequentially once a read starts where
        its previous one ended; with a plan (``expect``), the next bytes are the plan's."""
        if self.spool is not None and self._plan:
            self._prefetch_planned(offset + n)
            return
        streaming = getattr(self._ahead, "end", None) == offset
        if not streaming and not getattr(self._ahead, "end", -1) <= offset < self._ahead_until:
            self._cancel_ahead()
        self._ahead.end = start = offset + n
        if self.spool is None or not streaming or n < PREFETCH_MIN or start >= self.size:
            return
        stop = min(self.size, start + max(n, self.window))
        with self._ahead_lock:
            if self._ahead_pool is None:
                self._ahead_pool = ThreadPoolExecutor(self.connections,
                                                      thread_name_prefix="ckptport-ahead")
            first = max(start, self._ahead_until if self._ahead_until <= stop + n else start)
            queued = [f for f in getattr(self._ahead, "queued", ()) if not f.done()]
            queued += [self._ahead_pool.submit(self._fetch_ahead, a, min(stop, a + self.ahead))
                       for a in range(first, stop, self.ahead)]
            self._ahead.queued = queued
            self._ahead_until = max(first, stop)

    def _prefetch_planned(self, end: int) -> None:
        """Queue the plan's next window after a read ending at ``end`` (a read outside the
        plan queues nothing). Positions along the plan count its bytes from its start."""
        window = self.window
        with self._ahead_lock:
            plan, before = self._plan, self._plan_before
            # the range this read ended in: the reader goes along the plan (not the file)
            i = next((k for k in range(self._plan_index, len(plan))
                      if plan[k][0] < end <= plan[k][1]), -1)
            if i < 0:
                return
            self._plan_index = i
            here = before[i] + end - plan[i][0]
            at = max(here, self._planned)
            if self._ahead_pool is None:
                self._ahead_pool = ThreadPoolExecutor(self.connections,
                                                      thread_name_prefix="ckptport-ahead")
            # the window is topped up a whole piece at a time (or to the plan's end): a
            # reader going through small tensors would otherwise queue a request of each
            # one's few bytes (S3 asks for 8 MiB a request; moto copies the whole object)
            limit = min(here + window, before[-1])
            while at < limit and (limit - at >= self.ahead or limit == before[-1]):
                k = bisect.bisect_right(before, at) - 1
                start = plan[k][0] + at - before[k]
                stop = min(plan[k][1], start + self.ahead, start + limit - at)
                self._ahead_pool.submit(self._fetch_ahead, start, stop)
                at += stop - start
            self._planned = at

    def _cancel_ahead(self) -> None:
        """This thread's reader went elsewhere: what it queued ahead and is not yet being
        fetched is dropped (it would fill the spool's window with bytes nobody reads,
        pushing out those about to be read again)."""
        queued = getattr(self._ahead, "queued", ())
        cancelled = [f.cancel() for f in queued]  # every one, not up to the first
        if any(cancelled):
            with self._ahead_lock:
                self._ahead_until = 0
        self._ahead.queued = []

    def _fetch_ahead(self, start: int, stop: int) -> None:
        spool = self.spool
        gaps = [] if spool is None else spool.claim(start, stop, wait=False)
        try:
            for a, b in gaps:
                piece = memoryview(bytearray(b - a))
                self.backend.fetch_into(a, piece)
                spool.keep(a, piece)  # type: ignore[union-attr]
        except (InputError, OSError):
            pass  # the reader fetches this range itself, and reports what goes wrong
        finally:
            if spool is not None:
                spool.release(gaps)

    def _get(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` over up to ``connections`` requests at once: each range is its own
        request, retried on its own (the backend keeps one connection per thread), and the
        read returns once every range is in, so bytes reach the reader in order."""
        step = max(self.split, -(-len(buffer) // self.connections))
        if self.connections <= 1 or len(buffer) < 2 * self.split:
            self.backend.fetch_into(offset, buffer)
            return
        with self._ahead_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.connections,
                                                thread_name_prefix="ckptport-range")
            pool = self._pool
        futures = [pool.submit(self.backend.fetch_into, offset + a, buffer[a:a + step])
                   for a in range(0, len(buffer), step)]
        # every range written (or failed) before the buffer is handed back; each request
        # ends at its own deadline, and this wait at the command's at the latest
        transfers = self.path.transfers
        ends = transfers.command_ends()
        _, pending = wait(futures, timeout=max(0.0, transfers.left(ends)) + 1.0)
        if pending:
            for future in pending:
                future.cancel()
            self._stuck = True  # its threads are not waited for when it is closed
            raise transfers.expired(ends, self.path)
        for future in futures:
            future.result()

    def _fill(self, offset: int, buffer: memoryview) -> None:
        self._fill_kept(offset, buffer)
        watch = self.watch
        if watch is not None:
            watch(self, offset, buffer)

    def _fill_kept(self, offset: int, buffer: memoryview) -> None:
        """Fetch what the spool lacks (and keep it), read the rest from the spool."""
        if self.spool is None:
            self._get(offset, buffer)
            return
        end = offset + len(buffer)
        gaps = self.spool.claim(offset, end)
        try:
            for start, stop in gaps:
                piece = buffer[start - offset:stop - offset]
                self._get(start, piece)
                self.spool.keep(start, piece)
        finally:
            self.spool.release(gaps)
        for start, stop in self.spool.read_held(offset, buffer, gaps):  # evicted meanwhile
            self._get(start, buffer[start - offset:stop - offset])

    def holds(self, start: int, stop: int) -> bool:
        """Whether the spool holds bytes ``start`` to ``stop`` (a read of them fetches
        nothing, unless they are dropped meanwhile)."""
        return self.spool is not None and not self.spool.missing(start, stop)

    def fetch_unkept(self, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` from the spool if it holds all of it, else fetch it without
        keeping it (a read that must not push out what the spool holds for others)."""
        spool = self.spool
        if spool is not None and self.holds(offset, offset + len(buffer)):
            for start, stop in spool.read_held(offset, buffer, []):  # dropped meanwhile
                self._get(start, buffer[start - offset:stop - offset])
            return
        self._get(offset, buffer)

    def changed(self) -> bool:
        return self.backend.current_version() != self.version

    def torch_storage(self) -> object:
        """The whole object, downloaded once into memory (``ckptport.read`` only)."""
        with self._lock:
            if self._mapped is None:
                import torch

                data = bytearray(self.size)
                self.read_into(0, memoryview(data))
                self._mapped = torch.frombuffer(data, dtype=torch.uint8).untyped_storage() \
                    if data else torch.UntypedStorage(0)  # type: ignore[no-untyped-call]
            return self._mapped

    def close(self) -> None:
        for pool in (self._ahead_pool, self._pool):
            if pool is not None:
                pool.shutdown(wait=not self._stuck, cancel_futures=True)
        self._ahead_pool = self._pool = None
        self.backend.close()
        if self.spool is not None:
            self.spool.close()
            self.spool = None


class RemoteStream(io.RawIOBase):
    """The object as a read-only binary stream (hashing the source reads it in order)."""

    def __init__(self, file: RemoteFile) -> None:
        super().__init__()
        self.file, self.position = file, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self.file.size - self.position))
        self.file.read_into(self.position, view[:n])
        self.position += n
        return n
