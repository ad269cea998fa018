"""What a check code sees: the run's settings, the file under check, and what a code is."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...analysis.survey import InspectReport
from ...checkpoint import Checkpoint
from ...compare import Tolerance
from ...progress import Progress, no_progress
from ...remote.urls import Where
from ...rules import NormalizeOptions
from ...tree import TextEnum

if TYPE_CHECKING:
    from ...analysis.manifests import Manifest
    from ...signing import Attestation

__all__ = ["FINITE_SCOPES", "Severity", "CheckSettings", "FileUnderCheck", "Hit", "CheckCode"]

FINITE_SCOPES = ("weights", "all")


class Severity(TextEnum):
    """How a finding is annotated (GitHub ``::error`` / ``::warning``); both fail the gate."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class CheckSettings:
    """What a check run was asked for: the inputs its codes read (``given`` names them)."""

    formats: tuple[str, ...] = ()  # --require-format
    finite: str | None = None  # "weights" or "all" (--finite)
    reference: Checkpoint | None = None  # --against, read
    manifest: Manifest | None = None  # --against-manifest, loaded
    options: NormalizeOptions = field(default_factory=NormalizeOptions)
    tolerance: Tolerance = field(default_factory=Tolerance)  # --atol/--rtol for --against
    progress: Progress = no_progress  # reading tensor bytes (--finite, --against)
    max_expansion: float = 2.0  # readers.budget's ratio
    tag: str | None = None  # a DeepSpeed save folder's tag (None: follow ``latest``)
    attestation: Attestation | None = None  # --verify-signature: the signed weights, verified
    # the inputs given, spelled as a code's ``needs`` ("--against REF"): a code that needs
    # one runs by default when it is given, and cannot run without it
    given: frozenset[str] = frozenset()


@dataclass(frozen=True)
class FileUnderCheck:
    """One readable file as every code sees it: read once (leniently), inspected once."""

    checkpoint: Checkpoint
    report: InspectReport
    settings: CheckSettings

    @property
    def dangerous(self) -> bool:
        """Running more than the static codes on it would mean trusting it: not done."""
        return bool(self.report.dangerous_globals)

    @property
    def over_budget(self) -> str | None:
        """Why reading its tensor values would be refused (``readers.budget``), if it would."""
        from ...readers.budget import over_budget

        return over_budget(self.checkpoint, self.settings.max_expansion)

    @property
    def values_readable(self) -> bool:
        """Whether codes that read tensor values may run: nothing dangerous, within budget."""
        return not self.dangerous and self.over_budget is None


# (key or None, message), or with the member file of a layout it concerns (a rank file)
Hit = tuple[str | None, str] | tuple[str | None, str, Where]


def _nothing(file: FileUnderCheck) -> Iterable[Hit]:
    return ()


@dataclass(frozen=True)
class CheckCode:
    """A check: what it is (documented), the input it needs, and what it finds in a file.

    To add one: a function from ``FileUnderCheck`` to ``(key, message)`` pairs,
    in a module of its own if it is large, and one entry in ``CODES``. A code
    that reads an input only an option gives (a reference, a manifest) names
    that option as ``needs``: it runs by default when the option is given, and
    asking for it without the option is an ``OptionError`` (``chosen_codes``),
    never a run that passes because there was nothing to compare with.
    """

    code: str
    name: str
    severity: Severity  # both fail the gate (exit 1); annotations and readers tell them apart
    finds: str
    why: str
    fix: str
    run: Callable[[FileUnderCheck], Iterable[Hit]] = _nothing
    needs: str | None = None  # the option giving its input ("--against REF"), as in ``given``
