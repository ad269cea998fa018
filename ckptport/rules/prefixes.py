"""Strip wrapper prefixes so a wrapped model's weights load into the bare model.

torch.compile (``_orig_mod``), FSDP (``_fsdp_wrapped_module``), activation
checkpointing (``_checkpoint_wrapped_module``) and Lightning/Fabric
(``_forward_module``) insert a module name that is never a real submodule,
anywhere in a key; DataParallel/DDP prepend ``module.``, which is only
stripped at the start of a key because mid-key it can be a real submodule.
Stripping repeats until nothing changes, over any mix and order. Two keys
that would become one are an error, never a silent overwrite.

``--strip-prefix P`` adds a prefix (``model`` means ``model.``); one that
matches no key is an error listing the prefixes that are there.
``--strip-prefix auto`` strips the one attribute name every weight key
shares (Lightning's ``model.``), and says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
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

__all__ = ["StripPrefixes", "strip_key", "WRAPPER_NAMES", "DATA_PARALLEL_PREFIX",
           "normalize_prefix", "common_prefixes", "AUTO"]

WRAPPER_NAMES = frozenset(
    {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_forward_module"}
)
DATA_PARALLEL_PREFIX = "module."
AUTO = "auto"


def normalize_prefix(prefix: str) -> str:
    """``model`` and ``model.`` both mean the attribute ``model``; ``auto`` stays ``auto``."""
    return prefix if prefix == AUTO or prefix.endswith(".") else f"{prefix}."


def strip_key(key: str, extra: tuple[str, ...] = (), wrappers: bool = True) -> str:
    """``key`` without wrapper names and prefixes, applied until nothing changes.

    May return ``""`` (a ``_metadata`` entry for the wrapper itself).
    """
    while True:
        new = key
        if wrappers:
            new = ".".join(part for part in new.split(".") if part not in WRAPPER_NAMES)
            while new.startswith(DATA_PARALLEL_PREFIX):
                new = new[len(DATA_PARALLEL_PREFIX):]
        for prefix in extra:
            if new.startswith(prefix):
                new = new[len(prefix):]
        if new == key:
            return key
        key = new


def _wrappers_in(key: str, extra: tuple[str, ...]) -> set[str]:
    found = {f"{part}." for part in key.split(".") if part in WRAPPER_NAMES}
    if key.startswith(DATA_PARALLEL_PREFIX):
        found.add(DATA_PARALLEL_PREFIX)
    found.update(prefix for prefix in extra if key.startswith(prefix) or f".{prefix}" in key)
    return found


def common_prefixes(keys: list[str], limit: int = 5) -> list[str]:
    """The first key components, most common first (what a user could strip)."""
    counts = Counter(f"{k.split('.', 1)[0]}." for k in keys if "." in k)
    return [prefix for prefix, _ in counts.most_common(limit)]


@dataclass(frozen=True)
class StripPrefixes:
    """Default wrapper stripping (off with ``--keep-prefixes``) plus ``--strip-prefix``."""

    extra: tuple[str, ...] = ()
    wrappers: bool = True
    require_match: bool = True  # diff compares two files: a prefix may be on one side only
    name: str = "strip-prefixes"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        extra = self._prefixes(checkpoint)
        changes: list[Change] = []
        tree = replace_state_dicts(
            checkpoint.tree, lambda path, state: self._strip(checkpoint, state, path, changes,
                                                            extra))
        found = sorted({name for c in changes for name in _wrappers_in(c.before or "", extra)})
        summary = f"renamed {len(changes)} keys" if changes else "no wrapper prefixes"
        if AUTO in self.extra:
            chosen = [p for p in extra if p not in self.extra]
            summary += (f"; --strip-prefix auto stripped {', '.join(chosen)} (every weight key "
                        "carried it)" if chosen else "; --strip-prefix auto found no prefix "
                        "every weight key shares")
        return checkpoint.with_tree(tree), RuleResult(
            self.name, tuple(changes), summary,
            {"prefixes_removed": found, "renames": {c.before: c.after for c in changes}})

    def _prefixes(self, checkpoint: Checkpoint) -> tuple[str, ...]:
        """The extra prefixes, ``auto`` resolved; each must match some key."""
        states = state_dicts(checkpoint.tree)
        keys = [strip_key(k, (), self.wrappers) or k for _, s in states for k in s]
        prefixes = [normalize_prefix(p) for p in self.extra]
        resolved: list[str] = []
        for prefix in prefixes:
            if prefix == AUTO:
                shared = {k.split(".", 1)[0] for k in keys}
                if len(shared) == 1 and keys and all("." in k for k in keys):
                    resolved.append(f"{shared.pop()}.")
                continue
            if self.require_match and keys and not any(
                    k.startswith(prefix) or f".{prefix}" in k for k in keys):
                raise RuleError(f"--strip-prefix {prefix}: no key starts with it (keys start "
                                f"with {', '.join(common_prefixes(keys)) or 'no prefix'})",
                                checkpoint.source.path)
            resolved.append(prefix)
        return tuple(resolved)

    def _strip(self, checkpoint: Checkpoint, state: StateDict, path: KeyPath,
               changes: list[Change], extra: tuple[str, ...]) -> Tree:
        origin: dict[str, str] = {}
        items = []
        for key, value in state.items():
            new = strip_key(key, extra, self.wrappers) or key
            if new in origin:
                raise RuleError(
                    f"stripping prefixes would merge {origin[new]!r} and {key!r} into {new!r}"
                    f"{' under ' + format_path(path) if path else ''}; use --keep-prefixes or "
                    "a narrower --strip-prefix",
                    checkpoint.source.path,
                )
            origin[new] = key
            items.append((new, value))
            if new != key:
                changes.append(Change(new, "renamed", f"{key} -> {new}", key, new))
        stripped = rebuild_dict(state, items)
        versions = getattr(state, "_metadata", None)
        if versions is not None:
            stripped._metadata = self._versions(versions, extra)  # type: ignore[attr-defined]
        return stripped

    def _versions(self, versions: Mapping[str, Tree], extra: tuple[str, ...]
                  ) -> dict[str, Tree]:
        """Rename ``_metadata`` module paths the same way; the innermost module wins."""
        renamed = []
        for module in sorted(versions, key=len):
            stripped = strip_key(f"{module}." if module else "", extra, self.wrappers)
            renamed.append((stripped.removesuffix("."), versions[module]))
        return rebuild_dict(versions, list(dict(renamed).items()))
