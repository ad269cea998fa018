"""ckptport: make PyTorch checkpoints portable.

``read`` a checkpoint without running code from it, ``normalize`` it with
named rules, ``write`` a ``.pth`` or ``.safetensors`` that loads anywhere;
``normalize_file`` does all three and verifies (it is what ``ckptport
normalize`` runs; ``convert`` is its round-1 name). ``diff``, ``inspect``,
``check`` and ``manifest`` are the other commands. Importing ckptport does
not import torch; the first call that needs tensors as torch tensors does.
"""

from __future__ import annotations

from ._version import __version__
from .checkpoint import Checkpoint, Format, SourceFacts
from .commands.check import CheckReport, Finding, check
from .commands.diff import (
    DiffReport,
    DtypeMismatch,
    LeafMismatch,
    ShapeMismatch,
    TensorDelta,
    Tolerance,
    diff,
)
from .commands.inspection import InspectReport, inspect
from .commands.load import LoadResult, load_into, load_state_dict
from .commands.normalize import ConvertReport, NormalizeReport, convert, normalize_file
from .errors import (
    CkptportError,
    CodeArchiveError,
    InputError,
    OutputError,
    RuleError,
    SelectionError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    VerificationError,
)
from .readers import describe, materialize, open_checkpoint, read
from .rules import Normalized, NormalizeOptions, RuleResult, apply_rules, normalize
from .writers import Target, WriteResult, write

__all__ = [
    "__version__",
    "CheckReport",
    "Checkpoint",
    "CkptportError",
    "CodeArchiveError",
    "ConvertReport",
    "DiffReport",
    "DtypeMismatch",
    "Finding",
    "Format",
    "InputError",
    "InspectReport",
    "LoadResult",
    "LeafMismatch",
    "NormalizeOptions",
    "NormalizeReport",
    "Normalized",
    "OutputError",
    "RuleError",
    "RuleResult",
    "SelectionError",
    "ShapeMismatch",
    "SourceFacts",
    "StateDictMismatchError",
    "Target",
    "TensorDelta",
    "Tolerance",
    "UnsafeCheckpointError",
    "VerificationError",
    "WriteResult",
    "apply_rules",
    "check",
    "convert",
    "describe",
    "diff",
    "inspect",
    "load_into",
    "load_state_dict",
    "materialize",
    "normalize",
    "normalize_file",
    "open_checkpoint",
    "read",
    "write",
]
