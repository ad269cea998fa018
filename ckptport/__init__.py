"""ckptport: make PyTorch checkpoints portable.

``read`` a checkpoint without running code from it, ``normalize`` its tree
with named rules, ``write`` a ``.pth`` or ``.safetensors`` that loads
anywhere; ``normalize_file`` does all three and verifies (what ``ckptport
normalize`` runs), ``normalize_folder`` does it for a folder of them.
``diff``, ``inspect``, ``check``, ``manifest``, ``sign``, ``verify`` and
``verify_chain`` are the other commands;
``load_state_dict`` and ``load_into`` the one-liners for training code.
Report and option types live in their modules (``ckptport.analysis.diffing``,
``ckptport.rules``, …).

Importing ckptport imports neither torch nor the commands: each name below
is loaded when first used, so the CLI prints its first line at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import errors as _errors
from ._version import __version__
from .errors import *  # noqa: F403 (the error family: ERRORS below)

# The public API, in one table: each name and the module it is loaded from when first
# used. ``__all__`` is made from it, and tests/test_architecture.py holds the
# TYPE_CHECKING imports below (what type checkers see) and docs/reference.md's list to it.
LAZY = {
    "Checkpoint": ".checkpoint",
    "check": ".commands.check",
    "diff": ".commands.diff",
    "inspect": ".commands.inspection",
    "load_into": ".commands.load",
    "load_state_dict": ".commands.load",
    "manifest": ".commands.manifest",
    "normalize_file": ".commands.normalize",
    "normalize_folder": ".commands.normalize",
    "read": ".readers",
    "NormalizeOptions": ".rules",
    "normalize": ".rules",
    "SigningKey": ".signing",
    "TrustedKeys": ".signing",
    "sign": ".signing",
    "verify": ".signing",
    "verify_chain": ".signing",
    "write": ".writers",
}
ERRORS = tuple(name for name in _errors.__all__ if name.endswith("Error"))

if TYPE_CHECKING:  # what type checkers see; "as": re-exported
    from .checkpoint import Checkpoint as Checkpoint
    from .commands.check import check as check
    from .commands.diff import diff as diff
    from .commands.inspection import inspect as inspect
    from .commands.load import load_into as load_into
    from .commands.load import load_state_dict as load_state_dict
    from .commands.manifest import manifest as manifest
    from .commands.normalize import normalize_file as normalize_file
    from .commands.normalize import normalize_folder as normalize_folder
    from .readers import read as read
    from .rules import NormalizeOptions as NormalizeOptions
    from .rules import normalize as normalize
    from .signing import SigningKey as SigningKey
    from .signing import TrustedKeys as TrustedKeys
    from .signing import sign as sign
    from .signing import verify as verify
    from .signing import verify_chain as verify_chain
    from .writers import write as write

__all__ = ["__version__", *ERRORS, *LAZY]


# Any: a public name loaded when first used (a function, a class); type checkers see the
# TYPE_CHECKING imports above, this is for names they do not know
def __getattr__(name: str) -> Any:
    module = LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptport' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
