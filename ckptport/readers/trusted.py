"""``--trust``: unpickle with full Python, because the user vouches for the file.

This is the one place that runs code from a checkpoint: ``torch.load``
with ``weights_only=False`` (zip and legacy files) and ``torch.jit.load``
(TorchScript). Nothing reaches it without the user's explicit ``--trust``.
Tensors come back as torch tensors; every storage is mapped to the CPU and
the device the file recorded is counted for the report.
"""

from __future__ import annotations

import io
import warnings
from collections import Counter
from pathlib import Path

from ..checkpoint import Checkpoint, Format, SourceFacts, iter_tensors, shared_storages
from ..errors import InputError
from .base import Source

__all__ = ["load_trusted", "load_torchscript", "cause"]


def cause(error: BaseException) -> str:
    """The line of torch's message that says what went wrong (its last, for TorchScript)."""
    if isinstance(error, ModuleNotFoundError):
        return (f"the class's module {error.name!r} is not importable here (loading the "
                "file needs it)")
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    meaningful = [line for line in lines if not line.startswith(("File ", "Traceback", "^"))]
    return (meaningful or lines)[-1 if len(lines) > 1 else 0]


def _opened(source: Source) -> tuple[Path | io.BytesIO, int]:
    """What torch opens, and its size: a local file by its path; a remote object (which
    torch cannot open) read whole into memory, as ``torch.load`` of a download would."""
    if isinstance(source.main, Path):
        return source.main, source.main.stat().st_size
    assert source.file is not None
    return io.BytesIO(source.file.read(0, source.file.size)), source.file.size


def load_trusted(source: Source, fmt: Format) -> Checkpoint:
    """``torch.load(weights_only=False)`` of a file the user vouched for (``--trust``)."""
    import torch

    path = source.main
    opened, size = _opened(source)

    locations: Counter[str] = Counter()

    def to_cpu(storage: torch.types.Storage, location: str) -> torch.types.Storage:
        locations[str(location)] += 1
        return storage

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = torch.load(opened, map_location=to_cpu, weights_only=False,  # --trust
                              mmap=fmt is Format.TORCH_ZIP and isinstance(opened, Path))
    except Exception as exc:  # the file's own code may fail in any way
        raise InputError(f"cannot load with --trust: {cause(exc)}", path) from exc
    return Checkpoint(tree, SourceFacts(
        path=path, format=fmt, size=size,
        storage_locations=dict(sorted(locations.items())),
        shared_storages=shared_storages(tree), trusted=True))


def load_torchscript(source: Source, recorded: dict[str, int]) -> Checkpoint:
    """Parameters and buffers of a TorchScript module; only ever with ``--trust``."""
    import torch

    path = source.main
    opened, size = _opened(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's own deprecation notice
            module = torch.jit.load(  # type: ignore[no-untyped-call]  # --trust: user vouched
                str(opened) if isinstance(opened, Path) else opened, map_location="cpu")
    except Exception as exc:  # torch reports broken archives with many exception types
        raise InputError(f"cannot load the TorchScript archive: {cause(exc)}", path) from exc
    tree = module.state_dict()
    count = sum(1 for _ in iter_tensors(tree))
    return Checkpoint(tree, SourceFacts(
        path=path, format=Format.TORCHSCRIPT, size=size,
        storage_locations=recorded or ({"cpu": count} if count else {}),
        shared_storages=shared_storages(tree), trusted=True))
