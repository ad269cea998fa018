"""The one exception family of ckptport.

Every failure caused by the input, the options or the output location is a
``CkptportError``. The CLI catches the base class in one place and turns it
into a single line on stderr and an exit code, so a CI job never sees a
traceback for a bad file and never sees exit 0 for a failure.

Each error is also the standard exception it is, so Python callers catch
ours or the one they already know (``except FileNotFoundError`` catches
"no such file"; an ``OSError`` one carries ``errno``, ``strerror`` and
``filename`` as ``open()``'s do)::

    CkptportError
    ├── InputError                    the source cannot be read
    │   ├── InputNotFoundError        + FileNotFoundError
    │   ├── InputIsADirectoryError    + IsADirectoryError
    │   ├── InputPermissionError      + PermissionError
    │   ├── InputOSError              + OSError (any other failed read)
    │   ├── UnsafeCheckpointError     + pickle.UnpicklingError (what torch.load's
    │   │                               weights_only raises for the same file)
    │   ├── CodeArchiveError          TorchScript / torch.package: loading runs code
    │   └── DeadlineError             + TimeoutError (a remote peer did not answer in time)
    ├── OptionError                   + ValueError
    ├── SelectionError                + KeyError
    ├── RuleError                     + ValueError
    ├── StateDictMismatchError        + RuntimeError (what load_state_dict raises)
    ├── OutputError                   the destination cannot be written
    │   ├── OutputExistsError         + FileExistsError
    │   ├── OutputNotFoundError       + FileNotFoundError (its folder does not exist)
    │   ├── OutputIsADirectoryError   + IsADirectoryError
    │   ├── OutputPermissionError     + PermissionError
    │   └── OutputOSError             + OSError (disk full, any other failed write)
    ├── VerificationError             the written file does not read back as meant
    └── SignatureError                + ValueError (what model_signing raises): a bundle,
                                        signature, key or certificate that does not verify

A corrupt or unrecognized source is a plain ``InputError``: no standard
exception says "these bytes are not a checkpoint".
"""

from __future__ import annotations

import copy
import errno
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TypeVar

from .escape import printable

__all__ = [
    "EXIT_OK",
    "EXIT_FINDINGS",
    "EXIT_ERROR",
    "CkptportError",
    "InputError",
    "InputNotFoundError",
    "InputIsADirectoryError",
    "InputPermissionError",
    "InputOSError",
    "UnsafeCheckpointError",
    "CodeArchiveError",
    "DeadlineError",
    "OptionError",
    "SelectionError",
    "StateDictMismatchError",
    "RuleError",
    "OutputError",
    "OutputExistsError",
    "OutputNotFoundError",
    "OutputIsADirectoryError",
    "OutputPermissionError",
    "OutputOSError",
    "VerificationError",
    "SignatureError",
]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2

E = TypeVar("E", bound="CkptportError")


class CkptportError(Exception):
    """Base of every error ckptport raises on bad input, options or output.

    ``path`` names the file the error is about, so the one-line message
    always says which file to look at.
    """

    exit_code = EXIT_ERROR
    #: for the ``OSError`` members: the ``errno`` a caller may compare (EACCES, ENOENT, …)
    os_errno: int | None = None

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
        self._fill_os_fields()

    def __str__(self) -> str:
        """The line, for every member (``OSError``'s and ``KeyError``'s own would differ)."""
        return self.line()

    def _fill_os_fields(self) -> None:
        """``errno``, ``strerror`` and ``filename`` for the members that are OSErrors."""
        if isinstance(self, OSError):
            failure: OSError = self  # OSError's own fields, not new ones of ours
            failure.errno, failure.strerror = self.os_errno, self.message
            failure.filename = self.path

    def caused_by(self: E, exc: OSError) -> E:
        """This error, keeping the ``errno`` of the OS failure it reports (for the members
        whose standard exception is ``OSError`` itself)."""
        self.os_errno = exc.errno
        self._fill_os_fields()
        return self

    def __copy__(self) -> CkptportError:
        """A copy by fields: subclasses take other constructor arguments than ``args``."""
        return _rebuilt(type(self), self.__dict__)

    def __reduce__(self) -> tuple[Callable[[type[CkptportError], dict[str, object]],
                                           CkptportError],
                                  tuple[type[CkptportError], dict[str, object]]]:
        """Pickled by fields too (a folder's workers send errors back to the parent);
        ``OSError``'s own reduce would call the constructor with (errno, strerror)."""
        return _rebuilt, (type(self), {**self.__dict__, "spellings": dict(self.spellings)})

    def at(self, path: str | os.PathLike[str]) -> CkptportError:
        """This error naming ``path``, if it named no file yet (a new error; this one
        stays as it was raised)."""
        if self.path is not None:
            return self
        made = copy.copy(self)
        made.path = os.fspath(path)
        made.args = (made.line(),)
        made._fill_os_fields()
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
    def from_os_error(cls, exc: OSError, path: str | os.PathLike[str]) -> CkptportError:
        """The cause in the words users search for, not errno prose, as the standard
        exception it is (one of ours passes through as raised)."""
        if isinstance(exc, CkptportError):
            return exc
        if isinstance(exc, FileNotFoundError):
            return InputNotFoundError("no such file", path)
        if isinstance(exc, IsADirectoryError):
            return InputIsADirectoryError("is a directory, not a checkpoint file", path)
        if isinstance(exc, PermissionError):
            return InputPermissionError("permission denied", path)
        return InputOSError(f"cannot read: {exc.strerror or exc}", path).caused_by(exc)


class InputNotFoundError(InputError, FileNotFoundError):
    """No file at the source's path."""

    os_errno = errno.ENOENT


class InputIsADirectoryError(InputError, IsADirectoryError):
    """A folder where a checkpoint file was meant."""

    os_errno = errno.EISDIR


class InputPermissionError(InputError, PermissionError):
    """The source may not be read by this user."""

    os_errno = errno.EACCES


class InputOSError(InputError, OSError):
    """The operating system failed a read (an I/O error, a stale handle)."""


class UnsafeCheckpointError(InputError, pickle.UnpicklingError):
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

    os_errno = errno.ETIMEDOUT


class OptionError(CkptportError, ValueError):
    """An option's value is not one ckptport can use (a code, a ratio, a manifest's options),
    or an option given where it would change nothing (``only_with``)."""

    @classmethod
    def only_with(cls, needed: str, present: object, options: Iterable[tuple[str, object]]
                  ) -> None:
        """Refuse the ``(option, value)`` pairs given (a truthy value) while ``needed`` is
        not (``present`` falsy): each acts only with it, and a run that ignored them would
        look as if they had applied (``--atol`` without ``--against``)."""
        idle = [option for option, value in options if value]
        if idle and not present:
            raise cls(f"{' and '.join(idle)} {'acts' if len(idle) == 1 else 'act'} only "
                      f"with {needed}")


class SelectionError(CkptportError, KeyError):
    """``--select`` names something the checkpoint does not hold."""


class RuleError(CkptportError, ValueError):
    """A normalize rule cannot apply without losing data (e.g. two keys collide)."""


class StateDictMismatchError(CkptportError, RuntimeError):
    """``load_into``: the checkpoint's keys do not match the model's."""


class OutputError(CkptportError):
    """The destination cannot be written: exists, is the source, disk full."""


class OutputExistsError(OutputError, FileExistsError):
    """The destination exists and ``--overwrite`` was not given."""

    os_errno = errno.EEXIST


class OutputNotFoundError(OutputError, FileNotFoundError):
    """The folder the destination would be written in does not exist."""

    os_errno = errno.ENOENT


class OutputIsADirectoryError(OutputError, IsADirectoryError):
    """A folder where an output file was meant."""

    os_errno = errno.EISDIR


class OutputPermissionError(OutputError, PermissionError):
    """The destination's folder may not be written by this user."""

    os_errno = errno.EACCES


class OutputOSError(OutputError, OSError):
    """The operating system failed a write (disk full, quota, a read-only file system)."""


class VerificationError(CkptportError):
    """The written file does not read back as what was meant to be written."""


class SignatureError(CkptportError, ValueError):
    """A signature that cannot be trusted or used: not a bundle, a bad signature, a key or
    certificate that does not verify it, a statement that contradicts itself (exit 2)."""


def _rebuilt(cls: type[CkptportError], fields: dict[str, object]) -> CkptportError:
    """An error of ``cls`` with ``fields``, its constructor not called (subclasses take
    other arguments than ``args``)."""
    made = cls.__new__(cls)
    made.__dict__.update(fields)
    made.spellings = MappingProxyType(dict(made.spellings))
    made.args = (made.line(),)
    made._fill_os_fields()
    return made
