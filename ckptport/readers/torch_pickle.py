"""Read torch zip (``.pt .pth .bin .ckpt``) and legacy (non-zip) checkpoints.

Untrusted files go through ``torch.load(weights_only=True)`` with ckptport's
small allowlist scoped to the call; every storage is mapped to the CPU by a
``map_location`` callable that also records the location the file named
(``cuda:3``), so a GPU-saved file reads on a machine without a GPU and the
report can still say where it came from. Zip files load with ``mmap=True``:
tensors are views of the mapped file until something touches their bytes.

When the weights-only reader refuses (a global outside its allowlist, pickle
protocol 4 and above), ckptport's restricted unpickler (``restricted``) reads
the file instead: unknown classes become inert records, calls outside its
allow-list are refused by name. Zips are opened with torch's own reader, so
ckptport sees an archive exactly as ``torch.load`` does.
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, Format, SourceFacts, iter_tensors, shared_storages
from ..errors import InputError
from . import allowlist
from .pickle_scan import scan_globals
from .restricted import check_tensor_sizes, load_restricted, settle

__all__ = ["read_torch"]

_LEGACY_PICKLES = 4  # magic number, protocol version, sys info, the object
# torch's weights-only reader calls these with whatever the pickle passes:
# bytearray(10**12) or numpy's _reconstruct with a shape of 10**12 allocate a
# terabyte. Files naming them go to the restricted reader, which checks arguments.
_ALLOCATING_GLOBALS = frozenset({"builtins.bytearray", "numpy.core.multiarray._reconstruct",
                                 "numpy._core.multiarray._reconstruct"})


def read_torch(path: Path, fmt: Format, *, trust: bool = False,
               lenient: bool = False) -> Checkpoint:
    """A Checkpoint from a torch zip or legacy file; nothing in it runs unless ``trust``.

    ``lenient`` (for reports: ``inspect``, ``check``) keeps dangerous globals
    and refused calls as inert records listed in ``refused_globals`` instead
    of refusing the file; they are never imported or called either way.
    """
    if fmt is Format.TORCH_ZIP and _is_torchscript(path):
        if not trust:
            raise InputError("a TorchScript archive (torch.jit.save): loading one runs its "
                             "code, so ckptport refuses it; with --trust its parameters and "
                             "buffers are extracted into a state dict", path)
        return _read_torchscript(path)
    found_globals = _scan(path, fmt)
    locations: Counter[str] = Counter()

    def to_cpu(storage: Any, location: Any) -> Any:
        if not isinstance(location, str):  # the pickle says where; a hostile one says anything
            raise ValueError(f"a storage's recorded location is a {type(location).__name__}, "
                             "not a device name")
        locations[location] += 1
        return storage

    refused: tuple[str, ...] = ()
    try:
        if not trust and _ALLOCATING_GLOBALS.intersection(found_globals):
            raise _WeightsOnlyRefused()
        tree = _load(path, fmt, to_cpu, trust)
    except _WeightsOnlyRefused:
        loaded = load_restricted(path, fmt, lenient=lenient)
        tree, found_globals, refused = loaded.tree, loaded.globals, loaded.refused
        locations = Counter(loaded.locations)
    try:
        tree = settle(tree)
        check_tensor_sizes(tree)
    except InputError as exc:
        raise InputError(exc.message, path) from None
    return Checkpoint(
        tree=tree,
        source=SourceFacts(
            path=path,
            format=fmt,
            size=path.stat().st_size,
            storage_locations=dict(sorted(locations.items())),
            globals=found_globals,
            shared_storages=shared_storages(tree),
            trusted=trust,
            refused_globals=refused,
        ),
    )


class _WeightsOnlyRefused(Exception):
    """The weights-only reader refused a global or an opcode: try the restricted reader."""


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
        if not trust and "Weights only load failed" in str(exc):
            raise _WeightsOnlyRefused() from exc
        raise InputError(f"corrupt pickle: {_first_line(exc)}", path) from exc
    except Exception as exc:  # torch reports corrupt files with many exception types
        raise InputError(f"corrupt or truncated {fmt.value} checkpoint: {_first_line(exc)}",
                         path) from exc


def _scan(path: Path, fmt: Format) -> tuple[str, ...]:
    try:
        if fmt is Format.TORCH_ZIP:
            data = io.BytesIO(_zip_reader(path).get_record("data.pkl"))  # after the name check
            found = scan_globals(data)
            trailing = len(data.getbuffer()) - data.tell()
            if trailing:  # torch would ignore them; a scanner looking there would be fooled
                raise InputError(f"{trailing} bytes of trailing data after the pickle's STOP "
                                 "in data.pkl", path)
            return found
        with path.open("rb") as f:
            return scan_globals(f, pickles=_LEGACY_PICKLES)
    except RuntimeError as exc:
        raise InputError(f"corrupt zip: {_first_line(exc)}", path) from None
    except (ValueError, EOFError, OSError) as exc:
        kind = "zip" if fmt is Format.TORCH_ZIP else "pickle"
        raise InputError(f"corrupt or truncated {kind}: {_first_line(exc)}", path) from None


def _zip_reader(path: Path) -> Any:
    """torch's own zip reader: an archive is seen exactly as ``torch.load`` sees it."""
    import torch

    return torch._C.PyTorchFileReader(str(path))


def _is_torchscript(path: Path) -> bool:
    try:
        names = _zip_reader(path).get_all_records()
    except (RuntimeError, ValueError) as exc:  # ValueError: record names that are not UTF-8
        raise InputError(f"corrupt or truncated zip: {_first_line(exc)}", path) from None
    if "data.pkl" not in names and "constants.pkl" not in names:
        raise InputError("zip archive has no data.pkl: not a torch checkpoint", path)
    return "constants.pkl" in names


def _read_torchscript(path: Path) -> Checkpoint:
    """Parameters and buffers of a TorchScript module; only ever with ``--trust``."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.jit's own deprecation notice
            module = torch.jit.load(str(path), map_location="cpu")  # --trust: user vouched
    except Exception as exc:  # torch reports broken archives with many exception types
        raise InputError(f"corrupt TorchScript archive: {_first_line(exc)}", path) from exc
    tree = module.state_dict()
    count = sum(1 for _ in iter_tensors(tree))
    return Checkpoint(tree, SourceFacts(
        path=path, format=Format.TORCHSCRIPT, size=path.stat().st_size,
        storage_locations={"cpu": count} if count else {}, shared_storages=shared_storages(tree),
        trusted=True,
    ))


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
