"""List the globals a pickle refers to, without unpickling it.

``pickletools.genops`` walks opcodes only; nothing is imported or called.
The result is a report ("this file needs argparse.Namespace"), not a
security boundary: the boundary is the weights-only unpickler.
"""

from __future__ import annotations

import io
import pickletools
from typing import IO, cast

__all__ = ["scan_globals"]

_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
               "BINSTRING", "SHORT_BINSTRING"}


class _Bounded:
    """A stream that refuses reads longer than what is left of it.

    ``genops`` reads a string opcode's declared length in one call, and a
    buffered file allocates that much before finding the file shorter: a
    lying 8-byte length would ask for exabytes.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        start = stream.tell()
        self._end = stream.seek(0, io.SEEK_END)
        stream.seek(start)

    def read(self, n: int = -1) -> bytes:
        if n > self._end - self._stream.tell():
            raise ValueError(f"a pickle opcode declares {n} bytes, past the end of the data")
        return self._stream.read(n)

    def readline(self) -> bytes:
        return self._stream.readline()

    def tell(self) -> int:
        return self._stream.tell()


def scan_globals(stream: IO[bytes], pickles: int = 1) -> tuple[str, ...]:
    """Qualified names of GLOBAL / STACK_GLOBAL in ``pickles`` consecutive pickles."""
    found: dict[str, None] = {}
    bounded = _Bounded(stream)
    for _ in range(pickles):
        strings: list[str] = []
        memo: dict[int, str] = {}
        for opcode, arg, _pos in pickletools.genops(cast(IO[bytes], bounded)):
            name = opcode.name
            if name in _STRING_OPS and isinstance(arg, (str, bytes)):
                strings.append(arg if isinstance(arg, str) else arg.decode("latin-1"))
            elif name == "MEMOIZE" and strings:
                memo[len(memo)] = strings[-1]
            elif name in {"PUT", "BINPUT", "LONG_BINPUT"} and strings and isinstance(arg, int):
                memo[arg] = strings[-1]
            elif name in {"GET", "BINGET", "LONG_BINGET"} and arg in memo:
                strings.append(memo[cast(int, arg)])
            elif name == "GLOBAL" and isinstance(arg, str):
                found[arg.replace(" ", ".")] = None
            elif name == "STACK_GLOBAL" and len(strings) >= 2:
                found[f"{strings[-2]}.{strings[-1]}"] = None
    return tuple(found)
