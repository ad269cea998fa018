"""The ``ckptport`` command: parse options, call the library, print, exit.

One module per group of commands (``normalize``; ``reports``: manifest, diff,
inspect, check; ``signatures``: sign, verify), the options they share in
``options``, and the one shape of every error in ``group``.
torch is imported only by what needs it, so
``ckptport --help``, ``inspect`` and ``check`` start fast, and on a
terminal the first thing a command prints (``reading SRC…``) comes before
anything slow.
"""

from __future__ import annotations

import gc

import click

from .group import Group, print_version
from .normalize import normalize
from .reports import check_command, diff, inspect_command, manifest_command
from .signatures import sign_command, verify_command

__all__ = ["main", "cli"]


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=lambda ctx, param, value: print_version(ctx, value),
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



for _command in (normalize, manifest_command, diff, inspect_command, check_command,
                 sign_command, verify_command):
    cli.add_command(_command)


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
