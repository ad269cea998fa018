"""The one exception family of ckptport.

Every failure caused by the input, the options or the output location is a
``CkptportError``. The CLI catches the base class in one place and turns it
into a single line on stderr and an exit code, so a CI job never sees a
traceback for a bad file and never sees exit 0 for a failure.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from types import MappingProxyType

from .escape import printable

__all__ = [
    "EXIT_OK",
    "EXIT_FINDINGS",
    "EXIT_ERROR",
    "CkptportError",
    "InputError",
    "UnsafeCheckpointError",
    "CodeArchiveError",
    "DeadlineError",
    "OptionError",
    "SelectionError",
    "StateDictMismatchError",
    "RuleError",
    "OutputError",
    "VerificationError",
]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2


class CkptportError(Exception):
    """Base of every error ckptport raises on bad input, options or output.

    ``path`` names the file the error is about, so the one-line message
    always says which file to look at.
    """

    exit_code = EXIT_ERROR

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None, *,
                 dangerous: tuple[str, ...] = (),
                 spellings: Mapping[str, str] = MappingProxyType({})) -> None:
        """``dangerous``: code-running globals met before the input was refused, for reports
        that name them; ``spellings``: the file's own spelling of those it spells
        differently (``commands.Popen``)."""
        self.path = os.fspath(path) if path is not None else None
        self.message = message
        self.dangerous = dangerous
        self.spellings = MappingProxyType(dict(spellings))
        super().__init__(self.line())

    def __copy__(self) -> CkptportError:
        """A copy by fields: subclasses take other constructor arguments than ``args``."""
        made = type(self).__new__(type(self))
        made.__dict__.update(self.__dict__)
        made.args = self.args
        return made

    def at(self, path: str | os.PathLike[str]) -> CkptportError:
        """This error naming ``path``, if it named no file yet (a new error; this one
        stays as it was raised)."""
        if self.path is not None:
            return self
        made = copy.copy(self)
        made.path = os.fspath(path)
        made.args = (made.line(),)
        return made

    def naming(self, dangerous: tuple[str, ...], spellings: Mapping[str, str]) -> CkptportError:
        """This error, also naming code-running globals met before it (a new error)."""
        made = copy.copy(self)
        made.dangerous = tuple(dict.fromkeys((*self.dangerous, *dangerous)))
        made.spellings = MappingProxyType({**self.spellings, **spellings})
        return made

    def line(self) -> str:
        """The single line shown to the user."""
        text = printable(" ".join(self.message.split()))
        return f"{printable(self.path)}: {text}" if self.path else text


class InputError(CkptportError):
    """The source cannot be read: missing, corrupt, truncated, unrecognized."""

    @classmethod
    def from_os_error(cls, exc: OSError, path: str | os.PathLike[str]) -> InputError:
        """The cause in the words users search for, not errno prose."""
        if isinstance(exc, FileNotFoundError):
            return cls("no such file", path)
        if isinstance(exc, IsADirectoryError):
            return cls("is a directory, not a checkpoint file", path)
        if isinstance(exc, PermissionError):
            return cls("permission denied", path)
        return cls(f"cannot read: {exc.strerror or exc}", path)


class UnsafeCheckpointError(InputError):
    """The source needs globals that ckptport will not run without ``--trust``."""

    def __init__(self, path: str | os.PathLike[str] | None, globals_: tuple[str, ...],
                 why: str, spellings: Mapping[str, str] = MappingProxyType({})) -> None:
        self.globals = globals_
        super().__init__(why, path, dangerous=globals_, spellings=spellings)


class CodeArchiveError(InputError):
    """A TorchScript or torch.package archive: loading it runs the code it carries."""


class DeadlineError(InputError, TimeoutError):
    """A remote peer did not answer within its deadline (``remote.deadline``); callers may
    catch it as the standard ``TimeoutError``."""


class OptionError(CkptportError):
    """An option's value is not one ckptport can use (a code, a ratio, a manifest's options)."""


class SelectionError(CkptportError):
    """``--select`` names something the checkpoint does not hold."""


class RuleError(CkptportError):
    """A normalize rule cannot apply without losing data (e.g. two keys collide)."""


class StateDictMismatchError(CkptportError):
    """``load_into``: the checkpoint's keys do not match the model's."""


class OutputError(CkptportError):
    """The destination cannot be written: exists, is the source, disk full."""


class VerificationError(CkptportError):
    """The written file does not read back as what was meant to be written."""
