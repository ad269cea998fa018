"""``normalize --hash-name``: name the output after its own sha256, as torch.hub wants.

``torch.hub.load_state_dict_from_url(check_hash=True)`` takes the hex digits
after the first ``-`` that is followed by hex digits and a dot in the file
name (``resnet18-f37072fd.pth``) and checks that the file's sha256 starts
with them; timm's ``clean_checkpoint`` names its outputs the same way. The
name is known only once the file is written, so the file is written (and
verified) under a hidden temporary name in DST's folder, hashed, then
renamed in one step: DST's folder never shows a partial or unhashed file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

from ..errors import CkptportError, OutputError, OutputExistsError, OutputOSError
from .plan import Destination
from .staging import fsync_dir

__all__ = ["HASH_PREFIX_WIDTH", "staging_destination", "publish_hashed", "hashed_name"]

HASH_PREFIX_WIDTH = 8
_HUB_HASH = re.compile(r"-([a-f0-9]*)\.")  # torch.hub's HASH_REGEX
_CHUNK = 1 << 22


def hashed_name(dst: Path, sha256: str) -> Path:
    """``STEM-<first 8 hex>.EXT`` beside ``dst``."""
    return dst.with_name(f"{dst.stem}-{sha256[:HASH_PREFIX_WIDTH]}{dst.suffix}")


def staging_destination(destination: Destination) -> Destination:
    """Where the file is written before its name is known; one file only."""
    if destination.folder:
        raise OutputError("--hash-name names one file by its sha256; a shard set or DCP "
                          "folder has many (write a single .pth or .safetensors)",
                          destination.path)
    path = destination.path
    _check_hub_reads(path, "0123456789abcdef" * 4)  # before anything is read or written
    return Destination(path.with_name(f".{path.name}.ckptport-hash-name"), destination.format)


def _check_hub_reads(dst: Path, sha256: str) -> Path:
    """``dst``'s hashed name, refused where torch.hub would read the hash elsewhere in it
    (``model-a.b.pth``: ``-a.`` comes first)."""
    final = hashed_name(dst, sha256)
    found = _HUB_HASH.search(final.name)
    if found is None or found.group(1) != sha256[:HASH_PREFIX_WIDTH]:
        raise OutputError(f"torch.hub would read the hash from the wrong part of "
                          f"{final.name!r}; choose a DST name without '-' before hex "
                          "digits and a dot", dst)
    return final


def publish_hashed(written: Path, dst: Path, overwrite: bool,
                   before: Callable[[Path], object] | None = None) -> Path:
    """Rename the written file to its hashed name; the temporary file never stays behind.
    ``before`` is called with that name before the rename (what lies beside it checked
    once the name is known: ``normalize --sign``'s attestation); what it raises leaves
    nothing."""
    try:
        digest = hashlib.sha256()
        with written.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        final = _check_hub_reads(dst, digest.hexdigest())
        if final.exists() and not overwrite:
            raise OutputExistsError(f"{final.name} exists; pass --overwrite to replace it", dst)
        if before is not None:
            before(final)
        os.replace(written, final)
        fsync_dir(final.parent)
        return final
    except CkptportError:
        raise
    except OSError as exc:
        raise OutputOSError(f"cannot name the output by its hash: {exc.strerror or exc}",
                            dst).caused_by(exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            written.unlink()
