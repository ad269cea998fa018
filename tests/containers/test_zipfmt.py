"""``ckptport.containers.zipfmt``: the one zip layout every reader agrees on, and each refusal.

Archives are assembled here from their records (``Member`` and ``assemble``
below), so each test changes exactly one field of an otherwise valid
archive; one test parses what ``torch.save`` really writes.
"""

from __future__ import annotations

import dataclasses
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptport.containers.zipfmt import ZipRecord, parse_zip
from ckptport.errors import InputError
from ckptport.sources import MemorySource, open_source

LOCAL = struct.Struct("<4sHHHHHIIIHH")
CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
EOCD = struct.Struct("<4sHHHHIIH")
Z64_EOCD = struct.Struct("<4sQHHIIQQQQ")
Z64_LOCATOR = struct.Struct("<4sIQI")
U32 = 0xFFFFFFFF
DESCRIPTOR_FLAG = 0x08


@dataclasses.dataclass(frozen=True)
class Member:
    """One member as written; ``local``/``central`` override single header fields."""

    name: bytes
    data: bytes = b"payload"
    method: int = 0  # 0 stored, 8 deflated
    flags: int = 0
    local: dict[str, Any] = dataclasses.field(default_factory=dict)
    central: dict[str, Any] = dataclasses.field(default_factory=dict)
    descriptor: bytes | None = None  # after the data; None: the right one when flagged
    before: bytes = b""  # bytes hidden before the local header

    @property
    def stored(self) -> bytes:
        if self.method != 8:
            return self.data
        deflater = zlib.compressobj(wbits=-15)
        return deflater.compress(self.data) + deflater.flush()

    def fields(self) -> dict[str, Any]:
        return {"flags": self.flags, "method": self.method, "crc": zlib.crc32(self.data),
                "compressed": len(self.stored), "size": len(self.data), "name": self.name,
                "extra": b""}


def _local(member: Member) -> bytes:
    f = {**member.fields(), **({"crc": 0, "compressed": 0, "size": 0}
                              if member.flags & DESCRIPTOR_FLAG else {}), **member.local}
    return LOCAL.pack(b"PK\x03\x04", 20, f["flags"], f["method"], 0, 0, f["crc"],
                      f["compressed"], f["size"], len(f["name"]), len(f["extra"])) \
        + f["name"] + f["extra"]


def _central(member: Member, offset: int) -> bytes:
    f = {**member.fields(), "offset": offset, "comment": b"", "disk": 0, **member.central}
    return CENTRAL.pack(b"PK\x01\x02", 20, 20, f["flags"], f["method"], 0, 0, f["crc"],
                        f["compressed"], f["size"], len(f["name"]), len(f["extra"]),
                        len(f["comment"]), f["disk"], 0, 0, f["offset"]) \
        + f["name"] + f["extra"] + f["comment"]


def _descriptor(member: Member) -> bytes:
    if member.descriptor is not None:
        return member.descriptor
    if not member.flags & DESCRIPTOR_FLAG:
        return b""
    f = member.fields()
    return struct.pack("<4sIII", b"PK\x07\x08", f["crc"], f["compressed"], f["size"])


def assemble(members: list[Member], *, eocd: dict[str, Any] | None = None, zip64: bool = False,
             z64: dict[str, Any] | None = None, between: bytes = b"", tail: bytes = b"") -> bytes:
    """The archive: members, ``between`` them and the directory, the directory, the end."""
    out, directory = b"", b""
    for member in members:
        out += member.before
        directory += _central(member, len(out))
        out += _local(member) + member.stored + _descriptor(member)
    out += between
    f = {"disk": 0, "cd_disk": 0, "disk_entries": len(members), "entries": len(members),
         "cd_size": len(directory), "cd_offset": len(out), "comment": b"", **(eocd or {})}
    cd_offset = len(out)
    out += directory
    if zip64:
        g = {"sig": b"PK\x06\x06", "size": Z64_EOCD.size - 12, "disk": 0, "cd_disk": 0,
             "disk_entries": len(members), "entries": len(members),
             "cd_size": len(directory), "cd_offset": cd_offset, **(z64 or {})}
        record_at = len(out)
        out += Z64_EOCD.pack(g["sig"], g["size"], 45, 45, g["disk"], g["cd_disk"],
                             g["disk_entries"], g["entries"], g["cd_size"], g["cd_offset"])
        out += Z64_LOCATOR.pack(b"PK\x06\x07", 0, g.get("record_at", record_at),
                                g.get("disks", 1))
    return out + EOCD.pack(b"PK\x05\x06", f["disk"], f["cd_disk"], f["disk_entries"],
                           f["entries"], f["cd_size"], f["cd_offset"],
                           len(f["comment"])) + f["comment"] + tail


def torch_like(*extra: Member, **options: Any) -> bytes:
    """A valid archive shaped like ``torch.save``'s, plus ``extra`` members."""
    return assemble([Member(b"archive/data.pkl", b"\x80\x02N."),
                     Member(b"archive/version", b"3\n"), *extra], **options)


def parse(data: bytes) -> Any:
    return parse_zip(MemorySource(Path("ckpt.pth"), data))


def refusal(data: bytes) -> str:
    with pytest.raises(InputError) as caught:
        parse(data)
    message = str(caught.value)
    assert message.startswith("ckpt.pth: ") and "\n" not in message
    return message


# -- what is accepted ---------------------------------------------------------------------


def test_what_torch_save_writes_parses_as_zipfile_sees_it(tmp_path):
    path = tmp_path / "real.pth"
    torch.save({"w": torch.arange(6.0), "b": torch.ones(2)}, path)
    archive = parse_zip(open_source(path))
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        top = infos[0].filename.split("/")[0]
        assert archive.top == top
        assert set(archive.records) == {i.filename[len(top) + 1:] for i in infos}
        for info in infos:
            name = info.filename[len(top) + 1:]
            assert archive.read(name) == zf.read(info)
            assert archive.records[name].crc32 == info.CRC


def test_a_minimal_archive_parses_to_its_records():
    data = torch_like()
    archive = parse(data)
    assert archive.top == "archive"
    header = LOCAL.size + len(b"archive/data.pkl")
    assert archive.records["data.pkl"] == ZipRecord("archive/data.pkl", header, 4,
                                                    zlib.crc32(b"\x80\x02N."))
    assert archive.read("data.pkl") == b"\x80\x02N." and archive.read("version") == b"3\n"


def test_a_deflated_member_is_inflated_and_checked():
    text = b"def forward(self, x):\n    return x\n" * 20
    archive = parse(torch_like(Member(b"archive/code/m.py", text, method=8)))
    record = archive.records["code/m.py"]
    assert not record.stored and record.compressed < record.size == len(text)
    assert archive.read("code/m.py") == text


@pytest.mark.parametrize("method", [0, 8])
def test_data_descriptors_that_match_are_accepted(method):
    member = Member(b"archive/data/0", bytes(range(64)) * 4, method=method,
                    flags=DESCRIPTOR_FLAG)
    assert parse(torch_like(member)).read("data/0") == bytes(range(64)) * 4


def test_a_descriptor_without_its_signature_or_with_zip64_sizes_is_accepted():
    payload = b"abcd" * 8
    crc = zlib.crc32(payload)
    for descriptor in (struct.pack("<III", crc, 32, 32),
                       struct.pack("<4sIQQ", b"PK\x07\x08", crc, 32, 32)):
        member = Member(b"archive/data/0", payload, flags=DESCRIPTOR_FLAG,
                        descriptor=descriptor)
        assert parse(torch_like(member)).read("data/0") == payload


def test_zip64_end_records_are_followed():
    archive = parse(torch_like(zip64=True, eocd={"entries": 0xFFFF, "disk_entries": 0xFFFF,
                                                 "cd_size": U32, "cd_offset": U32}))
    assert set(archive.records) == {"data.pkl", "version"}


def test_zip64_extra_fields_give_the_sizes():
    payload = b"z" * 10
    extra = struct.pack("<HHQQ", 0x0001, 16, len(payload), len(payload))
    member = Member(b"archive/data/0", payload,
                    central={"size": U32, "compressed": U32, "extra": extra},
                    local={"size": U32, "compressed": U32})
    assert parse(torch_like(member)).records["data/0"].size == 10


# -- the end of central directory ------------------------------------------------------------


@pytest.mark.parametrize("options", [{"eocd": {"comment": b"hi"}}, {"tail": b"appended"}])
def test_the_end_record_must_be_the_last_22_bytes(options):
    assert "corrupt or truncated zip archive: the end-of-central-directory record is not " \
        "the last 22 bytes" in refusal(torch_like(**options))


def test_too_short_for_an_end_record():
    assert "too short to hold a central directory" in refusal(b"PK\x05\x06")


@pytest.mark.parametrize("field, value", [("disk", 1), ("cd_disk", 1), ("disk_entries", 1)])
def test_multi_disk_archives_are_refused(field, value):
    assert "zip archive refused: a multi-disk archive" in refusal(torch_like(eocd={field: value}))


@pytest.mark.parametrize("field", ["cd_size", "cd_offset", "entries"])
def test_zip64_sizes_without_a_zip64_record_are_refused(field):
    value = 0xFFFF if field == "entries" else U32
    eocd = {field: value, **({"disk_entries": value} if field == "entries" else {})}
    assert "zip64 sizes without a zip64 end record" in refusal(torch_like(eocd=eocd))


@pytest.mark.parametrize("z64, message", [
    ({"record_at": 0}, "a zip64 end record that is not right before its locator"),
    ({"disks": 2}, "a zip64 end record that is not right before its locator"),
    ({"sig": b"PK\x06\x05"}, "a malformed zip64 end record"),
    ({"size": 0}, "a malformed zip64 end record"),
    ({"disk_entries": 1}, "a malformed zip64 end record"),
    ({"entries": 3, "disk_entries": 3}, "a central directory entry without its signature"),
    ({"cd_offset": 1}, "the central directory does not end where the end record starts"),
])
def test_a_zip64_record_that_disagrees_is_refused(z64, message):
    assert message in refusal(torch_like(zip64=True, z64=z64))


# -- the directory: no gaps, no overlaps, nothing hidden -------------------------------------


def test_bytes_between_the_directory_and_the_end_record_are_refused():
    data = torch_like(eocd={"cd_offset": 0})  # the directory would end before the end record
    assert "the central directory does not end where the end record starts" in refusal(data)


def test_bytes_between_the_last_member_and_the_directory_are_refused():
    assert "7 bytes between the last member and the central directory" in refusal(
        torch_like(between=b"hidden!"))


def test_bytes_before_the_first_member_are_refused():
    data = assemble([Member(b"archive/data.pkl", before=b"JUNK")])
    assert "member 'archive/data.pkl' starts at byte 4, expected 0" in refusal(data)


def test_a_gap_between_members_is_refused():
    data = torch_like(Member(b"archive/data/0", before=b"gap"))
    assert "member 'archive/data/0' starts at byte" in refusal(data)
    assert "(bytes hidden before it, or members overlap)" in refusal(data)


def test_overlapping_members_are_refused():
    data = torch_like(Member(b"archive/data/0", central={"offset": 0}))
    assert "member 'archive/data/0' starts at byte 0, expected 50 (bytes hidden before it, " \
        "or members overlap)" in refusal(data)


def test_unexplained_directory_bytes_are_refused():
    data = torch_like(eocd={"entries": 1, "disk_entries": 1})
    assert "unexplained bytes in the central directory" in refusal(data)


def test_an_entry_running_past_the_directory_is_refused():
    data = bytearray(assemble([Member(b"archive/x")]))
    entry = data.index(b"PK\x01\x02")
    struct.pack_into("<H", data, entry + 28, 200)  # its name length, past the directory
    assert "a central directory entry runs past the directory" in refusal(bytes(data))


def test_a_malformed_extra_field_is_refused():
    member = Member(b"archive/x", central={"extra": b"\x09\x00\x08\x00abc"})
    assert "member b'archive/x' has a malformed extra field" in refusal(torch_like(member))


def test_zip64_sizes_missing_from_the_extra_field_are_refused():
    member = Member(b"archive/x", central={"size": U32})
    assert "member b'archive/x' needs zip64 sizes it does not carry" in refusal(
        torch_like(member))


def test_a_member_comment_or_disk_is_refused():
    for central in ({"comment": b"note"}, {"disk": 1}):
        member = Member(b"archive/x", central=central)
        assert "has a comment or sits on another disk" in refusal(torch_like(member))


def test_an_archive_without_members_is_refused():
    assert "an archive with no members" in refusal(assemble([]))


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("second", [b"archive/data.pkl", b"archive/DATA.pkl",
                                    b"archive/Data.PKL"])
def test_duplicate_names_even_ignoring_case_are_refused(second):
    data = assemble([Member(b"archive/data.pkl"), Member(second)])
    assert "appears twice (names must differ even ignoring case" in refusal(data)


@pytest.mark.parametrize("name", [b"archive/data.pkl\x00x", b"archive/da ta", b"archive/\x7f",
                                  b"archive\\data.pkl", b"archive/d\xc3\xa9", b""])
def test_names_that_are_not_printable_ascii_are_refused(name):
    assert f"member name {name!r} is not printable ASCII" in refusal(
        torch_like(Member(name)))


@pytest.mark.parametrize("name", ["/archive/x", "archive//x", "archive/./x", "archive/../x",
                                  "archive/x/"])
def test_names_that_are_not_plain_relative_paths_are_refused(name):
    assert f"member name {name!r} is not a plain relative path" in refusal(
        torch_like(Member(name.encode())))


@pytest.mark.parametrize("names", [[b"archive/data.pkl", b"other/version"], [b"data.pkl"]])
def test_members_outside_one_top_folder_are_refused(names):
    data = assemble([Member(name) for name in names])
    assert "members outside one top folder" in refusal(data)


# -- each local header agrees with its directory entry ---------------------------------------


@pytest.mark.parametrize("local", [{"name": b"archive/data.pkX"}, {"flags": 0x0800},
                                   {"method": 8}])
def test_a_local_header_disagreeing_on_name_flags_or_method_is_refused(local):
    data = torch_like(Member(b"archive/x", local=local))
    assert "member 'archive/x': its local header disagrees with the central directory " \
        "(name, flags or method)" in refusal(data)


def test_a_local_header_without_its_signature_is_refused():
    data = torch_like(Member(b"archive/x"))
    broken = data.replace(b"PK\x03\x04", b"PK\x03\x05", 3)  # the third member's header
    assert "its local header disagrees" in refusal(broken)


@pytest.mark.parametrize("local", [{"crc": 1}, {"size": 3}, {"compressed": 3}])
def test_a_local_header_disagreeing_on_sizes_or_crc_is_refused(local):
    data = torch_like(Member(b"archive/x", local=local))
    assert "member 'archive/x': its local header's sizes or CRC disagree" in refusal(data)


def test_a_flagged_local_header_with_other_sizes_is_refused():
    member = Member(b"archive/x", flags=DESCRIPTOR_FLAG, local={"size": 1})
    assert "its local header's sizes disagree with the central directory" in refusal(
        torch_like(member))


@pytest.mark.parametrize("descriptor", [
    struct.pack("<4sIII", b"PK\x07\x08", 0, 7, 7),  # wrong CRC
    struct.pack("<4sIII", b"PK\x07\x08", zlib.crc32(b"payload"), 6, 7),  # wrong size
    b"",  # none at all
])
def test_a_data_descriptor_that_disagrees_is_refused(descriptor):
    member = Member(b"archive/x", flags=DESCRIPTOR_FLAG, descriptor=descriptor)
    assert "member 'archive/x': its data descriptor disagrees with the central directory" \
        in refusal(torch_like(member))


def test_a_member_running_past_the_file_is_truncated():
    member = Member(b"archive/x", central={"compressed": 10_000, "size": 10_000},
                    local={"compressed": 10_000, "size": 10_000})
    assert "corrupt or truncated zip archive: member 'archive/x' runs past the end of the " \
        "file" in refusal(torch_like(member))


# -- flags, methods, deflated members ---------------------------------------------------------


@pytest.mark.parametrize("flags", [0x0001, 0x0040, 0x2000])
def test_encryption_and_other_flags_are_refused(flags):
    member = Member(b"archive/x", flags=flags)
    assert "member 'archive/x' is encrypted or uses unsupported flags" in refusal(
        torch_like(member))


@pytest.mark.parametrize("method", [1, 12, 14, 93])
def test_methods_other_than_stored_and_deflated_are_refused(method):
    member = Member(b"archive/x", method=method)
    assert f"member 'archive/x' uses compression method {method}" in refusal(torch_like(member))


def test_a_stored_member_whose_sizes_differ_is_refused():
    member = Member(b"archive/x", central={"size": 3}, local={"size": 3})
    assert "member 'archive/x' uses compression method 0" in refusal(torch_like(member))


@pytest.mark.parametrize("change, message", [
    ({"crc": 1}, "inflates to other bytes than its directory entry declares"),
    ({"size": 5}, "inflates to other bytes than its directory entry declares"),
    ({"size": 10_000}, "inflates to other bytes than its directory entry declares"),
])
def test_a_deflated_member_is_checked_against_its_crc_and_size(change, message):
    member = Member(b"archive/code/m.py", b"x = 1\n" * 50, method=8, central=change,
                    local=change)
    archive = parse(torch_like(member))
    with pytest.raises(InputError, match=f"member archive/code/m.py {message}"):
        archive.read("code/m.py")


def test_a_deflated_member_that_does_not_inflate_is_refused_on_reading():
    member = Member(b"archive/code/m.py", b"x" * 40, method=8)
    data = torch_like(member)
    stored = member.stored
    broken = data.replace(stored, b"\xff" * len(stored), 1)
    archive = parse(broken)
    with pytest.raises(InputError, match="member archive/code/m.py does not inflate"):
        archive.read("code/m.py")
