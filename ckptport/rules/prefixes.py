"""Strip wrapper prefixes so a wrapped model's weights load into the bare model.

torch.compile (``_orig_mod``), FSDP (``_fsdp_wrapped_module``), activation
checkpointing (``_checkpoint_wrapped_module``) and Lightning/Fabric
(``_forward_module``) insert a module name that is never a real submodule,
anywhere in a key; DataParallel/DDP prepend ``module.``, which is only
stripped at the start of a key because mid-key it can be a real submodule.
Stripping repeats until nothing changes, over any mix and order. Two keys
that would become one are an error, never a silent overwrite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checkpoint import Checkpoint, KeyPath, format_path, rebuild_dict
from ..errors import RuleError
from .base import Change, RuleResult
from .select import is_state_dict

__all__ = ["StripPrefixes", "strip_key", "WRAPPER_NAMES", "DATA_PARALLEL_PREFIX"]

WRAPPER_NAMES = frozenset(
    {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_forward_module"}
)
DATA_PARALLEL_PREFIX = "module."


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


@dataclass(frozen=True)
class StripPrefixes:
    """Default wrapper stripping (off with ``--keep-prefixes``) plus ``--strip-prefix``."""

    extra: tuple[str, ...] = ()
    wrappers: bool = True
    name: str = "strip-prefixes"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        changes: list[Change] = []
        tree = self._walk(checkpoint, checkpoint.tree, (), changes)
        found = sorted({name for c in changes for name in _wrappers_in(c.detail, self.extra)})
        summary = f"renamed {len(changes)} keys" if changes else "no wrapper prefixes"
        return checkpoint.with_tree(tree), RuleResult(
            self.name, tuple(changes), summary, {"prefixes_removed": found})

    def _walk(self, checkpoint: Checkpoint, node: Any, path: KeyPath,
              changes: list[Change]) -> Any:
        if is_state_dict(node):
            return self._strip(checkpoint, node, path, changes)
        if isinstance(node, Mapping):
            return rebuild_dict(node, [(k, self._walk(checkpoint, v, (*path, k), changes))
                                       for k, v in node.items()])
        if isinstance(node, list):
            return [self._walk(checkpoint, v, (*path, i), changes) for i, v in enumerate(node)]
        return node

    def _strip(self, checkpoint: Checkpoint, state: Mapping[str, Any], path: KeyPath,
               changes: list[Change]) -> Any:
        origin: dict[str, str] = {}
        items = []
        for key, value in state.items():
            new = strip_key(key, self.extra, self.wrappers) or key
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
                changes.append(Change(new, "renamed", f"{key} -> {new}"))
        stripped = rebuild_dict(state, items)
        versions = getattr(state, "_metadata", None)
        if versions is not None:
            stripped._metadata = self._versions(versions)  # type: ignore[attr-defined]
        return stripped

    def _versions(self, versions: Mapping[str, Any]) -> Any:
        """Rename ``_metadata`` module paths the same way; the innermost module wins."""
        renamed = []
        for module in sorted(versions, key=len):
            stripped = strip_key(f"{module}." if module else "", self.extra, self.wrappers)
            renamed.append((stripped.removesuffix("."), versions[module]))
        return rebuild_dict(versions, list(dict(renamed).items()))


def _wrappers_in(detail: str, extra: tuple[str, ...]) -> set[str]:
    """The wrapper names and prefixes an original key carried, for the report."""
    key = detail.split(" -> ", 1)[0]
    found = {f"{part}." for part in key.split(".") if part in WRAPPER_NAMES}
    if key.startswith(DATA_PARALLEL_PREFIX):
        found.add(DATA_PARALLEL_PREFIX)
    found.update(prefix for prefix in extra if prefix in key)
    return found
