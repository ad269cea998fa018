"""``ckptport check``: the CI gate on exported checkpoints.

Each code has a stable name, a severity, and a one-line message naming the
file and the key it concerns; ``CODES`` documents what each finds, why it
matters and how to fix it (the README's table is made from it). Files are
read for a report: a file with a code-running global is a finding that
names it, and nothing in it runs. No tensor byte is read unless ``finite``
or ``against`` needs values, and torch is not imported for zip, legacy and
safetensors files or shard sets.

A folder is searched for every regular file any loader could open:
checkpoint files whatever their extension (``.PT``, ``.pth.tar``), shard
sets, DCP and Hugging Face folders, and any other file whose bytes
``torch.load`` would unpickle. A file that no loader can open is listed as
skipped with the reason, never silently passed over.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..analysis.survey import InspectReport, survey
from ..checkpoint import Checkpoint, Format
from ..compare import Tolerance
from ..errors import (
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_OK,
    CkptportError,
    CodeArchiveError,
    InputError,
    OptionError,
)
from ..progress import Progress, no_progress
from ..readers import open_checkpoint, tag_for, tag_somewhere
from ..rules import NormalizeOptions, check_selection
from ..tensors import human_bytes
from ..tree import TextEnum
from ..unpickle import allowed_names
from ..unpickle.names import unresolved_package

__all__ = ["CheckCode", "CheckSettings", "FileUnderCheck", "CODES", "Finding", "Severity",
           "FileResult", "Skipped", "CheckReport", "check", "FINITE_SCOPES"]

FINITE_SCOPES = ("weights", "all")


class Severity(TextEnum):
    """How a finding is annotated (GitHub ``::error`` / ``::warning``); both fail the gate."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    path: Path
    key: str | None
    message: str


@dataclass(frozen=True)
class CheckSettings:
    """What a check run was asked for; a code's ``wanted`` decides from it whether it runs."""

    formats: tuple[str, ...] = ()  # --require-format
    finite: str | None = None  # "weights" or "all" (--finite)
    reference: Checkpoint | None = None  # --against
    manifest: Any = None  # --against-manifest, loaded
    options: NormalizeOptions = field(default_factory=NormalizeOptions)
    tolerance: Tolerance = field(default_factory=Tolerance)  # --atol/--rtol for --against
    progress: Progress = no_progress  # reading tensor bytes (--finite, --against)
    max_expansion: float = 2.0  # readers.budget's ratio
    tag: str | None = None  # a DeepSpeed save folder's tag (None: follow ``latest``)
    attestation: Any = None  # --verify-signature: the signed weights attestation, verified


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
        from ..readers.budget import over_budget

        return over_budget(self.checkpoint, self.settings.max_expansion)

    @property
    def values_readable(self) -> bool:
        """Whether codes that read tensor values may run: nothing dangerous, within budget."""
        return not self.dangerous and self.over_budget is None


# (key or None, message), or with the member file of a layout it concerns (a rank file)
Hit = tuple[str | None, str] | tuple[str | None, str, Path]


def _always(settings: CheckSettings) -> bool:
    return True


def _nothing(file: FileUnderCheck) -> Iterable[Hit]:
    return ()


@dataclass(frozen=True)
class CheckCode:
    """A check: what it is (documented), whether a run wants it, and what it finds in a file.

    To add one: a function from ``FileUnderCheck`` to ``(key, message)`` pairs,
    in a module of its own if it is large, and one entry in ``CODES``.
    """

    code: str
    name: str
    severity: Severity  # both fail the gate (exit 1); annotations and readers tell them apart
    finds: str
    why: str
    fix: str
    run: Callable[[FileUnderCheck], Iterable[Hit]] = _nothing
    wanted: Callable[[CheckSettings], bool] = _always


def _spelled(name: str, raw: str | None) -> str | None:
    return f"{name} (named {raw} in the file)" if raw else None


def _dangerous_message(name: str, spelled: str | None = None) -> str:
    return (f"dangerous global {spelled or name}: loading this file with full unpickling "
            "runs it (nothing was run)")


def _fate(name: str) -> str:
    """What ``normalize`` does with an object of this global, in words."""
    if name in allowed_names():
        return "normalize converts it to plain data"
    return "normalize keeps it as an inert record with --select all (nothing is run)"


def _device_bound(file: FileUnderCheck) -> Iterable[Hit]:
    for location, count in file.report.storage_locations.items():
        if location != "cpu":
            yield None, (f"{count} storages recorded on {location}; torch.load without "
                         "map_location fails without that device")


def _where(report: InspectReport) -> dict[str, str]:
    return {o.global_name: o.key for o in report.blocking_objects}


def _global_hit(file: FileUnderCheck, name: str, message: str) -> Hit:
    """A finding on a global: at its key, in the member file it was met in (a layout's)."""
    key = _where(file.report).get(name)
    member = file.checkpoint.source.origins.get(name)
    return (key, message) if member is None else (key, message, member)


def _beyond_weights_only(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for name in report.globals_beyond_weights_only:
        if name not in report.unproven_callables:
            spelled = _spelled(name, report.spellings.get(name)) or name
            yield _global_hit(file, name, f"needs {spelled}, which torch.load("
                              f"weights_only=True) refuses; {_fate(name)}")


def _dangerous(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for name in report.dangerous_globals:
        yield _global_hit(file, name, _dangerous_message(
            name, _spelled(name, report.spellings.get(name))))


def _third_party_calls(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for name in report.unproven_callables:
        spelled = _spelled(name, report.spellings.get(name)) or name
        package = unresolved_package(name)
        unseen = f"; ckptport never imports {package} to see what it does" if package else ""
        yield _global_hit(file, name, (
            f"calls {spelled}(…), which full unpickling would run; it cannot be proven "
            f"harmless{unseen} (nothing was run; normalize keeps the call as data, or refuses "
            "it when it is handed tensors)"))


def _expansion(file: FileUnderCheck) -> Iterable[Hit]:
    why = file.over_budget
    if why is not None:
        yield (file.checkpoint.source.largest[0][0] if file.checkpoint.source.largest
               else None), why


def _wrapper_prefixes(file: FileUnderCheck) -> Iterable[Hit]:
    report = file.report
    for prefix, count in report.wrapper_prefixes.items():
        yield report.wrapper_examples.get(prefix), \
            f"{count} keys carry the wrapper prefix {prefix!r}"


def _storage_bloat(file: FileUnderCheck) -> Iterable[Hit]:
    for bloat in file.report.storage_bloat:
        yield bloat.key, (f"storage of {human_bytes(bloat.storage_bytes)} holds "
                          f"{human_bytes(bloat.used_bytes)} of tensor data")


def _non_finite(file: FileUnderCheck) -> Iterable[Hit]:
    from ..analysis.finite import non_finite

    assert file.settings.finite is not None
    if not file.values_readable:
        return ()
    return non_finite(file.checkpoint, file.settings.options, file.settings.finite,
                      file.settings.progress)


def _format(file: FileUnderCheck) -> Iterable[Hit]:
    formats, fmt = file.settings.formats, file.report.format.value
    if fmt not in formats:
        yield None, f"format {fmt}, required: {', '.join(formats)}"


def _against_reference(file: FileUnderCheck) -> Iterable[Hit]:
    if not file.values_readable or file.settings.reference is None:
        return ()
    return _against(file.checkpoint, file.settings)


def _against_manifest(file: FileUnderCheck) -> Iterable[Hit]:
    if not file.values_readable:
        return ()
    from ..analysis.manifests import against_manifest

    return _listed_hits(against_manifest(file.checkpoint, file.settings.manifest,
                                         progress=file.settings.progress), "the manifest")


def _against_signature(file: FileUnderCheck) -> Iterable[Hit]:
    if not file.values_readable:
        return ()
    from ..analysis.manifests import against_manifest

    return _listed_hits(against_manifest(file.checkpoint, file.settings.attestation.manifest,
                                         progress=file.settings.progress),
                        "the signed attestation")


def _listed_hits(found: Any, what: str) -> list[Hit]:
    """A ``ManifestComparison`` as findings: each tensor missing, unexpected or changed."""
    hits = [(name, f"missing ({what} lists it)") for name in found.missing]
    hits += [(name, f"unexpected ({what} does not list it)") for name in found.unexpected]
    for want, have in found.changed:
        hits.append((want.name, f"{have.dtype}{list(have.shape)}, {what} says "
                                f"{want.dtype}{list(want.shape)}"
                     if (want.dtype, want.shape) != (have.dtype, have.shape) else
                     f"content changed (sha256 {have.sha256[:12]}…, {what} says "
                     f"{want.sha256[:12]}…)"))
    return sorted(hits)


def _code_archive(file: FileUnderCheck) -> Iterable[Hit]:
    if file.report.format is Format.TORCHSCRIPT:
        yield None, ("a TorchScript archive: loading it runs its code; use normalize --trust "
                     "if you vouch for it")


def _partial_layout(file: FileUnderCheck) -> Iterable[Hit]:
    from ..readers.layouts import PROBLEMS
    from ..readers.ranks import one_rank

    problems = file.checkpoint.source.metadata.get(PROBLEMS)
    for line in problems.splitlines() if problems else ():
        yield None, line
    shard = one_rank(file.checkpoint.tree)
    if shard is not None:
        key, layout = shard
        yield key, (f"holds rank {layout.rank}'s shard of a tensor sharded over {layout.world} "
                    "ranks: one rank file of a sharded state dict; read the folder of all "
                    "rank files as one checkpoint")


def _quantization(file: FileUnderCheck) -> Iterable[Hit]:
    from ..analysis.quantized import quantization_findings

    yield from quantization_findings(file.checkpoint, values=file.values_readable)


CODES = {rule.code: rule for rule in (
    CheckCode("CKP001", "device-bound", Severity.WARNING,
              "storages the file records on a device other than the CPU (cuda:3)",
              "torch.load without map_location fails on a machine without that device",
              "ckptport normalize SRC DST (maps to cpu; --anchor cpu)", _device_bound),
    CheckCode("CKP002", "globals-beyond-weights-only", Severity.WARNING,
              "globals plain torch.load(weights_only=True) refuses (argparse.Namespace, numpy, "
              "custom classes), each named with what normalize does with it",
              "since PyTorch 2.6 consumers must pass weights_only=False, which runs any code",
              "ckptport normalize SRC DST (turns objects into plain data)", _beyond_weights_only),
    CheckCode("CKP003", "dangerous-global", Severity.ERROR,
              "globals that run code, import or touch files (os.system, builtins.eval, "
              "subprocess.*, every standard-library global but its few data classes, what a "
              "name reaches: torch.os is os, …), each named; cannot be ignored",
              "loading the file with full unpickling runs that code",
              "do not load the file; rebuild it from a trusted source", _dangerous),
    CheckCode("CKP004", "wrapper-prefix", Severity.WARNING,
              "state-dict keys wrapped by DDP/DataParallel (module.), torch.compile "
              "(_orig_mod.), FSDP, activation checkpointing",
              "load_state_dict into the bare model fails with missing/unexpected keys",
              "ckptport normalize SRC DST (strips them)", _wrapper_prefixes),
    CheckCode("CKP005", "storage-bloat", Severity.WARNING,
              "storages larger than the bytes their tensors use (a saved slice of a big tensor)",
              "the file carries bytes nobody uses; downloads and loads cost more",
              "ckptport normalize SRC DST (compacts every storage)", _storage_bloat),
    CheckCode("CKP006", "non-finite", Severity.ERROR,
              "NaN or infinite values in floating-point tensors (with --finite)",
              "a diverged run exported as if it were good",
              "export from the last good step", _non_finite,
              lambda settings: settings.finite is not None),
    CheckCode("CKP007", "format", Severity.ERROR,
              "a container format other than --require-format",
              "consumers expect one format (safetensors loads without unpickling)",
              "ckptport normalize SRC DST.safetensors", _format,
              lambda settings: bool(settings.formats)),
    CheckCode("CKP008", "unreadable", Severity.ERROR,
              "a file that cannot be read: corrupt, truncated, ambiguous, hostile pickle",
              "nothing can load it, or loaders disagree on what it holds",
              "re-export it; the message says what is wrong"),
    CheckCode("CKP009", "disagrees-with-reference", Severity.ERROR,
              "tensors or values that differ from --against REF beyond --atol/--rtol",
              "the exported artifact is not the model that was validated",
              "export again from the reference, or compare with ckptport diff",
              _against_reference, lambda settings: settings.reference is not None),
    CheckCode("CKP010", "disagrees-with-manifest", Severity.ERROR,
              "tensors missing, unexpected, or with another dtype, shape or content than "
              "--against-manifest FILE records",
              "the artifact does not hold the weights that were released",
              "export again, or regenerate the manifest with ckptport manifest",
              _against_manifest, lambda settings: settings.manifest is not None),
    CheckCode("CKP011", "code-archive", Severity.ERROR,
              "a TorchScript or torch.package archive: loading it runs code it carries",
              "torch.jit.load and PackageImporter execute the archive's code",
              "ckptport normalize --trust SRC DST if you vouch for it, then ship DST",
              _code_archive),
    CheckCode("CKP012", "third-party-call", Severity.WARNING,
              "third-party callables the file calls (an enum member, a config class, a "
              "function), which ckptport cannot prove harmless, each named",
              "full unpickling (weights_only=False) runs them; a package's own enums are "
              "usually benign, unlike CKP003's code-running names",
              "ckptport normalize SRC DST (keeps them as data); --ignore CKP012 to accept a "
              "package you trust", _third_party_calls),
    CheckCode("CKP013", "partial-layout", Severity.ERROR,
              "a sharded checkpoint that is not whole: a rank file missing, a rank claimed by "
              "two files (rank_1 and rank_01, bf16_ beside plain), rank files of another run "
              "or left over from one with more ranks, pieces (shards, DCP chunks) that leave a "
              "gap or overlap in a tensor, or one rank's file read alone",
              "consolidating it fails or silently mixes runs; a single rank's file holds a "
              "fraction of each tensor",
              "save again from every rank, remove stale or foreign rank files, or check the "
              "whole folder (DeepSpeed tag folder, folder of rank files or shard files)",
              _partial_layout),
    CheckCode("CKP014", "expansion", Severity.ERROR,
              "tensors that stand for more bytes than the budget allows relative to the "
              "file's size (stride-0 or overlapping views), naming the biggest",
              "normalize, manifest and --finite would write or read that much from a small "
              "file (a disk-filling or memory bomb)",
              "re-export the tensors compact; --max-expansion RATIO if the file is yours",
              _expansion),
    CheckCode("CKP015", "not-the-signed-weights", Severity.ERROR,
              "tensors missing, unexpected, or with another dtype, shape or content than the "
              "weights attestation --verify-signature FILE signs (its signature checked with "
              "--public-key or --certificate-chain; a bad one is exit 2)",
              "the artifact does not hold the weights that were signed, in any container",
              "ship the signed weights (ckptport normalize keeps them), or sign the new ones",
              _against_signature, lambda settings: settings.attestation is not None),
    CheckCode("CKP016", "quantization", Severity.ERROR,
              "a quantized checkpoint that cannot be dequantized correctly: a scale without "
              "its weight or an FP8 weight without its scale, scales that do not tile the "
              "weight or are NaN, infinite or zero, packed widths that do not divide, a "
              "config.json that contradicts the tensors, a tensor two schemes claim",
              "every consumer (vLLM, transformers, --dequantize) computes wrong weights or "
              "fails on it",
              "re-export the quantized model with its scales (docs/quantized.md)",
              _quantization),
)}


@dataclass(frozen=True)
class FileResult:
    path: Path
    findings: tuple[Finding, ...]
    unreadable: bool = False


@dataclass(frozen=True)
class Skipped:
    """A file in a checked folder that no checkpoint loader can open."""

    path: Path
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
    trusted: Any = None,
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
        OptionError: an unknown code or finite scope.
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
    from ..readers.budget import ratio_of

    settings = CheckSettings(tuple(require_format), finite, None, None,
                             options or NormalizeOptions(), Tolerance(atol, rtol), progress,
                             ratio_of(max_expansion), tag)
    wanted = replace(settings, reference=_PLANNED if against is not None else None,
                     manifest=_PLANNED if against_manifest is not None else None,
                     attestation=_PLANNED if verify_signature is not None else None)
    chosen = _codes(codes, ignore, wanted)
    found, skipped = _expand([paths] if isinstance(paths, (str, os.PathLike)) else paths)
    tag_somewhere([*found, against], tag)
    if against is not None and "CKP009" in chosen:
        settings = replace(settings, reference=open_checkpoint(
            against, max_expansion=max_expansion, tag=tag_for(Path(against), tag)))
    if against_manifest is not None and "CKP010" in chosen:
        from ..analysis.manifests import load_manifest

        settings = replace(settings, manifest=load_manifest(against_manifest))
    if verify_signature is not None and "CKP015" in chosen:
        from ..signing import signed_weights

        if trusted is None:
            raise OptionError("--verify-signature needs the key or chain it must verify with "
                              "(--public-key, --certificate-chain)")
        settings = replace(settings, attestation=signed_weights(Path(verify_signature),
                                                                trusted))
    files = tuple(_check_file(path, chosen, settings) for path in found)
    return CheckReport(files, chosen, tuple(skipped))


_PLANNED: Any = object()  # stands for a reference or manifest not read yet
ALWAYS = "CKP003"  # runs whatever --codes/--ignore say: code-running names never pass


def _codes(chosen: Iterable[str], skipped: Iterable[str], settings: CheckSettings
           ) -> tuple[str, ...]:
    picked = [c.strip().upper() for item in chosen for c in str(item).split(",") if c.strip()]
    left_out = [c.strip().upper() for item in skipped for c in str(item).split(",") if c.strip()]
    unknown = [c for c in (*picked, *left_out) if c not in CODES]
    if unknown:
        raise OptionError(f"unknown check code {', '.join(unknown)} (known: {', '.join(CODES)})")
    if ALWAYS in left_out:
        raise OptionError(f"{ALWAYS} cannot be ignored: a file whose full unpickling runs code "
                          "never passes check")
    return tuple(c for c, code in CODES.items() if c == ALWAYS or (
        (c in picked if picked else code.wanted(settings)) and c not in left_out))


def _expand(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Any], list[Skipped]]:
    """Every checkpoint to check, and every other file of the folders given."""
    from ..readers.discover import discover
    from ..remote import location

    found: list[Any] = []  # Path, or RemotePath
    skipped: list[Skipped] = []
    for raw in paths:
        path = location(raw)  # a URL stays whole (never a folder to search)
        if not isinstance(path, Path) or not path.is_dir():
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

    path: Path
    files: int


def _check_file(path: Path | _NoCheckpoint, codes: tuple[str, ...], settings: CheckSettings
                ) -> FileResult:
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


def _finding(code: str, hit: Hit, path: Path) -> Finding:
    """A code's hit as a finding: on the member file it names, else on the checked path."""
    return Finding(code, CODES[code].severity, hit[2] if len(hit) == 3 else path, hit[0],
                   hit[1])


def _unreadable(path: Path, exc: CkptportError, codes: tuple[str, ...]) -> FileResult:
    """A file that cannot be read; the code-running globals met first are still named."""
    message = " ".join(exc.message.split())
    code = "CKP011" if isinstance(exc, CodeArchiveError) else "CKP008"
    member = path  # a layout's member file that is the cause (a rank file, its latest)
    if isinstance(path, Path) and exc.path is not None and path.is_dir():
        member = Path(exc.path)
    findings = [Finding(code, CODES[code].severity, member, None, message)]
    findings += [Finding("CKP003", Severity.ERROR, member, None, _dangerous_message(
                     name, _spelled(name, exc.spellings.get(name)))) for name in exc.dangerous]
    kept = tuple(f for f in findings if f.code in codes)
    return FileResult(path, kept, unreadable=not exc.dangerous and code == "CKP008")


def _against(checkpoint: Checkpoint, settings: CheckSettings) -> list[Hit]:
    """Differences from the reference, both sides normalized alike (``ckptport diff``)."""
    from ..analysis.diffing import compare_checkpoints

    reference = settings.reference
    assert reference is not None
    try:
        report = compare_checkpoints(reference, checkpoint,
                                     settings.tolerance,
                                     options_a=settings.options, options_b=settings.options,
                                     progress=settings.progress)
    except CkptportError as exc:  # e.g. no state dict to compare
        return [(None, f"cannot compare with the reference: {' '.join(exc.message.split())}")]
    rows: list[tuple[str | None, str]] = [
        *((k, "missing (in the reference only)") for k in report.only_in_a),
        *((k, "not in the reference") for k in report.only_in_b),
        *((m.key, f"shape {m.shape_b} vs {m.shape_a} in the reference")
          for m in report.shape_mismatches),
        *((d.key, f"{d.differing} values differ, max |a-b| {d.max_abs:.3g}")
          for d in report.value_mismatches),
        *((m.key, f"{m.b} vs {m.a} in the reference") for m in report.leaf_mismatches),
    ]
    if not report.tolerance.cast:
        rows += [(m.key, f"dtype {m.dtype_b} vs {m.dtype_a} in the reference")
                 for m in report.dtype_mismatches]
    name = reference.source.path.name
    return [(key, f"{what} ({name})") for key, what in rows]

