"""Tensors assembled from byte ranges of several files, read by position, never gathered.

A consolidated tensor of a sharded checkpoint (a ZeRO parameter spanning
two ranks' flat partitions, an FSDP weight split over eight rank files) is
a ``TensorInfo`` like any other, over a ``SpanFile``: a read-only view that
presents the pieces, in the order they make up the tensor's canonical
bytes, as one file. ``tensors.chunks`` streams it piece by piece, so
consolidating holds one read buffer, not the model; only ``to_torch``
makes the whole tensor, as it does for any leaf.

Every assembly is checked before it is described: the pieces must tile the
tensor exactly (no overlap, no hole), and each piece must lie inside the
storage it is read from (``Blob`` checks every read against its bounds).
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..dtypes import DType
from ..errors import InputError
from ..sealed import sealed
from ..sources import SourceFile
from ..tensors import Blob, StorageInfo, TensorInfo, contiguous_strides
from .layouts import LayoutError

__all__ = ["Run", "SpanFile", "assemble", "flat_run", "box_runs", "TilingError"]


class TilingError(LayoutError):
    """The pieces of a tensor overlap, leave a hole, or reach past it."""


@sealed
@dataclass(frozen=True, slots=True)
class Run:
    """``length`` bytes of the assembled tensor at ``start``, read from ``blob`` at ``at``."""

    start: int
    length: int
    blob: Blob
    at: int


class SpanFile(SourceFile):
    """Runs of other files' bytes, read as one file of their total size."""

    def __init__(self, path: Path, runs: Sequence[Run]) -> None:  # noqa: D107 - no descriptor
        self.path, self.fd = path, -1
        self.runs = tuple(runs)
        self.starts = [run.start for run in self.runs]
        self.size = sum(run.length for run in self.runs)
        self.snapshot = (0, 0, self.size, 0)
        self._lock = threading.Lock()
        self._mapped: object = None

    def read(self, offset: int, n: int) -> bytes:
        buffer = bytearray(max(n, 0))
        self.read_into(offset, memoryview(buffer))
        return bytes(buffer)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        if offset < 0 or offset + len(buffer) > self.size:
            raise InputError(f"bytes {offset}..{offset + len(buffer)} lie outside the "
                             f"{self.size} bytes of the assembled tensor", self.path)
        done = 0
        index = bisect.bisect_right(self.starts, offset) - 1
        while done < len(buffer):
            run = self.runs[index]
            within = offset + done - run.start
            take = min(run.length - within, len(buffer) - done)
            piece = buffer[done:done + take]
            if run.blob.file is None:
                piece[:] = run.blob.read(run.at + within, take)
            else:
                run.blob.read_into(run.at + within, piece)
            done += take
            index += 1

    def changed(self) -> bool:
        return any(run.blob.file is not None and run.blob.file.changed() for run in self.runs)

    def torch_storage(self) -> object:
        """The assembled bytes as one private storage: the whole tensor, made when asked."""
        with self._lock:
            if self._mapped is None:
                import torch

                data = bytearray(self.read(0, self.size))
                self._mapped = torch.frombuffer(data, dtype=torch.uint8).untyped_storage() \
                    if data else torch.UntypedStorage(0)
            return self._mapped

    def close(self) -> None:
        self.fd = -1


def _checked(runs: Iterable[Run], total: int, name: str, where: Path) -> list[Run]:
    ordered = sorted(runs, key=lambda run: run.start)
    at = 0
    for run in ordered:
        if run.start < at:
            raise TilingError(f"{name}: pieces overlap at byte {run.start} of its {total}",
                              where)
        if run.start > at:
            raise TilingError(f"{name}: no piece holds bytes {at}..{run.start} of its {total} "
                              "(a missing or short shard)", where)
        at = run.start + run.length
    if at != total:
        raise TilingError(f"{name}: its pieces hold {at} bytes, it needs {total}", where)
    return [run for run in ordered if run.length]


def assemble(name: str, where: Path, dtype: DType, shape: tuple[int, ...],
             runs: Iterable[Run], requires_grad: bool = False) -> TensorInfo:
    """A described tensor whose canonical bytes are ``runs``, checked to tile it exactly."""
    total = math.prod(shape) * dtype.itemsize
    checked = _checked(runs, total, name, where)
    if len(checked) == 1 and checked[0].start == 0 and checked[0].blob.file is not None:
        run = checked[0]  # one piece: a plain range of its file, nothing to stitch
        blob = Blob(run.blob.file, run.blob.offset + run.at, total, name=run.blob.name)
    else:
        blob = Blob(SpanFile(where, checked), 0, total, name=name)
    storage = StorageInfo(name, "cpu", dtype, total, blob)
    return TensorInfo(dtype, shape, contiguous_strides(shape), 0, storage, requires_grad)


def _source_bytes(piece: TensorInfo, name: str, where: Path) -> tuple[Blob, int]:
    """The blob a contiguous piece's bytes are in, and where they start."""
    if not piece.is_contiguous() or piece.storage.big_endian:
        raise InputError(f"{name}: a shard that is not a contiguous little-endian view; "
                         "ckptport assembles contiguous shards only", where)
    return piece.storage.blob, piece.offset * piece.dtype.itemsize


def flat_run(piece: TensorInfo, start: int, count: int, at: int, name: str,
              where: Path) -> Run:
    """Elements ``start..start + count`` of a flat piece, placed at element ``at``."""
    if start < 0 or count < 0 or start + count > piece.numel():
        raise InputError(f"{name}: needs elements {start}..{start + count} of a flat "
                         f"partition of {piece.numel()}", where)
    blob, base = _source_bytes(piece, name, where)
    size = piece.dtype.itemsize
    return Run(at * size, count * size, blob, base + start * size)


def box_runs(shape: tuple[int, ...], offsets: tuple[int, ...], piece: TensorInfo, name: str,
             where: Path) -> list[Run]:
    """The runs a shard at ``offsets`` contributes to a row-major tensor of ``shape``.

    Trailing dimensions the shard spans whole merge into one run, so a
    dim-0 shard is a single run, a column shard one run per row.
    """
    sizes, size = piece.shape, piece.dtype.itemsize
    if len(sizes) != len(shape) or any(o + n > g for o, n, g in zip(offsets, sizes, shape,
                                                                   strict=True)):
        raise TilingError(f"{name}: a shard of {sizes} at {offsets} reaches past {shape}",
                          where)
    if not math.prod(sizes):
        return []
    blob, base = _source_bytes(piece, name, where)
    split = len(shape) - 1  # the last dimension whose trailing ones the shard spans whole
    while split > 0 and sizes[split] == shape[split]:
        split -= 1
    row = sizes[split] * math.prod(shape[split + 1:])
    strides = contiguous_strides(shape)
    runs, local = [], 0
    for index in itertools.product(*(range(n) for n in sizes[:split])):
        start = sum((o + i) * s for o, i, s in zip(offsets, index, strides, strict=False))
        start += offsets[split] * strides[split]
        runs.append(Run(start * size, row * size, blob, base + local * size))
        local += row
    return runs
