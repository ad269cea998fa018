"""``ckptport normalize``: one checkpoint, or a folder of them, written portable."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import OptionError
from ..escape import printable
from ..render import formatter
from ..rules import NormalizeOptions
from .options import (
    LOCATION,
    Destination,
    OutputFormatName,
    anchor_callback,
    jobs_option,
    normalize_options,
    part_callback,
    progress_bars,
    report_format_option,
    size_callback,
)

if TYPE_CHECKING:
    from ..signing import SigningKey

__all__ = ["normalize"]


@click.command()
@click.argument("src", type=LOCATION)
@click.argument("dst", type=Destination())  # a str: a trailing "/" means a folder (a shard set)
@click.option("--to", type=OutputFormatName(), metavar="FORMAT",
              help="Output format: pth, safetensors, dcp or a registered one (default: from "
                   "DST's extension).")
@normalize_options
@click.option("--anchor", default="cpu", show_default=True, callback=anchor_callback,
              help="Device the .pth records for its storages: cpu or cuda:N (no GPU needed).")
@click.option("--trust", is_flag=True, help=(
              "Unpickle with full Python: runs code from the file. Only for files you vouch for."))
@click.option("--max-shard-size", callback=size_callback, metavar="SIZE",
              help="Write a Hugging Face shard set into the folder DST, shards of at most SIZE "
                   "(5GB, 500MB: decimal units as the hub; 2GiB binary). A folder DST alone "
                   "shards at 5GB.")
@click.option("--dcp-key", metavar="KEY",
              help="With --to dcp: nest the weights under KEY (dcp.load({KEY: sd}, ...)).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Re-read DST and compare every tensor bit for bit with the source.")
@click.option("--manifest", "manifest_path", type=click.Path(path_type=Path), metavar="FILE",
              help="Also write the manifest of what was written (ckptport manifest), from the "
                   "bytes as they are written.")
@jobs_option
@click.option("--part", callback=part_callback, metavar="I/N",
              help="Folder mode: convert only part I of N (split by relative path), so N "
                   "machines share a folder with no coordination.")
@click.option("--dry-run", is_flag=True,
              help="Folder mode: list what would be converted (part I/N) and stop.")
@click.option("--metadata", type=click.Choice(["keep", "drop"]), default="keep",
              show_default=True,
              help="A safetensors source's own metadata (modelspec, ss_*, notes) in a "
                   "safetensors DST: carried, or left out.")
@click.option("--hash-name", is_flag=True,
              help="Name the output STEM-<first 8 hex of its sha256>.EXT (what torch.hub's "
                   "check_hash verifies) and print that name. One file only.")
@click.option("--create-pr", is_flag=True,
              help="An hf:// DST: open a pull request with the files (as the hub's conversion "
                   "bot does) instead of committing to the branch.")
@click.option("--sign", "sign_key", type=click.Path(path_type=Path), metavar="PEM",
              help="Sign the output's weights attestation with this private key (beside it: "
                   "DST.weights.sig, or model.weights.sig in a folder DST), recording the "
                   "source's digest and files, the options and the tool (verify --chain).")
@click.option("--sign-certificate", type=click.Path(path_type=Path), metavar="PEM",
              help="With --sign: the key's signing certificate.")
@click.option("--sign-chain", multiple=True, type=click.Path(path_type=Path), metavar="PEM",
              help="With --sign-certificate: the certificates up to the root. Repeatable.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@report_format_option("normalize")
@click.pass_context
def normalize(ctx: click.Context, src: Path, dst: str, to: str | None,
              options: NormalizeOptions, max_expansion: float | None, tag: str | None,
              anchor: str, trust: bool, max_shard_size: int | None, dcp_key: str | None,
              overwrite: bool, verify: bool, manifest_path: Path | None, jobs: int | None,
              part: tuple[int, int] | None, dry_run: bool, metadata: str, hash_name: bool,
              create_pr: bool, sign_key: Path | None, sign_certificate: Path | None,
              sign_chain: tuple[Path, ...], quiet: bool, report_format: str) -> None:
    """Read SRC, normalize it, write DST (.pth, .pt, .bin, .ckpt or .safetensors), verify it.

    SRC may also be a shard set (its *.index.json or the folder holding it), a DCP
    folder or a Hugging Face model folder. A folder DST (or --max-shard-size) writes a
    shard set; --to dcp a DCP folder.

    A folder SRC that is none of those is a folder of checkpoints: each is written to
    the same relative path under DST (with --to's extension, .pth by default) by
    --jobs processes; a second run resumes. Exit 0 all converted, 1 some failed."""
    from ..readers import is_folder_of_checkpoints
    folder = is_folder_of_checkpoints(src)
    OptionError.only_with("one SRC, not a folder of checkpoints", not folder, [
        ("--manifest", manifest_path), ("--max-shard-size", max_shard_size),
        ("--dcp-key", dcp_key), ("--hash-name", hash_name), ("--tag", tag),
        ("--trust", trust), ("--sign", sign_key), ("--sign-certificate", sign_certificate),
        ("--sign-chain", sign_chain)])
    OptionError.only_with("a folder of checkpoints as SRC", folder,
                          [("--part", part), ("--dry-run", dry_run)])
    if folder:
        from ..commands.normalize import FolderOptions, normalize_folder

        with progress_bars(quiet) as progress:
            folder_report = normalize_folder(src, dst, FolderOptions(
                options=options, to=to or "pth", anchor=anchor, overwrite=overwrite,
                verify=verify, jobs=jobs, part=part, dry_run=dry_run, metadata=metadata,
                max_expansion=max_expansion, create_pr=create_pr), progress=progress)
        click.echo(formatter(report_format).folder(folder_report))
        ctx.exit(folder_report.exit_code)
    if trust:
        click.echo(f"ckptport: warning: --trust: {printable(str(src))} is unpickled with full "
                   "Python; any code in it runs", err=True)
    signing_key = _signing_key(sign_key, sign_certificate, sign_chain)
    with progress_bars(quiet) as progress:
        progress(f"reading {src}", 0)  # before the imports: torch costs a second
        from ..commands.normalize import normalize_file

        report = normalize_file(src, dst, options,
                                to=to, anchor=anchor, overwrite=overwrite, verify=verify,
                                trust=trust, max_shard_size=max_shard_size, dcp_key=dcp_key,
                                manifest=manifest_path, jobs=jobs, metadata=metadata,
                                hash_name=hash_name, create_pr=create_pr,
                                max_expansion=max_expansion, tag=tag, sign=signing_key,
                                progress=progress)
    click.echo(formatter(report_format).normalize(report))


def _signing_key(key: Path | None, certificate: Path | None, chain: tuple[Path, ...]
                 ) -> SigningKey | None:
    """``--sign``'s key (its password from CKPTPORT_KEY_PASSWORD), if one is given."""
    OptionError.only_with("--sign PEM", key, [("--sign-certificate", certificate),
                                              ("--sign-chain", chain)])
    if key is None:
        return None
    from ..signing import SigningKey

    return SigningKey(key, certificate, chain, os.environ.get("CKPTPORT_KEY_PASSWORD"))
