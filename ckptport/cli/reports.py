"""The commands that read and report: ``manifest``, ``diff``, ``inspect``, ``check``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from ..checkpoint import Format
from ..errors import EXIT_FINDINGS, OptionError, OutputExistsError
from ..render import formatter
from ..rules import NormalizeOptions
from .options import (
    LOCATION,
    jobs_option,
    normalize_options,
    progress_bars,
    report_format_option,
    trusted_keys_options,
)

if TYPE_CHECKING:
    from ..signing import TrustedKeys

__all__ = ["manifest_command", "diff", "inspect_command", "check_command"]


@click.command("manifest")
@click.argument("src", type=LOCATION)
@normalize_options
@click.option("-o", "--output", type=click.Path(path_type=Path), metavar="FILE",
              help="Write the manifest to FILE (atomically) and report on stdout; without it "
                   "the manifest itself goes to stdout.")
@click.option("--overwrite", is_flag=True, help="Replace FILE if it exists.")
@click.option("--trust", is_flag=True, help=(
              "Unpickle with full Python: runs code from the file. Only for files you vouch for."))
@jobs_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@report_format_option("manifest")
@click.pass_context
def manifest_command(ctx: click.Context, src: Path, options: NormalizeOptions,
                     max_expansion: float | None,
                     tag: str | None,
                     output: Path | None, overwrite: bool,
                     trust: bool, jobs: int | None, quiet: bool, report_format: str) -> None:
    """List the normalized weights of SRC with the sha256 of each tensor's canonical bytes
    and one weights digest: the same for the same weights in any container (.pth,
    .safetensors, a shard set, DCP, a Hugging Face folder), whatever the sharding
    and key order. Commit it; gate releases with check --against-manifest FILE."""
    from ..commands.manifest import manifest, write_manifest

    OptionError.only_with("-o FILE (without it the manifest itself, JSON, goes to stdout)",
                          output, [("--overwrite", overwrite),
                                   (f"--format {report_format}", report_format != "json" and
                                    ctx.get_parameter_source("report_format")
                                    is not ParameterSource.DEFAULT)])
    if output is not None and output.exists() and not overwrite:  # before the long read
        raise OutputExistsError("exists; pass --overwrite to replace it", output)
    with progress_bars(quiet) as progress:
        progress(f"reading {src}", 0)
        made = manifest(src, options, jobs=jobs, trust=trust, max_expansion=max_expansion, tag=tag,
                        progress=progress)
    for note in made.notes():
        click.echo(note, err=True)
    if output is None:
        click.echo(made.to_json(), nl=False)
        return
    write_manifest(made, output, overwrite=overwrite)
    click.echo(formatter(report_format).manifest(made, output))


@click.command()
@click.argument("a", type=LOCATION)
@click.argument("b", type=LOCATION)
@normalize_options
@click.option("--raw", is_flag=True, help="Compare as stored: no normalize rules on either side.")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Absolute tolerance.")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Relative tolerance, relative to A: |a-b| <= atol + rtol*|a|.")
@click.option("--cast", is_flag=True,
              help="Compare tensors of different dtypes by value instead of failing.")
@click.option("--trust", is_flag=True, help=(
              "Unpickle both with full Python: runs code from the files (TorchScript, files "
              "you vouch for)."))
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Rows per table in text and markdown (json lists all).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@report_format_option("diff")
@click.option("--plot", type=click.Path(path_type=Path), metavar="PNG",
              help="Also draw per-tensor max relative error, in model order (needs matplotlib).")
@click.option("--map-a", type=click.Path(path_type=Path), metavar="FILE",
              help="Apply the key recipe FILE (as --map) to A only.")
@click.option("--map-b", type=click.Path(path_type=Path), metavar="FILE",
              help="Apply the key recipe FILE (as --map) to B only.")
@click.pass_context
def diff(ctx: click.Context, a: Path, b: Path, options: NormalizeOptions,
         max_expansion: float | None, tag: str | None, raw: bool, atol: float,
         rtol: float, cast: bool, trust: bool, limit: int, quiet: bool, report_format: str,
         plot: Path | None, map_a: Path | None, map_b: Path | None) -> None:
    """Compare checkpoints A and B (any formats, or a manifest), both normalized alike first.

    Equal by value: NaN equals NaN, -0.0 equals 0.0; exact unless --atol/--rtol.
    A dtype change is a difference unless --cast. Exit 0 equal, 1 different,
    2 unreadable input.
    """
    from ..commands.diff import diff as diff_checkpoints
    given = [*options.given(), *(["--map-a"] if map_a else []), *(["--map-b"] if map_b else [])]
    if raw and given:
        raise OptionError(f"--raw compares as stored; it cannot be combined with "
                          f"{', '.join(given)}")
    if plot is not None:  # a manifest side has no values to draw
        from ..analysis.manifests import is_manifest
        from ..commands.diff import BY_VALUE

        OptionError.only_with(BY_VALUE, not any(is_manifest(x) for x in (a, b)),
                              [("--plot", plot)])
    if trust:
        click.echo("ckptport: warning: --trust: both files are unpickled with full Python; "
                   "any code in them runs", err=True)
    with progress_bars(quiet) as progress:
        progress(f"reading {a} and {b}", 0)
        report = diff_checkpoints(a, b, atol=atol, rtol=rtol, cast=cast,
                                  options=None if raw else options, raw=raw, trust=trust,
                                  map_a=map_a, map_b=map_b, max_expansion=max_expansion, tag=tag,
                                  progress=progress)
    if plot is not None:  # first: a plot that cannot be written leaves no report behind
        from ..render.plot import plot_drift

        plot_drift(report, plot)
    click.echo(formatter(report_format).diff(report, limit))
    if not report.equal:
        ctx.exit(EXIT_FINDINGS)


@click.command("inspect")
@click.argument("path", type=LOCATION)
@click.option("--depth", type=click.IntRange(min=0), default=2, show_default=True,
              help="Levels of the layout tree to list.")
@click.option("--hash", "with_hash", is_flag=True,
              help="Also compute the file's sha256 (reads every byte).")
@click.option("--tag", metavar="NAME",
              help="A DeepSpeed checkpoint folder's tag (default: the one 'latest' names).")
@report_format_option("inspect")
def inspect_command(path: Path, depth: int, with_hash: bool, tag: str | None,
                    report_format: str) -> None:
    """Describe PATH without running or reading it: format, layout, tensors, parameters,
    bytes by dtype, recorded devices, wrapper prefixes, objects that block weights-only
    loading and the globals they need, shared storages.
    """
    from ..commands.inspection import inspect
    report = inspect(path, depth=depth, with_hash=with_hash, tag=tag)
    click.echo(formatter(report_format).inspect(report))


def _codes(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    return [code.strip() for item in value for code in item.split(",") if code.strip()]


@click.command("check")
@click.argument("paths", nargs=-1, required=True, type=LOCATION)
@click.option("--codes", "codes", multiple=True, callback=_codes, metavar="CODES",
              help="Run only these codes (comma-separated or repeated, e.g. CKP001,CKP004); "
              "CKP003 (code-running globals) always runs.")
@click.option("--ignore", "ignore_codes", multiple=True, callback=_codes, metavar="CODES",
              help="Skip these codes (all but CKP003).")
@normalize_options
@click.option("--finite", "finite", flag_value="weights", default=None,
              help="Also fail on NaN/inf values of the selected weights (reads them).")
@click.option("--finite-all", "finite", flag_value="all",
              help="Also fail on NaN/inf values of every tensor, optimizer state included.")
@click.option("--require-format", multiple=True, type=click.Choice(Format.names()),
              help="Fail files in any other container format. Repeatable.")
@click.option("--against", type=LOCATION, metavar="REF",
              help="Fail where the weights differ from the reference checkpoint REF (both "
                   "normalized with --select, --ema, --strip-prefix, --keep-prefixes, --dtype).")
@click.option("--against-manifest", type=click.Path(path_type=Path), metavar="FILE",
              help="Fail where the tensors differ from the manifest FILE (ckptport manifest).")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Absolute tolerance for --against.")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Relative tolerance for --against.")
@click.option("--verify-signature", type=click.Path(path_type=Path), metavar="FILE",
              help="Fail where the weights are not those the weights attestation FILE (or "
                   "the one beside the OMS signature FILE) signs (CKP015).")
@trusted_keys_options
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@report_format_option("check")
@click.pass_context
def check_command(ctx: click.Context, paths: tuple[Path, ...], codes: list[str],
                  ignore_codes: list[str], options: NormalizeOptions,
                  max_expansion: float | None, tag: str | None, finite: str | None,
                  require_format: tuple[str, ...], against: Path | None,
                  against_manifest: Path | None, atol: float, rtol: float,
                  verify_signature: Path | None, trusted: TrustedKeys | None, quiet: bool,
                  report_format: str) -> None:
    """Gate exported checkpoints in CI: run the codes on every PATH (folders are searched
    for every file a loader could open) and report findings with stable codes.

    Exit 0 pass, 1 findings, 2 unreadable input. Nothing in a file ever runs.
    """
    from ..commands.check import check
    with progress_bars(quiet or not (finite or against or against_manifest or verify_signature)
                   ) as progress:
        report = check(paths, codes=codes, ignore=ignore_codes, finite=finite,
                       require_format=require_format, against=against,
                       against_manifest=against_manifest, atol=atol, rtol=rtol,
                       options=options, max_expansion=max_expansion, tag=tag,
                       verify_signature=verify_signature, trusted=trusted,
                       progress=progress)
    click.echo(formatter(report_format).check(report))
    ctx.exit(report.exit_code)

