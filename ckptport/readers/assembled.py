"""Tensors assembled from pieces of several files, proven whole, read by position.

A consolidated tensor of a sharded checkpoint (a ZeRO parameter spanning
two ranks' flat partitions, an FSDP weight split over eight rank files, a
DTensor split by columns) is a ``TensorInfo`` like any other, over a
``GridFile``: a read-only view that presents its pieces (``Box``es: a box
of the tensor and the row-major bytes that fill it) as one file of the
tensor's canonical bytes. ``tensors.chunks`` streams it, each read filled
with one strided copy per piece it meets (never one object per row), so
consolidating holds one read buffer, not the model.

Whole or refused: before a tensor is described, ``check_tiling`` proves
its pieces tile it, every element held by exactly one piece, no gap, no
overlap; each piece lies inside the tensor and inside the bytes it is read
from. Anything else is a ``TilingError`` naming the tensor, an element
and the files holding it (reported by ``check`` as CKP013). The proof
costs a few dictionary updates per piece, whatever the tensor's size.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

from ..dtypes import DType
from ..errors import InputError
from ..sealed import sealed
from ..sources import SourceFile
from ..tensors import Blob, StorageInfo, TensorInfo, contiguous_strides
from .layouts import LayoutError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    _Bytes = npt.NDArray[np.uint8]  # a flat byte array being filled (a view of the buffer)

__all__ = ["Box", "GridFile", "assemble", "flat_box", "shard_box", "check_tiling",
           "TilingError", "MAX_CUT_DIMS"]

MAX_CUT_DIMS = 8  # a piece's corners cost 2**cut dimensions: shards cut along 1 or 2


class TilingError(LayoutError):
    """The pieces of a tensor overlap, leave a hole, or reach past it."""


@sealed
@dataclass(frozen=True, slots=True)
class Box:
    """Elements ``offsets .. offsets + sizes`` of an assembled tensor (in its frame), whose
    row-major bytes are ``blob``'s from byte ``at`` on; ``origin`` names where they are."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    blob: Blob
    at: int
    origin: str


# -- the proof ---------------------------------------------------------------------------


def check_tiling(name: str, where: Path, frame: tuple[int, ...],
                 pieces: Iterable[tuple[tuple[int, ...], tuple[int, ...], str]]) -> None:
    """Prove that the boxes ``(offsets, sizes, origin)`` tile ``frame``: every element of it
    in exactly one box. Raises a ``TilingError`` naming an element held twice or by none.

    The proof is by corners. A box's indicator function is the sum, over its
    ``2**d`` corners, of +-1 (sign: the product over dimensions of +1 at its low
    side, -1 at its high side) times the indicator of the orthant above that
    corner. The pieces tile the frame exactly when their signed corners add up to
    the frame's own: then their sum of indicators *is* the frame's. Where they do
    not, the lexicographically first corner left over is an element covered
    ``1 + residue`` times (every corner below it cancels), which names the fault.
    Dimensions every piece spans whole drop out, so a dim-0 or column split costs
    two or four entries per piece.
    """
    boxes = list(pieces)
    if not math.prod(frame):
        return
    for offsets, sizes, origin in boxes:
        if len(offsets) != len(frame) or len(sizes) != len(frame) or any(
                o < 0 or n < 0 or o + n > g for o, n, g in zip(offsets, sizes, frame,
                                                               strict=True)):
            raise TilingError(f"{name}: a piece of {list(sizes)} at {list(offsets)} in "
                              f"{origin} reaches past its {list(frame)}", where)
    boxes = [box for box in boxes if math.prod(box[1])]
    cut = [d for d in range(len(frame)) if any(
        (offsets[d], sizes[d]) != (0, frame[d]) for offsets, sizes, _ in boxes)]
    if len(cut) > MAX_CUT_DIMS:
        raise TilingError(f"{name}: pieces cut along {len(cut)} dimensions; ckptport "
                          f"assembles shards cut along at most {MAX_CUT_DIMS}", where)
    residue: dict[tuple[int, ...], int] = {}
    whole = ((0,) * len(frame), frame, "")
    for sign, (offsets, sizes, _) in [(1, box) for box in boxes] + [(-1, whole)]:
        sides = [((offsets[d], 1), (offsets[d] + sizes[d], -1)) for d in cut]
        for corner in product(*sides):
            point = tuple(at for at, _ in corner)
            weight = sign * math.prod(s for _, s in corner)
            left = residue.get(point, 0) + weight
            if left:
                residue[point] = left
            else:
                residue.pop(point, None)
    if residue:
        raise _fault(name, where, frame, cut, boxes, min(residue))


def _fault(name: str, where: Path, frame: tuple[int, ...], cut: list[int],
           boxes: list[tuple[tuple[int, ...], tuple[int, ...], str]], point: tuple[int, ...]
           ) -> TilingError:
    """The error naming element ``point`` (its coordinates along ``cut``), which the boxes
    hold twice or not at all."""
    element = [0] * len(frame)
    for d, at in zip(cut, point, strict=True):
        element[d] = at
    held = [origin for offsets, sizes, origin in boxes if all(
        o <= e < o + n for o, n, e in zip(offsets, sizes, element, strict=True))]
    index = element[0] if len(frame) == 1 else tuple(element)
    if not held:
        return TilingError(f"{name}: no piece holds element {index} of its {list(frame)} "
                           f"(a missing or short shard; pieces from "
                           f"{_few(sorted({b[2] for b in boxes})) or 'no file'})", where)
    return TilingError(f"{name}: element {index} of its {list(frame)} is held by "
                       f"{len(held)} pieces ({_few(held)}): overlapping shards", where)


def _few(names: list[str], shown: int = 4) -> str:
    """Names for a one-line message: the first few, and how many more."""
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


# -- pieces ------------------------------------------------------------------------------


def _source_bytes(piece: TensorInfo, name: str, where: Path) -> tuple[Blob, int]:
    """The blob a contiguous piece's bytes are in, and where they start."""
    if not piece.is_contiguous() or piece.storage.big_endian:
        raise InputError(f"{name}: a shard that is not a contiguous little-endian view; "
                         "ckptport assembles contiguous shards only", where)
    return piece.storage.blob, piece.offset * piece.dtype.itemsize


def flat_box(piece: TensorInfo, start: int, count: int, at: int, name: str, where: Path,
             origin: str) -> Box:
    """Elements ``start..start + count`` of a flat piece, placed at element ``at`` of a
    flat frame."""
    if start < 0 or count < 0 or start + count > piece.numel():
        raise InputError(f"{name}: needs elements {start}..{start + count} of a flat "
                         f"partition of {piece.numel()}", where)
    blob, base = _source_bytes(piece, name, where)
    return Box((at,), (count,), blob, base + start * piece.dtype.itemsize, origin)


def shard_box(offsets: tuple[int, ...], piece: TensorInfo, name: str, where: Path,
              origin: str) -> Box:
    """A shard of the tensor at ``offsets``: its own shape, its own bytes."""
    blob, base = _source_bytes(piece, name, where)
    return Box(tuple(offsets), tuple(piece.shape), blob, base, origin)


# -- the assembled file ------------------------------------------------------------------


def _read(blob: Blob, at: int, target: memoryview) -> None:
    if blob.file is None:
        target[:] = blob.read(at, len(target))
    else:
        blob.read_into(at, target)


_Part = tuple[tuple[int, ...], tuple[int, ...], Blob, int]  # offsets, sizes, blob, at (bytes)


def _fill(out: _Bytes, start: int, shape: tuple[int, ...], parts: Sequence[_Part]) -> None:
    """Bytes ``start .. start + len(out)`` of the row-major byte array ``shape``, from
    ``parts`` (which tile it): whole rows by one strided copy per part, a partial row
    at either end by the same one dimension down."""
    end = start + len(out)
    if len(shape) == 1:
        for offsets, sizes, blob, at in parts:
            low, high = max(start, offsets[0]), min(end, offsets[0] + sizes[0])
            if low < high:
                _read(blob, at + low - offsets[0], out[low - start:high - start].data)
        return
    inner = math.prod(shape[1:])
    first, last = -(-start // inner), end // inner  # the whole rows: first .. last
    if first > last:  # inside one row
        _row(out, start, shape, parts, start // inner)
        return
    if start < first * inner:
        _row(out[:first * inner - start], start, shape, parts, first - 1)
    if first < last:
        _rows(out[first * inner - start:last * inner - start], first, last, shape, parts)
    if last * inner < end:
        _row(out[last * inner - start:], last * inner, shape, parts, last)


def _row(out: _Bytes, start: int, shape: tuple[int, ...], parts: Sequence[_Part],
         row: int) -> None:
    inner = math.prod(shape[1:])
    within = [(offsets[1:], sizes[1:], blob, at + (row - offsets[0]) * math.prod(sizes[1:]))
              for offsets, sizes, blob, at in parts if offsets[0] <= row < offsets[0] + sizes[0]]
    _fill(out, start - row * inner, shape[1:], within)


def _rows(out: _Bytes, first: int, last: int, shape: tuple[int, ...],
          parts: Sequence[_Part]) -> None:
    import numpy as np

    inner = math.prod(shape[1:])
    grid = out.reshape(last - first, *shape[1:])
    for offsets, sizes, blob, at in parts:
        low, high = max(first, offsets[0]), min(last, offsets[0] + sizes[0])
        if low >= high:
            continue
        row = math.prod(sizes[1:])
        source = at + (low - offsets[0]) * row
        if sizes[1:] == shape[1:]:  # whole rows: contiguous in the tensor too
            _read(blob, source, out[(low - first) * inner:(high - first) * inner].data)
            continue
        taken = np.empty((high - low) * row, dtype=np.uint8)  # every byte read just below
        _read(blob, source, taken.data)
        grid[(slice(low - first, high - first),
              *(slice(o, o + n) for o, n in zip(offsets[1:], sizes[1:], strict=True)))] = \
            taken.reshape(high - low, *sizes[1:])


class GridFile(SourceFile):
    """Pieces of other files' bytes, read as one file: the assembled tensor's canonical
    bytes. Built only from pieces ``check_tiling`` proved to tile the tensor."""

    def __init__(self, path: Path, frame: tuple[int, ...], itemsize: int,  # noqa: D107
                 boxes: Sequence[Box]) -> None:
        self.path, self.fd = path, -1
        shape = (*frame, itemsize)
        parts = [((*b.offsets, 0), (*b.sizes, itemsize), b.blob, b.at) for b in boxes]
        keep = max([0] + [d + 1 for d in range(len(frame)) if any(  # trailing whole dims
            (p[0][d], p[1][d]) != (0, frame[d]) for p in parts)])  # become one byte row
        tail = math.prod(shape[keep:])
        self.shape = (*shape[:keep], tail)
        self.parts = [((*o[:keep], 0), (*n[:keep], tail), blob, at) for o, n, blob, at in parts]
        self.blobs = tuple(b.blob for b in boxes)
        self.size = math.prod(self.shape)
        self.snapshot = (0, 0, self.size, 0)
        self._lock = threading.Lock()
        self._mapped: object = None

    def read(self, offset: int, n: int) -> bytes:
        buffer = bytearray(max(n, 0))
        self.read_into(offset, memoryview(buffer))
        return bytes(buffer)

    def read_into(self, offset: int, buffer: memoryview) -> None:
        import numpy as np

        if offset < 0 or offset + len(buffer) > self.size:
            raise InputError(f"bytes {offset}..{offset + len(buffer)} lie outside the "
                             f"{self.size} bytes of the assembled tensor", self.path)
        if len(buffer):
            _fill(np.frombuffer(buffer.cast("B"), dtype=np.uint8), offset, self.shape,
                  self.parts)

    def changed(self) -> bool:
        return any(blob.file is not None and blob.file.changed() for blob in self.blobs)

    def torch_storage(self) -> object:
        """The assembled bytes as one private storage: the whole tensor, made when asked."""
        with self._lock:
            if self._mapped is None:
                import torch

                data = bytearray(self.read(0, self.size))
                self._mapped = torch.frombuffer(data, dtype=torch.uint8).untyped_storage() \
                    if data else torch.UntypedStorage(0)  # type: ignore[no-untyped-call]
            return self._mapped

    def close(self) -> None:
        self.fd = -1


def _inside(box: Box, nbytes: int, name: str, where: Path) -> None:
    """A piece's bytes lie inside its storage and its file (a cut file is refused now,
    not halfway through writing)."""
    blob = box.blob
    end = box.at + nbytes
    if box.at < 0 or end > blob.size or (
            blob.file is not None and blob.offset + end > blob.file.size):
        raise TilingError(f"{name}: its piece in {box.origin} needs bytes {box.at}..{end} "
                          f"of a storage of {blob.size} (a truncated or lying shard)", where)


def assemble(name: str, where: Path, dtype: DType, shape: tuple[int, ...],
             boxes: Iterable[Box], requires_grad: bool = False,
             frame: tuple[int, ...] | None = None) -> TensorInfo:
    """A described tensor whose canonical bytes are ``boxes``, proven to tile it.

    ``frame`` is the shape the boxes are placed in: the tensor's own (shards), or
    its flattening (``(numel,)``: ZeRO's flat partitions).
    """
    frame = shape if frame is None else frame
    if math.prod(frame) != math.prod(shape):
        raise TilingError(f"{name}: pieces placed in {list(frame)} cannot make "
                          f"{list(shape)}", where)
    pieces = [box for box in boxes if math.prod(box.sizes)]
    check_tiling(name, where, frame, ((b.offsets, b.sizes, b.origin) for b in pieces))
    for box in pieces:
        _inside(box, math.prod(box.sizes) * dtype.itemsize, name, where)
    total = math.prod(shape) * dtype.itemsize
    if len(pieces) == 1 and pieces[0].blob.file is not None:
        box = pieces[0]  # one piece: a plain range of its file, nothing to stitch
        blob = Blob(box.blob.file, box.blob.offset + box.at, total, name=box.blob.name)
    else:
        blob = Blob(GridFile(where, frame, dtype.itemsize, pieces), 0, total, name=name)
    storage = StorageInfo(name, "cpu", dtype, total, blob)
    return TensorInfo(dtype, shape, contiguous_strides(shape), 0, storage, requires_grad)
