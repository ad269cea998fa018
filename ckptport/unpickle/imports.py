"""What a name of a package ckptport never imports reaches, read from the package's source.

Importing a package runs its code, so a third-party name (``deepspeed.…``,
``ultralytics.…``) is never imported. Its module's source can still be read:
an ``import os`` at the top of ``pkg/mod.py`` makes ``pkg.mod.os`` the module
``os``, and ``from subprocess import run as go`` makes ``pkg.mod.go`` the
name ``subprocess.run``, whatever the text ``pkg.mod`` promises. The source
is found the way the import system's path finder finds it (``PathFinder``
stats files; no package ``__init__`` runs), parsed, never executed, and its
top-level bindings read: ``import``s and ``from … import``s (in ``if`` and
``try`` blocks too: every binding counts). What a module defines itself
(``def``, ``class``, an assignment) is judged by its name's text, as when the
package is not installed: knowing the source only ever makes a verdict
stricter, never laxer.
"""

from __future__ import annotations

import ast
import importlib.machinery
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = ["Binding", "bindings", "submodule", "MAX_SOURCE_BYTES"]

MAX_SOURCE_BYTES = 4 << 20  # a module's source read to judge one name; larger: not read


@dataclass(frozen=True)
class Binding:
    """A top-level name bound by an import: a ``module``, or another module's ``name``."""

    kind: str  # "module" or "name"
    target: str  # the module, or the absolute ``module.name``


@lru_cache(maxsize=256)
def _source(module: str) -> tuple[Path, bool] | None:
    """The ``.py`` file of ``module`` and whether it is a package, found without importing."""
    path: list[str] | None = None
    origin: str | None = None
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth]), path)
        except (ImportError, ValueError, OSError):
            return None
        if spec is None:
            return None
        origin = spec.origin
        path = list(spec.submodule_search_locations or ()) or None
        if depth < len(parts) and path is None:
            return None  # a module that is not a package has no submodules
    if not (isinstance(origin, str) and origin.endswith(".py")):
        return None  # an extension module or a namespace package: nothing to read
    return Path(origin), path is not None


def submodule(module: str, name: str) -> bool:
    """Whether ``module.name`` is a module of its own on disk (found, never imported)."""
    return _source(f"{module}.{name}") is not None


def _absolute(module: str, package: bool, level: int, name: str | None) -> str | None:
    if level == 0:
        return name
    base = module.split(".") if package else module.split(".")[:-1]
    if level - 1 > len(base) - 1:
        return None
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


@lru_cache(maxsize=256)
def bindings(module: str) -> dict[str, tuple[Binding, ...]] | None:
    """Every import-bound top-level name of ``module``'s source; None when it cannot be read."""
    found = _source(module)
    if found is None:
        return None
    path, package = found
    try:
        if path.stat().st_size > MAX_SOURCE_BYTES:
            return None
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None
    bound: dict[str, list[Binding]] = {}
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound.setdefault(alias.asname, []).append(Binding("module", alias.name))
                else:
                    top = alias.name.split(".")[0]
                    bound.setdefault(top, []).append(Binding("module", top))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, package, node.level, node.module)
            for alias in node.names:
                if base is not None and alias.name != "*":
                    bound.setdefault(alias.asname or alias.name, []).append(
                        Binding("name", f"{base}.{alias.name}"))
        elif isinstance(node, (ast.If, ast.Try, ast.With)) or type(node).__name__ == "TryStar":
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, ()):
                    pending.extend(child.body if isinstance(child, ast.ExceptHandler)
                                   else [child])
    return {name: tuple(found) for name, found in bound.items()}
