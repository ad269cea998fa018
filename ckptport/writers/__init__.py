"""Writers: torch ``.pth`` and ``.safetensors``, written atomically and verified.

``write`` picks the format from the destination's extension (or ``fmt``),
writes into a temp file beside the destination, fsyncs it, reads it back
and compares every tensor bit for bit with what was meant to be written,
and only then moves it into place.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import Checkpoint, iter_tensors
from ..errors import OutputError, VerificationError
from ..progress import Progress, no_progress
from .atomic import AtomicFile, atomic_file
from .verify import verify_pth, verify_safetensors

if TYPE_CHECKING:
    from .safetensors import MetadataValue

__all__ = ["OutputFormat", "WriteResult", "write", "emit", "output_format", "check_destination",
           "same_file", "count_tensors", "unique_bytes", "ANCHOR_PATTERN"]

ANCHOR_PATTERN = r"cpu|cuda:\d+"


class OutputFormat(str, enum.Enum):
    PTH = "pth"
    SAFETENSORS = "safetensors"
    DCP = "dcp"


_EXTENSIONS = {".pth": OutputFormat.PTH, ".pt": OutputFormat.PTH, ".bin": OutputFormat.PTH,
               ".ckpt": OutputFormat.PTH, ".safetensors": OutputFormat.SAFETENSORS}


@dataclass(frozen=True)
class WriteResult:
    path: Path
    format: OutputFormat
    tensors: int
    bytes: int
    verified: bool
    files: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if not self.files:
            object.__setattr__(self, "files", (self.path,))


def output_format(dst: Path, requested: str | None) -> OutputFormat:
    if requested:
        return OutputFormat(requested)
    try:
        return _EXTENSIONS[dst.suffix.lower()]
    except KeyError:
        known = ", ".join(_EXTENSIONS)
        raise OutputError(f"cannot tell the output format from the extension "
                          f"{dst.suffix or '(none)'!r} (known: {known}); pass --to", dst) from None


def write(
    checkpoint: Checkpoint,
    dst: str | os.PathLike[str],
    *,
    fmt: str | None = None,
    anchor: str = "cpu",
    overwrite: bool = False,
    verify: bool = True,
    metadata: Mapping[str, MetadataValue] | None = None,
    progress: Progress = no_progress,
    precommit: Callable[[], None] = lambda: None,
) -> WriteResult:
    """Write ``checkpoint.tree`` to ``dst``; ``dst`` appears only once complete and verified.

    ``precommit`` runs after verification, just before ``dst`` appears; an
    error it raises leaves ``dst`` untouched (the source changed meanwhile).
    """
    path = Path(dst)
    kind = output_format(path, fmt)
    check_destination(checkpoint.source.files, path, overwrite)
    try:
        with atomic_file(path, overwrite=overwrite) as out:
            emit(kind, checkpoint.tree, out, anchor=anchor, verify=verify,
                 metadata=metadata or {}, progress=progress)
            precommit()
            out.publish()
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", path) from exc
    return WriteResult(path, kind, count_tensors(checkpoint.tree),
                       unique_bytes(checkpoint.tree), verify)


def emit(kind: OutputFormat, tree: Any, out: AtomicFile, *, anchor: str, verify: bool,
         metadata: Mapping[str, MetadataValue], progress: Progress) -> None:
    """Write ``tree`` into ``out``'s temp file, fsync it and verify it (not yet published)."""
    name, total = out.dst.name, unique_bytes(tree)
    try:
        if kind is OutputFormat.PTH:
            from .pth import write_pth

            write_pth(tree, out.file, anchor, progress(f"writing {name}", total))
            out.sync()
            if verify:
                verify_pth(out.tmp, tree, anchor, progress(f"verifying {name}", total))
        else:
            from .safetensors import plan_safetensors, write_safetensors

            plan = plan_safetensors(tree, metadata, out.dst)
            write_safetensors(plan, out.file, progress(f"writing {name}", total))
            out.sync()
            if verify:
                verify_safetensors(out.tmp, plan, tree, progress(f"verifying {name}", total))
    except VerificationError as exc:  # name the destination, not its temp file
        raise VerificationError(exc.message, out.dst) from exc


def check_destination(sources: tuple[Path, ...], dst: Path, overwrite: bool) -> None:
    """Refuse a destination that is a source file (under any spelling) or already exists."""
    if dst.is_dir():
        raise OutputError("is a directory; name an output file", dst)
    for source in sources:
        if same_file(source, dst):
            raise OutputError(f"is the source file {source}; write somewhere else", dst)
    if (dst.exists() or dst.is_symlink()) and not overwrite:
        raise OutputError("exists; pass --overwrite to replace it", dst)


def same_file(a: Path, b: Path) -> bool:
    """One file under two spellings: symlinks, ``..``, hard links."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def count_tensors(tree: Any) -> int:
    return sum(1 for _ in iter_tensors(tree))


def unique_bytes(tree: Any) -> int:
    from ..tensorops import view_key

    seen: dict[Any, int] = {}
    for _, tensor in iter_tensors(tree):
        seen[view_key(tensor) or id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())
