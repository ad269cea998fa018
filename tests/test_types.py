"""The package's types: ``Any`` only where a value really is anything, and each such place says why.

A use of ``Any`` (a name in code, or inside a quoted annotation) counts once per line, import
lines left out; it must carry a comment naming ``Any`` on its line or on one of the three lines
above (``# Any: what the value is and why nothing narrower fits``). ``python
tests/test_types.py`` prints the count per module.
"""

from __future__ import annotations

import io
import re
import sys
import tokenize
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ckptport"
LIMIT = 150  # lines using Any outside imports (28 at round 4's close)
_ANY = re.compile(r"\bAny\b")
_EXPLAINED = re.compile(r"#.*\bAny\b")


def any_lines(path: Path) -> list[int]:
    """Line numbers (1-based) where ``path`` uses ``Any`` outside its import statements."""
    text = path.read_text()
    found: set[int] = set()
    importing = False
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.NAME and token.string in ("import", "from") and \
                token.line.lstrip().startswith(token.string):
            importing = True
        elif token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            importing = False
        elif importing:
            continue
        elif token.type == tokenize.NAME and token.string == "Any":
            found.add(token.start[0])
        elif token.type == tokenize.STRING and not token.string.endswith(('"""', "'''")) \
                and _ANY.search(token.string):
            found.add(token.start[0])
    return sorted(found)


def unexplained(path: Path, lines: list[int]) -> list[int]:
    source = path.read_text().splitlines()
    return [n for n in lines
            if not any(_EXPLAINED.search(source[i]) for i in range(max(0, n - 4), n))]


def _census() -> dict[Path, list[int]]:
    return {path: lines for path in sorted(PACKAGE.rglob("*.py")) if (lines := any_lines(path))}


def test_any_is_rare() -> None:
    total = sum(len(lines) for lines in _census().values())
    assert total <= LIMIT, f"{total} lines use Any (at most {LIMIT})"


def test_each_any_says_why() -> None:
    unsaid = [f"{path.relative_to(PACKAGE.parent)}:{n}" for path, lines in _census().items()
              for n in unexplained(path, lines)]
    assert unsaid == [], "say why nothing narrower fits (# Any: ...): " + ", ".join(unsaid)


def test_the_counter_counts_what_it_should(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import Any, cast\n"
        "import typing\n"
        "def f(x: Any) -> int:  # Any: a pickle's argument\n"
        "    '''Any in a docstring is prose.'''\n"
        "    return cast('dict[str, Any]', x)['n']\n"
        "\n\n\n"
        "y: typing.Any = 1\n")
    assert any_lines(sample) == [3, 5, 9]
    assert unexplained(sample, [3, 5, 9]) == [9]


if __name__ == "__main__":
    census = _census()
    counts = Counter({str(p.relative_to(PACKAGE.parent)): len(v) for p, v in census.items()})
    for name, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        print(f"{count:4d}  {name}")
    print(f"{sum(counts.values()):4d}  in all (limit {LIMIT}); unexplained:",
          sum(len(unexplained(p, v)) for p, v in census.items()), file=sys.stdout)
