"""Signed weights: ``ckptport sign`` and ``ckptport verify``.

``sign`` writes two signatures, both Sigstore bundles made by OpenSSF's
``model_signing`` (``keys``, ``bundles``):

- the **OMS signature** over the model's files, exactly as ``model_signing
  sign`` writes it (``model_signing verify`` accepts it, and ``verify``
  accepts what ``model_signing`` signed);
- the **weights attestation** (``attestation``): a statement about the
  weights digest, which survives conversion to another container.

Beside a file ``X`` they are ``X.sig`` and ``X.weights.sig``; in a model
folder ``model.sig`` and ``model.weights.sig`` (left out of the signed
files); ``output`` names the OMS file and the attestation goes beside it.

Each file is read once: the read that hashes a file for the OMS signature
(sha256, as ``model_signing`` does) also hashes the tensors lying in it, on
the other cores (``onepass``); the tensors that lie in no file verbatim are
hashed by the manifest. With ``--file-hash blake3`` the files are hashed by
``model_signing``'s own BLAKE3 hasher while the tensors are hashed beside it. A remote source
(``hf://``, ``s3://``, ``https://``) gets and is verified by the weights
attestation only: its tensors are read, its files are not downloaded.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.manifests import (
    Manifest,
    ManifestComparison,
    compare_manifests,
    manifest_of,
    manifest_options,
)
from ..checkpoint import Checkpoint
from ..errors import OptionError, OutputExistsError, SignatureError
from ..progress import Progress, no_progress
from ..rules import NormalizeOptions
from .attestation import WEIGHTS_PREDICATE, Attestation, read_attestation, weights_predicate
from .bundles import OMS_PREDICATE, SignedStatement, open_statement, sign_statement, signed_bundle
from .files import FILE_HASHES, FilesComparison, compare_files, files_payload
from .keys import SigningKey, TrustedKeys
from .onepass import TensorRanges

__all__ = ["sign", "verify", "SignReport", "VerifyReport", "SigningKey", "TrustedKeys",
           "signature_paths", "attestation_path", "FILE_HASHES", "WEIGHTS_PREDICATE",
           "OMS_PREDICATE", "Attestation", "FilesComparison", "sign_weights", "derivation_of",
           "verify_chain", "ChainReport", "signed_weights"]

FOLDER_SIGNATURE = "model.sig"


def attestation_path(signature: Path) -> Path:
    """Where the weights attestation of the OMS signature ``signature`` lies."""
    stem = signature.name.removesuffix(".sig")
    return signature.with_name(f"{stem}.weights.sig")


def signature_paths(model: Any, output: Path | None = None, *,
                    folder: bool | None = None) -> tuple[Path, Path]:
    """(OMS signature, weights attestation) for ``model``: beside a file, in a folder
    (``folder`` says which for a model not written yet)."""
    if output is None:
        if not isinstance(model, Path):
            raise OptionError("a remote source's signature has no place beside it: name the "
                              "file (-o FILE / --signature FILE)")
        inside = model.is_dir() if folder is None else folder
        output = model / FOLDER_SIGNATURE if inside else model.with_name(model.name + ".sig")
    return output, attestation_path(output)


@dataclass(frozen=True)
class SignReport:
    """What ``sign`` wrote: the OMS signature (``None`` for a remote source) and the weights
    attestation, with the digest it signs."""

    files_signature: Path | None
    attestation: Path
    digest: str
    files: int
    tensors: int
    notes: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        made = [f"wrote {self.attestation}: weights attestation of {self.tensors} tensors, "
                f"weights digest sha256:{self.digest}"]
        if self.files_signature is not None:
            made.insert(0, f"wrote {self.files_signature}: OMS signature over {self.files} files")
        return made + list(self.notes)


def _ignored(model: Path, paths: tuple[Path, ...]) -> list[Path]:
    """The signature files inside a model folder, relative to it (left out of the hash)."""
    root = model.resolve()
    made = []
    for path in paths:
        with contextlib.suppress(ValueError):
            made.append(path.resolve().relative_to(root))
    return made


def _publish(texts: dict[Path, str], overwrite: bool) -> None:
    """Write every file or none (each staged beside its place, then all renamed in)."""
    from ..writers.staging import os_error, staged_file

    with contextlib.ExitStack() as stack:
        staged = []
        for path, text in texts.items():
            try:
                out = stack.enter_context(staged_file(path, overwrite=overwrite))
                out.file.write(text.encode())
                out.sync()
            except OSError as exc:
                raise os_error(exc, path) from exc
            staged.append(out)
        for out in staged:
            out.publish()


def sign(src: Any, key: SigningKey, *, output: Path | None = None,
         options: NormalizeOptions | None = None, file_hash: str = "sha256",
         weights_only: bool = False, overwrite: bool = False, jobs: int | None = None,
         trust: bool = False, max_expansion: float | None = None, tag: str | None = None,
         progress: Progress = no_progress) -> SignReport:
    """Sign ``src``'s files (OMS) and its weights (the attestation).

    Args:
        src: a local file or model folder, or a remote source (weights attestation only).
        key: how to sign (``SigningKey``).
        output: the OMS signature's path (the attestation goes beside it).
        options: which weights the digest covers (as ``ckptport manifest``).
        file_hash: ``sha256`` (default: what the ``model_signing`` CLI verifies) or
            ``blake3`` (on every core; its Python API verifies it).
        weights_only: write the weights attestation only (no pass over the files).

    Raises:
        CkptportError: unreadable source, unusable key, existing output.
    """
    from ..readers import open_checkpoint
    from ..remote import is_remote

    if file_hash not in FILE_HASHES:
        raise OptionError(f"--file-hash is {file_hash!r}, not one of {', '.join(FILE_HASHES)}")
    remote = is_remote(src)
    oms, attested = signature_paths(src if remote else Path(src), output)
    files_too = not (remote or weights_only)
    for path in ((oms, attested) if files_too else (attested,)):
        if path.exists() and not overwrite:
            raise OutputExistsError("exists; pass --overwrite to replace it", path)
    signer = key.signer()  # one signer for both: Sigstore asks for one identity
    options = options or NormalizeOptions()
    checkpoint = open_checkpoint(src, trust=trust, max_expansion=max_expansion, tag=tag)
    ignored = _ignored(Path(src), (oms, attested)) if files_too else []
    found: list[Any] = []

    def with_files(normalized: Checkpoint) -> dict[Any, str]:
        """The files' payload, hashing on the way the tensors that lie in them (one read)."""
        ranges = TensorRanges(normalized.tree)
        found.append(files_payload(Path(src), ignored, "sha256", ranges, jobs))
        return ranges.done

    if files_too and file_hash == "sha256":
        made = manifest_of(checkpoint, options, jobs=jobs, progress=progress, known=with_files)
        files = found[0]
    else:  # BLAKE3 (model_signing's own hasher, on every core) beside the tensors, or none
        with ThreadPoolExecutor(1) as pool:
            payload = pool.submit(files_payload, Path(src), ignored, file_hash) \
                if files_too else None
            made = manifest_of(checkpoint, options, jobs=jobs, progress=progress)
            files = None if payload is None else payload.result()
    texts = {attested: sign_statement(key, _name(src), made.digest, WEIGHTS_PREDICATE,
                                      weights_predicate(made), signer)}
    if files is not None:
        texts[oms] = signed_bundle(signer, files)
    _publish(texts, overwrite)
    notes = ("a remote source's files are not downloaded: its weights are signed, not its "
             "files",) if remote else ()
    return SignReport(oms if files_too else None, attested, made.digest,
                      0 if files is None else len(files.statement.pb.predicate["resources"]),
                      len(made.tensors), notes + made.notes())


def sign_weights(made: Manifest, key: SigningKey, path: Path, subject: str,
                 derivation: dict[str, Any], *, overwrite: bool, signer: Any = None) -> Path:
    """Sign an already made manifest (``normalize --sign``: the output's, hashed as it was
    written) with its ``derivation``, to ``path``."""
    _publish({path: sign_statement(key, subject, made.digest, WEIGHTS_PREDICATE,
                                   weights_predicate(made, derivation), signer)}, overwrite)
    return path


def derivation_of(source: Checkpoint, options: NormalizeOptions, *,
                  jobs: int | None = None) -> dict[str, Any]:
    """What ``normalize --sign`` records of how its output was made: the source's weights
    digest (default options: what its own attestation signs) and files (sha256 each), the
    options and recipe applied, the tool."""
    from .._version import __version__
    from ..analysis.manifests import options_of
    from ..sources import sha256_files

    facts = source.source
    root = facts.path if isinstance(facts.path, Path) and facts.path.is_dir() else None
    files = [{"name": str(path.relative_to(root)) if root else _name(path),
              "sha256": sha256_files((path,))} for path in facts.files]
    recipe = options.loaded_recipe
    return {"source": {"name": _name(facts.path),
                       "digest": manifest_of(source, NormalizeOptions(), jobs=jobs).digest,
                       "files": files},
            "options": options_of(options),
            "recipe_sha256": recipe.sha256 if recipe else "",
            "tool": f"ckptport {__version__}"}


def _name(src: Any) -> str:
    return Path(str(src).rstrip("/")).name or str(src)


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify`` found: the files against the OMS signature, the weights against the
    attestation (each ``None`` where not checked), and whether that is a pass."""

    path: Any
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


def _what(expected: Any, actual: Any) -> str:
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype}, signed {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {list(actual.shape)}, signed {list(expected.shape)}"
    return f"content sha256:{actual.sha256[:16]}…, signed sha256:{expected.sha256[:16]}…"


def _statements(src: Any, signatures: tuple[Path, ...], trusted: TrustedKeys,
                remote: bool) -> list[SignedStatement]:
    """The verified statements: the given signature files, each OMS one with the weights
    attestation beside it if there is one; by default the pair ``sign`` writes."""
    if not signatures:
        oms, attested = signature_paths(src if remote else Path(src))
        signatures = tuple(p for p in (oms, attested) if p.exists())
        if not signatures:
            raise SignatureError(f"no signature beside it ({oms.name}, {attested.name}); "
                                 "name one with --signature FILE", str(src))
    listed = list(dict.fromkeys(signatures))
    for path in signatures:
        beside = attestation_path(path)
        if beside != path and beside not in listed and beside.exists():
            listed.append(beside)
    return [open_statement(path, trusted) for path in listed]


def signed_weights(signature: Path, trusted: TrustedKeys) -> Attestation:
    """The verified weights attestation ``signature`` is (or lies beside, for an OMS
    signature): what ``check --verify-signature`` gates on."""
    weights = [read_attestation(s) for s in _statements(None, (signature,), trusted, False)
               if s.predicate_type != OMS_PREDICATE]
    if not weights:
        raise SignatureError("holds no weights attestation, and none lies beside it "
                             f"({attestation_path(signature).name}): ckptport sign writes one",
                             signature)
    return weights[0]


def verify(src: Any, trusted: TrustedKeys, *, signatures: tuple[Path, ...] = (),
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
        found: list[FilesComparison] = []

        def with_files(normalized: Checkpoint) -> dict[Any, str]:
            """The files checked by the read that also hashes the tensors in them."""
            assert local_files is not None
            ranges = TensorRanges(normalized.tree)
            found.append(compare_files(Path(src), local_files, ranges, jobs))
            return ranges.done

        expected = attestation.manifest
        read = checkpoint or open_checkpoint(src, trust=trust, max_expansion=max_expansion,
                                             tag=tag)
        actual = manifest_of(read, manifest_options(expected), jobs=jobs, progress=progress,
                             known=None if local_files is None else with_files)
        comparison = compare_manifests(expected, actual)
        compared = found[0] if found else None
    if compared is not None and not compared.same and comparison is not None \
            and _weights_same(comparison):
        notes.append("the files are not the signed files (another container or layout?) but "
                     "the weights are the signed weights")
    return VerifyReport(src, compared, comparison, attestation, tuple(notes))


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


def verify_chain(output: Any, source: Any, trusted: TrustedKeys, *,
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
