"""``--trust``: unpickle with full Python, because the user vouches for the file.

This is the one place that runs code from a checkpoint: ``torch.load``
with ``weights_only=False`` (zip and legacy files) and ``torch.jit.load``
(TorchScript). Nothing reaches it without the user's explicit ``--trust``.
Tensors come back as torch tensors; every storage is mapped to the CPU and
the device the file recorded is counted for the report.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, Format, SourceFacts, iter_tensors, shared_storages
from ..errors import InputError

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


def load_trusted(path: Path, fmt: Format) -> Checkpoint:
    """``torch.load(weights_only=False)`` of a file the user vouched for (``--trust``)."""
    import torch

    locations: Counter[str] = Counter()

    def to_cpu(storage: Any, location: Any) -> Any:
        locations[str(location)] += 1
        return storage

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = torch.load(path, map_location=to_cpu, weights_only=False,  # --trust
                              mmap=fmt is Format.TORCH_ZIP)
    except Exception as exc:  # the file's own code may fail in any way
        raise InputError(f"cannot load with --trust: {cause(exc)}", path) from exc
    return Checkpoint(tree, SourceFacts(
        path=path, format=fmt, size=path.stat().st_size,
        storage_locations=dict(sorted(locations.items())),
        shared_storages=shared_storages(tree), trusted=True))


def load_torchscript(path: Path, recorded: dict[str, int]) -> Checkpoint:
    """Parameters and buffers of a TorchScript module; only ever with ``--trust``."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's own deprecation notice
            module = torch.jit.load(str(path), map_location="cpu")  # --trust: user vouched
    except Exception as exc:  # torch reports broken archives with many exception types
        raise InputError(f"cannot load the TorchScript archive: {cause(exc)}", path) from exc
    tree = module.state_dict()
    count = sum(1 for _ in iter_tensors(tree))
    return Checkpoint(tree, SourceFacts(
        path=path, format=Format.TORCHSCRIPT, size=path.stat().st_size,
        storage_locations=recorded or ({"cpu": count} if count else {}),
        shared_storages=shared_storages(tree), trusted=True))
