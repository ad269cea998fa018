"""What an output records of where it came from: the files read, what the rules did.

Formats with a place for it (``OutputFormat.metadata``: safetensors) build
their own metadata from these facts; the command hands the facts over and
never builds a format's metadata. The source's sha256 is always the hash of
the files this run read (a ``source_sha256`` a source claims is never
copied: ckptport cannot verify it). For local files it costs a full read,
so it is computed once, on a thread, from the moment a writer first asks
for it, and the writer patches its placeholder when it is known. For remote
files a full read is a second download: the hash is fed by the reads the
command makes anyway (``remote.readhash``) and finished (what they did not
cover in order fetched) by the first caller of ``result()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..remote.urls import RemotePath, Where
from ..sources import sha256_files

__all__ = ["Provenance"]


@dataclass(frozen=True, eq=False)
class Provenance:
    """``files`` the source's bytes came from; ``rules`` what each rule did (rule -> summary);
    ``carried`` a source's own metadata an output keeps; ``extra`` more ``ckptport.*``
    facts (the recipe's sha256)."""

    files: tuple[Where, ...]
    rules: Mapping[str, str] = field(default_factory=dict)
    carried: Mapping[str, str] = field(default_factory=dict)
    extra: Mapping[str, str] = field(default_factory=dict)
    _digest: list[Future[str]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sha256(self) -> Future[str]:
        """The files' sha256, computed once: local files on a thread of their own (hashlib
        frees the GIL), remote ones from the command's own reads, finished on demand."""
        with self._lock:
            if not self._digest:
                if self.files and all(isinstance(f, RemotePath) for f in self.files):
                    from ..remote.readhash import ReadDigest

                    reads = ReadDigest(tuple(f for f in self.files if isinstance(f, RemotePath)))
                    self._digest.append(_OnDemand(reads.hexdigest))
                    return self._digest[0]
                future: Future[str] = Future()
                self._digest.append(future)
                threading.Thread(target=self._hash, args=(future,), daemon=True,
                                 name="ckptport-sha256").start()
            return self._digest[0]

    def known_sha256(self) -> str | None:
        """The sha256 if a writer asked for it (waiting for it to finish), else None."""
        with self._lock:
            started = self._digest[0] if self._digest else None
        return None if started is None else started.result()

    def _hash(self, future: Future[str]) -> None:
        try:
            future.set_result(sha256_files(self.files))
        except BaseException as exc:  # handed to whoever waits for the digest
            future.set_exception(exc)


class _OnDemand(Future[str]):
    """A value computed by the first caller of ``result`` (a remote source's sha256: the
    bytes its reads left unhashed are fetched only once it is wanted)."""

    def __init__(self, compute: Callable[[], str]) -> None:
        super().__init__()
        self._compute = compute
        self._once = threading.Lock()

    def result(self, timeout: float | None = None) -> str:
        with self._once:
            if not self.done():
                try:
                    self.set_result(self._compute())
                except BaseException as exc:  # raised to this caller and every later one
                    self.set_exception(exc)
        return super().result(timeout)
