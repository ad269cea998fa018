"""The ``ckptport`` command: parse options, call the library, print, exit.

Errors are turned into one stderr line and an exit code in one place
(``_Group.invoke``). torch is imported only by commands that need it, so
``ckptport --help`` starts fast.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from ._version import __version__
from .checkpoint import Format
from .errors import EXIT_ERROR, CkptportError
from .progress import Progress, no_progress
from .rules import CAST_CHOICES, NormalizeOptions
from .writers import ANCHOR_PATTERN, OutputFormat

__all__ = ["main", "cli"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM


class Terminated(BaseException):
    """SIGTERM as an exception, so cleanup (temp files) runs as for Ctrl-C."""


def _on_sigterm(signum: int, frame: Any) -> NoReturn:
    raise Terminated()


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        debug = os.environ.get("CKPTPORT_DEBUG") == "1"
        with contextlib.suppress(ValueError):  # not in the main thread
            signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            return super().invoke(ctx)
        except CkptportError as exc:
            _fail(ctx, exc.line(), exc.exit_code, debug)
        except KeyboardInterrupt:
            _fail(ctx, "interrupted; nothing was written", EXIT_INTERRUPTED, debug)
        except Terminated:
            _fail(ctx, "terminated; nothing was written", EXIT_TERMINATED, debug)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:  # a bug: still one line and a failing exit code
            _fail(ctx, f"internal error: {type(exc).__name__}: {exc} "
                  "(set CKPTPORT_DEBUG=1 for the traceback and report it)", EXIT_ERROR, debug)


def _fail(ctx: click.Context, line: str, code: int, debug: bool) -> NoReturn:
    if debug:
        traceback.print_exc()
    click.echo(f"ckptport: error: {line}", err=True)
    ctx.exit(code)


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator[Progress]:
    """tqdm bars on stderr, only on a terminal and without ``-q``."""
    if quiet or not sys.stderr.isatty():
        yield no_progress
        return
    from tqdm import tqdm

    bars: list[Any] = []

    def start(description: str, total: int) -> Callable[[int], None]:
        bar = tqdm(total=total, desc=description, unit="B", unit_scale=True,
                   unit_divisor=1024, file=sys.stderr, leave=False)
        bars.append(bar)
        return bar.update

    try:
        yield start
    finally:
        for bar in bars:
            bar.close()


def _normalize_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options that decide what a checkpoint normalizes to (shared by commands)."""
    options = [
        click.option("--select", default="auto", show_default=True, metavar="auto|all|KEY[.KEY…]",
                     help="What to keep: the model weights (auto), everything (all), or a key."),
        click.option("--ema", is_flag=True, help="Prefer EMA weights (timm and mmengine layouts)."),
        click.option("--strip-prefix", "strip_prefix", multiple=True, metavar="PREFIX",
                     help="Also strip this key prefix (e.g. Lightning's 'model.'). Repeatable."),
        click.option("--keep-prefixes", is_flag=True,
                     help="Do not strip wrapper prefixes (module., _orig_mod., …)."),
        click.option("--dtype", type=click.Choice(CAST_CHOICES), default="keep",
                     show_default=True, help="Cast floating-point tensors."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from .writers.shards import parse_size

    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _anchor(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.fullmatch(ANCHOR_PATTERN, value):
        raise click.BadParameter("must be 'cpu' or 'cuda:N'")
    return value


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckptport")
def cli() -> None:
    """Make PyTorch checkpoints portable: read without running code, normalize,
    write .pth or .safetensors that load anywhere, bit-identical.

    Exit codes: 0 ok, 1 differences or findings, 2 usage or input error.
    """


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--to", type=click.Choice([f.value for f in OutputFormat]),
              help="Output format (default: from DST's extension).")
@_normalize_options
@click.option("--anchor", default="cpu", show_default=True, callback=_anchor,
              help="Device the .pth records for its storages: cpu or cuda:N (no GPU needed).")
@click.option("--trust", is_flag=True, help=(
              "Unpickle with full Python: runs code from the file. Only for files you vouch for."))
@click.option("--max-shard-size", callback=_size, metavar="SIZE",
              help="Write a Hugging Face shard set into the folder DST, shards of at most SIZE "
                   "(5GB, 500MB: decimal units as the hub; 2GiB binary). A folder DST alone "
                   "shards at 5GB.")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Re-read DST and compare every tensor bit for bit.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.option("--format", "report_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Report format on stdout.")
def normalize(src: Path, dst: Path, to: str | None, select: str, ema: bool,
              strip_prefix: tuple[str, ...], keep_prefixes: bool, dtype: str, anchor: str,
              trust: bool, max_shard_size: int | None, overwrite: bool, verify: bool,
              quiet: bool, report_format: str) -> None:
    """Read SRC, normalize it, write DST (.pth, .pt, .bin or .safetensors), verify it.

    SRC may also be a shard set: its *.index.json or the folder holding it.
    A folder DST (or --max-shard-size) writes a shard set."""
    from .convert import convert
    from .render import formatter

    if trust:
        click.echo(f"ckptport: warning: --trust: {src} is unpickled with full Python; "
                   "any code in it runs", err=True)
    options = NormalizeOptions(select=select, ema=ema, strip_prefixes=strip_prefix,
                               keep_prefixes=keep_prefixes, dtype=dtype)
    with _progress(quiet) as progress:
        report = convert(src, dst, options, to=to, anchor=anchor, overwrite=overwrite,
                         verify=verify, trust=trust, max_shard_size=max_shard_size,
                         progress=progress)
    click.echo(formatter(report_format).convert(report))


@cli.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@_normalize_options
@click.option("--raw", is_flag=True, help="Compare as stored: no normalize rules on either side.")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Absolute tolerance.")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Relative tolerance, relative to A: |a-b| <= atol + rtol*|a|.")
@click.option("--cast", is_flag=True,
              help="Compare tensors of different dtypes by value instead of failing.")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Rows per table in text and markdown (json lists all).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.option("--format", "report_format", type=click.Choice(["text", "json", "markdown"]),
              default="text", show_default=True, help="Report format on stdout.")
@click.option("--plot", type=click.Path(path_type=Path), metavar="PNG",
              help="Also draw per-tensor max relative error, in model order (needs matplotlib).")
@click.pass_context
def diff(ctx: click.Context, a: Path, b: Path, select: str, ema: bool,
         strip_prefix: tuple[str, ...], keep_prefixes: bool, dtype: str, raw: bool, atol: float,
         rtol: float, cast: bool, limit: int, quiet: bool, report_format: str,
         plot: Path | None) -> None:
    """Compare checkpoints A and B (any formats), both normalized alike first.

    Equal by value: NaN equals NaN, -0.0 equals 0.0; exact unless --atol/--rtol.
    A dtype change is a difference unless --cast. Exit 0 equal, 1 different,
    2 unreadable input.
    """
    from .diff import diff as diff_checkpoints
    from .errors import EXIT_FINDINGS
    from .render import formatter

    options = NormalizeOptions(select=select, ema=ema, strip_prefixes=strip_prefix,
                               keep_prefixes=keep_prefixes, dtype=dtype)
    if raw and options != NormalizeOptions():
        raise click.UsageError("--raw compares as stored; it cannot be combined with "
                               "--select, --ema, --strip-prefix, --keep-prefixes or --dtype")
    with _progress(quiet) as progress:
        report = diff_checkpoints(a, b, atol=atol, rtol=rtol, cast=cast,
                                  options=None if raw else options, raw=raw, progress=progress)
    click.echo(formatter(report_format).diff(report, limit))
    if plot is not None:
        from .plot import plot_drift

        plot_drift(report, plot)
    if not report.equal:
        ctx.exit(EXIT_FINDINGS)


@cli.command("inspect")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--depth", type=click.IntRange(min=0), default=2, show_default=True,
              help="Levels of the layout tree to list.")
@click.option("--hash", "with_hash", is_flag=True,
              help="Also compute the file's sha256 (reads every byte).")
@click.option("--format", "report_format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Report format on stdout.")
def inspect_command(path: Path, depth: int, with_hash: bool, report_format: str) -> None:
    """Describe PATH without running or reading it: format, layout, tensors, parameters,
    bytes by dtype, recorded devices, wrapper prefixes, objects that block weights-only
    loading and the globals they need, shared storages.
    """
    from .inspect import inspect
    from .render import formatter

    report = inspect(path, depth=depth, with_hash=with_hash)
    click.echo(formatter(report_format).inspect(report))


def _codes(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    return [code.strip() for item in value for code in item.split(",") if code.strip()]


@cli.command("check")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--select", "select_codes", multiple=True, callback=_codes, metavar="CODES",
              help="Run only these rules (comma-separated or repeated, e.g. CKP001,CKP003).")
@click.option("--ignore", "ignore_codes", multiple=True, callback=_codes, metavar="CODES",
              help="Skip these rules.")
@click.option("--finite", is_flag=True, help="Also fail on NaN/inf values (reads every tensor).")
@click.option("--require-format", multiple=True,
              type=click.Choice([f.value for f in Format]),
              help="Fail files in any other container format. Repeatable.")
@click.option("--against", type=click.Path(path_type=Path), metavar="REF",
              help="Fail where the weights differ from the reference checkpoint REF.")
@click.option("--atol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Absolute tolerance for --against.")
@click.option("--rtol", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Relative tolerance for --against.")
@click.option("--format", "report_format", type=click.Choice(["text", "json", "github"]),
              default="text", show_default=True,
              help="Report format on stdout (github: Actions annotations).")
@click.pass_context
def check_command(ctx: click.Context, paths: tuple[Path, ...], select_codes: list[str],
                  ignore_codes: list[str], finite: bool, require_format: tuple[str, ...],
                  against: Path | None, atol: float, rtol: float, report_format: str) -> None:
    """Gate exported checkpoints in CI: run the rules on every PATH (directories are
    searched recursively) and report findings with stable codes.

    Exit 0 pass, 1 findings, 2 unreadable input. Nothing in a file ever runs.
    """
    from .check import check
    from .render import formatter

    try:
        report = check(paths, select=select_codes, ignore=ignore_codes, finite=finite,
                       require_format=require_format, against=against, atol=atol, rtol=rtol)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(formatter(report_format).check(report))
    ctx.exit(report.exit_code)


def main() -> None:
    cli(prog_name="ckptport")
