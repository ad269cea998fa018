"""ckptport: make PyTorch checkpoints portable.

``read`` a checkpoint without running code from it, ``normalize`` it with
named rules, ``write`` a ``.pth`` or ``.safetensors`` that loads anywhere;
``convert`` does all three and verifies. Importing ckptport does not import
torch; the first call that needs tensors does.
"""

from __future__ import annotations

from ._version import __version__
from .check import CheckReport, Finding, check
from .checkpoint import Checkpoint, Format, SourceFacts
from .convert import ConvertReport, convert
from .diff import (
    DiffReport,
    DtypeMismatch,
    LeafMismatch,
    ShapeMismatch,
    TensorDelta,
    Tolerance,
    diff,
)
from .errors import (
    CkptportError,
    InputError,
    OutputError,
    RuleError,
    SelectionError,
    StateDictMismatchError,
    UnsafeCheckpointError,
    VerificationError,
)
from .inspect import InspectReport, inspect
from .load import LoadResult, load_into, load_state_dict
from .readers import read
from .rules import Normalized, NormalizeOptions, RuleResult, normalize
from .writers import WriteResult, write

__all__ = [
    "__version__",
    "CheckReport",
    "Checkpoint",
    "CkptportError",
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
    "Normalized",
    "OutputError",
    "RuleError",
    "RuleResult",
    "SelectionError",
    "ShapeMismatch",
    "SourceFacts",
    "StateDictMismatchError",
    "TensorDelta",
    "Tolerance",
    "UnsafeCheckpointError",
    "VerificationError",
    "WriteResult",
    "check",
    "convert",
    "diff",
    "inspect",
    "load_into",
    "load_state_dict",
    "normalize",
    "read",
    "write",
]
