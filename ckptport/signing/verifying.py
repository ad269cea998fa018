"""``verify`` and ``verify --chain``: a model against its signatures, and an output against
the signed source it was normalized from."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..analysis.manifests import (
    ManifestComparison,
    compare_manifests,
    manifest_of,
    manifest_options,
)
from ..checkpoint import Checkpoint
from ..errors import OptionError, SignatureError
from ..progress import Progress, no_progress
from ..rules import NormalizeOptions
from .attestation import Attestation, read_attestation
from .bundles import OMS_PREDICATE, SignedStatement, open_statement
from .files import FilesComparison, compare_files
from .keys import TrustedKeys
from .onepass import TensorRanges
from .paths import attestation_path, signature_paths

if TYPE_CHECKING:
    from ..analysis.digest import TensorEntry
    from ..tensors import ViewKey

__all__ = ["VerifyReport", "ChainReport", "verify", "verify_chain", "signed_weights"]


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found: the files against the OMS signature, the weights against the
    attestation (each ``None`` where not checked), and whether that is a pass."""

    path: str | os.PathLike[str]
    files: FilesComparison | None
    weights: ManifestComparison | None
    attestation: Attestation | None
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        if self.weights is not None:  # the weights decide: a converted file passes here
            return 0 if _weights_same(self.weights) else 1
        return 0 if self.files is not None and self.files.same else 1

    def lines(self) -> list[str]:
        made = []
        if self.files is not None:
            f = self.files
            if f.same:
                made.append(f"files: the {f.compared} files match {f.signature} "
                            f"(signed, {f.by})")
            else:
                made.append(f"files: differ from {f.signature} (signed, {f.by}):")
                made += [f"  added {n}" for n in f.added]
                made += [f"  removed {n}" for n in f.removed]
                made += [f"  changed {n}" for n in f.changed]
        if self.weights is not None and self.attestation is not None:
            w, a = self.weights, self.attestation
            if _weights_same(w):
                made.append(f"weights: the {w.compared} tensors match {a.path} (signed, {a.by}): "
                            f"weights digest sha256:{a.manifest.digest}")
            else:
                made.append(f"weights: differ from {a.path} (signed, {a.by}):")
                made += _differences(w, "  ")
        verdict = "verified" if self.exit_code == 0 else "NOT verified"
        return [f"{self.path}: {verdict}", *made, *self.notes]


def _weights_same(c: ManifestComparison) -> bool:
    return not (c.missing or c.unexpected or c.changed)


def _differences(c: ManifestComparison, indent: str) -> list[str]:
    """Each tensor missing, extra or different, one line each."""
    return [*(f"{indent}missing {n}" for n in c.missing),
            *(f"{indent}extra {n}" for n in c.unexpected),
            *(f"{indent}different {e.name}: {_what(e, g)}" for e, g in c.changed)]


def _what(expected: TensorEntry, actual: TensorEntry) -> str:
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype}, signed {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {list(actual.shape)}, signed {list(expected.shape)}"
    return f"content sha256:{actual.sha256[:16]}…, signed sha256:{expected.sha256[:16]}…"


def _statements(src: str | os.PathLike[str], signatures: tuple[Path, ...],
                trusted: TrustedKeys, remote: bool) -> list[SignedStatement]:
    """The verified statements of ``signatures`` (``_opened``); by default the pair ``sign``
    writes beside ``src``."""
    if not signatures:
        oms, attested = signature_paths(src if remote else Path(src))
        signatures = tuple(p for p in (oms, attested) if p.exists())
        if not signatures:
            raise SignatureError(f"no signature beside it ({oms.name}, {attested.name}); "
                                 "name one with --signature FILE", str(src))
    return _opened(signatures, trusted)


def _opened(signatures: tuple[Path, ...], trusted: TrustedKeys) -> list[SignedStatement]:
    """The signature files verified, each OMS one with the weights attestation beside it if
    there is one."""
    listed = list(dict.fromkeys(signatures))
    for path in signatures:
        beside = attestation_path(path)
        if beside != path and beside not in listed and beside.exists():
            listed.append(beside)
    return [open_statement(path, trusted) for path in listed]


def signed_weights(signature: Path, trusted: TrustedKeys) -> Attestation:
    """The verified weights attestation ``signature`` is (or lies beside, for an OMS
    signature): what ``check --verify-signature`` gates on."""
    weights = [read_attestation(s) for s in _opened((signature,), trusted)
               if s.predicate_type != OMS_PREDICATE]
    if not weights:
        raise SignatureError("holds no weights attestation, and none lies beside it "
                             f"({attestation_path(signature).name}): ckptport sign writes one",
                             signature)
    return weights[0]


def verify(src: str | os.PathLike[str], trusted: TrustedKeys, *, signatures: tuple[Path, ...] = (),
           jobs: int | None = None, trust: bool = False, max_expansion: float | None = None,
           tag: str | None = None, checkpoint: Checkpoint | None = None,
           progress: Progress = no_progress) -> VerifyReport:
    """``src`` against its signatures: its files (OMS) and its weights (the attestation).

    A bad bundle, signature, key or certificate, or a statement that contradicts itself,
    is a ``SignatureError`` (exit 2); differences are in the report (exit 1).
    """
    from ..readers import open_checkpoint
    from ..remote import is_remote

    remote = is_remote(src)
    statements = _statements(src, signatures, trusted, remote)
    oms = [s for s in statements if s.predicate_type == OMS_PREDICATE]
    weights = [read_attestation(s) for s in statements if s.predicate_type != OMS_PREDICATE]
    if len(oms) > 1 or len(weights) > 1:
        raise OptionError("give one OMS signature and one weights attestation at most")
    notes = []
    if remote and oms and not weights:
        raise SignatureError("a remote source's files are not downloaded, so an OMS signature "
                             "alone cannot be checked: give its weights attestation",
                             oms[0].path)
    if remote and oms:
        notes.append(f"not checked: {oms[0].path} (a remote source's files are not "
                     "downloaded; its weights are checked)")
    attestation = weights[0] if weights else None
    local_files = oms[0] if oms and not remote else None
    compared, comparison = None, None
    if attestation is None:
        compared = None if local_files is None else compare_files(Path(src), local_files)
    else:
        comparison, compared = _weights_and_files(
            src, attestation, local_files, checkpoint or open_checkpoint(
                src, trust=trust, max_expansion=max_expansion, tag=tag), jobs, progress)
    if compared is not None and not compared.same and comparison is not None \
            and _weights_same(comparison):
        notes.append("the files are not the signed files (another container or layout?) but "
                     "the weights are the signed weights")
    return VerifyReport(src, compared, comparison, attestation, tuple(notes))


def _weights_and_files(src: str | os.PathLike[str], attestation: Attestation,
                       local_files: SignedStatement | None, read: Checkpoint,
                       jobs: int | None, progress: Progress
                       ) -> tuple[ManifestComparison, FilesComparison | None]:
    """The weights of ``read`` against the attestation and, given the OMS statement
    ``local_files``, the files against it, checked by the read that hashes the tensors."""
    found: list[FilesComparison] = []

    def with_files(normalized: Checkpoint) -> dict[ViewKey, str]:
        """The files checked by the read that also hashes the tensors in them."""
        assert local_files is not None
        ranges = TensorRanges(normalized.tree)
        found.append(compare_files(Path(src), local_files, ranges, jobs))
        return ranges.done

    expected = attestation.manifest
    actual = manifest_of(read, manifest_options(expected), jobs=jobs, progress=progress,
                         known=None if local_files is None else with_files)
    return compare_manifests(expected, actual), found[0] if found else None


@dataclass(frozen=True)
class ChainReport:
    """``verify OUT --chain SRC``: the signed source, the output against its own
    attestation, the link between them, and the output re-derived from the source."""

    source: VerifyReport
    output: VerifyReport
    recorded: str  # the source digest the output's derivation records
    actual: str  # the source's weights digest (default options)
    rederived: ManifestComparison

    @property
    def linked(self) -> bool:
        return self.recorded == self.actual

    @property
    def exit_code(self) -> int:
        same = self.linked and _weights_same(self.rederived)
        return 0 if self.source.exit_code == self.output.exit_code == 0 and same else 1

    def lines(self) -> list[str]:
        made = [f"{self.output.path}: chain from {self.source.path} "
                + ("verified" if self.exit_code == 0 else "NOT verified")]
        made += [f"  source {line}" for line in self.source.lines()]
        made += [f"  output {line}" for line in self.output.lines()]
        if not self.linked:
            made.append(f"  link: the output's derivation records the source sha256:"
                        f"{self.recorded}, the source's weights are sha256:{self.actual}")
        r = self.rederived
        if _weights_same(r):
            made.append(f"  re-derived: the {r.compared} tensors are what the recorded options "
                        "make of the source, bit for bit")
        else:
            made.append("  re-derived: the output is not what the recorded options make of "
                        "the source:")
            made += _differences(r, "    ")
        return made


def verify_chain(output: str | os.PathLike[str], source: str | os.PathLike[str],
                 trusted: TrustedKeys, *,
                 signatures: tuple[Path, ...] = (), output_signatures: tuple[Path, ...] = (),
                 jobs: int | None = None, trust: bool = False,
                 max_expansion: float | None = None, tag: str | None = None,
                 progress: Progress = no_progress) -> ChainReport:
    """``output`` (signed by ``normalize --sign``) against ``source``'s signature: the source
    is the signed one, the output's attestation is valid and names the source's digest, and
    normalizing the source with the recorded options gives the output's tensors again."""
    from ..analysis.manifests import options_from_json
    from ..readers import open_checkpoint

    read = open_checkpoint(source, trust=trust, max_expansion=max_expansion, tag=tag)
    signed = verify(source, trusted, signatures=signatures, jobs=jobs, checkpoint=read,
                    progress=progress)
    if signed.attestation is None:
        raise SignatureError("--chain needs the source's weights attestation (ckptport sign "
                             "writes it beside the OMS signature)", str(source))
    made = verify(output, trusted, signatures=output_signatures, jobs=jobs, trust=trust,
                  max_expansion=max_expansion, progress=progress)
    if made.attestation is None or made.attestation.derivation is None:
        raise SignatureError("the output's weights attestation records no derivation (made "
                             "by normalize --sign)", str(output))
    derivation = made.attestation.derivation
    try:
        options = options_from_json(derivation.get("options", {}))
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"the derivation's options: {exc}", made.attestation.path) \
            from None
    default = NormalizeOptions()
    actual = signed.attestation.manifest.digest \
        if manifest_options(signed.attestation.manifest) == default \
        else manifest_of(read, default, jobs=jobs, progress=progress).digest
    again = manifest_of(read, options, jobs=jobs, progress=progress)
    return ChainReport(signed, made, str(derivation["source"].get("digest")), actual,
                       compare_manifests(again, made.attestation.manifest))
