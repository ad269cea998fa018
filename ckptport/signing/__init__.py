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
files, ``paths``); ``output`` names the OMS file and the attestation goes beside it.
``verifying`` checks a model against them, and an output against its signed source.

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
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..analysis.manifests import Manifest, manifest_of
from ..checkpoint import Checkpoint
from ..errors import OptionError, OutputExistsError
from ..progress import Progress, no_progress
from ..rules import NormalizeOptions
from .attestation import WEIGHTS_PREDICATE, Attestation, weights_predicate
from .bundles import OMS_PREDICATE, sign_statement, signed_bundle
from .files import FILE_HASHES, FilesComparison, files_payload
from .keys import SigningKey, TrustedKeys
from .onepass import TensorRanges
from .paths import attestation_path, signature_paths, subject_name
from .verifying import ChainReport, VerifyReport, signed_weights, verify, verify_chain

if TYPE_CHECKING:
    from model_signing._signing.signing import Payload, Signer

    from ..tensors import ViewKey

__all__ = ["sign", "verify", "SignReport", "VerifyReport", "SigningKey", "TrustedKeys",
           "signature_paths", "attestation_path", "FILE_HASHES", "WEIGHTS_PREDICATE",
           "OMS_PREDICATE", "Attestation", "FilesComparison", "sign_weights", "derivation_of",
           "verify_chain", "ChainReport", "signed_weights"]


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


def sign(src: str | os.PathLike[str], key: SigningKey, *, output: Path | None = None,
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
    OptionError.only_with("an OMS signature over the files (not --weights-only, not a URL)",
                          files_too, [(f"--file-hash {file_hash}", file_hash != "sha256")])
    for path in ((oms, attested) if files_too else (attested,)):
        if path.exists() and not overwrite:
            raise OutputExistsError("exists; pass --overwrite to replace it", path)
    signer = key.signer()  # one signer for both: Sigstore asks for one identity
    options = options or NormalizeOptions()
    checkpoint = open_checkpoint(src, trust=trust, max_expansion=max_expansion, tag=tag)
    ignored = _ignored(Path(src), (oms, attested)) if files_too else []
    made, files = _hashed(checkpoint, options, Path(src) if files_too else None, ignored,
                          file_hash, jobs, progress)
    texts = {attested: sign_statement(key, subject_name(src), made.digest, WEIGHTS_PREDICATE,
                                      weights_predicate(made), signer)}
    if files is not None:
        texts[oms] = signed_bundle(signer, files)
    _publish(texts, overwrite)
    notes = ("a remote source's files are not downloaded: its weights are signed, not its "
             "files",) if remote else ()
    return SignReport(oms if files_too else None, attested, made.digest,
                      0 if files is None else len(files.statement.pb.predicate["resources"]),
                      len(made.tensors), notes + made.notes())


def _hashed(checkpoint: Checkpoint, options: NormalizeOptions, model: Path | None,
            ignored: list[Path], file_hash: str, jobs: int | None, progress: Progress
            ) -> tuple[Manifest, Payload | None]:
    """The weights' manifest and, given the ``model`` path, its files' payload: in one read
    of each file with sha256, side by side with BLAKE3."""
    found: list[Payload] = []

    def with_files(normalized: Checkpoint) -> dict[ViewKey, str]:
        """The files' payload, hashing on the way the tensors that lie in them (one read)."""
        assert model is not None
        ranges = TensorRanges(normalized.tree)
        found.append(files_payload(model, ignored, "sha256", ranges, jobs))
        return ranges.done

    if model is not None and file_hash == "sha256":
        made = manifest_of(checkpoint, options, jobs=jobs, progress=progress, known=with_files)
        return made, found[0]
    # BLAKE3 (model_signing's own hasher, on every core) beside the tensors, or none
    with ThreadPoolExecutor(1) as pool:
        payload = None if model is None else pool.submit(files_payload, model, ignored,
                                                         file_hash)
        made = manifest_of(checkpoint, options, jobs=jobs, progress=progress)
        return made, None if payload is None else payload.result()


def sign_weights(made: Manifest, key: SigningKey, path: Path, subject: str,
                 derivation: Mapping[str, object], *, overwrite: bool,
                 signer: Signer | None = None) -> Path:
    """Sign an already made manifest (``normalize --sign``: the output's, hashed as it was
    written) with its ``derivation``, to ``path``."""
    _publish({path: sign_statement(key, subject, made.digest, WEIGHTS_PREDICATE,
                                   weights_predicate(made, derivation), signer)}, overwrite)
    return path


def derivation_of(source: Checkpoint, options: NormalizeOptions, *,
                  jobs: int | None = None) -> dict[str, object]:
    """What ``normalize --sign`` records of how its output was made: the source's weights
    digest (default options: what its own attestation signs) and files (sha256 each), the
    options and recipe applied, the tool."""
    from .._version import __version__
    from ..analysis.manifests import options_of
    from ..sources import sha256_files

    facts = source.source
    root = facts.path if isinstance(facts.path, Path) and facts.path.is_dir() else None
    files = [{"name": str(path.relative_to(root)) if root and isinstance(path, Path)
              else subject_name(path),
              "sha256": sha256_files((path,))} for path in facts.files]
    recipe = options.loaded_recipe
    return {"source": {"name": subject_name(facts.path),
                       "digest": manifest_of(source, NormalizeOptions(), jobs=jobs).digest,
                       "files": files},
            "options": options_of(options),
            "recipe_sha256": recipe.sha256 if recipe else "",
            "tool": f"ckptport {__version__}"}
