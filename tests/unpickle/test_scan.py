"""``ckptport.unpickle.scan``: the bounded opcode walk that runs before anything unpickles.

Each pickle is built here byte by byte (the helpers below), so every test
names exactly the opcode it is about.
"""

from __future__ import annotations

import pickle
import struct

import pytest

from ckptport.unpickle.scan import Scan, ScanError, executes_before, scan

STOP = b"."
NONE = b"N"


def proto(n: int) -> bytes:
    return b"\x80" + bytes([n])


def frame(size: int) -> bytes:
    return b"\x95" + struct.pack("<Q", size)


def short_text(text: str) -> bytes:
    """SHORT_BINUNICODE: a 1-byte length, then UTF-8."""
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def long_binput(index: int) -> bytes:
    return b"r" + struct.pack("<I", index)


def scan_error(data: bytes, start: int = 0) -> ScanError:
    with pytest.raises(ScanError) as caught:
        scan(data, start)
    return caught.value


# -- well-formed pickles -----------------------------------------------------------


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickles_python_writes_scan_to_their_stop(protocol):
    value = {"w": [1.5, -2, None, True], "name": "layer", "blob": b"\x00" * 300,
             "big": 1 << 80, "nested": ((1, 2), frozenset({3}))}
    data = pickle.dumps(value, protocol=protocol)
    assert scan(data) == Scan(0, len(data), protocol if protocol >= 2 else 0)


def test_frames_that_tile_a_big_pickle_scan():
    data = pickle.dumps([bytes(70_000), "x" * 70_000, list(range(20_000))], protocol=4)
    assert data.count(b"\x95") > 1  # pickle really framed it
    assert scan(data).end == len(data)


def test_scan_starts_where_asked_and_stops_at_stop():
    data = b"JUNK" + proto(2) + NONE + STOP + b"after"
    assert scan(data, 4) == Scan(4, 8, 2)


def test_scan_error_is_a_value_error_with_its_position():
    error = scan_error(proto(2) + NONE + b"\xff" + STOP)
    assert isinstance(error, ValueError) and error.position == 3
    assert "byte 3 holds 0xff, not a pickle opcode" in str(error)


@pytest.mark.parametrize("data", [proto(6) + NONE + STOP, proto(255) + STOP])
def test_unknown_protocols_are_refused(data):
    assert f"unsupported pickle protocol {data[1]}" in str(scan_error(data))


def test_a_lone_proto_byte_is_refused():
    assert "unsupported pickle protocol ?" in str(scan_error(b"\x80"))


# -- lengths past the end ------------------------------------------------------------


@pytest.mark.parametrize("opcode, width", [
    (b"\x8e", "<Q"),  # BINBYTES8
    (b"\x96", "<Q"),  # BYTEARRAY8
    (b"\x8d", "<Q"),  # BINUNICODE8
    (b"X", "<I"),  # BINUNICODE
    (b"B", "<I"),  # BINBYTES
    (b"T", "<I"),  # BINSTRING
])
def test_a_length_past_the_end_is_refused_before_allocating(opcode, width):
    declared = (1 << 40) if width == "<Q" else 0xFFFF_FFF0
    data = proto(4) + opcode + struct.pack(width, declared) + b"abc" + STOP
    error = scan_error(data)
    assert f"at byte 2 declares {declared} bytes, past the end of the data" in str(error)
    assert error.position == 2


@pytest.mark.parametrize("framed", [False, True])
def test_a_short_string_past_the_end_is_refused(framed):
    body = b"\x8c\x10abc"  # SHORT_BINUNICODE says 16 bytes, 3 follow
    data = proto(4) + (frame(len(body)) if framed else b"") + body
    assert "declares 16 bytes, past the end of the data" in str(scan_error(data))


def test_a_length_exactly_to_the_end_is_well_formed_until_stop_is_missing():
    data = proto(4) + b"\x8c\x03abc"  # the string ends the data: no STOP after it
    assert "without STOP (truncated)" in str(scan_error(data))


# -- memo index bombs --------------------------------------------------------------


def test_a_memo_index_beyond_the_data_is_a_memory_bomb():
    data = proto(2) + NONE + long_binput(1 << 31) + STOP
    error = scan_error(data)
    assert f"names memo slot {1 << 31} of a {len(data)}-byte pickle (a memory bomb)" in \
        str(error)
    assert error.position == 3


def test_a_memo_index_within_the_data_is_kept():
    data = proto(2) + NONE + long_binput(5) + NONE + long_binput(0) + STOP
    assert scan(data).end == len(data)


# -- frames: lying, nested, crossed, hiding data after STOP -----------------------------


def test_a_frame_claiming_more_than_remains_is_refused():
    data = proto(4) + frame(1 << 40) + NONE + STOP
    assert "a FRAME at byte 2 claims 1099511627776 bytes but only 2 remain" in \
        str(scan_error(data))


def test_a_frame_inside_a_frame_is_refused():
    inner = frame(2) + NONE + STOP
    data = proto(4) + frame(len(inner)) + inner
    assert "a FRAME at byte 11 starts inside another frame" in str(scan_error(data))


def test_an_opcode_crossing_its_frame_end_is_refused():
    data = proto(4) + frame(2) + short_text("abc") + STOP  # the frame ends mid-string
    assert "an opcode at byte 11 crosses the end of its FRAME" in str(scan_error(data))


def test_stop_before_its_frame_ends_hides_data_and_is_refused():
    body = NONE + STOP + proto(2) + NONE + STOP
    data = proto(4) + frame(len(body)) + body
    assert "stops at byte 12, 4 bytes before its FRAME ends" in str(scan_error(data))


def test_frames_back_to_back_are_well_formed():
    first, second = short_text("ab"), NONE + STOP
    data = proto(4) + frame(len(first)) + first + frame(len(second)) + second
    assert scan(data).end == len(data)


# -- opcodes refused, PROTO not first, no STOP --------------------------------------------


@pytest.mark.parametrize("name, body", [
    ("EXT1", b"\x82\x01"), ("EXT2", b"\x83\x01\x00"), ("EXT4", b"\x84\x01\x00\x00\x00"),
    ("NEXT_BUFFER", b"\x97"), ("READONLY_BUFFER", NONE + b"\x98"),
])
def test_opcodes_torch_cannot_load_are_refused(name, body):
    error = scan_error(proto(5) + body + STOP)
    assert f"pickle opcode {name} at byte {error.position} is not supported" in str(error)
    assert error.position == 2 + body.index(body.lstrip(NONE)[:1])


@pytest.mark.parametrize("data, at", [
    (proto(2) + NONE + proto(2) + STOP, 3),
    (b"N" + proto(2) + STOP, 1),  # a protocol-0 pickle switching protocol
    (proto(4) + frame(3) + proto(4) + NONE + STOP, 11),
])
def test_proto_anywhere_but_first_is_refused(data, at):
    assert f"PROTO at byte {at}, after the pickle started" in str(scan_error(data))


@pytest.mark.parametrize("data", [
    b"", proto(2), proto(2) + NONE, b"I12", b"I12\n", b"cos\nsystem", proto(4) + b"\x8e\x01",
    proto(4) + frame(1) + NONE,
])
def test_a_pickle_without_stop_is_truncated(data):
    error = scan_error(data)
    assert f"the pickle ends at byte {len(data)} without STOP (truncated)" in str(error)


# -- executes_before: would a full unpickler have acted before the error? ---------------


def _until_error(data: bytes) -> bool:
    return executes_before(data, scan_error(data).position)


@pytest.mark.parametrize("acting", [
    b"cos\nsystem\n",  # GLOBAL imports
    short_text("os") + short_text("system") + b"\x93",  # STACK_GLOBAL
    b"]" + NONE + b"b",  # BUILD on a list
    b"(" + b"]" + b"o",  # OBJ
])
def test_an_import_or_call_before_the_error_is_execution(acting):
    data = proto(4) + acting + b"\xff"
    assert _until_error(data)


@pytest.mark.parametrize("inert", [
    NONE + b"]" + short_text("a") + b"a",  # plain data
    b"\x93",  # STACK_GLOBAL with nothing on the stack: the unpickler fails there
    b"t",  # TUPLE without a mark
    b"c1bad\nname\n",  # GLOBAL of a module Python could not import
    b"Ixyz\ncos\nsystem\n",  # INT that does not parse stops it before the GLOBAL
])
def test_nothing_imported_or_called_before_the_error_is_not(inert):
    assert not _until_error(proto(2) + inert + b"\xff")


def test_execution_after_the_error_does_not_count():
    data = proto(2) + b"\xff" + b"cos\nsystem\n" + STOP
    assert not _until_error(data)


def test_a_global_cut_by_the_end_does_not_import():
    data = b"cos\nsys"  # the second line never ends
    assert not executes_before(data, len(data))
