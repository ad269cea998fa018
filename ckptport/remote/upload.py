"""``s3://`` destinations: multipart uploads that appear under their name only once verified.

S3 cannot read an upload before it is completed, and a completed upload is
visible at once under its key. So each file goes first to a staging key
beside its destination (``PREFIX/.NAME.<random>.ckptport-tmp``):

1. its parts are uploaded over several connections, each with its
   ``Content-MD5`` (S3 refuses a part whose bytes arrived different);
2. the upload is completed, and what the server stored is read back: the
   size and ETag ``HeadObject`` gives (the multipart ETag is the MD5 of the
   parts' MD5s, computed here from the local bytes), then every byte by
   range, each part's sha256 compared with that of the bytes sent (the
   local file, itself verified against the source before it was uploaded,
   is gone by then: local disk holds one file at a time);
3. only then is it copied server-side (``UploadPartCopy``, part for part,
   so the copy's ETag is the same content-derived ETag, checked again) to
   its final key, and the staging object is deleted.

A file whose first bytes are not known yet (a safetensors shard's header
holds the source's sha256, known once the whole source is read: ``LateBytes``)
has every part but the first sent at once; the first part (5 MiB, or the
header if larger) is kept (in memory, up to ``HEADS_IN_MEMORY`` in all, then
in an unlinked temporary file) and sent, with
those bytes written in, when the set is committed (``finish``). So writing
a shard set reads the source once: the first shard does not wait while the
rest of the source is fetched again to be hashed.

A run that fails or is interrupted aborts its open multipart uploads and
deletes its staging objects: nothing appears under a destination name, and
no upload is left dangling. A process killed outright (SIGKILL, power) can
leave a staging object or an incomplete upload; a bucket lifecycle rule
(``AbortIncompleteMultipartUpload``, and expiry of ``*.ckptport-tmp``)
cleans those. A shard set's files are published one by one, the index
last (S3 has no transaction over several keys): a failure while
publishing removes the files this run created.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CkptportError, DeadlineError, OutputError, VerificationError
from . import meter
from .deadline import bounded
from .fetching import Transient
from .parts import LateBytes, Part, Staged, multipart_etag, parallel, read_back
from .urls import RemotePath, RemoteURL

if TYPE_CHECKING:
    from .s3 import Answer

__all__ = ["S3Store", "Staged", "Part", "LateBytes", "multipart_etag", "part_size",
           "TEMP_SUFFIX"]  # the parts' types are ``parts``', named here as the store's face

MIN_PART = 5 << 20  # S3's smallest part (but the last)
HEADS_IN_MEMORY = 64 << 20  # the first parts held back, beyond this on local disk
MAX_PARTS = 10_000
PART_SIZE = int(os.environ.get("CKPTPORT_S3_PART_SIZE", str(16 << 20)))  # the least part
LARGEST_PART = 64 << 20  # parts grow to keep every connection busy, up to this
TEMP_SUFFIX = ".ckptport-tmp"

def part_size(size: int, connections: int) -> int:
    """A part per connection, of ``PART_SIZE`` to ``LARGEST_PART`` (by MiB), larger only
    where the object would need more than 10,000 parts. Fewer parts mean fewer requests
    to send, copy and complete (a part retried costs its bytes again: hence the bound)."""
    shared = min(LARGEST_PART, -(-size // max(1, connections)))
    wanted = max(MIN_PART, PART_SIZE, shared, -(-size // MAX_PARTS))
    return -(-wanted // (1 << 20)) * (1 << 20)


def _ranges(size: int, step: int, first: int = 0) -> list[tuple[int, int]]:
    """``[0, size)`` in ranges of ``step``; with ``first`` (bytes sent last: kept until
    then), the first range is as small as S3 allows that holds them: ``MIN_PART``, grown by
    MiB."""
    head = min(size, step if not first else max(MIN_PART, -(-first // (1 << 20)) * (1 << 20)))
    rest = [(a, min(size, a + step)) for a in range(head, size, step)]
    return [(0, head), *rest] if size else [(0, 0)]


def send_later(fd: int, span: tuple[int, int], where: RemotePath) -> bytes:
    """The first part's bytes, kept to be sent once its late bytes are known."""
    data = os.pread(fd, span[1] - span[0], span[0])
    if len(data) != span[1] - span[0]:
        raise OutputError("the local copy changed while it was uploaded", where)
    return data


class S3Store:
    """An ``s3://BUCKET/KEY`` or ``s3://BUCKET/PREFIX/`` destination being written.

    ``name`` arguments are relative to the folder the URL names (the key's
    folder for a file). Use as a context manager: leaving it with an
    exception aborts every open upload and deletes every staging object.
    """

    def __init__(self, path: RemotePath) -> None:
        from .s3 import client

        self.path, self.url = path, path.url
        self.bucket = self.url.host
        self.folder = self.url.key if self.url.key.endswith("/") or not self.url.key \
            else self.url.key.rsplit("/", 1)[0] + "/" if "/" in self.url.key else ""
        self.transfers = path.transfers  # every call waits within a request's deadline
        self.client = client(self.transfers.timeout)
        self.connections = self.transfers.connections  # parts in flight at once
        self.uploads: dict[str, str] = {}  # key -> upload id, not yet completed
        self.staging: set[str] = set()  # staging objects not yet deleted
        self.created: list[str] = []  # final keys this run made, removed if it fails
        # the first parts sent last (``finish``), 5 MiB or so a file: in memory up to
        # ``HEADS_IN_MEMORY`` (local disk holds the shard being written, not these too)
        self.heads: tempfile.SpooledTemporaryFile[bytes] | None = None
        self._heads_lock = threading.Lock()

    def where(self, name: str) -> RemotePath:
        return RemotePath(RemoteURL("s3", self.bucket, self.folder + name),
                          opener=self.path.opener, transfers=self.transfers)

    def _call(self, operation: str, where: RemotePath | None = None, /,
              **params: object) -> Answer:
        from .s3 import refusal

        try:
            return self._raw(operation, where, **params)
        except DeadlineError:
            raise
        except Exception as exc:
            made = refusal(exc, where or self.path)
            if isinstance(made, Transient):
                raise OutputError(f"{made} (gave up after botocore's retries)",
                                  where or self.path) from None
            assert isinstance(made, CkptportError)
            raise OutputError(made.message, where or self.path) from None

    def _raw(self, operation: str, where: RemotePath | None = None, /,
             **params: object) -> Answer:
        """One call, waited for within a request's deadline; botocore's errors as raised."""
        meter.add(0)
        return bounded(lambda: getattr(self.client, operation)(Bucket=self.bucket, **params),
                       self.transfers, self.transfers.request_ends(), where or self.path)

    # -- what is there

    def check_bucket(self) -> None:
        """Fail now, before anything is read, if the bucket is missing or out of reach."""
        try:
            self._raw("head_bucket")
        except DeadlineError:
            raise
        except Exception as exc:
            code = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise OutputError(f"no such bucket {self.bucket!r}", self.path) from None
            self._call("head_bucket")  # the same failure, in the words every call uses

    def head(self, name: str) -> tuple[int, str] | None:
        """``name``'s size and ETag, or None when there is no such object."""
        from .s3 import refusal

        try:
            head = self._raw("head_object", Key=self.folder + name)
        except DeadlineError:
            raise
        except Exception as exc:
            code = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound"):
                return None
            made = refusal(exc, self.where(name))
            raise OutputError(str(getattr(made, "message", made)), self.where(name)) from None
        return int(head["ContentLength"]), str(head.get("ETag", ""))

    def exists(self, name: str) -> bool:
        return self.head(name) is not None

    def names(self) -> list[str]:
        """The objects directly in the folder (not below it), staging objects left out."""
        return [n for n in self.below("", nested=False) if not n.endswith(TEMP_SUFFIX)]

    def below(self, prefix: str, nested: bool = True) -> list[str]:
        """The names of the objects under ``prefix`` in the folder (relative to the folder)."""
        found: list[str] = []
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", Prefix=self.folder + prefix,
                              **({} if nested else {"Delimiter": "/"}), **token)
            found += [o["Key"][len(self.folder):] for o in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return found
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def get(self, name: str) -> bytes:
        """A small object, whole (a journal entry)."""
        body: bytes = self._call("get_object", self.where(name),
                                 Key=self.folder + name)["Body"].read()
        return body

    def put(self, name: str, data: bytes) -> None:
        """A small object in one request (a journal entry: written whole or not at all)."""
        self._call("put_object", self.where(name), Key=self.folder + name, Body=data)

    # -- staging

    def stage(self, local: Path, name: str, verify: bool = True,
              late: LateBytes | None = None) -> Staged:
        """Upload ``local`` to a staging key and check what the server stored: its size and
        ETag, and with ``verify`` every byte read back. With ``late``, the part holding
        those bytes is kept and the upload left open for ``finish``."""
        where = self.where(name)
        key = f"{self.folder}.{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        size = local.stat().st_size
        spans = _ranges(size, part_size(size, self.connections),
                        0 if late is None else late.offset + late.length)
        with open(local, "rb") as file:
            fd = file.fileno()
            upload = self._call("create_multipart_upload", where, Key=key)["UploadId"]
            self.uploads[key] = upload

            def send(item: tuple[int, tuple[int, int]]) -> Part:
                number, (start, stop) = item
                data = os.pread(fd, stop - start, start)
                if len(data) != stop - start:
                    raise OutputError("the local copy changed while it was uploaded", where)
                return self._send(where, key, upload, number, start, data)

            items = list(enumerate(spans, start=1))
            head = None if late is None else self._keep(send_later(fd, spans[0], where))
            parts = tuple(parallel(send, items[0 if late is None else 1:], self.connections))
        staged = Staged(name, key, size, parts, upload, head, late, verify)
        return staged if late is not None else self.finish(staged)

    def _keep(self, data: bytes) -> tuple[int, int]:
        with self._heads_lock:
            if self.heads is None:
                self.heads = tempfile.SpooledTemporaryFile(HEADS_IN_MEMORY,
                                                           prefix="ckptport-heads-")
            at = self.heads.seek(0, os.SEEK_END)
            self.heads.write(data)
            return at, len(data)

    def _kept(self, at: int, n: int) -> bytes:
        with self._heads_lock:
            assert self.heads is not None
            self.heads.seek(at)
            return self.heads.read(n)

    def _send(self, where: RemotePath, key: str, upload: str, number: int, start: int,
              data: bytes) -> Part:
        md5 = hashlib.md5(data).digest()
        answer = self._call("upload_part", where, Key=key, UploadId=upload, PartNumber=number,
                            Body=data, ContentMD5=base64.b64encode(md5).decode())
        if answer.get("ETag") != f'"{md5.hex()}"':
            raise VerificationError(f"S3 stored part {number} with ETag {answer.get('ETag')}, "
                                    "not the MD5 of its bytes", where)
        return Part(number, start, start + len(data), md5, hashlib.sha256(data).digest())

    def finish(self, staged: Staged) -> Staged:
        """Complete a staged upload (its late bytes written into its first part, which is
        sent now), check the ETag and size S3 gives it, read it back."""
        if not staged.upload:
            return staged  # completed and verified already
        where = self.where(staged.name)
        parts = staged.parts
        if staged.head is not None and staged.late is not None:
            late, head = staged.late, bytearray(self._kept(*staged.head))
            value = late.value()
            if len(value) != late.length:
                raise VerificationError("the bytes written last changed the file's length",
                                        where)
            head[late.offset:late.offset + late.length] = value
            parts = (self._send(where, staged.key, staged.upload, 1, 0, bytes(head)), *parts)
        done = Staged(staged.name, staged.key, staged.size, parts)
        self._complete(done.key, staged.upload, parts, where, overwrite=True)
        self.staging.add(done.key)
        self._check_stored(done.key, done, where)
        if staged.verify:
            from .s3 import S3Object

            read_back(done, where, S3Object(RemotePath(RemoteURL("s3", self.bucket, done.key),
                                                       transfers=self.transfers), self.client),
                      self.connections)
        return done

    def _complete(self, key: str, upload: str, parts: tuple[Part, ...], where: RemotePath,
                  overwrite: bool) -> None:
        listed = {"Parts": [{"ETag": p.etag, "PartNumber": p.number} for p in parts]}
        try:
            self._call("complete_multipart_upload", where, Key=key, UploadId=upload,
                       MultipartUpload=listed, **({} if overwrite else {"IfNoneMatch": "*"}))
        except OutputError as exc:
            if "PreconditionFailed" in exc.message or "pre-conditions" in exc.message:
                raise OutputError("exists (appeared while writing); pass --overwrite to replace "
                                  "it", where) from None
            if overwrite or "NotImplemented" not in exc.message:
                raise
            # a store without conditional writes (older MinIO, some S3 look-alikes): the
            # check is a HEAD just before, which a writer racing this one could pass too
            if self.head(key[len(self.folder):]) is not None:
                raise OutputError("exists (appeared while writing); pass --overwrite to "
                                  "replace it", where) from None
            self._call("complete_multipart_upload", where, Key=key, UploadId=upload,
                       MultipartUpload=listed)
        self.uploads.pop(key)  # on a failure ``discard`` aborts it

    def _check_stored(self, key: str, staged: Staged, where: RemotePath) -> None:
        """The size and ETag S3 gives the completed object are those of the local bytes."""
        head = self._call("head_object", where, Key=key)
        if int(head["ContentLength"]) != staged.size or head.get("ETag") != staged.etag:
            raise VerificationError(f"S3 holds {head['ContentLength']} bytes with ETag "
                                    f"{head.get('ETag')}; {staged.size} bytes with ETag "
                                    f"{staged.etag} were uploaded", where)

    # -- publishing

    def publish(self, staged: Staged, overwrite: bool) -> RemotePath:
        """Copy a verified staging object to its name (part for part, its ETag checked
        again), then delete the staging object."""
        where = self.where(staged.name)
        key = self.folder + staged.name
        upload = self._call("create_multipart_upload", where, Key=key)["UploadId"]
        self.uploads[key] = upload
        source = {"Bucket": self.bucket, "Key": staged.key}
        whole = len(staged.parts) == 1

        def copy(part: Part) -> Part:
            span = {} if whole else {"CopySourceRange": f"bytes={part.start}-{part.stop - 1}"}
            answer = self._call("upload_part_copy", where, Key=key, UploadId=upload,
                                PartNumber=part.number, CopySource=source,
                                CopySourceIfMatch=staged.etag, **span)
            if answer.get("CopyPartResult", {}).get("ETag") != part.etag:
                raise VerificationError(f"S3 copied part {part.number} with ETag "
                                        f"{answer.get('CopyPartResult', {}).get('ETag')}, "
                                        f"not {part.etag}", where)
            return part

        parallel(copy, list(staged.parts), self.connections)
        self._complete(key, upload, staged.parts, where, overwrite)
        self.created.append(key)  # made by this run: a failure before the end removes it
        self._check_stored(key, staged, where)
        self._delete(staged.key)
        return where

    def commit(self, staged: list[Staged], stale: list[str], overwrite: bool,
               message: str = "", description: str = "") -> RemotePath:
        """Publish ``staged`` in order (a set's index last), then delete ``stale`` names; S3
        has no commit message (``message``, ``description`` are for the hub)."""
        finished = [self.finish(item) for item in staged]  # all verified before any appears
        for item in finished:
            self.publish(item, overwrite)
        for name in stale:
            self.remove(name)
        self.created.clear()  # published: a failure from here on keeps it
        return self.path

    def remove(self, name: str) -> None:
        """Delete ``name`` (a stale shard of a set being replaced)."""
        self._call("delete_object", self.where(name), Key=self.folder + name)

    def _delete(self, key: str) -> None:
        self._call("delete_object", Key=key)
        self.staging.discard(key)

    def discard(self) -> list[str]:
        """Abort every open upload, delete every staging object and the objects this run
        created; what could not be removed is returned (each step is tried whatever
        failed before it: a lifecycle rule is the net for what is left)."""
        left = []
        for key, upload in list(self.uploads.items()):
            if not self._quietly(self.client.abort_multipart_upload, Key=key, UploadId=upload):
                left.append(f"the upload of {key}")
            if key.endswith(TEMP_SUFFIX):  # a staging upload may have completed after all
                self.staging.add(key)
        left += [key for key in [*self.staging, *self.created]
                 if not self._quietly(self.client.delete_object, Key=key)]
        self.uploads.clear()
        self.staging.clear()
        self.created.clear()
        return left

    def _quietly(self, call: Callable[..., object], **params: object) -> bool:
        try:
            call(Bucket=self.bucket, **params)
        except Exception as exc:  # cleanup after a failure: the first failure is the one told
            code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code")
            return code in ("NoSuchUpload", "NoSuchKey")  # gone already
        return True

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 *rest: object) -> None:
        if self.heads is not None:
            self.heads.close()
            self.heads = None
        if kind is None:
            return
        left = self.discard()
        if left and isinstance(exc, CkptportError):
            raise OutputError(f"{exc.message}; could not remove {', '.join(left)} (a bucket "
                              "lifecycle rule cleans what is left)", exc.path) from exc
