"""Recipes: key surgery kept in a file beside the model (``--map FILE``).

A **recipe** holds the steps of ``keys`` (subtree, keep/drop, rename) as an
ordered list in a TOML or JSON file; its steps run in the file's order and
its sha256 is recorded wherever the options are (a manifest's options, a
safetensors output's ``ckptport.map_sha256``)::

    steps = [
      { subtree = "backbone" },
      { drop = ["*.num_batches_tracked"] },
      { rename = ['^blocks\\.(\\d+)\\.', 'layers.\\1.'] },
    ]

TOML needs Python 3.11+ (``tomllib``); JSON reads everywhere. The command
line's options are the same steps, in the documented order (``recipe_of``).

The file comes with the checkpoint, so it is untrusted: it is at most 1 MiB
nested at most ``MAX_RECIPE_DEPTH`` deep, measured by a linear scan before a
parser (both recurse per level) sees it, and each rename pattern is judged
before it is used (``keys.compile_rename``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import RuleError
from ..tree import KEY_PREFIX
from .keys import KeepDrop, Rename, Subtree, compile_rename

__all__ = ["Recipe", "Step", "load_recipe", "recipe_of", "key_rules", "recipe_from_json",
           "STEP_KINDS", "KEY_MAP_SHA256"]

STEP_KINDS = ("subtree", "keep", "drop", "rename")
KEY_MAP_SHA256 = f"{KEY_PREFIX}map_sha256"  # safetensors metadata: the recipe that made it
MAX_RECIPE_BYTES = 1 << 20
MAX_RECIPE_DEPTH = 16  # a recipe is 3 deep: the document, steps = [...], a step {...}, a list


@dataclass(frozen=True)
class Step:
    """One recipe step: ``subtree`` (one prefix), ``keep``/``drop`` (globs) or ``rename``."""

    kind: str
    args: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        value: str | list[str] = self.args[0] if self.kind == "subtree" else list(self.args)
        return {self.kind: value}


@dataclass(frozen=True)
class Recipe:
    """A ``--map FILE``: its steps in order, and the sha256 of the file's bytes."""

    path: str
    sha256: str
    steps: tuple[Step, ...]

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "sha256": self.sha256,
                "steps": [step.to_json() for step in self.steps]}


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read a recipe file (TOML on Python 3.11+, or JSON); ``RuleError`` naming the file,
    the line where the parser says, and the cause."""
    target = Path(path)
    try:
        size = target.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise RuleError(f"--map: is {size} bytes, too large for a recipe", target)
        data = target.read_bytes()
    except OSError as exc:
        cause = "no such file" if isinstance(exc, FileNotFoundError) else \
            (exc.strerror or str(exc))
        raise RuleError(f"--map: {cause}", target) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RuleError(f"--map: not UTF-8 text ({exc.reason} at byte {exc.start})",
                        target) from None
    depth = _depth(text)
    if depth > MAX_RECIPE_DEPTH:
        raise RuleError(f"--map: nested {depth} levels deep (a recipe is 4; at most "
                        f"{MAX_RECIPE_DEPTH})", target)
    doc = _parse(text, target)
    return Recipe(str(target), hashlib.sha256(data).hexdigest(), _steps(doc, target))


def _depth(text: str) -> int:
    """How deep ``[`` and ``{`` nest in a TOML or JSON text, outside strings and comments
    (one pass; a parser's recursion is never where a deep nesting is found)."""
    depth = deepest = i = 0
    n = len(text)
    while i < n:
        char = text[i]
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
        elif char == "#":
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif char in "\"'":
            quote = text[i:i + 3] if text[i:i + 3] == char * 3 else char
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                i += 2 if char == '"' and text[i] == "\\" else 1
            i += len(quote) - 1
        i += 1
    return deepest


def _parse(text: str, target: Path) -> object:
    if target.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise RuleError(f"--map: not valid JSON: line {exc.lineno}: {exc.msg}",
                            target) from None
    if sys.version_info < (3, 11):
        raise RuleError("--map: TOML recipes need Python 3.11+ (tomllib); write the recipe as "
                        "JSON ({\"steps\": [...]}) on this Python", target)
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"--map: not valid TOML: {exc}", target) from None


def _steps(doc: object, target: Path) -> tuple[Step, ...]:
    if not isinstance(doc, dict) or set(doc) != {"steps"} or not isinstance(doc["steps"], list):
        raise RuleError("--map: a recipe holds one list, steps = [...] (each step one of "
                        f"{', '.join(STEP_KINDS)})", target)
    return tuple(_step(raw, index, target) for index, raw in enumerate(doc["steps"], start=1))


def _step(raw: object, index: int, target: Path) -> Step:
    where = f"--map: step {index}"
    if not isinstance(raw, dict) or len(raw) != 1:
        raise RuleError(f"{where}: a step is a table with one key, one of "
                        f"{', '.join(STEP_KINDS)}", target)
    (kind, value), = raw.items()
    if kind not in STEP_KINDS:
        raise RuleError(f"{where}: unknown step {kind!r} (steps: {', '.join(STEP_KINDS)})",
                        target)
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or \
            not all(isinstance(v, str) for v in values) or \
            not all(values[:1] if kind == "rename" else values):  # a replacement may be ""
        raise RuleError(f"{where}: {kind} takes a string or a list of strings", target)
    if kind == "subtree" and len(values) != 1:
        raise RuleError(f"{where}: subtree takes one prefix", target)
    if kind == "rename":
        if len(values) != 2:
            raise RuleError(f"{where}: rename takes [PATTERN, REPLACEMENT]", target)
        try:
            compile_rename(values[0], values[1], where=f"{where}: rename")
        except RuleError as exc:
            raise RuleError(exc.message, target) from None
    return Step(kind, tuple(values))


def recipe_of(subtree: str | None, keep: Sequence[str], drop: Sequence[str],
              rename: Sequence[tuple[str, str]]) -> tuple[Step, ...]:
    """The command-line options as steps, in the documented order."""
    steps = [Step("subtree", (subtree,))] if subtree else []
    steps += [Step("keep", tuple(keep))] if keep else []
    steps += [Step("drop", tuple(drop))] if drop else []
    steps += [Step("rename", pair) for pair in rename]
    return tuple(steps)


def key_rules(steps: Sequence[Step], *, require_match: bool = True
              ) -> list[Subtree | KeepDrop | Rename]:
    """The rules of ``steps``; a keep step directly followed by a drop step is one rule
    (keep first, then drop, as documented)."""
    rules: list[Subtree | KeepDrop | Rename] = []
    for step in steps:
        if step.kind == "subtree":
            rules.append(Subtree(step.args[0]))
        elif step.kind == "rename":
            rules.append(Rename(step.args[0], step.args[1], require_match))
        elif step.kind == "drop" and rules and isinstance(rules[-1], KeepDrop) \
                and not rules[-1].drop:
            rules[-1] = KeepDrop(rules[-1].keep, step.args, require_match)
        else:
            keep, drop = (step.args, ()) if step.kind == "keep" else ((), step.args)
            rules.append(KeepDrop(keep, drop, require_match))
    return rules


def recipe_from_json(doc: object, where: str) -> Recipe:
    """A recipe as a manifest records it (``Recipe.to_json``), checked like a file."""
    if not isinstance(doc, dict) or not isinstance(doc.get("sha256"), str) \
            or not isinstance(doc.get("path"), str):
        raise RuleError("map: give path, sha256 and steps", where)
    return Recipe(doc["path"], doc["sha256"], _steps({"steps": doc.get("steps")}, Path(where)))
