"""A bounded walk over a pickle's opcodes before anything unpickles it.

CPython's C unpickler allocates what an opcode declares before checking the
data holds it (``BINBYTES8``, ``BYTEARRAY8``), grows its memo to whatever
index ``LONG_BINPUT`` names (a 10-byte pickle can ask for 32 GB), and
hashes nested tuples recursively in C (a megabyte of ``TUPLE1`` opcodes
overflows the C stack). This walk reads only opcode codes and argument
lengths, so it costs a fraction of unpickling, and refuses before any
allocation:

- argument lengths past the end of the data, memo indexes beyond the data's
  size, FRAMEs that lie, nest or are crossed by an opcode;
- opcodes torch cannot load either (``EXT*``, out-of-band buffers),
  ``PROTO`` anywhere but first, unknown opcodes;
- a pickle with no ``STOP``.

It also returns an upper bound on how deep tuples can nest, from a count
of the bytes that can build one; the engine sizes its C stack from it.
"""

from __future__ import annotations

import pickletools
import re
from dataclasses import dataclass
from typing import Protocol, overload

__all__ = ["Scan", "ScanError", "scan", "tuple_depth_bound", "nesting_depth",
           "executes_before", "Opcodes"]


class Opcodes(Protocol):
    """What ``scan`` and ``executes_before`` read of a pickle: its bytes, or an object
    that reads a file's blocks only as the walk lands on them (``containers.sniff``)."""

    def __len__(self) -> int: ...

    @overload
    def __getitem__(self, item: int) -> int: ...

    @overload
    def __getitem__(self, item: slice) -> bytes: ...

    def find(self, needle: bytes, start: int = ..., end: int | None = ...) -> int: ...

    def index(self, needle: bytes, start: int = ...) -> int: ...


class ScanError(ValueError):
    """The pickle is malformed at ``position``; nothing there may be unpickled."""

    def __init__(self, message: str, position: int, truncated: bool = False) -> None:
        super().__init__(message)
        self.position = position
        self.truncated = truncated  # it ran out of data: more of the file may complete it


@dataclass(frozen=True)
class Scan:
    """A well-formed pickle: ``start``..``end`` (just past ``STOP``), its protocol."""

    start: int
    end: int
    protocol: int


_FIXED, _NEWLINE, _TWO_LINES, _COUNTED1, _COUNTED4, _COUNTED8 = range(6)
_STOP, _PROTO, _FRAME, _LONG_BINPUT, _REFUSED = 6, 7, 8, 9, 10
_REFUSED_OPS = {"EXT1", "EXT2", "EXT4", "NEXT_BUFFER", "READONLY_BUFFER"}


def _tables() -> tuple[list[int], list[int], list[str]]:
    """Per opcode byte: how it is skipped, how many fixed bytes, and its name."""
    kind, width, names = [-1] * 256, [0] * 256, [""] * 256
    for op in pickletools.opcodes:
        code = ord(op.code.encode("latin-1"))
        names[code] = op.name
        arg = op.arg
        if op.name in _REFUSED_OPS:
            kind[code] = _REFUSED
        elif op.name == "STOP":
            kind[code] = _STOP
        elif op.name == "PROTO":
            kind[code], width[code] = _PROTO, 1
        elif op.name == "FRAME":
            kind[code], width[code] = _FRAME, 8
        elif op.name == "LONG_BINPUT":
            kind[code], width[code] = _LONG_BINPUT, 4
        elif arg is None:
            kind[code] = _FIXED
        elif arg.n >= 0:
            kind[code], width[code] = _FIXED, arg.n
        elif arg.n == pickletools.UP_TO_NEWLINE:
            kind[code] = _TWO_LINES if op.name in ("GLOBAL", "INST") else _NEWLINE
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
            kind[code] = _COUNTED1
        elif arg.n in (pickletools.TAKEN_FROM_ARGUMENT4, pickletools.TAKEN_FROM_ARGUMENT4U):
            kind[code] = _COUNTED4
        elif arg.n == pickletools.TAKEN_FROM_ARGUMENT8U:
            kind[code] = _COUNTED8
    return kind, width, names


_KIND, _WIDTH, _NAMES = _tables()
# fixed-size opcodes skip in one table lookup: 1 + their argument bytes
_STEP = [1 + _WIDTH[c] if _KIND[c] == _FIXED else 0 for c in range(256)]
# bytes whose opcode builds a tuple or calls something that may (tuple(), NEWOBJ...)
_TUPLE_MAKERS = tuple(bytes([ord(op.code.encode("latin-1"))]) for op in pickletools.opcodes
                      if op.name in {"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "FROZENSET",
                                     "REDUCE", "NEWOBJ", "NEWOBJ_EX", "OBJ", "INST"})


def tuple_depth_bound(data: bytes | memoryview, start: int, end: int, exact_above: int) -> int:
    """No tuple in the pickle can nest deeper than this (each level needs its own opcode).

    A count of the bytes that could be tuple-making opcodes is a bound that costs one
    pass of ``bytes.count``; it also counts bytes inside string payloads (English text is
    full of ``t``, ``o``, ``i``), so above ``exact_above`` the real nesting is measured
    by walking the opcodes (``nesting_depth``).
    """
    region = bytes(data[start:end])
    rough = sum(region.count(maker) for maker in _TUPLE_MAKERS)
    return rough if rough <= exact_above else nesting_depth(region)


def _opcode_names(*wanted: str) -> frozenset[int]:
    return frozenset(ord(op.code.encode("latin-1")) for op in pickletools.opcodes
                     if op.name in wanted)


_BUILDS_TUPLE = _opcode_names("TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "FROZENSET", "REDUCE",
                              "NEWOBJ", "NEWOBJ_EX", "OBJ", "INST", "BUILD")
_PUTS = _opcode_names("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE")
_GETS = _opcode_names("GET", "BINGET", "LONG_BINGET")
_DUP = _opcode_names("DUP")


def _memo_index(data: bytes, pos: int, after: int, memo_size: int) -> int:
    name = _NAMES[data[pos]]
    if name == "MEMOIZE":
        return memo_size
    if name in ("PUT", "GET"):
        return int(data[pos + 1:after - 1])
    return int.from_bytes(data[pos + 1:after], "little")


def nesting_depth(data: bytes) -> int:
    """How deep tuples (and what calls build from them) nest in a well-formed pickle.

    A stack machine over nesting depths only: a tuple (or a call's result, which
    may be one of its arguments) is one deeper than the deepest item it takes;
    lists and dicts break the chain (hashing stops at them); memo slots keep the
    depth of what they hold.
    """
    stack: list[int] = []
    marks: list[int] = []
    memo: dict[int, int] = {}
    deepest = 0
    pos = 2 if data[:1] == b"\x80" else 0
    end = len(data)
    while pos < end:
        op = data[pos]
        after = _next(data, pos)
        before, takes_mark, pushed, makes_mark = _STACK[op]
        if op in _PUTS:
            memo[_memo_index(data, pos, after, len(memo))] = stack[-1] if stack else 0
        elif op in _GETS:
            stack.append(memo.get(_memo_index(data, pos, after, len(memo)), 0))
        elif op in _DUP:
            stack.append(stack[-1] if stack else 0)
        else:
            taken: list[int] = []
            if takes_mark:
                cut = marks.pop() if marks else 0
                taken, stack = stack[cut:], stack[:cut]
            if before:
                taken += stack[-before:]
                del stack[-before:]
            if makes_mark:
                marks.append(len(stack))
            depth = 1 + max(taken, default=0) if op in _BUILDS_TUPLE else 0
            deepest = max(deepest, depth)
            stack.extend([depth] * pushed)
        pos = after
    return deepest


def _next(data: bytes, pos: int) -> int:
    """Where the opcode after the one at ``pos`` starts (the pickle was scanned already)."""
    op = data[pos]
    kind = _KIND[op]
    if kind == _FIXED or kind in (_PROTO, _FRAME, _LONG_BINPUT):
        return pos + 1 + _WIDTH[op]
    if kind == _COUNTED1:
        return pos + 2 + data[pos + 1]
    if kind == _COUNTED4:
        return pos + 5 + int.from_bytes(data[pos + 1:pos + 5], "little")
    if kind == _COUNTED8:
        return pos + 9 + int.from_bytes(data[pos + 1:pos + 9], "little")
    if kind == _NEWLINE:
        return data.index(b"\n", pos + 1) + 1
    if kind == _TWO_LINES:
        return data.index(b"\n", data.index(b"\n", pos + 1) + 1) + 1
    return pos + 1  # STOP


def _counted(data: Opcodes, pos: int, width: int, end: int) -> int:
    """Past an opcode whose argument is a length and that many bytes; the length checked."""
    start = pos + 1 + width
    if start > end:
        raise IndexError(pos)
    declared = int.from_bytes(data[pos + 1:start], "little")
    if declared > end - start:
        raise ScanError(f"a pickle opcode at byte {pos} declares {declared} bytes, past the end "
                        f"of the data ({end - start} remain)", pos, truncated=True)
    return start + declared


def _protocol(data: Opcodes, start: int, end: int) -> tuple[int, int]:
    """The protocol the pickle's ``PROTO`` declares (0 without one) and where its opcodes
    start."""
    if start >= end or _NAMES[data[start]] != "PROTO":
        return 0, start
    if start + 1 >= end or data[start + 1] > 5:
        shown = data[start + 1] if start + 1 < end else "?"
        raise ScanError(f"unsupported pickle protocol {shown}", start)
    return data[start + 1], start + 2


def _frame(data: Opcodes, at: int, frame_end: int, end: int) -> int:
    """Where the FRAME at ``at`` ends: it may neither nest nor claim more than remains."""
    if at < frame_end:
        raise ScanError(f"a FRAME at byte {at} starts inside another frame", at)
    size = int.from_bytes(data[at + 1:at + 9], "little")
    if size > end - at - 9:
        raise ScanError(f"a FRAME at byte {at} claims {size} bytes but only "
                        f"{end - at - 9} remain", at, truncated=True)
    return at + 9 + size


def _unexpected(kind: int, op: int, at: int) -> ScanError:
    """What an opcode no pickle may hold there says: a late PROTO, a refused or unknown one."""
    if kind == _PROTO:
        return ScanError(f"PROTO at byte {at}, after the pickle started", at)
    if kind == _REFUSED:
        return ScanError(f"pickle opcode {_NAMES[op]} at byte {at} is not supported "
                         "(torch cannot load it either)", at)
    return ScanError(f"byte {at} holds {op:#04x}, not a pickle opcode", at)


def scan(data: Opcodes, start: int = 0) -> Scan:
    """Walk one pickle from ``start``; raise ``ScanError`` where it goes wrong.

    One loop with the common opcodes inline (a call per opcode would cost more than the
    walk: files hold millions); what happens once or never is in the helpers above.
    """
    end = len(data)
    kind, step = _KIND, _STEP
    memo_limit = end  # a real memo index is below the number of opcodes, below the size
    protocol, pos = _protocol(data, start, end)
    frame_end = -1
    try:
        while True:
            op = data[pos]
            skip = step[op]
            if skip and frame_end < 0:
                pos += skip
                continue
            at = pos
            k = kind[op]
            if k == _COUNTED1 and frame_end < 0:  # short strings: most of a big pickle
                pos += 2 + data[pos + 1]
                if pos > end:
                    raise ScanError(f"a pickle opcode at byte {at} declares {pos - at - 2} "
                                    f"bytes, past the end of the data", at, truncated=True)
                continue
            if k == _FIXED:
                pos += skip
            elif k == _COUNTED4:
                pos = _counted(data, pos, 4, end)
            elif k == _COUNTED1:
                pos = _counted(data, pos, 1, end)
            elif k == _LONG_BINPUT:
                index = int.from_bytes(data[pos + 1:pos + 5], "little")
                if index > memo_limit:
                    raise ScanError(f"LONG_BINPUT at byte {at} names memo slot {index} of a "
                                    f"{end}-byte pickle (a memory bomb)", at)
                pos += 5
            elif k == _NEWLINE:
                pos = data.index(b"\n", pos + 1) + 1
            elif k == _TWO_LINES:
                pos = data.index(b"\n", data.index(b"\n", pos + 1) + 1) + 1
            elif k == _COUNTED8:
                pos = _counted(data, pos, 8, end)
            elif k == _STOP:
                if at + 1 < frame_end:
                    raise ScanError(f"the pickle stops at byte {at}, {frame_end - at - 1} bytes "
                                    "before its FRAME ends (data hidden after STOP)", at)
                return Scan(start, at + 1, protocol)
            elif k == _FRAME:
                frame_end = _frame(data, at, frame_end, end)
                pos += 9
                continue
            else:
                raise _unexpected(k, op, at)
            if pos > end:
                raise ScanError(f"a pickle opcode at byte {at} declares {pos - at} bytes, "
                                f"past the end of the data ({end - at} remain)", at,
                                truncated=True)
            if 0 <= frame_end < pos:
                if at < frame_end:
                    raise ScanError(f"an opcode at byte {at} crosses the end of its FRAME", at)
                frame_end = -1
    except ScanError:
        raise
    except (IndexError, ValueError):  # ran off the end: index() or data[pos]
        raise ScanError(f"the pickle ends at byte {end} without STOP (truncated)",
                        pos, truncated=True) from None


_ACTING = frozenset(ord(op.code.encode("latin-1")) for op in pickletools.opcodes
                    if op.name in {"STACK_GLOBAL", "OBJ", "REDUCE", "NEWOBJ", "NEWOBJ_EX",
                                   "BUILD", "EXT1", "EXT2", "EXT4"})
_IMPORTING = frozenset(ord(op.code.encode("latin-1")) for op in pickletools.opcodes
                       if op.name in {"GLOBAL", "INST"})
_DOTTED = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _stack_effects() -> list[tuple[int, bool, int, bool]]:
    """Per opcode byte: items taken (besides a mark), whether it pops to a mark, items
    pushed, whether it pushes a mark."""
    effects = [(0, False, 0, False)] * 256
    for op in pickletools.opcodes:
        taken, given = op.stack_before, op.stack_after
        mark = pickletools.markobject
        takes_mark = mark in taken
        before = taken.index(mark) if takes_mark else len(taken)
        effects[ord(op.code.encode("latin-1"))] = (before, takes_mark,
                                                   0 if mark in given else len(given),
                                                   mark in given)
    return effects


_STACK = _stack_effects()


MAX_TEXT = 1 << 20  # of a text argument, what the sniff reads to judge it
_NUMBER_TEXT = re.compile(rb"[0-9A-Za-z+\-._]*")  # what int(text, 0) and float() may take

def executes_before(data: Opcodes, end: int) -> bool:
    """Whether the well-formed opcodes of ``data[:end]`` import or call anything.

    ``end`` is where ``scan`` stopped; a full unpickler runs every opcode
    before it, so a broken pickle can still act.
    """
    pos = 2 if data[:1] == b"\x80" else 0
    # the unpickler's stack depth and marks: an opcode short of operands fails there
    depth, marks = 0, list[int]()
    while pos < end:
        op = data[pos]
        before, takes_mark, after, makes_mark = _STACK[op]
        if takes_mark:
            if not marks:
                return False
            depth = marks.pop()
        if depth < before:
            return False
        depth -= before
        if makes_mark:
            marks.append(depth)
        depth += after
        if op in _ACTING:
            return True
        if op in _IMPORTING:  # imports only a module and name Python could import
            first = data.find(b"\n", pos + 1)
            second = data.find(b"\n", first + 1) if first >= 0 else -1
            if second - pos > MAX_TEXT:  # no module has such a name: the import fails
                return False
            return 0 <= second < end and all(
                _DOTTED.fullmatch(part) for part in (data[pos + 1:first], data[first + 1:second]))
        kind = _KIND[op]
        if kind == _FIXED or kind in (_PROTO, _FRAME, _LONG_BINPUT):
            pos += 1 + _WIDTH[op]
        elif kind == _COUNTED1:
            pos += 2 + data[pos + 1]
        elif kind == _COUNTED4:
            pos += 5 + int.from_bytes(data[pos + 1:pos + 5], "little")
        elif kind == _COUNTED8:
            pos += 9 + int.from_bytes(data[pos + 1:pos + 9], "little")
        elif kind == _NEWLINE:
            newline = data.find(b"\n", pos + 1)
            if newline < 0 or not _valid_text(_NAMES[op], data, pos + 1, newline):
                return False  # the unpickler stops here with an error
            pos = newline + 1
        else:
            return False
    return False


def _valid_text(name: str, data: Opcodes, start: int, newline: int) -> bool:
    """``_valid_line`` of ``data[start:newline]``, holding at most ``MAX_TEXT`` of it.

    A line can run through a whole file (a safetensors file whose header length begins
    with ``I`` and whose tensors hold no newline byte): beyond ``MAX_TEXT`` only its
    start is judged, and a start the unpickler could accept counts as accepted, so a
    payload after it is still found.
    """
    if newline - start <= MAX_TEXT:
        return _valid_line(name, data[start:newline])
    head = bytes(data[start:start + MAX_TEXT])
    if name in ("INT", "LONG", "GET", "PUT", "FLOAT"):
        return _NUMBER_TEXT.fullmatch(head) is not None
    if name == "STRING":
        return head[:1] in (b"'", b'"')
    return True


def _valid_line(name: str, line: bytes) -> bool:
    """Whether CPython's unpickler accepts this text argument (else it stops there)."""
    try:
        text = line.decode("ascii") if name != "UNICODE" else ""
        if name in ("INT",):
            return line in (b"00", b"01") or isinstance(int(text, 0), int)
        if name == "LONG":
            return isinstance(int(text.removesuffix("L"), 0), int)
        if name in ("GET", "PUT"):
            return isinstance(int(text, 10), int)
        if name == "FLOAT":
            return isinstance(float(text), float)
        if name == "STRING":
            return len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
        if name == "UNICODE":
            line.decode("raw_unicode_escape")
        return True
    except (UnicodeDecodeError, ValueError):
        return False
