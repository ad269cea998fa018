"""Key material for signing and verifying, handed to OpenSSF's ``model_signing``.

ckptport writes no DSSE, bundle or key handling of its own: a ``SigningKey``
becomes one of ``model_signing``'s signers (an ECDSA private key, a private
key with its certificate and chain, or Sigstore keyless), and ``TrustedKeys``
become its verifiers. The library is imported only here and only when a
signature is made or checked (``pip install 'ckptport[sign]'``), so every
other command keeps its start-up time.

Certificates are judged as ``model_signing`` judges them: the chain is
checked against the given roots as of the leaf's own start date (there is
no trusted timestamp offline), so a release keeps verifying after its
certificate expires; the leaf must allow digital signatures or code signing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OptionError, SignatureError

if TYPE_CHECKING:
    from model_signing._signing.signing import Signer, Verifier

__all__ = ["SigningKey", "TrustedKeys", "need_library", "SIGN_EXTRA", "cause"]

SIGN_EXTRA = "pip install 'ckptport[sign]'"


def need_library() -> None:
    """An ``OptionError`` saying how to get ``model_signing``'s signing internals, unless
    they import (each user then imports the modules it calls: loaded once, here)."""
    try:
        from model_signing._signing import (  # noqa: F401 (imported to be there)
            sign_certificate,
            sign_ec_key,
            sign_sigstore,
            sign_sigstore_pb,
            signing,
        )
    except ImportError as exc:
        raise OptionError(f"signing needs the model_signing library ({exc.name} is missing): "
                          f"{SIGN_EXTRA}") from None


def cause(exc: BaseException) -> str:
    """An exception's words, or its kind where it has none (``InvalidSignature``)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


@dataclass(frozen=True)
class SigningKey:
    """How to sign: ``private_key`` (PEM, ECDSA P-256/384/521) alone, with a
    ``certificate`` and its ``chain`` (intermediates, then roots), or ``sigstore``
    keyless (an OIDC ``identity_token``, or ambient credentials; needs the network)."""

    private_key: Path | None = None
    certificate: Path | None = None
    chain: tuple[Path, ...] = ()
    password: str | None = None
    sigstore: bool = False
    identity_token: str | None = None
    staging: bool = False

    def __post_init__(self) -> None:
        if self.sigstore == (self.private_key is not None):
            raise OptionError("sign with a private key (--key) or with Sigstore (--sigstore), "
                              "one of the two")
        if self.certificate is None and self.chain:
            raise OptionError("a certificate chain needs the signing certificate "
                              "(--certificate)")
        OptionError.only_with("--key PEM", self.private_key, [("--certificate", self.certificate)])
        OptionError.only_with("--sigstore", self.sigstore,
                              [("--identity-token", self.identity_token)])

    def signer(self) -> Signer:
        need_library()
        from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore

        if self.sigstore:
            try:
                return sign_sigstore.Signer(identity_token=self.identity_token,
                                            use_staging=self.staging,
                                            use_ambient_credentials=self.identity_token is None)
            except Exception as exc:  # noqa: BLE001 (the network and each library raise their own)
                raise SignatureError(f"Sigstore keyless signing is not available: "
                                     f"{cause(exc)}") from None
        key = self.private_key
        assert key is not None
        where = key
        try:
            _readable(key, *((self.certificate,) if self.certificate else ()), *self.chain)
            password = None if self.password is None else self.password.encode()
            if self.certificate is None:
                # model_signing annotates the password str; cryptography reads bytes
                return sign_ec_key.Signer(key, password)  # type: ignore[arg-type]
            where = self.certificate
            signer = sign_certificate.Signer(key, self.certificate, self.chain)
        except SignatureError:
            raise
        except (ValueError, TypeError) as exc:
            raise SignatureError(f"cannot sign with it: {cause(exc)}", where) from None
        return signer


@dataclass(frozen=True)
class TrustedKeys:
    """What a signature must verify with: any of ``public_keys`` (PEM), or a
    certificate chain ending in one of the ``roots`` (PEM certificates), or a
    Sigstore ``identity`` from ``issuer``."""

    public_keys: tuple[Path, ...] = ()
    roots: tuple[Path, ...] = ()
    identity: str | None = None
    issuer: str | None = None
    staging: bool = False

    def __post_init__(self) -> None:
        given = sum(map(bool, (self.public_keys, self.roots, self.identity)))
        if given != 1:
            raise OptionError("verify with public keys (--public-key), a certificate chain "
                              "(--certificate-chain) or a Sigstore identity "
                              "(--sigstore-identity with --sigstore-issuer), one of the three")
        if (self.identity is None) != (self.issuer is None):
            raise OptionError("--sigstore-identity and --sigstore-issuer go together")

    @property
    def keyless(self) -> bool:
        return self.identity is not None

    def verifiers(self) -> Iterator[tuple[str, Verifier]]:
        """(what it is, a ``model_signing`` verifier) for each trusted key or chain."""
        need_library()
        from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore

        if self.keyless:
            assert self.identity is not None and self.issuer is not None  # __post_init__
            try:
                keyless = sign_sigstore.Verifier(identity=self.identity, oidc_issuer=self.issuer,
                                                 use_staging=self.staging)
            except Exception as exc:  # noqa: BLE001 (the network and each library raise their own)
                raise SignatureError(f"Sigstore verification is not available: "
                                     f"{cause(exc)}") from None
            yield f"Sigstore identity {self.identity}", keyless
            return
        if self.roots:
            _readable(*self.roots)
            try:
                chain = sign_certificate.Verifier(self.roots)
            except (ValueError, TypeError) as exc:
                raise SignatureError(f"not a PEM certificate: {cause(exc)}",
                                     self.roots[0]) from None
            yield "certificate chain " + ", ".join(map(str, self.roots)), chain
            return
        for key in self.public_keys:
            _readable(key)
            try:
                verifier = sign_ec_key.Verifier(key)
            except (ValueError, TypeError) as exc:
                raise SignatureError(f"not a usable public key: {cause(exc)}", key) from None
            yield f"public key {key}", verifier


def _readable(*paths: Path) -> None:
    for path in paths:
        if not os.path.isfile(path):
            raise SignatureError("no such key or certificate file", path)
