"""Key surgery: keep a subtree, keep or drop keys by glob, rename keys by regex.

These are the throwaway scripts people write beside their checkpoints
(mmengine's ``revise_keys``, a detector's ``backbone.``, ``num_batches_tracked``
to drop), as named rules that say what they changed. They run after the
wrapper prefixes are stripped, in the documented order:

    select -> strip prefixes -> subtree -> keep/drop -> rename

so filters see the names ``inspect`` shows and renames come last. A step
that matches no key is an error (a typo would otherwise be a silent no-op),
and a rename that makes two keys one is an error naming both. Module
versions (``_metadata``) follow every step, as they follow prefix stripping.

A **recipe** (``--map FILE``) holds the same steps as an ordered list in a
TOML or JSON file kept beside the model; its steps run in the file's order
and its sha256 is recorded wherever the options are::

    steps = [
      { subtree = "backbone" },
      { drop = ["*.num_batches_tracked"] },
      { rename = ['^blocks\\.(\\d+)\\.', 'layers.\\1.'] },
    ]

TOML needs Python 3.11+ (``tomllib``); JSON reads everywhere.

Time is bounded by the input as memory is: a rename pattern is judged from
its structure before any key is read (``patterns``: one that can backtrack
exponentially is refused; a key longer than the pattern's polynomial cost
allows is refused naming it), and a recipe is at most 1 MiB nested at most
``MAX_RECIPE_DEPTH`` deep, measured by a linear scan before a parser (both
recurse per level) sees it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import Checkpoint
from ..errors import RuleError
from ..tree import (
    KEY_PREFIX,
    KeyPath,
    StateDict,
    Tree,
    format_path,
    rebuild_dict,
    replace_state_dicts,
    state_dicts,
)
from .base import Change, RuleResult
from .patterns import Cost, Exponential, cost

__all__ = ["Subtree", "KeepDrop", "Rename", "Recipe", "Step", "load_recipe", "recipe_of",
           "key_rules", "compile_rename", "recipe_from_json", "STEP_KINDS",
           "KEY_MAP_SHA256"]

STEP_KINDS = ("subtree", "keep", "drop", "rename")
KEY_MAP_SHA256 = f"{KEY_PREFIX}map_sha256"  # safetensors metadata: the recipe that made it
MAX_RECIPE_BYTES = 1 << 20
MAX_RECIPE_DEPTH = 16  # a recipe is 3 deep: the document, steps = [...], a step {...}, a list
MAX_PATTERN = 1000  # characters of one rename pattern

KeyMap = Callable[[str], "str | None"]  # new name of a key, or None to drop it


def _all_keys(checkpoint: Checkpoint) -> list[str]:
    return [key for _, state in state_dicts(checkpoint.tree) for key in state]


def _module_paths(checkpoint: Checkpoint) -> list[str]:
    """The module paths of every state dict's ``_metadata`` (renamed like keys)."""
    return [str(module) for _, state in state_dicts(checkpoint.tree)
            for module in getattr(state, "_metadata", None) or ()]


def _top_prefixes(keys: Sequence[str], limit: int = 8) -> str:
    counts = Counter(k.split(".", 1)[0] for k in keys)
    shown = [f"{prefix} ({count})" for prefix, count in counts.most_common(limit)]
    more = f", … {len(counts) - limit} more" if len(counts) > limit else ""
    return ", ".join(shown) + more if shown else "no keys"


def _apply(checkpoint: Checkpoint, rule: str, key_map: KeyMap, module_map: KeyMap,
           summary: Callable[[int, int], str], details: Mapping[str, object] | None = None
           ) -> tuple[Checkpoint, RuleResult]:
    """Map every state dict's keys with ``key_map`` (``None`` drops); collisions are errors.

    ``module_map`` maps ``_metadata`` module paths (each with a trailing
    dot, so ``a.b`` is seen as ``a.b.``; ``None`` drops the entry).
    """
    changes: list[Change] = []

    def edit(path: KeyPath, state: StateDict) -> Tree:
        origin: dict[str, str] = {}
        items = []
        where = f" under {format_path(path)}" if path else ""
        for key, value in state.items():
            new = key_map(key)
            if new is None:
                changes.append(Change(key, "dropped", f"{rule} dropped it"))
                continue
            if new in origin:
                raise RuleError(f"{rule} would merge {origin[new]!r} and {key!r} into {new!r}"
                                f"{where}; make the step narrower", checkpoint.source.path)
            origin[new] = key
            items.append((new, value))
            if new != key:
                changes.append(Change(new, "renamed", f"{key} -> {new}", key, new))
        mapped = rebuild_dict(state, items)
        versions = getattr(state, "_metadata", None)
        if versions is not None:
            mapped._metadata = _versions(versions, module_map)  # type: ignore[attr-defined]
        return mapped

    tree = replace_state_dicts(checkpoint.tree, edit)
    renamed = sum(1 for c in changes if c.action == "renamed")
    return checkpoint.with_tree(tree), RuleResult(
        rule, tuple(changes), summary(renamed, len(changes) - renamed), dict(details or {}))


def _versions(versions: Mapping[str, Tree], module_map: KeyMap) -> dict[str, Tree]:
    """Module paths mapped like keys; dropped modules leave; the innermost module wins."""
    renamed = []
    for module in sorted(versions, key=len):
        new = module_map(f"{module}." if module else "")
        if new is not None:
            renamed.append((new.removesuffix("."), versions[module]))
    return rebuild_dict(versions, list(dict(renamed).items()))


def _counted(renamed: int, dropped: int) -> str:
    parts = [f"renamed {renamed} keys" if renamed else "", f"dropped {dropped}" if dropped else ""]
    return ", ".join(p for p in parts if p) or "no change"


@dataclass(frozen=True)
class Subtree:
    """``--subtree backbone``: keep the keys under ``backbone.`` and strip it.

    A subtree no key has is an error listing the top-level prefixes there are,
    with counts (the usual typo: ``model.backbone`` after ``model.`` was stripped).
    """

    prefix: str
    name: str = "subtree"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        head = self.prefix.removesuffix(".") + "."
        keys = _all_keys(checkpoint)
        if not any(k.startswith(head) for k in keys):
            raise RuleError(f"--subtree {self.prefix}: no key starts with {head!r}; the keys' "
                            f"top-level prefixes are {_top_prefixes(keys)}",
                            checkpoint.source.path)

        def under(key: str) -> str | None:
            return key[len(head):] if key.startswith(head) and len(key) > len(head) else None

        def module(path: str) -> str | None:
            return None if not path.startswith(head) else path[len(head):]

        return _apply(checkpoint, self.name, under, module,
                      lambda r, d: f"kept {r} keys under {head}, dropped {d}",
                      {"subtree": head})


@dataclass(frozen=True)
class KeepDrop:
    """``--keep GLOB`` then ``--drop GLOB`` (shell-style, case-sensitive, on the whole key).

    With keep patterns, a key stays only if one matches; then a key any drop
    pattern matches goes. Each pattern must match some key it sees, unless
    ``require_match`` is off (``diff``: a pattern may fit one side only).
    """

    keep: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    require_match: bool = True
    name: str = "keep-drop"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        keys = _all_keys(checkpoint)
        if self.require_match:
            kept = [k for k in keys if self._kept(k)]
            for option, patterns, seen in (("--keep", self.keep, keys),
                                           ("--drop", self.drop, kept)):
                for pattern in patterns:
                    if not any(fnmatch.fnmatchcase(k, pattern) for k in seen):
                        raise RuleError(f"{option} {pattern}: matches no key (the keys' "
                                        f"top-level prefixes are {_top_prefixes(seen)})",
                                        checkpoint.source.path)
        survivors = {k for k in keys if self._kept(k) and not self._dropped(k)}
        modules = {f"{key.rsplit('.', n)[0]}." for key in survivors
                   for n in range(1, key.count(".") + 1)}

        def key_map(key: str) -> str | None:
            return key if key in survivors else None

        def module(path: str) -> str | None:  # a module stays while a key lies under it
            return path if not path or path in modules else None

        return _apply(checkpoint, self.name, key_map, module, _counted,
                      {"keep": list(self.keep), "drop": list(self.drop)})

    def _kept(self, key: str) -> bool:
        return not self.keep or any(fnmatch.fnmatchcase(key, p) for p in self.keep)

    def _dropped(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in self.drop)


def compile_rename(pattern: str, replacement: str, where: str = "--rename"
                   ) -> tuple[re.Pattern[str], Cost]:
    """The compiled pattern and what matching one key costs, its replacement checked;
    ``RuleError`` naming the option for a pattern that does not parse or has no bound."""
    if len(pattern) > MAX_PATTERN:
        raise RuleError(f"{where}: a pattern of {len(pattern)} characters (at most "
                        f"{MAX_PATTERN})")
    try:
        compiled = re.compile(pattern)
        compiled.sub(replacement, "")  # parses the replacement's group references
        bound = cost(pattern)
    except re.error as exc:
        raise RuleError(f"{where} {pattern!r} {replacement!r}: {exc}") from None
    except RecursionError:
        raise RuleError(f"{where} {pattern!r}: groups nested too deeply") from None
    except Exponential as exc:
        raise RuleError(f"{where} {pattern!r}: can take exponential time on a key that "
                        f"almost matches ({exc}); write each repeat so that what ends it "
                        "cannot continue it, e.g. ([^.]+\\.)* instead of (.+\\.?)*") from None
    return compiled, bound


@dataclass(frozen=True)
class Rename:
    """``--rename PATTERN REPLACEMENT``: ``re.sub`` on the whole key, groups allowed.

    Every match in a key is replaced (``re.sub``); anchor with ``^``/``$``
    to replace one. Module versions are renamed by the same substitution on
    their path with a trailing dot.
    """

    pattern: str
    replacement: str
    require_match: bool = True
    name: str = "rename"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        compiled, bound = compile_rename(self.pattern, self.replacement)
        keys = _all_keys(checkpoint)
        longest = max((*keys, *_module_paths(checkpoint)), key=len, default="")
        if len(longest) > bound.longest():
            raise RuleError(f"--rename {self.pattern!r}: a name of {len(longest)} characters "
                            f"({longest[:40]!r}…); this pattern's matching can cost n^"
                            f"{bound.degree} steps on n characters, so it renames keys and "
                            f"module paths of at most {bound.longest()} (anchor it with ^…$, "
                            "or use [^.]* for .*)", checkpoint.source.path)
        if self.require_match and not any(compiled.search(k) for k in keys):
            raise RuleError(f"--rename {self.pattern!r}: matches no key (the keys' top-level "
                            f"prefixes are {_top_prefixes(keys)})", checkpoint.source.path)

        def key_map(key: str) -> str:
            return compiled.sub(self.replacement, key)

        def module(path: str) -> str:
            return key_map(path) if path else path

        return _apply(checkpoint, self.name, key_map, module,
                      lambda r, d: f"{self.pattern} -> {self.replacement}: {_counted(r, d)}",
                      {"pattern": self.pattern, "replacement": self.replacement})


# -- recipes ------------------------------------------------------------------------------


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
