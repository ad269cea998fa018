"""Make text from a file safe to print: every non-printable character escaped.

Keys, class names, member names and metadata come from the file; a hostile
or merely odd one (a vocabulary with ``\\x1b`` keys) would otherwise move
the cursor, rewrite a terminal line or forge a line in a CI log. Every
text report and error line passes file-derived text through ``printable``.
"""

from __future__ import annotations

__all__ = ["printable"]


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character (space excepted) written as an escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escaped(c) for c in text)
