"""Range reads over HTTP(S) with the standard library's ``http.client``.

Why the standard library: plain HTTPS needs no extra package, each thread
keeps one persistent connection per host (``--jobs`` threads read ranges
in parallel), response bodies are read straight into the caller's buffer
(``readinto``, no copy), and redirects and headers are under control: an
``Authorization`` header (a hub token, ``user:password@`` in the URL) is
sent to the host it was meant for and dropped when a redirect leads to
another host (the hub redirects to a CDN with a signed URL).

The first request (``Range: bytes=0-0``) pins the object: its size (from
``Content-Range``), its ``ETag``, and the final location after redirects,
which later ranges go to directly (and back through the original URL if
that signed location expires). Every range sends ``If-Match`` with the
pinned ETag and is checked: status 206, the ``Content-Range`` asked for,
the pinned total size and ETag, a body of exactly the length asked for.

Every request runs under an alarm at its deadline (``deadline.Transfers``:
its own budget and the command's total): connecting and each socket read
wait at most ``Timeout.connect`` / ``Timeout.read`` and never past the
deadline, and when the deadline passes the watchdog shuts the request's
socket down, so a peer that drips its headers or its body one byte at a time
is cut off on time. A body's length is checked before it is read: a range's
``Content-Length`` must be the length asked for, and a body ckptport does not
need (the first request's byte, a redirect's page, an error's text) is read
only when it announces at most 64 KiB; otherwise the connection is dropped.
"""

from __future__ import annotations

import base64
import http.client
import re
import socket
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar
from urllib.parse import unquote, urljoin, urlsplit

from ..errors import DeadlineError, InputError
from . import meter
from .deadline import Transfers, armed
from .fetching import RANGE, NotFound, Transient, pieces, retrying
from .urls import RemotePath

__all__ = ["HttpObject", "open_http"]

MAX_REDIRECTS = 10
SMALL_BODY = 1 << 16  # bodies ckptport does not need are read up to this size, else dropped
T = TypeVar("T")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def open_http(path: RemotePath) -> HttpObject:
    url = path.url
    headers = {}
    if url.userinfo:
        user, _, password = url.userinfo.partition(":")
        pair = f"{unquote(user)}:{unquote(password)}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    target = f"{url.scheme}://{url.host}/{url.key}" + (f"?{url.query}" if url.query else "")
    return HttpObject(path, target, headers, path.transfers)


class HttpObject:
    """One object behind a URL, pinned at the first request, read by range."""

    def __init__(self, path: RemotePath, target: str, headers: Mapping[str, str],
                 transfers: Transfers, expect: Mapping[str, str] | None = None) -> None:
        self.path, self.target, self.transfers = path, target, transfers
        self.auth_host = urlsplit(target).netloc  # credentials go to this host only
        self.headers = dict(headers)
        self.expect = dict(expect or {})  # headers every answer must carry (X-Repo-Commit)
        self.location = target
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.etag: str | None = None
        self.size = -1
        self.size, self.etag, self.location = retrying(self._pin, path, transfers)
        self.version = self.etag or f"size:{self.size}"
        self.least = self.piece = RANGE
        meter.add(0, requests=0, objects=1)

    def _attempt(self, ends: float, work: Callable[[], T]) -> T:
        """``work()`` (one try of one request) under an alarm at ``ends``: its sockets are
        shut down when time is up, and what fails then is the deadline."""
        with armed(ends) as alarm:
            self._local.alarm, self._local.ends = alarm, ends
            try:
                return work()
            except (Transient, InputError):
                if alarm.fired:
                    raise self.transfers.expired(ends, self.path) from None
                raise
            finally:
                self._local.alarm = None
                if alarm.fired:
                    self._drop()

    # -- the first request

    def _pin(self, ends: float) -> tuple[int, str | None, str]:
        return self._attempt(ends, self._pin_answer)

    def _pin_answer(self) -> tuple[int, str | None, str]:
        response, where = self._request(self.target, {"Range": "bytes=0-0"})
        try:
            pinned = self._pinned(response, where)
        except BaseException:
            self._drop()  # a refused answer's body is never waited for
            raise
        self._finish(response)
        return pinned

    def _pinned(self, response: http.client.HTTPResponse, where: str
                ) -> tuple[int, str | None, str]:
        """The size, ETag and location from the first answer (its one byte read)."""
        status = response.status
        if status == 416:  # an empty object has no byte 0
            total = _total(response.getheader("Content-Range"))
            if total == 0:
                return 0, response.getheader("ETag"), where
        self._refuse(status, response)
        if status == 200:
            raise InputError("the server ignores Range requests (it answered 200 with the "
                             "whole object); ckptport reads remote objects by range only",
                             self.path)
        if status != 206:
            raise InputError(f"unexpected HTTP {status} {response.reason}", self.path)
        match = _CONTENT_RANGE.fullmatch(response.getheader("Content-Range") or "")
        if not match or match.group(3) == "*" or match.group(1) != "0":
            raise InputError("the server answered a range request with Content-Range "
                             f"{response.getheader('Content-Range')!r}", self.path)
        sent = int(match.group(2)) + 1
        if response.length != sent or sent > SMALL_BODY:
            raise InputError(f"the server answered a one-byte range request with bytes "
                             f"0-{sent - 1} in a body of {_announced(response)}", self.path)
        try:
            body = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise Transient("the answer ended early (truncated, or the connection broke: "
                            f"{type(exc).__name__})") from None
        meter.add(len(body), requests=0)
        return int(match.group(3)), response.getheader("ETag"), where

    # -- ranges

    def fetch_into(self, offset: int, buffer: memoryview) -> None:
        for start, piece in pieces(offset, buffer):
            retrying(lambda ends, start=start, piece=piece: self._attempt(  # type: ignore[misc]
                ends, lambda: self._range(start, piece)), self.path, self.transfers)

    def _range(self, offset: int, buffer: memoryview) -> None:
        end = offset + len(buffer) - 1
        headers = {"Range": f"bytes={offset}-{end}"}
        if self.etag and not self.etag.startswith("W/"):  # If-Match compares strong ETags
            headers["If-Match"] = self.etag
        response, _ = self._request(self.location, headers)
        try:
            status = response.status
            if status in (401, 403) and self.location != self.target:
                self.location = self.target  # a signed redirect expired: ask the origin again
                raise Transient(f"HTTP {status} from the redirected location")
            self._refuse(status, response)
            if status == 200:
                raise InputError("the server ignored a Range request (it answered 200 with the "
                                 "whole object)", self.path)
            if status != 206:
                raise InputError(f"unexpected HTTP {status} {response.reason}", self.path)
            self._check(response, offset, end)
            self._body(response, buffer)
        except BaseException:
            self._drop()  # a refused answer's body is never waited for
            raise
        self._finish(response)

    def _check(self, response: http.client.HTTPResponse, offset: int, end: int) -> None:
        got = response.getheader("Content-Range") or ""
        match = _CONTENT_RANGE.fullmatch(got)
        if not match or (int(match.group(1)), int(match.group(2))) != (offset, end):
            raise InputError(f"asked for bytes {offset}-{end}, the server sent Content-Range "
                             f"{got!r}", self.path)
        if match.group(3) != "*" and int(match.group(3)) != self.size:
            raise InputError(f"changed while it was read: its size is now {match.group(3)} "
                             f"bytes, {self.size} at the first request", self.path)
        etag = response.getheader("ETag")
        if self.etag and etag and etag != self.etag:
            raise InputError(f"changed while it was read: ETag {etag}, {self.etag} at the "
                             "first request", self.path)
        length = response.getheader("Content-Length")
        if length is not None and (not length.isdigit() or int(length) != end - offset + 1):
            raise InputError(f"asked for {end - offset + 1} bytes, the server announces "
                             f"{length}", self.path)

    def _body(self, response: http.client.HTTPResponse, buffer: memoryview) -> None:
        done = 0
        try:
            while done < len(buffer):
                n = response.readinto(buffer[done:])
                if not n:
                    break
                done += n
        except (OSError, http.client.HTTPException) as exc:
            meter.add(done, requests=0)
            self._drop()
            raise Transient(f"the body ended after {done} of {len(buffer)} bytes (truncated, "
                            f"or the connection broke: {type(exc).__name__})") from None
        meter.add(done, requests=0)
        if done < len(buffer):
            self._drop()
            raise Transient(f"the body ended after {done} of {len(buffer)} bytes (truncated)")

    def current_version(self) -> str | None:
        try:
            size, etag, _ = self._pin(self.transfers.request_ends())
        except DeadlineError:
            raise
        except (InputError, Transient):
            return None
        return etag or f"size:{size}"

    # -- one request, redirects followed

    def _request(self, url: str, headers: Mapping[str, str]
                 ) -> tuple[http.client.HTTPResponse, str]:
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            sent = {**headers, **(self.headers if parts.netloc == self.auth_host else {}),
                    "User-Agent": "ckptport", "Accept-Encoding": "identity"}
            response = self._send(parts.scheme, parts.netloc,
                                  parts.path + (f"?{parts.query}" if parts.query else ""), sent)
            location = response.getheader("Location")
            if response.status in (301, 302, 303, 307, 308) and location:
                self._finish(response)
                url = urljoin(url, location)
                continue
            for name, value in self.expect.items():
                if response.status < 300 and response.getheader(name) not in (None, value):
                    self._drop()
                    raise InputError(f"the server answered with {name} "
                                     f"{response.getheader(name)}, expected {value}", self.path)
            return response, url
        raise InputError(f"more than {MAX_REDIRECTS} redirects", self.path)

    def _send(self, scheme: str, netloc: str, target: str, headers: Mapping[str, str]
              ) -> http.client.HTTPResponse:
        connection = self._connection(scheme, netloc)
        ends, budget = self._local.ends, self.transfers.timeout
        meter.add(0)
        try:
            if connection.sock is None:
                connection.timeout = self.transfers.wait(ends, budget.connect)
                connection.connect()
            connection.sock.settimeout(self.transfers.wait(ends, budget.read))
            self._local.alarm.watch(connection.sock)
            connection.request("GET", target or "/", headers=dict(headers))
            return connection.getresponse()
        except socket.gaierror:
            self._drop()
            raise InputError(f"cannot resolve the host {netloc.rsplit('@', 1)[-1]}",
                             self.path) from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise Transient(f"cannot reach the server ({_why(exc)})") from None

    def _connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        held = getattr(self._local, "connection", None)
        if held is not None and held[0] == (scheme, netloc):
            kept: http.client.HTTPConnection = held[1]
            return kept
        self._drop()
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        connection = kind(netloc, timeout=self.transfers.timeout.connect)
        self._local.connection = ((scheme, netloc), connection)
        with self._lock:
            self._connections.append(connection)
        return connection

    def _finish(self, response: http.client.HTTPResponse) -> None:
        """Keep the connection for the next request only if this answer was read whole."""
        if not response.isclosed():
            if response.length is not None and response.length <= SMALL_BODY:
                try:
                    response.read()
                    return
                except (OSError, http.client.HTTPException):
                    pass
            self._drop()

    def _drop(self) -> None:
        held = getattr(self._local, "connection", None)
        if held is not None:
            held[1].close()
            self._local.connection = None

    def _refuse(self, status: int, response: http.client.HTTPResponse) -> None:
        """Turn an error status into a retry (429, 5xx) or an ``InputError`` naming it."""
        if status == 429 or status >= 500:
            raise Transient(f"HTTP {status} {response.reason}", _retry_after(response))
        if status == 404 or status == 410:
            raise NotFound(f"not found (HTTP {status})", self.path)
        if status in (401, 403):
            raise InputError(f"access denied (HTTP {status}): check the credentials "
                             "(HF_TOKEN for the hub, user:password@ or a signed URL for "
                             "HTTP)", self.path)
        if status == 412:
            raise InputError("changed while it was read (HTTP 412: it no longer has the ETag "
                             f"{self.etag} pinned at the first request); run again", self.path)
        if status == 416:
            raise InputError(f"is shorter than the {self.size} bytes the server first reported "
                             "(HTTP 416 for a range inside that size)", self.path)
        if 400 <= status < 500:
            raise InputError(f"HTTP {status} {response.reason}", self.path)

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()


def _total(content_range: str | None) -> int | None:
    match = re.fullmatch(r"bytes \*/(\d+)", content_range or "")
    return int(match.group(1)) if match else None


def _announced(response: http.client.HTTPResponse) -> str:
    if response.chunked:
        return "chunks of no announced length"
    length = response.getheader("Content-Length")
    if length is None:
        return "no announced length"
    return f"{length} bytes" if length.isdigit() else f"Content-Length {length!r}"


def _retry_after(response: http.client.HTTPResponse) -> float | None:
    value = response.getheader("Retry-After")
    return float(value) if value and value.isdigit() else None


def _why(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)

