"""Read a written file back and prove it holds exactly what was meant.

The ``.pth`` check loads with plain ``torch.load(weights_only=True)`` and
no allowlist: if that fails here it would fail for every user. The
safetensors check opens the file with the ``safetensors`` library itself
(the reader every consumer uses) and checks every tensor's name, dtype and
shape there; the bytes are then compared through ckptport's zero-copy
reader, from the page cache, without a second copy of each tensor.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from ..compare import tree_mismatches
from ..errors import VerificationError
from ..progress import Advance

__all__ = ["verify_pth", "verify_safetensors"]


def verify_pth(path: Path, expected: Any, anchor: str, advance: Advance) -> None:
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = torch.load(path, weights_only=True, mmap=True,
                                map_location="cpu" if anchor != "cpu" else None)
    except OSError:
        raise  # the file went away or the disk failed: an output error, not a bad file
    except Exception as exc:  # any failure to load is the finding itself
        raise VerificationError(f"written file does not load with weights_only=True: {exc}",
                                path) from exc
    _expect_same(path, expected, actual, advance)


def verify_safetensors(path: Path, plan: Any, expected: Any, advance: Advance) -> None:
    from safetensors import safe_open

    from ..readers.safetensors import read_safetensors

    try:
        with safe_open(str(path), framework="pt") as f:
            if set(f.keys()) != set(plan.tensors):
                raise VerificationError("tensor names in the written file differ from the plan",
                                        path)
            for name, entry in plan.entries.items():
                stored = f.get_slice(name)  # header only: the bytes are compared below
                if stored.get_dtype() != entry.dtype or tuple(stored.get_shape()) != entry.shape:
                    raise VerificationError(f"tensor {name!r} reads back as {stored.get_dtype()} "
                                            f"{stored.get_shape()}", path)
    except VerificationError:
        raise
    except Exception as exc:  # the official reader rejecting our bytes is the finding
        raise VerificationError(f"safetensors rejects the written file: {exc}", path) from exc
    _expect_same(path, expected, read_safetensors(path).tree, advance)


def _expect_same(path: Path, expected: Any, actual: Any, advance: Advance) -> None:
    problems = tree_mismatches(expected, actual, on_tensor=advance)
    if problems:
        raise VerificationError("written file reads back different: " + "; ".join(problems),
                                path)
