"""Tensors computed only when they are written: casts in the streaming pipeline.

A rule that must produce new bytes (``--dtype``) would otherwise hold every
converted tensor in memory at once. In the streaming pipeline (``convert``)
it returns a *deferred* tensor instead: a meta tensor (dtype and shape, no
data) carrying the function that makes the real one. Writers and
verification call ``materialize`` one tensor at a time, just before the
bytes are needed, and drop the result after, so peak memory stays near the
largest tensor rather than the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["deferred", "is_deferred", "materialize"]

_MAKE = "_ckptport_make"


def deferred(shape: Any, dtype: torch.dtype, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    import torch

    placeholder = torch.empty(tuple(shape), dtype=dtype, device="meta")
    setattr(placeholder, _MAKE, make)
    return placeholder


def is_deferred(value: Any) -> bool:
    return getattr(value, _MAKE, None) is not None


def materialize(tensor: torch.Tensor) -> torch.Tensor:
    """The real tensor behind ``tensor`` (``tensor`` itself when it is not deferred)."""
    make = getattr(tensor, _MAKE, None)
    return make() if make is not None else tensor
