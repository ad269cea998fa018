"""Signed statements: a Sigstore bundle holding a DSSE envelope of an in-toto statement.

Both signatures ckptport writes are this one shape, made and checked by
``model_signing`` (``keys``): the OMS signature over files (predicate
``https://model_signing/signature/v1.0``) and the weights attestation
(``attestation``). Reading is strict: the bundle is parsed by the library's
models, which refuse unknown fields; the envelope must carry an in-toto
statement; the statement may hold only its four fields.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SignatureError
from .keys import SigningKey, TrustedKeys, cause, need_library

if TYPE_CHECKING:
    from model_signing._signing.signing import Payload, Signer

__all__ = ["SignedStatement", "open_statement", "sign_statement", "signed_bundle",
           "IN_TOTO_STATEMENT", "OMS_PREDICATE"]

IN_TOTO_STATEMENT = "https://in-toto.io/Statement/v1"
IN_TOTO_PAYLOAD = "application/vnd.in-toto+json"
OMS_PREDICATE = "https://model_signing/signature/v1.0"
_STATEMENT_FIELDS = {"_type", "subject", "predicateType", "predicate"}
MAX_BUNDLE_BYTES = 256 << 20  # a bundle lists files or tensors, not their bytes


@dataclass(frozen=True)
class SignedStatement:
    """A statement whose signature verified: ``by`` says with what."""

    path: Path
    statement: dict[str, Any]  # Any: parsed JSON, its fields checked as it is read
    by: str

    @property
    def predicate_type(self) -> str:
        return str(self.statement["predicateType"])


class _Statement:
    """What ``model_signing``'s signers sign: an object with an in-toto ``statement``."""

    def __init__(self, statement: object) -> None:
        self.statement = statement


def sign_statement(key: SigningKey, subject_name: str, digest: str, predicate_type: str,
                   predicate: Mapping[str, object], signer: Signer | None = None) -> str:
    """The JSON of a bundle signing an in-toto statement about ``digest`` (sha256)."""
    from in_toto_attestation.v1 import statement

    made = statement.Statement(
        subjects=[statement.ResourceDescriptor(name=subject_name,
                                               digest={"sha256": digest}).pb],
        predicate_type=predicate_type, predicate=predicate)
    return signed_bundle(signer or key.signer(), _Statement(made))


def signed_bundle(signer: Signer, payload: Payload | _Statement) -> str:
    """The bundle JSON of ``signer`` signing ``payload`` (a ``_Statement`` is what a signer
    reads of a ``Payload``: its ``statement``); a failure (Sigstore's services out of reach,
    a token refused) is a ``SignatureError`` naming the cause."""
    from model_signing._signing import sign_sigstore, sign_sigstore_pb

    try:
        signature = signer.sign(payload)  # type: ignore[arg-type]  # see above
    except Exception as exc:  # noqa: BLE001 (the network and each library raise their own)
        raise SignatureError(f"signing failed: {cause(exc)}") from None
    assert isinstance(signature, (sign_sigstore.Signature, sign_sigstore_pb.Signature))
    return str(signature.bundle.to_json())


def open_statement(path: str | os.PathLike[str], trusted: TrustedKeys) -> SignedStatement:
    """The statement ``path``'s bundle signs, once its signature verifies with ``trusted``;
    ``SignatureError`` naming the file and the cause otherwise."""
    target = Path(path)
    need_library()
    from model_signing._signing import sign_sigstore, sign_sigstore_pb

    try:
        size = target.stat().st_size
    except OSError:
        raise SignatureError("no such signature file", target) from None
    if size > MAX_BUNDLE_BYTES:
        raise SignatureError(f"is {size} bytes, too large for a signature", target)
    kind = sign_sigstore.Signature if trusted.keyless else sign_sigstore_pb.Signature
    try:
        signature = kind.read(target)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SignatureError(f"not a Sigstore bundle: {cause(exc)}", target) from None
    failures = []
    for label, verifier in trusted.verifiers():
        try:
            payload_type, payload = verifier._verify_signed_content(signature)
        except Exception as exc:  # noqa: BLE001 (each library layer raises its own kind)
            failures.append(f"{label}: {cause(exc)}")
            continue
        return SignedStatement(target, _statement(payload_type, payload, target), label)
    raise SignatureError("the signature does not verify (" + "; ".join(failures) + ")", target)


# Any: the parsed JSON statement, its shape checked here, its fields read by its users
def _statement(payload_type: str, payload: bytes, target: Path) -> dict[str, Any]:
    if payload_type != IN_TOTO_PAYLOAD:
        raise SignatureError(f"the envelope holds {payload_type!r}, not an in-toto statement",
                             target)
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise SignatureError(f"the signed statement is not JSON ({exc})", target) from None
    if not isinstance(doc, dict) or doc.get("_type") != IN_TOTO_STATEMENT:
        raise SignatureError(f"the signed payload is not an in-toto statement "
                             f"({IN_TOTO_STATEMENT})", target)
    unknown = sorted(set(doc) - _STATEMENT_FIELDS)
    if unknown:
        raise SignatureError(f"the signed statement has an unknown field {unknown[0]!r}", target)
    if not isinstance(doc.get("predicateType"), str) or not isinstance(doc.get("predicate"),
                                                                        dict):
        raise SignatureError("the signed statement has no predicate", target)
    subjects = doc.get("subject")
    if not (isinstance(subjects, list) and len(subjects) == 1 and isinstance(subjects[0], dict)
            and isinstance(subjects[0].get("digest"), dict)
            and isinstance(subjects[0]["digest"].get("sha256"), str)):
        raise SignatureError("the signed statement must have one subject with a sha256 digest",
                             target)
    return doc
