"""Byte ranges of a remote object already fetched, kept on local disk to be read again.

``RemoteFile`` keeps what it fetches here when its command reads the source
more than once (``sources.read_more_than_once``): writing and verifying then
share one fetch of each byte, on local disk. With a remote DST the spool is
bounded (a window of the most recent ranges: what the prefetch brings ahead
of the reader, what the source's hash catches up with) and held in memory,
so local disk holds the file being written and nothing of the source.
"""

from __future__ import annotations

import bisect
import collections
import os
import shutil
import tempfile
import threading

__all__ = ["Spool", "SPOOL_HEADROOM"]

SPOOL_HEADROOM = 1 << 30  # free space the spool leaves in the temporary folder


class Spool:
    """Byte ranges of one object already fetched, in an unlinked temporary file.

    With a ``limit``, at most that many bytes are held, in memory: the oldest
    ranges kept are dropped to make room, and a later read of them fetches them
    again. Held bytes are read under the lock, so a range is never dropped while
    it is being read.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.file = tempfile.TemporaryFile(prefix="ckptport-spool-") if limit is None else None
        self.fd = -1 if self.file is None else self.file.fileno()
        self._pieces: dict[int, bytes] = {}  # bounded: each range kept, by its start
        self._piece_starts: list[int] = []  # sorted
        self._lock = threading.Condition()
        self._starts: list[int] = []  # disjoint, sorted [start, stop) ranges held
        self._stops: list[int] = []
        self._fetching: list[tuple[int, int]] = []  # ranges a thread is fetching now
        self.limit = limit
        self._kept: collections.deque[tuple[int, int]] = collections.deque()  # oldest first
        self._held = 0

    @classmethod
    def for_size(cls, size: int, limit: int | None = None) -> Spool | None:
        """A spool for an object of ``size`` bytes: a bounded one (in memory), or one on
        disk where the temporary folder holds the object with room to spare; else None."""
        if os.environ.get("CKPTPORT_REMOTE_SPOOL") == "0":
            return None
        if limit is not None:
            return cls(limit)
        try:
            free = shutil.disk_usage(tempfile.gettempdir()).free
        except OSError:
            return None
        return cls() if free > size + SPOOL_HEADROOM else None

    def missing(self, start: int, stop: int) -> list[tuple[int, int]]:
        """The parts of ``[start, stop)`` not held, in order."""
        with self._lock:
            return self._missing(start, stop)

    def _missing(self, start: int, stop: int) -> list[tuple[int, int]]:
        gaps = []
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        position = start
        while position < stop and i < len(self._starts):
            if self._stops[i] <= position:
                i += 1
                continue
            if self._starts[i] >= stop:
                break
            if self._starts[i] > position:
                gaps.append((position, self._starts[i]))
            position = max(position, self._stops[i])
            i += 1
        if position < stop:
            gaps.append((position, stop))
        return gaps

    def claim(self, start: int, stop: int, wait: bool = True) -> list[tuple[int, int]]:
        """The parts of ``[start, stop)`` this thread must fetch (then ``keep`` and
        ``release``). Parts another thread is fetching are waited for, not fetched twice:
        the source's hash and the tensor reads of ``normalize`` meet on the same bytes.
        Without ``wait`` (a prefetch), nothing is claimed while another fetch overlaps."""
        with self._lock:
            while True:
                gaps = self._missing(start, stop)
                if not any(a < y and x < b for a, b in gaps for x, y in self._fetching):
                    self._fetching += gaps
                    return gaps
                if not wait:
                    return []
                self._lock.wait()

    def release(self, gaps: list[tuple[int, int]]) -> None:
        with self._lock:
            for gap in gaps:
                self._fetching.remove(gap)
            self._lock.notify_all()

    def keep(self, start: int, data: memoryview) -> None:
        """Hold ``data`` (a range this thread claimed), dropping the oldest held ranges
        beyond ``limit``."""
        piece = b""
        if self.limit is not None:
            piece = bytes(data)
        else:
            done = 0
            try:
                while done < len(data):
                    done += os.pwrite(self.fd, data[done:], start + done)
            except OSError:  # the disk filled up: these bytes are fetched again if read again
                return
        with self._lock:
            stop = start + len(data)
            i = bisect.bisect_left(self._stops, start)  # first range that may touch
            j = bisect.bisect_right(self._starts, stop)  # past the last that may touch
            low, high = start, stop
            if i < j:
                low, high = min(start, self._starts[i]), max(stop, self._stops[j - 1])
            self._starts[i:j] = [low]
            self._stops[i:j] = [high]
            if self.limit is None or not len(data):
                return
            self._pieces[start] = piece
            bisect.insort(self._piece_starts, start)
            self._kept.append((start, stop))
            self._held += len(data)
            while self._held > self.limit and len(self._kept) > 1:
                self._drop(*self._kept.popleft())

    def _drop(self, start: int, stop: int) -> None:
        """Stop holding ``[start, stop)`` (a range kept, inside one held range) and free
        its memory."""
        i = bisect.bisect_right(self._starts, start) - 1
        low, high = self._starts[i], self._stops[i]
        if i < 0 or not low <= start < stop <= high:  # not held whole: keep it (never lose
            return  # track of a byte that is held)
        pieces = [(a, b) for a, b in ((low, start), (stop, high)) if a < b]
        self._starts[i:i + 1] = [a for a, _ in pieces]
        self._stops[i:i + 1] = [b for _, b in pieces]
        self._held -= stop - start
        del self._pieces[start]
        self._piece_starts.remove(start)

    def read_held(self, offset: int, buffer: memoryview,
                  fetched: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Fill ``buffer`` (from ``offset``) from the spool, but for the ``fetched`` ranges
        already in it; the ranges no longer held (dropped meanwhile) are returned."""
        end = offset + len(buffer)
        wanted, position = [], offset
        for start, stop in [*fetched, (end, end)]:
            if position < start:
                wanted.append((position, start))
            position = stop
        lost = []
        with self._lock:
            for start, stop in wanted:
                gone = self._missing(start, stop)
                lost += gone
                held, position = [], start
                for a, b in [*gone, (stop, stop)]:
                    if position < a:
                        held.append((position, a))
                    position = b
                for a, b in held:
                    self.read_into(a, buffer[a - offset:b - offset])
        return lost

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Bytes held (a bounded spool's: read under the lock)."""
        if self.file is None:
            self._read_pieces(offset, buffer)
            return
        done = 0
        while done < len(buffer):
            n = os.preadv(self.fd, [buffer[done:]], offset + done)
            if n <= 0:
                raise OSError("the spool file ended early")
            done += n

    def _read_pieces(self, offset: int, buffer: memoryview) -> None:
        at, end = offset, offset + len(buffer)
        i = bisect.bisect_right(self._piece_starts, offset) - 1
        while at < end:
            start = self._piece_starts[i] if 0 <= i < len(self._piece_starts) else end
            piece = self._pieces.get(start, b"")
            if not start <= at < start + len(piece):
                raise OSError(f"the spool does not hold byte {at}")
            n = min(end, start + len(piece)) - at
            buffer[at - offset:at - offset + n] = piece[at - start:at - start + n]
            at, i = at + n, i + 1

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self._pieces.clear()
