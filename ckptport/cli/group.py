"""The ``ckptport`` group: the one shape of every error, signals, the version.

Errors are turned into one stderr line and an exit code in one place
(``Group.invoke``), whatever raised them (ckptport, click's usage checks, a
bug), and under ``--format json`` also into a JSON error object on stdout.
A closed stdout (``ckptport inspect x | head -1``) ends the command quietly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from types import FrameType
from typing import NoReturn

import click

from .._version import installed_version
from ..errors import EXIT_ERROR, CkptportError
from ..escape import printable
from ..render import Failure, formatter
from ..tree import paused_gc
from .options import FORMAT, TRANSFERS

__all__ = ["Group", "Terminated", "print_version", "EXIT_INTERRUPTED", "EXIT_TERMINATED",
           "EXIT_STDOUT_CLOSED"]

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM
# a process killed by SIGPIPE, as shells report it (``yes | head``); 0 where there is none
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE if hasattr(signal, "SIGPIPE") else 0


class Terminated(BaseException):
    """SIGTERM as an exception, so cleanup (temp files) runs as for Ctrl-C."""


def _on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    raise Terminated()


class Group(click.Group):
    """click's group, with every failure of a command (or of parsing) in one shape."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[FORMAT] = _format_named(args)  # until --format itself is parsed
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as exc:  # the group's own options: one line too
            _fail(ctx, exc.format_message(), EXIT_ERROR, False, "UsageError")

    def invoke(self, ctx: click.Context) -> object:
        from ..remote import Timeout, Transfers, meter

        meter.reset()  # the bytes this command transfers, for its report
        debug = os.environ.get("CKPTPORT_DEBUG") == "1"
        with contextlib.suppress(ValueError):  # not in the main thread
            signal.signal(signal.SIGTERM, _on_sigterm)
        # a command is one short process: the cyclic collector's passes over a tree of
        # millions of small objects cost more than anything they could free
        try:
            spec = ctx.params.get("remote_timeout")
            # one clock over every transfer of the command, handed to each URL it reads
            ctx.meta[TRANSFERS] = Transfers(Timeout.parse(spec) if spec else None,
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
    fmt = ctx.meta.get(FORMAT)
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
    from ..render import FORMATTERS

    return named if any(f.name == named for f in FORMATTERS) else None


def _stdout_closed(ctx: click.Context) -> NoReturn:
    """The reader of stdout went away (``| head -1``): what it wanted it has; end quietly,
    and let the interpreter's last flush go nowhere instead of failing again."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # not a real file
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    ctx.exit(EXIT_STDOUT_CLOSED)


def print_version(ctx: click.Context, wanted: bool) -> None:
    if wanted and not ctx.resilient_parsing:
        click.echo(f"ckptport, version {installed_version()}")
        ctx.exit()

