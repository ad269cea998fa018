"""The ``ckptport`` command: parse options, call the library, print, exit.

Errors are turned into one stderr line and an exit code in one place
(``_Group.invoke``), whatever raised them (ckptport, click's usage checks, a
bug), and under ``--format json`` also into a JSON error object on stdout.
A closed stdout (``ckptport inspect x | head -1``) ends the command quietly.
torch is imported only by what needs it, so
``ckptport --help``, ``inspect`` and ``check`` start fast, and on a
terminal the first thing a command prints (``reading SRC…``) comes before
anything slow.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from ._version import installed_version
from .checkpoint import Format
from .errors import EXIT_ERROR, EXIT_FINDINGS, CkptportError, OutputExistsError
from .escape import printable
from .progress import Progress, no_progress
from .quant import DEQUANTIZE_CHOICES
from .render import Failure, formats_for, formatter
from .rules import CAST_CHOICES, NormalizeOptions
from .tree import paused_gc
from .writers.formats import FORMATS
from .writers.plan import ANCHOR_PATTERN

__all__ = ["main", "cli"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM
_TRANSFERS = "ckptport.transfers"  # ``ctx.meta``: the command's ``remote.Transfers``
_FORMAT = "ckptport.format"  # ``ctx.meta``: the command's --format, for its error report
# a process killed by SIGPIPE, as shells report it (``yes | head``); 0 where there is none
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 0


class Terminated(BaseException):
    """SIGTERM as an exception, so cleanup (temp files) runs as for Ctrl-C."""


def _on_sigterm(signum: int, frame: Any) -> NoReturn:
    raise Terminated()


class _Group(click.Group):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_FORMAT] = _format_named(args)  # until --format itself is parsed
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:  # the group's own options: one line too
            _fail(ctx, exc.format_message(), EXIT_ERROR, False, "UsageError")

    def invoke(self, ctx: click.Context) -> Any:
        from .remote import Timeout, Transfers, meter

        meter.reset()  # the bytes this command transfers, for its report
        debug = os.environ.get("CKPTPORT_DEBUG") == "1"
        with contextlib.suppress(ValueError):  # not in the main thread
            signal.signal(signal.SIGTERM, _on_sigterm)
        # a command is one short process: the cyclic collector's passes over a tree of
        # millions of small objects cost more than anything they could free
        try:
            spec = ctx.params.get("remote_timeout")
            # one clock over every transfer of the command, handed to each URL it reads
            ctx.meta[_TRANSFERS] = Transfers(Timeout.parse(spec) if spec else None,
                                             connections=ctx.params.get("connections"))
            with paused_gc():
                return super().invoke(ctx)
        except CkptportError as exc:
            _fail(ctx, exc.line(), exc.exit_code, debug, type(exc).__name__, exc.path)
        except KeyboardInterrupt as exc:  # a message of its own says what was kept
            _fail(ctx, str(exc) or "interrupted; nothing was written", EXIT_INTERRUPTED, debug,
                  "Interrupted")
        except Terminated as exc:
            _fail(ctx, str(exc) or "terminated; nothing was written", EXIT_TERMINATED, debug,
                  "Terminated")
        except BrokenPipeError:
            _stdout_closed(ctx)
        except (click.exceptions.Exit, click.exceptions.NoArgsIsHelpError, click.Abort):
            raise
        except click.ClickException as exc:  # a usage check, by click or by a command
            _fail(ctx, exc.format_message(), EXIT_ERROR, debug, "UsageError")
        except Exception as exc:  # a bug: still one line and a failing exit code
            _fail(ctx, f"internal error: {type(exc).__name__}: {exc} "
                  "(set CKPTPORT_DEBUG=1 for the traceback and report it)", EXIT_ERROR, debug,
                  "InternalError")


def _fail(ctx: click.Context, line: str, code: int, debug: bool, kind: str,
          path: str | None = None) -> NoReturn:
    """The one shape of every error: a line on stderr, the report format's error object
    on stdout where it has one (json), the exit code."""
    if debug:
        traceback.print_exc()
    fmt = ctx.meta.get(_FORMAT)
    shown = formatter(fmt).error(Failure(ctx.invoked_subcommand or ctx.info_name or "",
                                         line, path, kind, code)) if fmt else None
    try:
        if shown is not None:
            click.echo(shown)
        click.echo(f"ckptport: error: {printable(line)}", err=True)
    except BrokenPipeError:
        _stdout_closed(ctx)
    ctx.exit(code)


def _format_named(args: list[str]) -> str | None:
    """The value of the last ``--format`` in ``args``: the report format of an error that
    click raises before it parses the option (an unknown option, a missing argument)."""
    named = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--format" and i + 1 < len(args):
            named = args[i + 1]
        elif arg.startswith("--format="):
            named = arg.removeprefix("--format=")
    from .render import FORMATTERS

    return named if any(f.name == named for f in FORMATTERS) else None


def _stdout_closed(ctx: click.Context) -> NoReturn:
    """The reader of stdout went away (``| head -1``): what it wanted it has; end quietly,
    and let the interpreter's last flush go nowhere instead of failing again."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # not a real file
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    ctx.exit(EXIT_STDOUT_CLOSED)


@contextlib.contextmanager
def _progress(quiet: bool) -> Iterator[Progress]:
    """tqdm bars (and ``reading X…`` lines) on stderr, only on a terminal and without ``-q``."""
    if quiet or not sys.stderr.isatty():
        yield no_progress
        return
    from tqdm import tqdm

    bars: list[Any] = []

    def start(description: str, total: int) -> Callable[[int], None]:
        label = printable(description)
        if not total:  # a status line: what is being done before there is anything to count
            bar = tqdm(total=1, desc=label, bar_format="{desc}…", file=sys.stderr, leave=False)
        else:
            bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
                       file=sys.stderr, leave=False)
        bars.append(bar)
        return bar.update

    try:
        yield start
    finally:
        for bar in bars:
            bar.close()


class _Location(click.ParamType):
    """A source: a local path, or a URL (hf://, s3://, http(s)://) kept whole, never
    folded into a ``Path`` (which would turn ``https://`` into ``https:/``)."""

    name = "path"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        from .remote import location

        return location(value, ctx.meta.get(_TRANSFERS) if ctx is not None else None)


LOCATION = _Location()


class _Destination(_Location):
    """A DST: a URL as for a source (it carries the command's transfers), a local path as
    written (a trailing ``/`` says a folder: a shard set)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        from .remote import is_remote

        return super().convert(value, param, ctx) if is_remote(value) else value


def _normalize_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options that decide what a checkpoint normalizes to (shared by commands).

    The command receives them as one ``options: NormalizeOptions`` and the read
    budget as ``max_expansion``, so a new option is added here and in
    ``NormalizeOptions`` only.
    """

    @functools.wraps(func)
    def command(*args: Any, select: str, ema: str, strip_prefix: tuple[str, ...],
                keep_prefixes: bool, dtype: str, dequantize: str | None, subtree: str | None,
                keep: tuple[str, ...], drop: tuple[str, ...],
                rename: tuple[tuple[str, str], ...], map_file: Path | None, **kwargs: Any
                ) -> Any:
        options = NormalizeOptions(select=select, ema=ema, strip_prefixes=strip_prefix,
                                   keep_prefixes=keep_prefixes, dtype=dtype,
                                   dequantize=dequantize, subtree=subtree,
                                   keep=keep, drop=drop, rename=rename, recipe=map_file)
        return func(*args, options=options, **kwargs)

    options = [
        click.option("--select", default="auto", show_default=True, metavar="auto|all|KEY[.KEY…]",
                     help="What to keep: the model weights (auto), everything (all), or a key "
                          "path (dict keys, list indexes, recorded objects' attributes)."),
        click.option("--ema", "ema", flag_value="require", default="off",
                     help="Take the EMA weights (timm, ultralytics, mmengine layouts); an error "
                          "if there are none."),
        click.option("--prefer-ema", "ema", flag_value="prefer",
                     help="Take the EMA weights when there are some, else the weights."),
        click.option("--strip-prefix", "strip_prefix", multiple=True, metavar="PREFIX",
                     help="Also strip this key prefix ('model' means 'model.'); 'auto' strips "
                          "the one every weight key shares. Repeatable."),
        click.option("--keep-prefixes", is_flag=True,
                     help="Do not strip wrapper prefixes (module., _orig_mod., …)."),
        click.option("--dtype", type=click.Choice(CAST_CHOICES), default="keep",
                     show_default=True, help="Cast floating-point tensors (never the codes or "
                     "scales of a quantized weight: those are refused; see --dequantize)."),
        click.option("--dequantize", type=click.Choice(DEQUANTIZE_CHOICES), is_flag=False,
                     flag_value="bfloat16", default=None, metavar="[bfloat16|float16|float32]",
                     help="Turn each quantized weight (FP8 block-scaled, MXFP4, …) into one "
                          "plain tensor, bit for bit what its scheme's reference library "
                          "computes (default bfloat16)."),
        click.option("--subtree", metavar="PREFIX",
                     help="Keep only the keys under PREFIX. and strip it (--subtree backbone). "
                          "Runs after prefix stripping; then --keep/--drop, then --rename."),
        click.option("--keep", multiple=True, metavar="GLOB",
                     help="Keep only keys matching a shell-style GLOB ('layer*'). Repeatable."),
        click.option("--drop", multiple=True, metavar="GLOB",
                     help="Drop keys matching GLOB ('*.num_batches_tracked'), after --keep. "
                          "Repeatable."),
        click.option("--rename", multiple=True, nargs=2, metavar="PATTERN REPLACEMENT",
                     help="re.sub(PATTERN, REPLACEMENT) on every key, groups allowed "
                          "('^blocks\\.(\\d+)\\.' 'layers.\\1.'). Repeatable, in order; last."),
        click.option("--map", "map_file", type=click.Path(path_type=Path), metavar="FILE",
                     help="A recipe: the key steps as an ordered list in a TOML (or JSON) file, "
                          "steps = [{subtree=...}, {drop=[...]}, {rename=[P, R]}]."),
        click.option("--tag", metavar="NAME",
                     help="A DeepSpeed checkpoint folder's tag to read (default: the one its "
                          "'latest' file names, as DeepSpeed does)."),
        click.option("--max-expansion", type=click.FloatRange(min=0, min_open=True),
                     metavar="RATIO", help="Tensors may stand for at most RATIO times the "
                     "file's bytes plus 64 MiB (default 2, or CKPTPORT_MAX_EXPANSION): stride-0 "
                     "and overlapping views beyond that are refused."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _report_format(command: str) -> Callable[..., Any]:
    return click.option("--format", "report_format", type=click.Choice(formats_for(command)),
                        default="text", show_default=True, help="Report format on stdout.",
                        callback=_remember_format, is_eager=True)


def _remember_format(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Kept for ``_fail``: an error under ``--format json`` is a JSON object on stdout too."""
    ctx.meta[_FORMAT] = value
    return value


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from .writers.plan import parse_size

    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _jobs_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--jobs", type=click.IntRange(min=1), metavar="N",
                        help="Workers: threads over tensors for one SRC, processes over files "
                             "for a folder (default: every core).")(func)


def _signing_key(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say how to sign (``sign``, ``normalize --sign``), as one ``key``."""

    @functools.wraps(func)
    def command(*args: Any, key: Path | None, certificate: Path | None,
                certificate_chain: tuple[Path, ...], sigstore: bool,
                identity_token: str | None, **kwargs: Any) -> Any:
        from .signing import SigningKey

        made = None if key is None and not sigstore else SigningKey(
            key, certificate, certificate_chain, os.environ.get("CKPTPORT_KEY_PASSWORD"),
            sigstore, identity_token)
        return func(*args, signing_key=made, **kwargs)

    for option in reversed([
        click.option("--certificate", type=click.Path(path_type=Path), metavar="PEM",
                     help="The signing certificate of --key (then the bundle carries it)."),
        click.option("--certificate-chain", multiple=True, type=click.Path(path_type=Path),
                     metavar="PEM", help="Certificates from the signing one to the root. "
                     "Repeatable."),
        click.option("--sigstore", is_flag=True,
                     help="Sign keyless with Sigstore (OIDC identity; needs the network)."),
        click.option("--identity-token", metavar="TOKEN",
                     help="With --sigstore: this OIDC token, not ambient credentials."),
    ]):
        command = option(command)
    return command


def _trusted_keys(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say what a signature must verify with, as one ``trusted``."""

    @functools.wraps(func)
    def command(*args: Any, public_key: tuple[Path, ...], roots: tuple[Path, ...],
                sigstore_identity: str | None, sigstore_issuer: str | None,
                **kwargs: Any) -> Any:
        from .signing import TrustedKeys

        made = None if not (public_key or roots or sigstore_identity or sigstore_issuer) \
            else TrustedKeys(public_key, roots, sigstore_identity, sigstore_issuer)
        return func(*args, trusted=made, **kwargs)

    for option in reversed([
        click.option("--public-key", multiple=True, type=click.Path(path_type=Path),
                     metavar="PEM", help="A public key the signature may verify with. "
                     "Repeatable."),
        click.option("--certificate-chain", "roots", multiple=True,
                     type=click.Path(path_type=Path), metavar="PEM",
                     help="Trusted certificates (roots, intermediates) the bundle's signing "
                          "certificate must chain to. Repeatable."),
        click.option("--sigstore-identity", metavar="ID",
                     help="Verify a Sigstore signature made by this identity."),
        click.option("--sigstore-issuer", metavar="URL", help="... from this OIDC issuer."),
    ]):
        command = option(command)
    return command


def _part(ctx: click.Context, param: click.Parameter, value: str | None
          ) -> tuple[int, int] | None:
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise click.BadParameter("must be I/N with 1 <= I <= N, e.g. 3/8")
    return int(match.group(1)), int(match.group(2))


class _OutputFormatName(click.ParamType):
    """A name of ``writers.formats.FORMATS``, read when the command runs (formats registered
    after start-up are offered too)."""

    name = "format"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> str:
        if value not in FORMATS:
            self.fail(f"{value!r} is not an output format (known: {', '.join(FORMATS)})",
                      param, ctx)
        return str(value)


def _anchor(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.fullmatch(ANCHOR_PATTERN, value):
        raise click.BadParameter("must be 'cpu' or 'cuda:N'")
    return value


def _print_version(ctx: click.Context, wanted: bool) -> None:
    if wanted and not ctx.resilient_parsing:
        click.echo(f"ckptport, version {installed_version()}")
        ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=lambda ctx, param, value: _print_version(ctx, value),
              help="Show the version (the installed package's metadata) and exit.")
@click.option("--remote-timeout", metavar="SPEC",
              help="Deadlines of remote reads, in seconds: the command's total (a number), "
                   "or NAME=SECONDS pairs of total, request, connect, read (default "
                   "total=3600,request=300,connect=30,read=60, or CKPTPORT_REMOTE_TIMEOUT).")
@click.option("--connections", type=click.IntRange(min=1), metavar="N",
              help="Requests in flight at once for remote reads (ranges of one read, each "
                   "retried on its own) and s3:// uploads (parts) (default 8, or "
                   "CKPTPORT_REMOTE_CONNECTIONS).")
def cli(remote_timeout: str | None, connections: int | None) -> None:
    """Make PyTorch checkpoints portable: read without running code, normalize,
    write .pth or .safetensors that load anywhere, bit-identical.

    Exit codes: 0 ok, 1 differences or findings, 2 usage or input error.
    """


@cli.command()
@click.argument("src", type=LOCATION)
@click.argument("dst", type=_Destination())  # a str: a trailing "/" means a folder (a shard set)
@click.option("--to", type=_OutputFormatName(), metavar="FORMAT",
              help="Output format: pth, safetensors, dcp or a registered one (default: from "
                   "DST's extension).")
@_normalize_options
@click.option("--anchor", default="cpu", show_default=True, callback=_anchor,
              help="Device the .pth records for its storages: cpu or cuda:N (no GPU needed).")
@click.option("--trust", is_flag=True, help=(
              "Unpickle with full Python: runs code from the file. Only for files you vouch for."))
@click.option("--max-shard-size", callback=_size, metavar="SIZE",
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
@_jobs_option
@click.option("--part", callback=_part, metavar="I/N",
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
@_report_format("normalize")
@click.pass_context
def normalize(ctx: click.Context, src: Path, dst: str, to: str | None,
              options: NormalizeOptions, max_expansion: float | None, tag: str | None,
              anchor: str,
              trust: bool, max_shard_size: int | None, dcp_key: str | None, overwrite: bool,
              verify: bool, manifest_path: Path | None, jobs: int | None,
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
    from .readers import is_checkpoint_folder
    if src.is_dir() and not is_checkpoint_folder(src):
        if manifest_path is not None or max_shard_size is not None or dcp_key is not None \
                or hash_name or tag is not None or sign_key is not None:
            raise click.UsageError("folder mode writes one file per checkpoint: --manifest, "
                                   "--max-shard-size, --dcp-key, --hash-name, --tag and --sign "
                                   "apply to one SRC")
        from .commands.normalize import FolderOptions, normalize_folder

        with _progress(quiet) as progress:
            folder_report = normalize_folder(src, dst, FolderOptions(
                options=options, to=to or "pth", anchor=anchor, overwrite=overwrite,
                verify=verify, jobs=jobs, part=part, dry_run=dry_run, metadata=metadata,
                max_expansion=max_expansion), progress=progress)
        click.echo(formatter(report_format).folder(folder_report))
        ctx.exit(folder_report.exit_code)
    if part is not None or dry_run:
        raise click.UsageError("--part and --dry-run apply to a folder of checkpoints")
    if trust:
        click.echo(f"ckptport: warning: --trust: {printable(str(src))} is unpickled with full "
                   "Python; any code in it runs", err=True)
    signing_key = None
    if sign_key is not None:
        from .signing import SigningKey

        signing_key = SigningKey(sign_key, sign_certificate, sign_chain,
                                 os.environ.get("CKPTPORT_KEY_PASSWORD"))
    elif sign_certificate is not None or sign_chain:
        raise click.UsageError("--sign-certificate and --sign-chain go with --sign PEM")
    with _progress(quiet) as progress:
        progress(f"reading {src}", 0)  # before the imports: torch costs a second
        from .commands.normalize import normalize_file

        report = normalize_file(src, dst, options,
                                to=to, anchor=anchor, overwrite=overwrite, verify=verify,
                                trust=trust, max_shard_size=max_shard_size, dcp_key=dcp_key,
                                manifest=manifest_path, jobs=jobs, metadata=metadata,
                                hash_name=hash_name, create_pr=create_pr,
                                max_expansion=max_expansion, tag=tag, sign=signing_key,
                                progress=progress)
    click.echo(formatter(report_format).normalize(report))


@cli.command("manifest")
@click.argument("src", type=LOCATION)
@_normalize_options
@click.option("-o", "--output", type=click.Path(path_type=Path), metavar="FILE",
              help="Write the manifest to FILE (atomically) and report on stdout; without it "
                   "the manifest itself goes to stdout.")
@click.option("--overwrite", is_flag=True, help="Replace FILE if it exists.")
@click.option("--trust", is_flag=True, help=(
              "Unpickle with full Python: runs code from the file. Only for files you vouch for."))
@_jobs_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@_report_format("manifest")
def manifest_command(src: Path, options: NormalizeOptions, max_expansion: float | None,
                     tag: str | None,
                     output: Path | None, overwrite: bool,
                     trust: bool, jobs: int | None, quiet: bool, report_format: str) -> None:
    """List the normalized weights of SRC with the sha256 of each tensor's canonical bytes
    and one weights digest: the same for the same weights in any container (.pth,
    .safetensors, a shard set, DCP, a Hugging Face folder), whatever the sharding
    and key order. Commit it; gate releases with check --against-manifest FILE."""
    from .commands.manifest import manifest, write_manifest

    if output is not None and output.exists() and not overwrite:  # before the long read
        raise OutputExistsError("exists; pass --overwrite to replace it", output)
    with _progress(quiet) as progress:
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


@cli.command()
@click.argument("a", type=LOCATION)
@click.argument("b", type=LOCATION)
@_normalize_options
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
@_report_format("diff")
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
    from .commands.diff import diff as diff_checkpoints
    if raw and (options != NormalizeOptions() or map_a or map_b):
        raise click.UsageError("--raw compares as stored; it cannot be combined with "
                               "--select, --ema, --strip-prefix, --keep-prefixes, --dtype or "
                               "the key options")
    if trust:
        click.echo("ckptport: warning: --trust: both files are unpickled with full Python; "
                   "any code in them runs", err=True)
    with _progress(quiet) as progress:
        progress(f"reading {a} and {b}", 0)
        report = diff_checkpoints(a, b, atol=atol, rtol=rtol, cast=cast,
                                  options=None if raw else options, raw=raw, trust=trust,
                                  map_a=map_a, map_b=map_b, max_expansion=max_expansion, tag=tag,
                                  progress=progress)
    if plot is not None:  # first: a plot that cannot be written leaves no report behind
        from .render.plot import plot_drift

        plot_drift(report, plot)
    click.echo(formatter(report_format).diff(report, limit))
    if not report.equal:
        ctx.exit(EXIT_FINDINGS)


@cli.command("inspect")
@click.argument("path", type=LOCATION)
@click.option("--depth", type=click.IntRange(min=0), default=2, show_default=True,
              help="Levels of the layout tree to list.")
@click.option("--hash", "with_hash", is_flag=True,
              help="Also compute the file's sha256 (reads every byte).")
@click.option("--tag", metavar="NAME",
              help="A DeepSpeed checkpoint folder's tag (default: the one 'latest' names).")
@_report_format("inspect")
def inspect_command(path: Path, depth: int, with_hash: bool, tag: str | None,
                    report_format: str) -> None:
    """Describe PATH without running or reading it: format, layout, tensors, parameters,
    bytes by dtype, recorded devices, wrapper prefixes, objects that block weights-only
    loading and the globals they need, shared storages.
    """
    from .commands.inspection import inspect
    report = inspect(path, depth=depth, with_hash=with_hash, tag=tag)
    click.echo(formatter(report_format).inspect(report))


def _codes(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    return [code.strip() for item in value for code in item.split(",") if code.strip()]


@cli.command("check")
@click.argument("paths", nargs=-1, required=True, type=LOCATION)
@click.option("--codes", "codes", multiple=True, callback=_codes, metavar="CODES",
              help="Run only these codes (comma-separated or repeated, e.g. CKP001,CKP004); "
              "CKP003 (code-running globals) always runs.")
@click.option("--ignore", "ignore_codes", multiple=True, callback=_codes, metavar="CODES",
              help="Skip these codes (all but CKP003).")
@_normalize_options
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
@_trusted_keys
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@_report_format("check")
@click.pass_context
def check_command(ctx: click.Context, paths: tuple[Path, ...], codes: list[str],
                  ignore_codes: list[str], options: NormalizeOptions,
                  max_expansion: float | None, tag: str | None, finite: str | None,
                  require_format: tuple[str, ...], against: Path | None,
                  against_manifest: Path | None, atol: float, rtol: float,
                  verify_signature: Path | None, trusted: Any, quiet: bool,
                  report_format: str) -> None:
    """Gate exported checkpoints in CI: run the codes on every PATH (folders are searched
    for every file a loader could open) and report findings with stable codes.

    Exit 0 pass, 1 findings, 2 unreadable input. Nothing in a file ever runs.
    """
    from .commands.check import check
    with _progress(quiet or not (finite or against or against_manifest or verify_signature)
                   ) as progress:
        report = check(paths, codes=codes, ignore=ignore_codes, finite=finite,
                       require_format=require_format, against=against,
                       against_manifest=against_manifest, atol=atol, rtol=rtol,
                       options=options, max_expansion=max_expansion, tag=tag,
                       verify_signature=verify_signature, trusted=trusted,
                       progress=progress)
    click.echo(formatter(report_format).check(report))
    ctx.exit(report.exit_code)


@cli.command("sign")
@click.argument("src", type=LOCATION)
@click.option("--key", type=click.Path(path_type=Path), metavar="PEM",
              help="The private key (PEM, ECDSA; CKPTPORT_KEY_PASSWORD if encrypted).")
@_signing_key
@_normalize_options
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
@_jobs_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def sign_command(src: Path, signing_key: Any, options: NormalizeOptions,
                 max_expansion: float | None, tag: str | None, output: Path | None,
                 file_hash: str, weights_only: bool, overwrite: bool, trust: bool,
                 jobs: int | None, quiet: bool) -> None:
    """Sign SRC: an OMS signature over its files (model_signing verifies it) and a weights
    attestation over its weights digest, which still verifies after any conversion."""
    from .signing import sign

    if signing_key is None:
        raise click.UsageError("sign with --key PEM or --sigstore")
    with _progress(quiet) as progress:
        report = sign(src, signing_key, output=output, options=options, file_hash=file_hash,
                      weights_only=weights_only, overwrite=overwrite, jobs=jobs, trust=trust,
                      max_expansion=max_expansion,
                      tag=tag, progress=progress)
    click.echo("\n".join(report.lines()))


@cli.command("verify")
@click.argument("src", type=LOCATION)
@click.option("--signature", "signatures", multiple=True, type=click.Path(path_type=Path),
              metavar="FILE", help="An OMS signature or weights attestation (the attestation "
              "beside an OMS signature is read too). Default: the ones sign writes.")
@_trusted_keys
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
@_jobs_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
@click.pass_context
def verify_command(ctx: click.Context, src: Path, signatures: tuple[Path, ...], trusted: Any,
                   chain: Path | None, output_signatures: tuple[Path, ...], trust: bool,
                   tag: str | None, jobs: int | None, quiet: bool) -> None:
    """Check SRC against its signatures: exit 0 when its files match the OMS signature or
    its weights (in whatever container SRC now is) match the weights attestation, 1 with
    what differs, 2 for a bad signature, key or certificate."""
    from .signing import verify, verify_chain

    if trusted is None:
        raise click.UsageError("verify with --public-key, --certificate-chain or "
                               "--sigstore-identity/--sigstore-issuer")
    if output_signatures and chain is None:
        raise click.UsageError("--output-signature goes with --chain SOURCE")
    with _progress(quiet) as progress:
        report = verify(src, trusted, signatures=signatures, jobs=jobs, trust=trust, tag=tag,
                        progress=progress) if chain is None else verify_chain(
            src, chain, trusted, signatures=signatures, output_signatures=output_signatures,
            jobs=jobs, trust=trust, tag=tag, progress=progress)
    click.echo("\n".join(report.lines()))
    ctx.exit(report.exit_code)


def main() -> None:
    """The ``ckptport`` executable: one command, then the process ends.

    So the cyclic collector stays off throughout (``invoke`` pauses it for
    in-process callers too), and what the command made is frozen before
    exit so the interpreter's final collection does not walk it all
    (after ``import torch``: ~0.3 s of CPU).
    """
    gc.disable()
    try:
        cli(prog_name="ckptport")
    finally:
        gc.freeze()
