"""The safetensors layout, parsed strictly and written deterministically, without torch.

An 8-byte little-endian header length, a JSON header, then raw tensor
bytes. Parsing checks every claim of the header before anything is
allocated, and refuses headers on which JSON parsers could disagree with
the safetensors library (Rust ``serde_json``): duplicate keys, ``NaN``
literals, lone surrogates, integers beyond 64 bits, booleans where numbers
belong. Every field is type-checked. ckptport writes the header itself
because ``safetensors.save_file`` orders metadata keys differently from one
process to the next: keys sorted, padded with spaces to 8 bytes.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from ..dtypes import DType, by_safetensors
from ..errors import InputError
from ..sources import SourceFile

__all__ = ["Entry", "Header", "parse_header", "encode_header", "MAX_HEADER", "METADATA_KEY"]

MAX_HEADER = 100_000_000  # the safetensors library's own limit
METADATA_KEY = "__metadata__"
_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Entry:
    """One tensor's record: dtype, shape (as torch counts it), byte range relative to the data.

    For packed sub-byte dtypes the header counts values and torch counts
    units (``float4_e2m1fn_x2``: one byte, two values): ``header_shape`` is
    what the file says, ``shape`` what a reader gets.
    """

    dtype: DType
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def code(self) -> str:
        assert self.dtype.safetensors is not None
        return self.dtype.safetensors

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def header_shape(self) -> tuple[int, ...]:
        if self.dtype.packing == 1:
            return self.shape
        return (*self.shape[:-1], self.shape[-1] * self.dtype.packing)


@dataclass(frozen=True)
class Header:
    metadata: Mapping[str, str]
    entries: Mapping[str, Entry]  # in file order
    data_start: int


class _Refuse(ValueError):
    pass


def _pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k in keys if keys.count(k) > 1)
        raise _Refuse(f"the JSON header names {duplicate!r} twice")
    return dict(pairs)


def _constant(name: str) -> NoReturn:
    raise _Refuse(f"the JSON header holds {name}, which is not JSON")


def _integer(text: str) -> int:
    value = int(text)
    if not -_U64 <= value <= _U64:
        raise _Refuse(f"the JSON header holds the integer {text[:30]}, beyond 64 bits")
    return value


def _strings_ok(value: object) -> None:
    """Lone surrogates decode in Python's json but not in the library's."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise _Refuse("the JSON header holds an invalid unicode escape") from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def parse_header(source: SourceFile) -> Header:
    """The validated header of a safetensors file."""
    try:
        return _parse(source)
    except _Refuse as exc:
        raise InputError(f"safetensors header refused: {exc}", source.path) from None


def _parse(source: SourceFile) -> Header:
    size = source.size
    if size < 8:
        raise InputError("truncated safetensors file (no header length)", source.path)
    (header_len,) = struct.unpack("<Q", source.read(0, 8))
    if header_len > MAX_HEADER or header_len > size - 8:
        raise InputError(f"safetensors header length {header_len} is impossible for a "
                         f"{size}-byte file", source.path)
    raw = source.read(8, header_len)
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant,
                         parse_int=_integer)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"safetensors header is not valid JSON: {exc}", source.path) from None
    if not isinstance(doc, dict):
        raise _Refuse("the header is not a JSON object")
    _strings_ok(doc)
    metadata = doc.pop(METADATA_KEY, None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise _Refuse("__metadata__ must map strings to strings")
    data_start = 8 + header_len
    data_len = size - data_start
    entries = {name: _entry(name, info, data_len) for name, info in doc.items()}
    ordered = dict(sorted(entries.items(), key=lambda item: (item[1].start, item[1].end)))
    _check_coverage(ordered, data_len)
    return Header(metadata=metadata, entries=ordered, data_start=data_start)


def _entry(name: str, info: object, data_len: int) -> Entry:
    if not isinstance(info, dict):
        raise _Refuse(f"entry {name!r} is not an object")
    code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    dtype = by_safetensors(code) if isinstance(code, str) else None
    if dtype is None or not isinstance(code, str):
        raise _Refuse(f"tensor {name!r} has unsupported dtype {code!r}")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise _Refuse(f"tensor {name!r} has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):
        raise _Refuse(f"tensor {name!r} has invalid data_offsets {offsets!r}")
    start, end = offsets
    units = _units(name, code, dtype, shape)
    expected = math.prod(units) * dtype.itemsize
    if end - start != expected:
        raise _Refuse(f"tensor {name!r} declares {expected} bytes for shape {shape} but its "
                      f"data_offsets span {end - start}")
    if end > data_len:
        raise _Refuse(f"tensor {name!r} reaches byte {end} past the end of the data "
                      f"({data_len} bytes; truncated file?)")
    return Entry(dtype=dtype, shape=units, start=start, end=end)


def _units(name: str, code: str, dtype: DType, shape: list[int]) -> tuple[int, ...]:
    """The header's shape in torch's units: packed values grouped along the last dimension.

    The safetensors library accepts any shape whose bits fill whole bytes;
    torch (and so ckptport, and the library's own torch loader) packs along
    the last dimension, so a last dimension the packing does not divide is
    refused rather than regrouped across rows.
    """
    if dtype.packing == 1:
        return tuple(shape)
    if not shape or shape[-1] % dtype.packing:
        raise _Refuse(f"tensor {name!r} is {code} of shape {shape}: {dtype.packing} values "
                      f"pack into {dtype.itemsize} byte(s) along the last dimension, which "
                      f"{'it does not have' if not shape else 'they do not divide'}")
    return (*shape[:-1], shape[-1] // dtype.packing)


def _check_coverage(entries: Mapping[str, Entry], data_len: int) -> None:
    position = 0
    for name, entry in entries.items():
        if entry.start != position:
            raise _Refuse(f"tensor {name!r} starts at byte {entry.start}, expected {position} "
                          "(overlapping or gapped data)")
        position = entry.end
    if position != data_len:
        raise _Refuse(f"the data has {data_len - position} trailing bytes beyond the last "
                      "tensor")


def encode_header(metadata: Mapping[str, str], entries: Mapping[str, Entry]) -> bytes:
    """Length prefix and JSON header, keys sorted, padded to 8 bytes."""
    doc: dict[str, object] = {}
    if metadata:
        doc[METADATA_KEY] = dict(sorted(metadata.items()))
    for name, entry in entries.items():
        doc[name] = {"dtype": entry.code, "shape": list(entry.header_shape),
                     "data_offsets": [entry.start, entry.end]}
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw
