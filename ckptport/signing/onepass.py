"""Each file read once for both signatures: the files' sha256 and the tensors' with it.

The OMS signature hashes every file whole; the weights attestation hashes
every tensor's canonical bytes. Where a tensor's canonical bytes lie verbatim
in a file (``tensors.file_range``: a contiguous little-endian tensor, every
tensor of a ``.safetensors`` file and most of a ``.pth``), the one read that
hashes the file also hashes the tensor: the file's reader thread updates the
file's sha256 chunk by chunk and hands each tensor its slice of the chunk on
a lane of its own (one thread per lane, so a tensor's slices are hashed in
order, and the lanes run on the other cores: hashlib frees the GIL). Tensors
with no such range (gathered views, casts, big-endian storages) are hashed
by the manifest as usual.

The files are enumerated, named and described by ``model_signing``'s own
file serializer (``model_signing.hashing``), with this hasher in place of
its ``SimpleFileHasher``: the signature is what ``model_signing sign`` writes.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ..parallel import workers
from ..tensors import ViewKey, file_range, view_key
from ..tree import Tree, iter_tensors

if TYPE_CHECKING:
    from model_signing import hashing

__all__ = ["TensorRanges", "tapped_config", "new_config"]

CHUNK = 8 << 20
FileKey = tuple[int, int]  # (st_dev, st_ino): a file however its path is spelled


class TensorRanges:
    """The tensors of a tree that lie verbatim in files, by file; their digests as hashed."""

    def __init__(self, tree: Tree) -> None:
        self.by_file: dict[FileKey, list[tuple[int, int, ViewKey]]] = {}
        seen: set[ViewKey] = set()
        for _, leaf in iter_tensors(tree):
            key = view_key(leaf)
            where = file_range(leaf)
            if key in seen or where is None:
                continue
            seen.add(key)
            source, start, length = where
            self.by_file.setdefault(source.snapshot[:2], []).append((start, length, key))
        self.done: dict[ViewKey, str] = {}
        self._lock = threading.Lock()

    def of(self, path: Path) -> list[tuple[int, int, ViewKey]]:
        st = os.stat(path)
        return sorted(self.by_file.get((st.st_dev, st.st_ino), ()))

    def finished(self, digests: Iterable[tuple[ViewKey, str]]) -> None:
        with self._lock:
            self.done.update(digests)


def _hash_file(path: Path, ranges: TensorRanges, lanes: int) -> bytes:
    """The file's sha256 (raw), its tensors' sha256 handed to ``ranges`` on the way."""
    wanted = ranges.of(path)
    file_sha = hashlib.sha256()
    tensor_sha = {key: hashlib.sha256() for _, _, key in wanted}
    load = [0] * lanes
    lane_of: dict[ViewKey, int] = {}
    for _, length, key in sorted(wanted, key=lambda r: -r[1]):  # biggest first, least loaded
        lane = load.index(min(load))
        lane_of[key] = lane
        load[lane] += length
    pools = [ThreadPoolExecutor(1, thread_name_prefix="ckptport-sign") for _ in range(lanes)]
    pending: deque[Future[None]] = deque()
    try:
        with open(path, "rb", buffering=0) as f:
            offset, next_range, active = 0, 0, []
            while chunk := f.read(CHUNK):
                end = offset + len(chunk)
                file_sha.update(chunk)
                while next_range < len(wanted) and wanted[next_range][0] < end:
                    active.append(wanted[next_range])
                    next_range += 1
                view = memoryview(chunk)
                for start, length, key in active:
                    low, high = max(start, offset), min(start + length, end)
                    if low < high:
                        pending.append(pools[lane_of[key]].submit(
                            tensor_sha[key].update, view[low - offset:high - offset]))
                active = [r for r in active if r[0] + r[1] > end]
                while len(pending) > 4 * lanes:  # a few chunks in flight, no more
                    pending.popleft().result()
                offset = end
        for done in pending:
            done.result()
    finally:
        for pool in pools:
            pool.shutdown()
    ranges.finished((key, sha.hexdigest()) for key, sha in tensor_sha.items())
    return file_sha.digest()


def new_config() -> hashing.Config:
    """A ``model_signing`` hashing config with its defaults (its constructor is not
    annotated: the one untyped call, made here)."""
    from model_signing import hashing

    return hashing.Config()  # type: ignore[no-untyped-call]


def tapped_config(ranges: TensorRanges, jobs: int | None = None) -> hashing.Config:
    """A ``model_signing`` hashing config over files with sha256 whose hasher reads each
    file once and hashes the tensors lying in it into ``ranges`` on the way."""
    from model_signing._hashing import hashing as engines
    from model_signing._hashing import io
    from model_signing._serialization import file

    lanes = max(1, workers(jobs) - 1)

    class TappedHasher(io.FileHasher):
        """A sha256 ``FileHasher`` that also hashes the tensors lying in the file."""

        def __init__(self, path: Path) -> None:
            self._path = path

        @property
        def digest_name(self) -> str:
            return "sha256"

        @property
        def digest_size(self) -> int:
            return 32

        def compute(self) -> engines.Digest:
            return engines.Digest("sha256", _hash_file(self._path, ranges, lanes))

    config = new_config()
    config._serializer = file.Serializer(TappedHasher, max_workers=workers(jobs))  # noqa: SLF001
    return config

