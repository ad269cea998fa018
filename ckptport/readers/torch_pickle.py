"""Read torch zip (``.pt .pth .bin .ckpt``) and legacy (non-zip) checkpoints.

Untrusted files go through ``torch.load(weights_only=True)`` with ckptport's
small allowlist scoped to the call; every storage is mapped to the CPU by a
``map_location`` callable that also records the location the file named
(``cuda:3``), so a GPU-saved file reads on a machine without a GPU and the
report can still say where it came from. Zip files load with ``mmap=True``:
tensors are views of the mapped file until something touches their bytes.
"""

from __future__ import annotations

import io
import pickle
import re
import warnings
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, Format, SourceFacts, format_path, iter_tensors
from ..errors import InputError, UnsafeCheckpointError
from . import allowlist
from .pickle_scan import scan_globals

__all__ = ["read_torch"]

_LEGACY_PICKLES = 4  # magic number, protocol version, sys info, the object
_GLOBAL_IN_MESSAGE = re.compile(r"GLOBAL ([\w.]+)")
_WEIGHTS_ONLY_REASON = re.compile(r"WeightsUnpickler error: (.*)")


def read_torch(path: Path, fmt: Format, *, trust: bool = False) -> Checkpoint:
    """A Checkpoint from a torch zip or legacy file; nothing in it runs unless ``trust``."""
    if fmt is Format.TORCH_ZIP:
        _refuse_torchscript(path)
    found_globals = _scan(path, fmt)
    locations: Counter[str] = Counter()

    def to_cpu(storage: Any, location: str) -> Any:
        locations[location] += 1
        return storage

    tree = _load(path, fmt, to_cpu, trust)
    return Checkpoint(
        tree=tree,
        source=SourceFacts(
            path=path,
            format=fmt,
            size=path.stat().st_size,
            storage_locations=dict(sorted(locations.items())),
            globals=found_globals,
            shared_storages=_shared_storages(tree),
            trusted=trust,
        ),
    )


def _load(path: Path, fmt: Format, map_location: Any, trust: bool) -> Any:
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if trust:
                return torch.load(  # the user vouched for this file (--trust)
                    path, map_location=map_location, weights_only=False,
                    mmap=fmt is Format.TORCH_ZIP,
                )
            with torch.serialization.safe_globals(allowlist.safe_globals()):
                return torch.load(
                    path, map_location=map_location, weights_only=True,
                    mmap=fmt is Format.TORCH_ZIP,
                )
    except pickle.UnpicklingError as exc:
        raise _refusal(path, fmt, str(exc)) from exc
    except Exception as exc:  # torch reports corrupt files with many exception types
        raise InputError(f"corrupt or truncated {fmt.value} checkpoint: {_first_line(exc)}",
                         path) from exc


def _refusal(path: Path, fmt: Format, message: str) -> InputError:
    if "Weights only load failed" not in message:
        return InputError(f"corrupt pickle: {_first_line(message)}", path)
    names = _unsafe_globals(path, fmt, message)
    if names:
        return UnsafeCheckpointError(
            path,
            names,
            "refused: the file needs globals outside the weights-only allowlist: "
            f"{', '.join(names)} (nothing was run; pass --trust only if you vouch for the file)",
        )
    reason = _WEIGHTS_ONLY_REASON.search(message)
    detail = reason.group(1) if reason else _first_line(message)
    return InputError(f"the weights-only reader cannot read this pickle: {detail}", path)


def _unsafe_globals(path: Path, fmt: Format, message: str) -> tuple[str, ...]:
    import torch

    names = dict.fromkeys(_GLOBAL_IN_MESSAGE.findall(message))
    if fmt is Format.TORCH_ZIP:
        try:
            names.update(dict.fromkeys(torch.serialization.get_unsafe_globals_in_checkpoint(path)))
        except Exception:  # the scan is a nicety; the message already names one global
            pass
    allowed = allowlist.allowed_names()
    return tuple(name for name in names if name not in allowed)


def _scan(path: Path, fmt: Format) -> tuple[str, ...]:
    try:
        if fmt is Format.TORCH_ZIP:
            with zipfile.ZipFile(path) as archive:
                pkl = next(n for n in archive.namelist() if n.endswith("data.pkl"))
                return scan_globals(io.BytesIO(archive.read(pkl)))
        with path.open("rb") as f:
            return scan_globals(f, pickles=_LEGACY_PICKLES)
    except StopIteration:
        raise InputError("zip archive has no data.pkl: not a torch checkpoint", path) from None
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as exc:
        kind = "zip" if fmt is Format.TORCH_ZIP else "pickle"
        raise InputError(f"corrupt or truncated {kind}: {_first_line(exc)}", path) from None


def _refuse_torchscript(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"corrupt or truncated zip: {_first_line(exc)}", path) from None
    if any(n.endswith("/constants.pkl") for n in names):
        raise InputError(
            "a TorchScript archive (torch.jit.save), not a checkpoint; its code is never run",
            path,
        )


def _shared_storages(tree: Any) -> tuple[tuple[str, ...], ...]:
    groups: dict[int, list[str]] = {}
    for key_path, tensor in iter_tensors(tree):
        storage = tensor.untyped_storage()
        if storage.nbytes():
            groups.setdefault(storage.data_ptr(), []).append(format_path(key_path))
    return tuple(tuple(paths) for paths in groups.values() if len(paths) > 1)


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
