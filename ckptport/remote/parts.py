"""What an S3 multipart upload is made of, and how what S3 stored is read back.

A ``Staged`` file is its parts (each part's MD5, which S3 checks on
arrival and folds into the object's ETag, and its sha256, which the
read-back compares); ``read_back`` streams the stored object over several
connections, a run of whole parts each, and compares every part with the
bytes that were sent. The store (``upload``) makes and publishes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..errors import CkptportError, OutputError, VerificationError

if TYPE_CHECKING:
    from .s3 import S3Object
    from .urls import RemotePath

__all__ = ["LateBytes", "Part", "Staged", "multipart_etag", "parallel", "read_back",
           "READ_BACK"]

READ_BACK = 8 << 20  # bytes compared at a time (a block of a streamed ranged read) reading back

T = TypeVar("T")
R = TypeVar("R")


class LateBytes(Protocol):
    """Bytes of a file still to be computed (``writers.LatePatch``): ``length`` bytes at
    ``offset``, and the call that waits for them."""

    @property
    def offset(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def value(self) -> Callable[[], bytes]: ...


@dataclass(frozen=True)
class Part:
    number: int
    start: int
    stop: int
    md5: bytes
    sha256: bytes  # of the bytes sent: what reading back compares

    @property
    def etag(self) -> str:
        return f'"{self.md5.hex()}"'


@dataclass(frozen=True)
class Staged:
    """One file uploaded to its staging key and verified there."""

    name: str  # the destination name, relative to the store's folder
    key: str  # the staging key
    size: int
    parts: tuple[Part, ...]
    # while not yet completed (``finish``): the upload, where its first part's bytes wait
    # (offset, length in the store's ``heads`` file), what goes into them, whether to read
    # it back
    upload: str = ""
    head: tuple[int, int] | None = None
    late: LateBytes | None = None
    verify: bool = True

    @property
    def etag(self) -> str:
        return multipart_etag([p.md5 for p in self.parts])


def multipart_etag(md5s: Iterable[bytes]) -> str:
    """The ETag S3 gives a completed multipart upload: the MD5 of the parts' MD5s, ``-N``."""
    digests = list(md5s)
    return f'"{hashlib.md5(b"".join(digests)).hexdigest()}-{len(digests)}"'


def parallel(work: Callable[[T], R], items: list[T], connections: int) -> list[R]:
    """``work`` over ``items`` on ``connections`` threads, results in order; the first
    failure (or Ctrl-C) cancels what has not started and waits for what has."""
    if connections <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    pool = ThreadPoolExecutor(min(connections, len(items)), thread_name_prefix="ckptport-s3")
    try:
        futures = [pool.submit(work, item) for item in items]
        return [future.result() for future in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_back(staged: Staged, where: RemotePath, remote: S3Object, connections: int) -> None:
    """Every byte of the staged object by range, each part's sha256 compared with that
    of the bytes sent: a few streamed requests per connection, each a run of parts."""
    if remote.etag != staged.etag or remote.size != staged.size:
        raise VerificationError("the staged object changed before it was read back", where)

    def compare(run: tuple[Part, ...]) -> None:
        parts, digest = list(run), hashlib.sha256()

        def take(at: int, got: memoryview) -> None:
            nonlocal digest
            while got:
                part = parts[0]
                n = min(len(got), part.stop - at)
                digest.update(got[:n])
                at, got = at + n, got[n:]
                if at == part.stop:
                    if digest.digest() != part.sha256:
                        raise VerificationError(
                            f"the uploaded object reads back different in bytes "
                            f"{part.start}-{part.stop - 1}", where)
                    parts.pop(0)
                    digest = hashlib.sha256()

        try:
            remote.each_block(run[0].start, run[-1].stop - run[0].start, READ_BACK, take)
        except VerificationError:
            raise
        except CkptportError as exc:
            raise OutputError(f"reading back what was uploaded: {exc.message}",
                              where) from None

    if staged.size:
        every = sorted(staged.parts, key=lambda p: p.number)
        step = -(-len(every) // max(1, connections))
        parallel(compare, [tuple(every[i:i + step]) for i in range(0, len(every), step)],
                  connections)

