"""Small tensor facts shared by rules, writers, verification and diff."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ViewKey", "view_key", "storage_key", "is_compact", "as_bytes", "bits_equal",
           "human_bytes"]

ViewKey = tuple[int, int, tuple[int, ...], tuple[int, ...], str]


def storage_key(tensor: torch.Tensor) -> int | None:
    """Identity of the storage behind ``tensor``; None for empty storages.

    A deferred tensor (``lazy``) is its own storage: tied names share the
    one deferred object.
    """
    from .lazy import is_deferred

    if is_deferred(tensor):
        return id(tensor)
    storage = tensor.untyped_storage()
    return storage.data_ptr() if storage.nbytes() else None


def view_key(tensor: torch.Tensor) -> ViewKey | None:
    """Identity of the exact view: two tensors with equal keys are one tensor (tied)."""
    storage = storage_key(tensor)
    if storage is None:
        return None
    return (storage, int(tensor.storage_offset()), tuple(tensor.shape), tuple(tensor.stride()),
            str(tensor.dtype))


def is_compact(tensor: torch.Tensor) -> bool:
    """True when the storage holds exactly this tensor's bytes, in order."""
    return (
        tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's bytes (no copy)."""
    import torch

    return tensor.reshape(-1).view(torch.uint8)


_COMPARE_CHUNK = 1 << 24  # bytes; bounds the temporary of each comparison


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes: NaN payloads and -0.0 included.

    Compared with numpy in chunks: measured here 3× faster than
    ``torch.equal`` (whose thread pool competes with the hashing thread),
    and the temporaries stay small.
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    import numpy as np

    x, y = as_bytes(a.contiguous()).numpy(), as_bytes(b.contiguous()).numpy()
    return all(np.array_equal(x[i:i + _COMPARE_CHUNK], y[i:i + _COMPARE_CHUNK])
               for i in range(0, x.size, _COMPARE_CHUNK))


def human_bytes(n: int | float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
