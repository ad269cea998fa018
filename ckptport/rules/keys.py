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
The same steps kept in a file beside the model are a recipe (``recipes``).

Time is bounded by the input as memory is: a rename pattern is judged from
its structure before any key is read (``patterns``: one that can backtrack
exponentially is refused; a key longer than the pattern's polynomial cost
allows is refused naming it).
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..checkpoint import Checkpoint
from ..errors import RuleError
from ..tree import (
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

__all__ = ["Subtree", "KeepDrop", "Rename", "compile_rename"]

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
