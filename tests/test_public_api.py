"""The public API is one table (``ckptport.LAZY`` and the error family): ``__all__``, the
imports type checkers see and docs/reference.md's list are held to it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import ckptport
from ckptport import errors

ROOT = Path(__file__).resolve().parent.parent


def test_all_is_the_table_and_every_name_resolves():
    assert ckptport.__all__ == ["__version__", *ckptport.ERRORS, *ckptport.LAZY]
    assert set(ckptport.ERRORS) == {n for n in errors.__all__ if n.endswith("Error")}
    assert len(set(ckptport.__all__)) == len(ckptport.__all__)
    code = ("import sys, ckptport; assert 'torch' not in sys.modules; "
            "[getattr(ckptport, n) for n in ckptport.__all__]; print(sorted(dir(ckptport)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert ast.literal_eval(done.stdout) == sorted(ckptport.__all__)


def test_what_type_checkers_see_is_the_table():
    """The TYPE_CHECKING imports name each lazy name, from its module, re-exported."""
    tree = ast.parse((ROOT / "ckptport" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING")
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: not re-exported (as {alias.name})"
            seen[alias.name] = f".{node.module}"
    assert seen == ckptport.LAZY


def test_the_docs_list_the_table():
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("\n## Python API\n", 1)[1]
    listed = section.split("Each error is also", 1)[0]
    names = re.findall(r"`(\w+)`", listed)
    assert sorted(names) == sorted([*ckptport.LAZY, *ckptport.ERRORS])
