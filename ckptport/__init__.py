"""ckptport: make PyTorch checkpoints portable.

``read`` a checkpoint without running code from it, ``normalize`` its tree
with named rules, ``write`` a ``.pth`` or ``.safetensors`` that loads
anywhere; ``normalize_file`` does all three and verifies (what ``ckptport
normalize`` runs), ``normalize_folder`` does it for a folder of them.
``diff``, ``inspect``, ``check`` and ``manifest`` are the other commands;
``load_state_dict`` and ``load_into`` the one-liners for training code.
Report and option types live in their modules (``ckptport.analysis.diffing``,
``ckptport.rules``, …).

Importing ckptport imports neither torch nor the commands: each name below
is loaded when first used, so the CLI prints its first line at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    CkptportError,
    InputError,
    OptionError,
    OutputError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    VerificationError,
)

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .commands.check import check
    from .commands.diff import diff
    from .commands.inspection import inspect
    from .commands.load import load_into, load_state_dict
    from .commands.manifest import manifest
    from .commands.normalize import normalize_file, normalize_folder
    from .readers import read
    from .rules import NormalizeOptions, normalize
    from .writers import write

__all__ = [
    "__version__",
    "Checkpoint",
    "CkptportError",
    "InputError",
    "NormalizeOptions",
    "OptionError",
    "OutputError",
    "StateDictMismatchError",
    "UnsafeCheckpointError",
    "VerificationError",
    "check",
    "diff",
    "inspect",
    "load_into",
    "load_state_dict",
    "manifest",
    "normalize",
    "normalize_file",
    "normalize_folder",
    "read",
    "write",
]

_LAZY = {
    "Checkpoint": ".checkpoint",
    "check": ".commands.check",
    "diff": ".commands.diff",
    "normalize_folder": ".commands.normalize",
    "inspect": ".commands.inspection",
    "load_into": ".commands.load",
    "load_state_dict": ".commands.load",
    "manifest": ".commands.manifest",
    "normalize_file": ".commands.normalize",
    "read": ".readers",
    "NormalizeOptions": ".rules",
    "normalize": ".rules",
    "write": ".writers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptport' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
