"""Every wait on a remote peer has a named budget, and one command's transfers have a total.

A socket timeout bounds one ``recv``: a server that sends one byte every
second (of its headers or of a body) never trips it, and a request that is
retried after each timeout multiplies it. So the budgets here are wall-clock
deadlines, as httpx's ``Timeout(connect, read, write, pool)`` names each wait:

- ``connect``: opening one connection;
- ``read``: one socket read without a byte (a dropped connection is noticed);
- ``request``: one request from its first attempt to its last byte, retries and
  their backoff included (ranges are fetched in pieces of at most
  ``fetching.PIECE`` bytes, so a valid read of any size is many requests);
- ``total``: every transfer of one command, from its first request.

``Transfers`` is one command's clock over a ``Timeout``; it is passed down to
every object the command opens (``RemotePath.transfers``). A request's end is
the earlier of its own budget and the command's; when it passes, the
``Watchdog`` shuts the request's sockets down (a blocked read returns at once,
whatever the peer does) and the request fails with ``DeadlineError``: one line
naming the URL and the budget, exit 2. A library call whose sockets ckptport
does not hold (huggingface_hub's revision lookup, boto3) runs in a worker
thread that the caller stops waiting for at the deadline (``bounded``).

Configured by ``--remote-timeout`` or ``CKPTPORT_REMOTE_TIMEOUT``: a number of
seconds (the total) or ``name=seconds`` pairs (``total=7200,request=600``).

This module imports only the standard library (``urls`` imports it at start-up).
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TypeVar

from ..errors import DeadlineError, OptionError

__all__ = ["ENV", "CONNECTIONS", "CONNECTIONS_ENV", "Alarm", "Timeout", "Transfers", "armed",
           "bounded", "connections_from_env"]

ENV = "CKPTPORT_REMOTE_TIMEOUT"
T = TypeVar("T")


@dataclass(frozen=True)
class Timeout:
    """The budgets of remote waits, in seconds (see the module docstring)."""

    connect: float = 30.0
    read: float = 60.0
    request: float = 300.0
    total: float = 3600.0

    @classmethod
    def parse(cls, spec: str) -> Timeout:
        """``"900"`` (the total) or ``"total=900,request=120"``; an ``OptionError`` otherwise."""
        names = [f.name for f in fields(cls)]
        made, text = cls(), spec.strip()
        for item in text.split(",") if text else ():
            name, sep, value = item.strip().rpartition("=")
            name = name.strip() if sep else "total"
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if name not in names or not 0 < seconds < float("inf"):
                raise OptionError(f"remote timeout {spec!r}: expected SECONDS or NAME=SECONDS "
                                  f"pairs with NAME one of {', '.join(names)} and SECONDS > 0")
            made = replace(made, **{name: seconds})
        return made

    @classmethod
    def from_env(cls) -> Timeout:
        return cls.parse(os.environ.get(ENV, ""))

    def describe(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name):g}" for f in fields(self))


CONNECTIONS_ENV = "CKPTPORT_REMOTE_CONNECTIONS"
CONNECTIONS = 8  # requests one command has in flight at once (hf_transfer, s5cmd open many)


def connections_from_env() -> int:
    """``CKPTPORT_REMOTE_CONNECTIONS`` (a whole number >= 1), else ``CONNECTIONS``."""
    text = os.environ.get(CONNECTIONS_ENV, "").strip()
    if not text:
        return CONNECTIONS
    if not text.isdigit() or int(text) < 1:
        raise OptionError(f"{CONNECTIONS_ENV}={text!r}: expected a whole number of at least 1")
    return int(text)


class Transfers:
    """One command's clock over its transfers: when each request and the whole must end,
    and how many requests it may have in flight at once (``connections``: each remote
    object reads a large range as that many ranges in parallel, each retried on its own;
    an ``s3://`` destination uploads that many parts at once).

    The command's total starts at its first request (parsing options and importing
    torch are not transfers)."""

    def __init__(self, timeout: Timeout | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 connections: int | None = None) -> None:
        self.timeout = timeout if timeout is not None else Timeout.from_env()
        self.connections = connections if connections is not None else connections_from_env()
        if self.connections < 1:
            raise OptionError(f"--connections {self.connections}: at least 1")
        self.clock = clock
        self._lock = threading.Lock()
        self._ends: float | None = None

    def command_ends(self) -> float:
        with self._lock:
            if self._ends is None:
                self._ends = self.clock() + self.timeout.total
            return self._ends

    def request_ends(self) -> float:
        """The end of a request that starts now."""
        return min(self.clock() + self.timeout.request, self.command_ends())

    def left(self, ends: float) -> float:
        return ends - self.clock()

    def wait(self, ends: float, budget: float) -> float:
        """A socket timeout for one wait of ``budget`` (``connect``, ``read``) before ``ends``
        (at least a millisecond: zero would make the socket non-blocking)."""
        return max(0.001, min(budget, self.left(ends)))

    def expired(self, ends: float, where: object) -> DeadlineError:
        """The error for a request that ran out of time at ``ends``."""
        if ends >= self.command_ends():
            what = (f"the command's remote transfers passed their total deadline of "
                    f"{self.timeout.total:g} s")
        else:
            what = f"a request got no complete answer within {self.timeout.request:g} s"
        return DeadlineError(f"{what} (a slow or stalled server; raise it with "
                             f"--remote-timeout or {ENV}, e.g. total=7200,request=900)",
                             where)  # type: ignore[arg-type]


class Alarm:
    """The sockets one request uses, shut down by the ``Watchdog`` when its time is up."""

    def __init__(self) -> None:
        self.fired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            if not self.fired:
                return
        _cut(sock)  # armed after it fired: cut at once

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _cut(sock)


def _cut(sock: socket.socket) -> None:
    """Shut a socket down under a blocked reader (``socket.socket.shutdown`` also for TLS:
    ``SSLSocket.shutdown`` would unwrap it under the reader's feet)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class _Watchdog:
    """One daemon thread that fires each armed ``Alarm`` when its time comes."""

    def __init__(self) -> None:
        self._wake = threading.Condition()
        self._heap: list[tuple[float, int, Alarm]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, when: float, alarm: Alarm) -> None:
        with self._wake:
            heapq.heappush(self._heap, (when, next(self._order), alarm))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ckptport-deadline",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()

    def disarm(self, alarm: Alarm) -> None:
        with self._wake:
            self._heap = [entry for entry in self._heap if entry[2] is not alarm]
            heapq.heapify(self._heap)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(None if not self._heap
                                    else self._heap[0][0] - time.monotonic())
                _, _, alarm = heapq.heappop(self._heap)
            alarm.fire()


    def forget(self) -> None:
        """In a forked child: the parent's thread is not there; start afresh when armed."""
        self._wake = threading.Condition()
        self._heap, self._thread = [], None


WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCHDOG.forget)


class armed:  # noqa: N801 - a context manager read as a phrase: ``with armed(ends) as alarm``
    """An ``Alarm`` that fires at ``ends`` (monotonic) unless the block has finished."""

    def __init__(self, ends: float) -> None:
        self.ends, self.alarm = ends, Alarm()

    def __enter__(self) -> Alarm:
        WATCHDOG.arm(self.ends, self.alarm)
        return self.alarm

    def __exit__(self, *exc: object) -> None:
        WATCHDOG.disarm(self.alarm)


def bounded(call: Callable[[], T], transfers: Transfers, ends: float, where: object) -> T:
    """``call()`` (a library's request whose sockets ckptport does not hold), waited for
    until ``ends`` at most: then ``DeadlineError``, and the call is left to end on its own
    socket timeouts (``Timeout.read``) in its daemon thread (one per call: a shared pool
    would make one command's parallel reads queue, and queueing count as waiting)."""
    value: list[T] = []
    error: list[BaseException] = []

    def work() -> None:
        try:
            value.append(call())
        except BaseException as exc:  # handed to the caller's thread as raised
            error.append(exc)

    worker = threading.Thread(target=work, name="ckptport-bounded", daemon=True)
    worker.start()
    worker.join(max(0.0, transfers.left(ends)))
    if worker.is_alive():
        raise transfers.expired(ends, where)
    if error:
        raise error[0]
    return value[0]
