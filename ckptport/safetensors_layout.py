"""The safetensors file layout, parsed and written without torch.

An 8-byte little-endian header length, a JSON header, then raw tensor
bytes. ckptport writes the header itself because ``safetensors.save_file``
orders metadata keys differently from one process to the next; here keys
are sorted and the header padded with spaces to 8 bytes, so the same input
gives the same bytes. Parsing checks every claim of the header against the
file before anything is allocated.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

__all__ = ["ITEMSIZE", "Entry", "Header", "parse_header", "encode_header", "MAX_HEADER"]

MAX_HEADER = 100_000_000  # the safetensors library's own limit

ITEMSIZE: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "C64": 8,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
}


@dataclass(frozen=True)
class Entry:
    """One tensor's record: dtype code, shape, byte range relative to the data."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Header:
    metadata: Mapping[str, str]
    entries: Mapping[str, Entry]
    data_start: int


def parse_header(path: Path) -> Header:
    """The validated header of a safetensors file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        raw_len = f.read(8)
        if len(raw_len) < 8:
            raise InputError("truncated safetensors file (no header length)", path)
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > MAX_HEADER or header_len > size - 8:
            raise InputError(f"safetensors header length {header_len} is impossible for a "
                             f"{size}-byte file", path)
        raw = f.read(header_len)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"safetensors header is not valid JSON: {exc}", path) from None
    if not isinstance(doc, dict):
        raise InputError("safetensors header is not a JSON object", path)
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise InputError("safetensors __metadata__ must map strings to strings", path)
    data_start = 8 + header_len
    data_len = size - data_start
    entries = {name: _entry(path, name, info, data_len) for name, info in doc.items()}
    _check_coverage(path, entries, data_len)
    return Header(metadata=metadata, entries=entries, data_start=data_start)


def _entry(path: Path, name: str, info: object, data_len: int) -> Entry:
    if not isinstance(info, dict):
        raise InputError(f"safetensors entry {name!r} is not an object", path)
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise InputError(f"tensor {name!r} has unsupported dtype {dtype!r}", path)
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise InputError(f"tensor {name!r} has an invalid shape {shape!r}", path)
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise InputError(f"tensor {name!r} has invalid data_offsets {offsets!r}", path)
    start, end = offsets
    expected = math.prod(shape) * ITEMSIZE[dtype]
    if end - start != expected:
        raise InputError(f"tensor {name!r} declares {expected} bytes for shape {shape} "
                         f"but its data_offsets span {end - start}", path)
    if end > data_len:
        raise InputError(f"tensor {name!r} reaches byte {end} past the end of the data "
                         f"({data_len} bytes; truncated file?)", path)
    return Entry(dtype=dtype, shape=tuple(shape), start=start, end=end)


def _check_coverage(path: Path, entries: Mapping[str, Entry], data_len: int) -> None:
    position = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].start, item[1].end)):
        if entry.start != position:
            raise InputError(f"tensor {name!r} starts at byte {entry.start}, expected "
                             f"{position} (overlapping or gapped data)", path)
        position = entry.end
    if position != data_len:
        raise InputError(f"safetensors data has {data_len - position} trailing bytes "
                         f"beyond the last tensor", path)


def encode_header(metadata: Mapping[str, str], entries: Mapping[str, Entry]) -> bytes:
    """Length prefix and JSON header, keys sorted, padded to 8 bytes."""
    doc: dict[str, object] = {}
    if metadata:
        doc["__metadata__"] = dict(sorted(metadata.items()))
    for name, entry in entries.items():
        doc[name] = {"dtype": entry.dtype, "shape": list(entry.shape),
                     "data_offsets": [entry.start, entry.end]}
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw
