"""Running the codes over files: the folders searched, each file read once, the report."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ...analysis.survey import survey
from ...compare import Tolerance
from ...errors import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_OK,
    CkptportError,
    CodeArchiveError,
    InputError,
    OptionError,
)
from ...progress import Progress, no_progress
from ...readers import open_checkpoint, tag_for, tag_somewhere
from ...remote.urls import RemotePath
from ...rules import NormalizeOptions, check_selection
from .codes import (
    ATTESTATION,
    CODES,
    FINITE,
    FORMATS,
    MANIFEST,
    REFERENCE,
    chosen_codes,
    dangerous_message,
    spelled_as,
)
from .file import FINITE_SCOPES, CheckSettings, FileUnderCheck, Hit, Severity

if TYPE_CHECKING:
    from ...remote import RemotePath
    from ...signing import TrustedKeys

__all__ = ["Finding", "FileResult", "Skipped", "CheckReport", "check"]


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    path: Path | RemotePath  # the file, or the member file of a layout it concerns
    key: str | None
    message: str


@dataclass(frozen=True)
class FileResult:
    path: Path | RemotePath
    findings: tuple[Finding, ...]
    unreadable: bool = False


@dataclass(frozen=True)
class Skipped:
    """A file in a checked folder that no checkpoint loader can open."""

    path: Path | RemotePath
    reason: str


@dataclass(frozen=True)
class CheckReport:
    files: tuple[FileResult, ...]
    codes: tuple[str, ...]  # the codes that ran
    skipped: tuple[Skipped, ...] = ()
    findings: int = field(init=False)
    exit_code: int = field(init=False)

    def __post_init__(self) -> None:
        count = sum(len(f.findings) for f in self.files)
        code = EXIT_ERROR if any(f.unreadable for f in self.files) else (
            EXIT_FINDINGS if count else EXIT_OK)
        object.__setattr__(self, "findings", count)
        object.__setattr__(self, "exit_code", code)


def check(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    codes: Iterable[str] = (),
    ignore: Iterable[str] = (),
    finite: str | None = None,
    require_format: Iterable[str] = (),
    against: str | os.PathLike[str] | None = None,
    against_manifest: str | os.PathLike[str] | None = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    options: NormalizeOptions | None = None,
    max_expansion: float | None = None,
    tag: str | None = None,
    verify_signature: str | os.PathLike[str] | None = None,
    trusted: TrustedKeys | None = None,
    progress: Progress = no_progress,
) -> CheckReport:
    """Run the codes on every file (folders searched for every file a loader could open).

    Args:
        paths: one path or several; a folder is searched for every checkpoint in it.
        codes: run only these codes (``"CKP001"``); default: every code the other
            arguments ask for. ``ignore``: skip these. CKP003 always runs: a file whose
            full unpickling runs code never passes (ignoring it is an ``OptionError``).
        finite: ``"weights"`` checks the weights ``options.select`` picks for NaN/inf,
            ``"all"`` every tensor (CKP006); None: not checked.
        require_format: container formats allowed (CKP007).
        against / against_manifest: a reference checkpoint (CKP009, within
            ``atol``/``rtol``) or a manifest (CKP010) the files must agree with.
        options: how both sides are normalized for ``against`` and the weights picked.
        max_expansion: ``readers.budget``'s ratio for CKP014 (default 2).
        tag: a DeepSpeed save folder's tag to check (default: the one ``latest`` names).
        verify_signature: a weights attestation (or the OMS signature it lies beside) the
            files' weights must be (CKP015), its signature verified with ``trusted``
            (``signing.TrustedKeys``).

    Returns:
        A ``CheckReport``: findings per file, files skipped, and the exit code.

    Raises:
        OptionError: an unknown code or finite scope; a code asked for without the input it
            needs (``CheckCode.needs``: ``codes=["CKP009"]`` without ``against``), an input
            whose code is left out, or an argument that would change nothing (``atol``
            without ``against``, ``trusted`` without ``verify_signature``).
        CkptportError: the reference, manifest or signature cannot be read or does not
            verify (a checked file that cannot be read is a CKP008 finding, not an error).
    """
    if options is not None and options.select.upper() in CODES:  # meant --codes
        raise OptionError(f"--select {options.select} names a check code: --codes "
                          f"{options.select} runs only it (--select picks the weights "
                          "--finite and --against read)")
    if finite is not None and finite not in FINITE_SCOPES:
        raise OptionError(f"finite must be one of {', '.join(FINITE_SCOPES)} or None, not "
                          f"{finite!r}")
    options = options or NormalizeOptions()
    _refuse_idle(options, finite, against, atol, rtol)
    OptionError.only_with(ATTESTATION, verify_signature, [
        ("--public-key, --certificate-chain or --sigstore-identity", trusted)])
    OptionError.only_with("--public-key, --certificate-chain or --sigstore-identity", trusted,
                          [(ATTESTATION, verify_signature)])
    from ...readers.budget import ratio_of

    given = frozenset(option for option, value in (
        (FINITE, finite), (FORMATS, tuple(require_format)), (REFERENCE, against),
        (MANIFEST, against_manifest), (ATTESTATION, verify_signature)) if value)
    settings = CheckSettings(formats=tuple(require_format), finite=finite, options=options,
                             tolerance=Tolerance(atol, rtol), progress=progress,
                             max_expansion=ratio_of(max_expansion), tag=tag, given=given)
    chosen = chosen_codes(codes, ignore, settings)
    found, skipped = _expand([paths] if isinstance(paths, (str, os.PathLike)) else paths)
    tag_somewhere([*found, against], tag)
    settings = _with_inputs(settings, against, against_manifest, verify_signature, trusted,
                            max_expansion)
    files = tuple(_check_file(path, chosen, settings) for path in found)
    return CheckReport(files, chosen, tuple(skipped))


def _refuse_idle(options: NormalizeOptions, finite: str | None,
                 against: str | os.PathLike[str] | None, atol: float, rtol: float) -> None:
    """Refuse options that would change nothing: the tolerances and the normalize options
    act on what ``--against`` compares; ``--finite`` reads only the weights ``--select`` and
    ``--ema`` pick (``--finite-all``: every tensor, whatever was picked)."""
    OptionError.only_with(REFERENCE, against, [("--atol", atol), ("--rtol", rtol)])
    picking = ("--select", "--ema", "--prefer-ema")
    given = options.given()
    OptionError.only_with(REFERENCE, against, [(o, o not in picking) for o in given])
    OptionError.only_with(f"{REFERENCE} or --finite", against or finite == "weights",
                          [(o, o in picking) for o in given])


def _with_inputs(settings: CheckSettings, against: str | os.PathLike[str] | None,
                 against_manifest: str | os.PathLike[str] | None,
                 verify_signature: str | os.PathLike[str] | None,
                 trusted: TrustedKeys | None, max_expansion: float | None) -> CheckSettings:
    """``settings`` with what the codes compare with, each read once: the reference
    checkpoint (CKP009), the manifest (CKP010), the verified weights attestation (CKP015);
    each given only with its code chosen (``chosen_codes``)."""
    if against is not None:
        settings = replace(settings, reference=open_checkpoint(
            against, max_expansion=max_expansion, tag=tag_for(Path(against), settings.tag)))
    if against_manifest is not None:
        from ...analysis.manifests import load_manifest

        settings = replace(settings, manifest=load_manifest(against_manifest))
    if verify_signature is not None and trusted is not None:
        from ...signing import signed_weights

        settings = replace(settings, attestation=signed_weights(Path(verify_signature),
                                                                trusted))
    return settings


def _expand(paths: Iterable[str | os.PathLike[str]]
            ) -> tuple[list[Path | RemotePath | _NoCheckpoint], list[Skipped]]:
    """Every checkpoint to check, and every other file of the folders given: a local folder,
    or a bucket folder or hub repository holding several checkpoints (searched from its
    listing, as folder mode searches it)."""
    from ...readers import is_folder_of_checkpoints
    from ...readers.discover import discover
    from ...remote import location

    found: list[Path | RemotePath | _NoCheckpoint] = []
    skipped: list[Skipped] = []
    for raw in paths:
        path = location(raw)
        searched = path.is_dir() if isinstance(path, Path) else is_folder_of_checkpoints(path)
        if not searched:
            found.append(path)
            continue
        try:
            items = discover(path)
        except OSError as exc:
            raise InputError(f"cannot search the folder: {exc.strerror or exc}", path) from None
        found += [item.path for item in items.checkpoints]
        skipped += [Skipped(p, why) for p, why in items.others]
        if not items.checkpoints:  # empty, or only configs and READMEs: fails the gate
            found.append(_NoCheckpoint(path, len(items.others)))
    return found, skipped


@dataclass(frozen=True)
class _NoCheckpoint:
    """A folder searched in which nothing is a checkpoint (an export that wrote no weights)."""

    path: Path | RemotePath
    files: int


def _check_file(path: Path | RemotePath | _NoCheckpoint, codes: tuple[str, ...],
                settings: CheckSettings) -> FileResult:
    if isinstance(path, _NoCheckpoint):
        held = f"none of its {path.files} files is one" if path.files else "it is empty"
        return _unreadable(path.path, InputError(
            f"holds no checkpoint: {held} (an export that wrote no weights?)", path.path), codes)
    try:
        checkpoint = open_checkpoint(path, lenient=True,  # for a report: nothing refused
                                     tag=tag_for(path, settings.tag))
        file = FileUnderCheck(checkpoint, survey(checkpoint), settings)
    except CkptportError as exc:
        return _unreadable(path, exc, codes)
    if settings.options != NormalizeOptions() and not file.dangerous:
        check_selection(checkpoint, settings.options)  # the options' error, not the file's
    try:
        findings = [_finding(code, hit, path) for code in codes for hit in CODES[code].run(file)]
    except CkptportError as exc:
        return _unreadable(path, exc, codes)
    return FileResult(path, tuple(findings))


def _finding(code: str, hit: Hit, path: Path | RemotePath) -> Finding:
    """A code's hit as a finding: on the member file it names, else on the checked path."""
    return Finding(code, CODES[code].severity, hit[2] if len(hit) == 3 else path, hit[0],
                   hit[1])


def _unreadable(path: Path | RemotePath, exc: CkptportError, codes: tuple[str, ...]) -> FileResult:
    """A file that cannot be read; the code-running globals met first are still named."""
    message = " ".join(exc.message.split())
    code = "CKP011" if isinstance(exc, CodeArchiveError) else "CKP008"
    member = path  # a layout's member file that is the cause (a rank file, its latest)
    if isinstance(path, Path) and exc.path is not None and path.is_dir():
        member = Path(exc.path)
    findings = [Finding(code, CODES[code].severity, member, None, message)]
    findings += [Finding("CKP003", Severity.ERROR, member, None, dangerous_message(
                     name, spelled_as(name, exc.spellings.get(name)))) for name in exc.dangerous]
    kept = tuple(f for f in findings if f.code in codes)
    return FileResult(path, kept, unreadable=not exc.dangerous and code == "CKP008")

