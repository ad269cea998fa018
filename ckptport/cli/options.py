"""What the commands share: their options, parameter types and progress bars.

An option several commands take is written once here (``normalize_options``,
``signing_key_options``, …), so its name and help are the same wherever it appears.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..escape import printable
from ..progress import Progress, no_progress
from ..quant import DEQUANTIZE_CHOICES
from ..render import formats_for
from ..rules import CAST_CHOICES, NormalizeOptions
from ..writers.formats import FORMATS
from ..writers.plan import ANCHOR_PATTERN

if TYPE_CHECKING:
    from ..remote import RemotePath

__all__ = ["TRANSFERS", "FORMAT", "CommandFunction", "progress_bars", "LOCATION", "Location",
           "Destination", "normalize_options", "report_format_option", "size_callback",
           "jobs_option", "signing_key_options", "trusted_keys_options", "part_callback",
           "OutputFormatName", "anchor_callback"]

TRANSFERS = "ckptport.transfers"  # ``ctx.meta``: the command's ``remote.Transfers``
FORMAT = "ckptport.format"  # ``ctx.meta``: the command's --format, for its error report
# a command's function as click calls it: each parameter by name, its result unused
CommandFunction = Callable[..., object]
Option = Callable[[CommandFunction], CommandFunction]  # an option's decorator


def _decorated(command: CommandFunction, options: list[Option]) -> CommandFunction:
    """``command`` with ``options``, given in the order ``--help`` lists them."""
    for option in reversed(options):
        command = option(command)
    return command


@contextlib.contextmanager
def progress_bars(quiet: bool) -> Iterator[Progress]:
    """tqdm bars (and ``reading X…`` lines) on stderr, only on a terminal and without ``-q``."""
    if quiet or not sys.stderr.isatty():
        yield no_progress
        return
    from tqdm import tqdm

    closes: list[Callable[[], object]] = []  # each bar's close

    def start(description: str, total: int) -> Callable[[int], None]:
        label = printable(description)
        if not total:  # a status line: what is being done before there is anything to count
            bar = tqdm(total=1, desc=label, bar_format="{desc}…", file=sys.stderr, leave=False)
        else:
            bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
                       file=sys.stderr, leave=False)
        closes.append(bar.close)
        update: Callable[[int], None] = bar.update  # tqdm is untyped
        return update

    try:
        yield start
    finally:
        for close in closes:
            close()


class Location(click.ParamType["Path | RemotePath", "str | os.PathLike[str]"]):
    """A source: a local path, or a URL (hf://, s3://, http(s)://) kept whole, never
    folded into a ``Path`` (which would turn ``https://`` into ``https:/``)."""

    name = "path"

    def convert(self, value: str | os.PathLike[str], param: click.Parameter | None,
                ctx: click.Context | None) -> Path | RemotePath:
        from ..remote import location

        return location(value, ctx.meta.get(TRANSFERS) if ctx is not None else None)


LOCATION = Location()


class Destination(click.ParamType["str | os.PathLike[str] | RemotePath",
                                  "str | os.PathLike[str]"]):
    """A DST: a URL as for a source (it carries the command's transfers), a local path as
    written (a trailing ``/`` says a folder: a shard set)."""

    name = "path"

    def convert(self, value: str | os.PathLike[str], param: click.Parameter | None,
                ctx: click.Context | None) -> str | os.PathLike[str] | RemotePath:
        from ..remote import is_remote

        return LOCATION.convert(value, param, ctx) if is_remote(value) else value


_NORMALIZE_OPTIONS: list[Option] = [  # in --help's order
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


def normalize_options(func: CommandFunction) -> CommandFunction:
    """The options that decide what a checkpoint normalizes to (shared by commands).

    The command receives them as one ``options: NormalizeOptions`` and the read
    budget as ``max_expansion``, so a new option is added here and in
    ``NormalizeOptions`` only.
    """

    @functools.wraps(func)
    def command(*args: object, select: str, ema: str, strip_prefix: tuple[str, ...],
                keep_prefixes: bool, dtype: str, dequantize: str | None, subtree: str | None,
                keep: tuple[str, ...], drop: tuple[str, ...],
                rename: tuple[tuple[str, str], ...], map_file: Path | None, **kwargs: object
                ) -> object:
        options = NormalizeOptions(select=select, ema=ema, strip_prefixes=strip_prefix,
                                   keep_prefixes=keep_prefixes, dtype=dtype,
                                   dequantize=dequantize, subtree=subtree,
                                   keep=keep, drop=drop, rename=rename, recipe=map_file)
        return func(*args, options=options, **kwargs)

    return _decorated(command, _NORMALIZE_OPTIONS)


def report_format_option(command: str) -> Callable[[CommandFunction], CommandFunction]:
    return click.option("--format", "report_format", type=click.Choice(formats_for(command)),
                        default="text", show_default=True, help="Report format on stdout.",
                        callback=_remember_format, is_eager=True)


def _remember_format(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Kept for ``group._fail``: an error under ``--format json`` is a JSON object on stdout too."""
    ctx.meta[FORMAT] = value
    return value


def size_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from ..writers.plan import parse_size

    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def jobs_option(func: CommandFunction) -> CommandFunction:
    return click.option("--jobs", type=click.IntRange(min=1), metavar="N",
                        help="Workers: threads over tensors for one SRC, processes over files "
                             "for a folder (default: every core).")(func)


def signing_key_options(func: CommandFunction) -> CommandFunction:
    """The options that say how to sign (``sign``, ``normalize --sign``), as one ``key``."""

    @functools.wraps(func)
    def command(*args: object, key: Path | None, certificate: Path | None,
                certificate_chain: tuple[Path, ...], sigstore: bool,
                identity_token: str | None, **kwargs: object) -> object:
        from ..signing import SigningKey

        made = None if key is None and not sigstore else SigningKey(
            key, certificate, certificate_chain, os.environ.get("CKPTPORT_KEY_PASSWORD"),
            sigstore, identity_token)
        return func(*args, signing_key=made, **kwargs)

    return _decorated(command, [
        click.option("--certificate", type=click.Path(path_type=Path), metavar="PEM",
                     help="The signing certificate of --key (then the bundle carries it)."),
        click.option("--certificate-chain", multiple=True, type=click.Path(path_type=Path),
                     metavar="PEM", help="Certificates from the signing one to the root. "
                     "Repeatable."),
        click.option("--sigstore", is_flag=True,
                     help="Sign keyless with Sigstore (OIDC identity; needs the network)."),
        click.option("--identity-token", metavar="TOKEN",
                     help="With --sigstore: this OIDC token, not ambient credentials."),
    ])


def trusted_keys_options(func: CommandFunction) -> CommandFunction:
    """The options that say what a signature must verify with, as one ``trusted``."""

    @functools.wraps(func)
    def command(*args: object, public_key: tuple[Path, ...], roots: tuple[Path, ...],
                sigstore_identity: str | None, sigstore_issuer: str | None,
                **kwargs: object) -> object:
        from ..signing import TrustedKeys

        made = None if not (public_key or roots or sigstore_identity or sigstore_issuer) \
            else TrustedKeys(public_key, roots, sigstore_identity, sigstore_issuer)
        return func(*args, trusted=made, **kwargs)

    return _decorated(command, [
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
    ])


def part_callback(ctx: click.Context, param: click.Parameter, value: str | None
          ) -> tuple[int, int] | None:
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise click.BadParameter("must be I/N with 1 <= I <= N, e.g. 3/8")
    return int(match.group(1)), int(match.group(2))


class OutputFormatName(click.ParamType[str, object]):
    """A name of ``writers.formats.FORMATS``, read when the command runs (formats registered
    after start-up are offered too)."""

    name = "format"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None
                ) -> str:
        if value not in FORMATS:
            self.fail(f"{value!r} is not an output format (known: {', '.join(FORMATS)})",
                      param, ctx)
        return str(value)


def anchor_callback(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not re.fullmatch(ANCHOR_PATTERN, value):
        raise click.BadParameter("must be 'cpu' or 'cuda:N'")
    return value

