"""Recognize a checkpoint's container from its first bytes, never its name.

A ``.pt`` may be a zip, a legacy pickle or even safetensors; users rename
files freely, so the extension is only a hint for writers, not for readers.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ..checkpoint import Format
from ..errors import InputError

__all__ = ["sniff"]

_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_PICKLE_PROTO = 0x80


def sniff(path: Path) -> Format:
    """The container format of ``path``, or an ``InputError`` saying why not."""
    try:
        with path.open("rb") as f:
            head = f.read(9)
            size = path.stat().st_size
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None
    if not head:
        raise InputError("empty file (0 bytes), not a checkpoint", path)
    if head[:4] in _ZIP_MAGICS:
        return Format.TORCH_ZIP
    if len(head) == 9 and head[8:9] == b"{":
        (header_len,) = struct.unpack("<Q", head[:8])
        if header_len <= size - 8:
            return Format.SAFETENSORS
        raise InputError(
            f"safetensors header claims {header_len} bytes but the file has {size}"
            " (truncated or corrupt)",
            path,
        )
    if head[0] == _PICKLE_PROTO:
        return Format.TORCH_LEGACY
    raise InputError(
        f"not a PyTorch or safetensors checkpoint (starts with {head[:8].hex()})", path
    )
