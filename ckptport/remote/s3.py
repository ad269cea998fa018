"""``s3://`` sources through boto3: the AWS credential chain, ``AWS_ENDPOINT_URL``.

boto3 finds credentials as every AWS tool does (environment, shared
files, SSO, instance and container roles) and honours ``AWS_ENDPOINT_URL``
(``AWS_ENDPOINT_URL_S3``) for MinIO, R2, GCS interoperability or a local
server. ``HeadObject`` pins the object's size, ETag and version id; every
``GetObject`` asks for one byte range with ``IfMatch`` (and ``VersionId``
on a versioned bucket), so a rewritten object is an error, never a mix.
botocore retries throttling and 5xx itself; a body cut short is retried
here like any other transient fault. botocore holds the sockets, bounded by
``Timeout.connect`` and ``Timeout.read``; each call is waited for within the
request's deadline (``deadline.bounded``), and a body still arriving at the
deadline is abandoned (its thread writes nothing more).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import DeadlineError, InputError
from . import meter
from .deadline import Timeout, bounded
from .fetching import ATTEMPTS, PIECE, NotFound, Transient, missing_extra, pieces, retrying
from .urls import RemotePath, redact

__all__ = ["open_s3", "S3Object", "client", "refusal", "Body", "S3Client", "Answer"]

# Any: a boto3 S3 client (botocore makes its methods at run time; no stubs are installed)
S3Client = Any
# Any: botocore's answer to one call, a dict of that operation's own shape
Answer = dict[str, Any]


class Body(Protocol):
    """A GetObject answer's body (botocore's ``StreamingBody``): read by pieces, closed."""

    def read(self, amt: int | None = None) -> bytes: ...

    def close(self) -> None: ...


_lock = threading.Lock()
# the least one request fetches of a split read: AWS's performance guidance for ranged GETs
# (8-16 MB), and boto3's own download chunk; each GET costs a request fee and a first-byte
# latency, and a store that reads the whole object per range (moto) pays that per request
LEAST = 8 << 20
AHEAD = 16 << 20  # a read-ahead request: the top of that guidance (a window of fewer requests)


@functools.cache
def _client(endpoint: str | None, timeout: Timeout) -> S3Client:
    """One client per endpoint (boto3 clients are thread-safe; building one is slow)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise missing_extra("s3") from None
    config = Config(retries={"max_attempts": ATTEMPTS, "mode": "standard"},
                    max_pool_connections=64, connect_timeout=timeout.connect,
                    read_timeout=timeout.read)
    with _lock:
        return boto3.session.Session().client("s3", config=config)


def _forked() -> None:
    """In a forked child (folder mode's workers): the parent's clients hold its pooled
    connections, which two processes must never read from at once (each would take the
    other's answers, or wait for them); the child makes its own, under a fresh lock."""
    global _lock
    _lock = threading.Lock()
    _client.cache_clear()


os.register_at_fork(after_in_child=_forked)


def client(timeout: Timeout) -> S3Client:
    """The client for the endpoint the environment names (AWS's own when none)."""
    return _client(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
                   timeout)


def open_s3(path: RemotePath) -> S3Object:
    return S3Object(path, client(path.transfers.timeout))


class S3Object:
    """One S3 object at the version its ``HeadObject`` found."""

    def __init__(self, path: RemotePath, client: S3Client) -> None:
        self.path, self.client, self.transfers = path, client, path.transfers
        self.bucket, self.key = path.url.host, path.url.key
        if not self.key or self.key.endswith("/"):
            raise InputError("names a folder, not an object: name a "
                             "checkpoint file or a *.index.json", path)
        head = retrying(lambda ends: self._call("head_object", ends), path, self.transfers)
        self.size = int(head["ContentLength"])
        self.etag: str = head.get("ETag", "")
        self.version_id: str | None = head.get("VersionId")
        self.version = self.version_id or self.etag
        self.least, self.piece = LEAST, AHEAD
        meter.add(0, objects=1)

    def _call(self, operation: str, ends: float, **extra: object) -> Answer:
        pinned = {"VersionId": self.version_id} if getattr(self, "version_id", None) else {}
        meter.add(0)
        try:
            return bounded(lambda: getattr(self.client, operation)(
                Bucket=self.bucket, Key=self.key, **pinned, **extra),
                self.transfers, ends, self.path)
        except DeadlineError:
            raise
        except Exception as exc:
            raise refusal(exc, self.path) from None

    def fetch_into(self, offset: int, buffer: memoryview) -> None:
        for start, piece in pieces(offset, buffer):
            retrying(lambda ends, start=start, piece=piece: self._range(  # type: ignore[misc]
                start, piece, ends), self.path, self.transfers)

    def _range(self, offset: int, buffer: memoryview, ends: float) -> None:
        end = offset + len(buffer) - 1
        answer = self._call("get_object", ends, Range=f"bytes={offset}-{end}",
                            **({"IfMatch": self.etag} if self.etag else {}))
        got = answer.get("ContentRange", "")
        if got.split("/")[0] != f"bytes {offset}-{end}":
            raise InputError(f"asked for bytes {offset}-{end}, S3 sent Content-Range {got!r}",
                             self.path)
        self._fill_from(answer["Body"], buffer, ends, last=True)

    def _fill_from(self, body: Body, buffer: memoryview, ends: float, last: bool) -> None:
        """``buffer`` filled from the body, waited for until ``ends`` (then the body's
        thread stops writing); a body cut short is ``Transient``. The body is closed by
        the thread reading it (closing it from here would wait for a dripping read)."""
        late = threading.Event()
        try:
            done = bounded(lambda: self._body(body, buffer, late, last), self.transfers,
                           ends, self.path)
        except DeadlineError:
            late.set()
            raise
        meter.add(done, requests=0)
        if done < len(buffer):
            raise Transient(f"the body ended after {done} of {len(buffer)} bytes (truncated)")

    def _body(self, body: Body, buffer: memoryview, late: threading.Event, last: bool) -> int:
        """What arrived of ``buffer``; the body closed after its ``last`` block, or when it
        broke or was abandoned (a stream goes on with the next block otherwise)."""
        done = 0
        try:
            while done < len(buffer):
                piece = body.read(min(len(buffer) - done, 1 << 20))
                if not piece or late.is_set():
                    break
                buffer[done:done + len(piece)] = piece
                done += len(piece)
        except Exception as exc:  # urllib3 / botocore streaming errors: the connection broke
            meter.add(done, requests=0)
            raise Transient(f"the connection broke after {done} of {len(buffer)} bytes "
                            f"({type(exc).__name__})") from None
        finally:
            if last or done < len(buffer):
                body.close()
        return done

    def each_block(self, offset: int, n: int, block: int,
                   take: Callable[[int, memoryview], None]) -> None:
        """Bytes ``offset`` to ``offset + n`` handed to ``take`` (their offset, the bytes)
        ``block`` bytes at a time as they arrive, in requests of at most ``PIECE`` bytes
        (a request's deadline bounds one), each retried from the block where it broke: a
        read-back of a whole object in a few requests, holding one block in memory."""
        done, end = [offset], offset + n
        buffer = memoryview(bytearray(min(block, n)))
        while done[0] < end:
            stop = min(end, done[0] + PIECE)
            retrying(lambda ends, stop=stop: self._stream(  # type: ignore[misc]
                done, stop, buffer, take, ends), self.path, self.transfers)

    def _stream(self, done: list[int], stop: int, buffer: memoryview,
                take: Callable[[int, memoryview], None], ends: float) -> None:
        """One request for ``done[0]`` to ``stop``, its body handed on block by block
        (``done[0]`` advanced past each, so a retry starts where this one broke)."""
        start = done[0]
        answer = self._call("get_object", ends, Range=f"bytes={start}-{stop - 1}",
                            **({"IfMatch": self.etag} if self.etag else {}))
        got = answer.get("ContentRange", "")
        if got.split("/")[0] != f"bytes {start}-{stop - 1}":
            raise InputError(f"asked for bytes {start}-{stop - 1}, S3 sent Content-Range "
                             f"{got!r}", self.path)
        body = answer["Body"]
        while done[0] < stop:
            view = buffer[:min(len(buffer), stop - done[0])]
            last = done[0] + len(view) >= stop
            self._fill_from(body, view, ends, last)
            try:
                take(done[0], view)
            except BaseException:  # no read in flight: this thread closes it
                if not last:
                    body.close()
                raise
            done[0] += len(view)

    def current_version(self) -> str | None:
        try:
            head = bounded(lambda: self.client.head_object(Bucket=self.bucket, Key=self.key),
                           self.transfers, self.transfers.request_ends(), self.path)
        except DeadlineError:
            raise
        except Exception:
            return None
        return str(head.get("VersionId") or head.get("ETag", ""))

    def close(self) -> None:
        """The client's connection pool is shared by every object; nothing to close."""


def refusal(exc: Exception, path: RemotePath) -> Exception:
    """botocore's exceptions as one line: not found, denied, changed, or unreachable."""
    name = type(exc).__name__
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
        what = "no such bucket" if code == "NoSuchBucket" else "not found"
        return NotFound(f"{what} ({code})", path)
    if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                "ExpiredToken"):
        return InputError(f"access denied ({code}): check the AWS credentials (environment, "
                          "~/.aws, role) and the bucket policy", path)
    if code in ("PreconditionFailed", "412"):
        return InputError("changed while it was read (its ETag is no longer the one pinned "
                          "at the first request); run again", path)
    if code in ("InvalidRange", "416"):
        return InputError("is shorter than the size S3 first reported", path)
    if name == "NoCredentialsError":
        return InputError("no AWS credentials found (set AWS_ACCESS_KEY_ID/"
                          "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run where a role applies)",
                          path)
    if status is not None and (status == 429 or status >= 500):
        return Transient(f"S3 answered {status} {code}")
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                "ConnectionClosedError"):
        return InputError(f"cannot reach the S3 endpoint ({name})", path)
    text = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else name)
    return InputError(f"S3 error: {text}", path)


MAX_LISTED = 100_000  # names in one bucket folder, for its layouts to decide from


def folder_names(path: RemotePath) -> frozenset[str]:
    """The names directly in the bucket folder ``path`` names (objects as named, folders
    with a trailing ``/``): what the readers' layouts decide from, as for a local folder."""
    return frozenset(_listed(path, "/"))


def folder_files(path: RemotePath) -> tuple[str, ...]:
    """Every object below the bucket folder ``path`` names, relative to it, in name order
    (folder mode's walk over a bucket folder). An empty object named ``…/`` (what a console's
    "Create folder" leaves) is a folder, as the delimited listing sees it, not a file."""
    return tuple(sorted(name for name in _listed(path, "") if not name.endswith("/")))


def _listed(path: RemotePath, delimiter: str) -> set[str]:
    """``ListObjectsV2`` below ``path``'s prefix, page by page, each page retried and
    bounded by the command's deadlines; at most ``MAX_LISTED`` names."""
    s3 = client(path.transfers.timeout)
    prefix = path.url.key
    names: set[str] = set()
    token: dict[str, str] = {}
    split = {"Delimiter": delimiter} if delimiter else {}

    def page(ends: float) -> Answer:
        try:
            return bounded(lambda: s3.list_objects_v2(Bucket=path.url.host, Prefix=prefix,
                                                      **split, **token),
                           path.transfers, ends, path)
        except DeadlineError:
            raise
        except Exception as exc:
            raise refusal(exc, path) from None

    while True:
        answer = retrying(page, path, path.transfers)
        names.update(o["Key"][len(prefix):] for o in answer.get("Contents", ())
                     if o["Key"] != prefix)
        names.update(p["Prefix"][len(prefix):] for p in answer.get("CommonPrefixes", ()))
        if len(names) > MAX_LISTED:
            raise InputError(f"holds more than {MAX_LISTED} names; name the checkpoint file "
                             "or its *.index.json", path)
        if not answer.get("IsTruncated"):
            return names
        token = {"ContinuationToken": answer["NextContinuationToken"]}
