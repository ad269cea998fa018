"""Report formats: each a formatter object with one method per report kind.

The CLI picks a formatter from ``--format`` and prints what it returns on
stdout; progress and errors go to stderr, so ``--format json`` output is
always parseable.
"""

from __future__ import annotations

from .protocol import Failure, Formatter

__all__ = ["Formatter", "Failure", "FORMATTERS", "formatter", "formats_for"]


def _formatters() -> tuple[Formatter, ...]:
    from .github import GithubFormatter
    from .json import JsonFormatter
    from .markdown import MarkdownFormatter
    from .text import TextFormatter

    return (TextFormatter(), JsonFormatter(), MarkdownFormatter(), GithubFormatter())


FORMATTERS: tuple[Formatter, ...] = _formatters()


def formats_for(command: str) -> list[str]:
    """The ``--format`` choices of ``command``."""
    return [f.name for f in FORMATTERS if command in f.commands]


def formatter(name: str) -> Formatter:
    """The formatter whose ``--format`` name is ``name`` (each formatter knows its own)."""
    for candidate in FORMATTERS:
        if candidate.name == name:
            return candidate
    raise ValueError(f"unknown report format {name!r} (known: "
                     f"{', '.join(f.name for f in FORMATTERS)})")
