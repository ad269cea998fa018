"""``ckptport sign`` and ``ckptport verify``: OMS signatures and weights attestations."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import OptionError
from ..rules import NormalizeOptions
from .options import (
    LOCATION,
    jobs_option,
    normalize_options,
    progress_bars,
    signing_key_options,
    trusted_keys_options,
)

if TYPE_CHECKING:
    from ..signing import SigningKey, TrustedKeys

__all__ = ["sign_command", "verify_command"]


@click.command("sign")
@click.argument("src", type=LOCATION)
@click.option("--key", type=click.Path(path_type=Path), metavar="PEM",
              help="The private key (PEM, ECDSA; CKPTPORT_KEY_PASSWORD if encrypted).")
@signing_key_options
@normalize_options
@click.option("-o", "--output", type=click.Path(path_type=Path), metavar="FILE",
              help="The OMS signature's file (the weights attestation goes beside it, "
                   "NAME.weights.sig). Default: SRC.sig, or model.sig in a model folder.")
@click.option("--file-hash", type=click.Choice(["sha256", "blake3"]), default="sha256",
              show_default=True, help="How the OMS signature hashes the files (the "
              "model_signing CLI verifies sha256 only; blake3 hashes on every core).")
@click.option("--weights-only", is_flag=True,
              help="Write the weights attestation only (no OMS signature over the files).")
@click.option("--overwrite", is_flag=True, help="Replace the signature files if they exist.")
@click.option("--trust", is_flag=True, help=(
              "Unpickle with full Python: runs code from the file. Only for files you vouch for."))
@jobs_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def sign_command(src: Path, signing_key: SigningKey | None, options: NormalizeOptions,
                 max_expansion: float | None, tag: str | None, output: Path | None,
                 file_hash: str, weights_only: bool, overwrite: bool, trust: bool,
                 jobs: int | None, quiet: bool) -> None:
    """Sign SRC: an OMS signature over its files (model_signing verifies it) and a weights
    attestation over its weights digest, which still verifies after any conversion."""
    from ..signing import sign

    if signing_key is None:
        raise click.UsageError("sign with --key PEM or --sigstore")
    with progress_bars(quiet) as progress:
        report = sign(src, signing_key, output=output, options=options, file_hash=file_hash,
                      weights_only=weights_only, overwrite=overwrite, jobs=jobs, trust=trust,
                      max_expansion=max_expansion,
                      tag=tag, progress=progress)
    click.echo("\n".join(report.lines()))


@click.command("verify")
@click.argument("src", type=LOCATION)
@click.option("--signature", "signatures", multiple=True, type=click.Path(path_type=Path),
              metavar="FILE", help="An OMS signature or weights attestation (the attestation "
              "beside an OMS signature is read too). Default: the ones sign writes.")
@trusted_keys_options
@click.option("--chain", type=LOCATION, metavar="SOURCE",
              help="SRC was made by normalize --sign from SOURCE: check SOURCE against "
                   "--signature, SRC against its own attestation, and that the recorded "
                   "options make SRC's tensors of SOURCE's, bit for bit.")
@click.option("--output-signature", "output_signatures", multiple=True,
              type=click.Path(path_type=Path), metavar="FILE",
              help="With --chain: SRC's weights attestation (default: the one beside it).")
@click.option("--trust", is_flag=True, help=(
              "Unpickle with full Python: runs code from the file. Only for files you vouch for."))
@click.option("--tag", metavar="NAME", help="A DeepSpeed save folder's tag.")
@jobs_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.pass_context
def verify_command(ctx: click.Context, src: Path, signatures: tuple[Path, ...],
                   trusted: TrustedKeys | None, chain: Path | None,
                   output_signatures: tuple[Path, ...], trust: bool, tag: str | None,
                   jobs: int | None, quiet: bool) -> None:
    """Check SRC against its signatures: exit 0 when its files match the OMS signature or
    its weights (in whatever container SRC now is) match the weights attestation, 1 with
    what differs, 2 for a bad signature, key or certificate."""
    from ..signing import verify, verify_chain

    if trusted is None:
        raise click.UsageError("verify with --public-key, --certificate-chain or "
                               "--sigstore-identity/--sigstore-issuer")
    OptionError.only_with("--chain SOURCE", chain, [("--output-signature", output_signatures)])
    with progress_bars(quiet) as progress:
        report = verify(src, trusted, signatures=signatures, jobs=jobs, trust=trust, tag=tag,
                        progress=progress) if chain is None else verify_chain(
            src, chain, trusted, signatures=signatures, output_signatures=output_signatures,
            jobs=jobs, trust=trust, tag=tag, progress=progress)
    click.echo("\n".join(report.lines()))
    ctx.exit(report.exit_code)

