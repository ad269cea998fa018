"""A strict parse of a torch zip archive: one layout every zip reader agrees on.

torch's reader (miniz: case-insensitive names, C strings, the central
directory it finds from the end), Python's ``zipfile`` (case-sensitive,
tolerant of a prefix) and a scanner walking local headers can each see a
different file in one crafted archive: members that differ only in case,
names with an embedded NUL, duplicate names, a second central directory,
junk before the first member, local headers that disagree with the
directory. This parser accepts exactly the layout ``torch.save`` writes,
where all of them must agree, and refuses everything else:

- the end-of-central-directory record at the very end (no comment), the
  zip64 records right before it when present, one directory;
- members that tile the file: the first at byte 0, each local header,
  data and data descriptor right after the previous one, the directory
  right after the last, no gaps, no overlaps;
- every local header equal to its directory entry (name, method, flags,
  sizes and CRC, or a matching data descriptor);
- unencrypted members with printable ASCII names, unique even ignoring
  case, all below one top folder; stored, or deflated (TorchScript
  compresses its code). A deflated member is inflated on reading, bounded
  by the size the directory declares and checked against its CRC; readers
  refuse a deflated storage record, which ``torch.load(mmap=True)`` would
  map as raw bytes while plain ``torch.load`` inflates it.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from ..errors import InputError
from ..sources import SourceFile

__all__ = ["ZipRecord", "ZipArchive", "parse_zip", "ZIP_MAGIC"]

ZIP_MAGIC = b"PK\x03\x04"
_EOCD = struct.Struct("<4sHHHHIIH")
_Z64_LOCATOR = struct.Struct("<4sIQI")
_Z64_EOCD = struct.Struct("<4sQHHIIQQQQ")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_ALLOWED_FLAGS = 0x0808  # data descriptor, UTF-8 names
_MAX_RECORDS = 1_000_000
_U32, _U16 = 0xFFFFFFFF, 0xFFFF


@dataclass(frozen=True)
class ZipRecord:
    """One member: where its bytes are and what the directory says of them."""

    name: str  # the member's full name: ``archive/data/0``
    data_offset: int
    size: int
    crc32: int
    compressed: int = -1  # bytes stored, when deflated; -1 when stored as is

    @property
    def stored(self) -> bool:
        return self.compressed < 0


@dataclass(frozen=True)
class ZipArchive:
    source: SourceFile
    top: str  # the one top folder (``archive``)
    records: dict[str, ZipRecord]

    def read(self, name: str) -> bytes:
        """A member's bytes; a deflated one inflated, its size and CRC checked."""
        record = self.records[name]
        if record.stored:
            return self.source.read(record.data_offset, record.size)
        inflater = zlib.decompressobj(-15)
        try:
            data = inflater.decompress(self.source.read(record.data_offset, record.compressed),
                                       record.size + 1)
        except zlib.error as exc:
            raise InputError(f"member {record.name} does not inflate: {exc}",
                             self.source.path) from None
        if len(data) != record.size or zlib.crc32(data) != record.crc32:
            raise InputError(f"member {record.name} inflates to other bytes than its "
                             "directory entry declares", self.source.path)
        return data


class _Refuse(Exception):
    """The archive is one readers could see differently."""


class _Truncated(_Refuse):
    """The archive is cut short or damaged."""


def parse_zip(source: SourceFile) -> ZipArchive:
    """The archive's members, or an ``InputError`` naming what makes it ambiguous."""
    try:
        return _parse(source)
    except _Truncated as exc:
        raise InputError(f"corrupt or truncated zip archive: {exc}", source.path) from None
    except _Refuse as exc:
        raise InputError(f"zip archive refused: {exc}", source.path) from None
    except (struct.error, UnicodeDecodeError) as exc:
        raise InputError(f"corrupt zip archive: {exc}", source.path) from None


def _parse(source: SourceFile) -> ZipArchive:
    size = source.size
    if size < _EOCD.size:
        raise _Truncated("too short to hold a central directory")
    tail_start = max(0, size - 4096)
    tail = source.read(tail_start, size - tail_start)
    eocd_at = size - _EOCD.size
    (sig, disk, cd_disk, disk_entries, entries, cd_size, cd_offset,
     comment) = _EOCD.unpack_from(tail, eocd_at - tail_start)
    if sig != b"PK\x05\x06" or comment:
        raise _Truncated("the end-of-central-directory record is not the last 22 bytes "
                         "(truncated, a trailing comment, or data appended after the archive)")
    if disk or cd_disk or disk_entries != entries:
        raise _Refuse("a multi-disk archive")
    directory_end = eocd_at
    locator_at = eocd_at - _Z64_LOCATOR.size
    if locator_at >= 0 and source.read(locator_at, 4) == b"PK\x06\x07":
        entries, cd_size, cd_offset, directory_end = _zip64(source, locator_at)
    elif _U32 in (cd_size, cd_offset) or entries == _U16:
        raise _Refuse("zip64 sizes without a zip64 end record")
    if entries > _MAX_RECORDS:
        raise _Refuse(f"{entries} members")
    if cd_offset + cd_size != directory_end:
        raise _Refuse("the central directory does not end where the end record starts "
                      "(a second directory, or bytes hidden between them)")
    directory = source.read(cd_offset, cd_size)
    members = _directory(directory, entries)
    records = _tile(source, members, cd_offset)
    top = _top_folder(records)
    return ZipArchive(source, top, {name[len(top) + 1:]: record
                                    for name, record in records.items()})


def _zip64(source: SourceFile, locator_at: int) -> tuple[int, int, int, int]:
    sig, disk, record_at, disks = _Z64_LOCATOR.unpack(source.read(locator_at,
                                                                  _Z64_LOCATOR.size))
    if disk or disks != 1 or record_at + _Z64_EOCD.size != locator_at:
        raise _Refuse("a zip64 end record that is not right before its locator")
    (sig, record_size, _made, _needed, disk_no, cd_disk, disk_entries, entries, cd_size,
     cd_offset) = _Z64_EOCD.unpack(source.read(record_at, _Z64_EOCD.size))
    if sig != b"PK\x06\x06" or record_size != _Z64_EOCD.size - 12 or disk_no or cd_disk \
            or disk_entries != entries:
        raise _Refuse("a malformed zip64 end record")
    return entries, cd_size, cd_offset, record_at


@dataclass(frozen=True)
class _Member:
    raw_name: bytes
    name: str
    flags: int
    method: int
    crc32: int
    size: int
    compressed: int
    local_offset: int


def _directory(data: bytes, entries: int) -> list[_Member]:
    members, pos = [], 0
    for _ in range(entries):
        if data[pos:pos + 4] != b"PK\x01\x02":
            raise _Refuse("a central directory entry without its signature")
        (_, _made, _needed, flags, method, _time, _date, crc, compressed, size, name_len,
         extra_len, comment_len, disk, _internal, _external,
         offset) = _CENTRAL.unpack_from(data, pos)
        start = pos + _CENTRAL.size
        raw = data[start:start + name_len]
        extra = data[start + name_len:start + name_len + extra_len]
        pos = start + name_len + extra_len + comment_len
        if pos > len(data) or len(raw) != name_len:
            raise _Refuse("a central directory entry runs past the directory")
        if comment_len or disk:
            raise _Refuse(f"member {raw!r} has a comment or sits on another disk")
        size, compressed, offset = _zip64_extra(extra, size, compressed, offset, raw)
        members.append(_Member(raw, _name(raw), flags, method, crc, size, compressed, offset))
    if pos != len(data):
        raise _Refuse(f"{len(data) - pos} unexplained bytes in the central directory")
    return members


def _zip64_extra(extra: bytes, size: int, compressed: int, offset: int,
                 name: bytes) -> tuple[int, int, int]:
    """Sizes and offset from the zip64 extra field, where the 32-bit fields say so."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4:pos + 4 + length]
        pos += 4 + length
        if tag != 0x0001:
            continue
        values = list(struct.unpack_from(f"<{len(body) // 8}Q", body))
        if size == _U32 and values:
            size = values.pop(0)
        if compressed == _U32 and values:
            compressed = values.pop(0)
        if offset == _U32 and values:
            offset = values.pop(0)
    if pos != len(extra):
        raise _Refuse(f"member {name!r} has a malformed extra field")
    if _U32 in (size, compressed, offset):
        raise _Refuse(f"member {name!r} needs zip64 sizes it does not carry")
    return size, compressed, offset


def _name(raw: bytes) -> str:
    """A member name every reader spells alike: printable ASCII, no tricks."""
    if not raw or any(b < 0x21 or b > 0x7E for b in raw) or b"\\" in raw:
        raise _Refuse(f"member name {raw!r} is not printable ASCII (a NUL or control byte "
                      "makes readers disagree on it)")
    name = raw.decode("ascii")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise _Refuse(f"member name {name!r} is not a plain relative path")
    return name


def _tile(source: SourceFile, members: list[_Member], cd_offset: int
          ) -> dict[str, ZipRecord]:
    records: dict[str, ZipRecord] = {}
    folded: set[str] = set()
    position = 0
    for member in sorted(members, key=lambda m: m.local_offset):
        if member.name in records or member.name.lower() in folded:
            raise _Refuse(f"member {member.name!r} appears twice (names must differ even "
                          "ignoring case: torch's reader does not tell case apart)")
        folded.add(member.name.lower())
        if member.flags & ~_ALLOWED_FLAGS:
            raise _Refuse(f"member {member.name!r} is encrypted or uses unsupported flags")
        if member.method not in (0, 8) or (member.method == 0 and
                                           member.compressed != member.size):
            raise _Refuse(f"member {member.name!r} uses compression method {member.method}")
        if member.local_offset != position:
            raise _Refuse(f"member {member.name!r} starts at byte {member.local_offset}, "
                          f"expected {position} (bytes hidden before it, or members overlap)")
        data_offset, position = _local(source, member)
        records[member.name] = ZipRecord(member.name, data_offset, member.size, member.crc32,
                                         member.compressed if member.method else -1)
    if position != cd_offset:
        raise _Refuse(f"{cd_offset - position} bytes between the last member and the central "
                      "directory")
    if not records:
        raise _Refuse("an archive with no members")
    return records


def _local(source: SourceFile, member: _Member) -> tuple[int, int]:
    """Check ``member``'s local header (and descriptor): (data offset, next member's offset)."""
    header = source.read(member.local_offset, _LOCAL.size)
    (sig, _needed, flags, method, _time, _date, crc, compressed, size, name_len,
     extra_len) = _LOCAL.unpack(header)
    name = source.read(member.local_offset + _LOCAL.size, name_len)
    if sig != ZIP_MAGIC or name != member.raw_name or flags != member.flags or \
            method != member.method:
        raise _Refuse(f"member {member.name!r}: its local header disagrees with the central "
                      "directory (name, flags or method)")
    data_offset = member.local_offset + _LOCAL.size + name_len + extra_len
    data_end = data_offset + member.compressed
    if data_end > source.size:
        raise _Truncated(f"member {member.name!r} runs past the end of the file")
    found = (crc, compressed, size)
    expected = (member.crc32, member.compressed, member.size)
    if not flags & 0x08:
        if found not in (expected, (member.crc32, _U32, _U32)):
            raise _Refuse(f"member {member.name!r}: its local header's sizes or CRC disagree "
                          "with the central directory")
        return data_offset, data_end
    if found not in ((0, 0, 0), expected):
        raise _Refuse(f"member {member.name!r}: its local header's sizes disagree with the "
                      "central directory")
    return data_offset, data_end + _descriptor(source, member, data_end)


def _descriptor(source: SourceFile, member: _Member, at: int) -> int:
    """Length of the data descriptor at ``at``, checked against the directory."""
    head = source.read(at, min(24, source.size - at))
    body = head[4:] if head[:4] == b"PK\x07\x08" else head
    skip = len(head) - len(body)
    for width, fmt in ((8, "<IQQ"), (4, "<III")):
        length = 4 + 2 * width
        if len(body) >= length and struct.unpack_from(fmt, body) == (
                member.crc32, member.compressed, member.size):
            return skip + length
    raise _Refuse(f"member {member.name!r}: its data descriptor disagrees with the central "
                  "directory")


def _top_folder(records: dict[str, ZipRecord]) -> str:
    first = next(iter(records))
    top, slash, _ = first.partition("/")
    if not slash or not all(name.startswith(f"{top}/") for name in records):
        raise _Refuse("members outside one top folder (torch reads the first member's folder)")
    return top
