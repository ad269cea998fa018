"""Normalize rules: small named transforms, each returning what it changed.

The order matters and is fixed: pick the weights first (so later rules see
only what will be written), map storages to the CPU, turn objects into
plain data, strip wrapper prefixes, key surgery (subtree, keep/drop,
rename), dequantize, cast, then compact storages (which must see the final tensors).

To add a rule: write a module with a frozen dataclass that has a ``name``
and ``__call__(checkpoint) -> (checkpoint, RuleResult)``, and add it to
``build_rules`` below.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields

from ..checkpoint import Checkpoint
from ..errors import OptionError, RuleError
from ..quant import DEQUANTIZE_CHOICES
from ..tree import is_state_dict
from .base import Change, NormalizeRule, RuleResult
from .device import MapToCPU
from .keys import compile_rename
from .objects import ConvertObjects
from .prefixes import AUTO, StripPrefixes, normalize_prefix, strip_key
from .quantized import Dequantize
from .recipes import Recipe, Step, key_rules, load_recipe, recipe_of
from .select import EMA_MODES, Select
from .tensors import CAST_CHOICES, CastDtype, CompactTensors

__all__ = [
    "NormalizeOptions",
    "Normalized",
    "normalize",
    "apply_rules",
    "build_rules",
    "check_selection",
    "Change",
    "NormalizeRule",
    "RuleResult",
    "CAST_CHOICES",
    "EMA_MODES",
    "strip_key",
    "is_state_dict",
    "Recipe",
    "load_recipe",
]

@dataclass(frozen=True)
class NormalizeOptions:
    """The options ``normalize``, ``diff``, ``check --against`` and ``manifest`` share.

    ``ema``: ``off``, ``require`` (the ``--ema`` flag: an error when the file
    holds no EMA weights) or ``prefer``. ``strip_prefixes`` may hold
    ``auto``; ``model`` means ``model.``. Every field is checked here, so a
    bad value from the API or a manifest is an ``OptionError`` naming it.

    Key surgery (``rules/keys.py``) runs after prefix stripping, in this
    order: ``subtree`` (keep the keys under it, stripped), ``keep`` then
    ``drop`` (shell-style globs), ``rename`` ((pattern, replacement) regex
    pairs, in order). ``recipe`` (``--map FILE``, ``rules/recipes.py``: a
    ``Recipe`` or the path of its TOML/JSON file) holds such steps in its own
    order instead; the two cannot be combined. A bad pattern or recipe is a ``RuleError`` here.
    """

    select: str = "auto"
    ema: str = "off"
    strip_prefixes: tuple[str, ...] = ()
    keep_prefixes: bool = False
    dtype: str = "keep"
    dequantize: str | None = None
    subtree: str | None = None
    keep: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    rename: tuple[tuple[str, str], ...] = ()
    recipe: Recipe | str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.select, str) and bool(self.select), "select",
               "a non-empty string", self.select)
        _check(self.ema in EMA_MODES, "ema", f"one of {', '.join(EMA_MODES)}", self.ema)
        _check(type(self.keep_prefixes) is bool, "keep_prefixes", "true or false",
               self.keep_prefixes)
        _check(self.dtype in CAST_CHOICES, "dtype", f"one of {', '.join(CAST_CHOICES)}",
               self.dtype)
        _check(self.dequantize is None or self.dequantize in DEQUANTIZE_CHOICES, "dequantize",
               f"None or one of {', '.join(DEQUANTIZE_CHOICES)}", self.dequantize)
        prefixes = self.strip_prefixes
        _check(isinstance(prefixes, (tuple, list)) and all(
            isinstance(p, str) and p for p in prefixes), "strip_prefixes",
               "a list of non-empty strings", prefixes)
        object.__setattr__(self, "strip_prefixes",
                           tuple(normalize_prefix(p) for p in prefixes))
        self._check_keys()

    def _check_keys(self) -> None:
        """Key-surgery options as tuples, every pattern and the recipe checked."""
        if self.subtree is not None and not (isinstance(self.subtree, str)
                                             and self.subtree.strip(".")):
            raise RuleError(f"--subtree {self.subtree!r}: name a module path (backbone)")
        for option in ("keep", "drop"):
            patterns = getattr(self, option)
            patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns)
            if not all(isinstance(p, str) and p for p in patterns):
                raise RuleError(f"--{option}: each pattern is a non-empty string")
            object.__setattr__(self, option, patterns)
        pairs = []
        for pair in self.rename:
            if isinstance(pair, str) or len(pair) != 2 or \
                    not all(isinstance(x, str) for x in pair):
                raise RuleError(f"--rename {pair!r}: give (PATTERN, REPLACEMENT)")
            compile_rename(*pair)
            pairs.append((pair[0], pair[1]))
        object.__setattr__(self, "rename", tuple(pairs))
        if self.recipe is not None and not isinstance(self.recipe, Recipe):
            object.__setattr__(self, "recipe", load_recipe(self.recipe))
        if self.recipe is not None and (self.subtree or self.keep or self.drop or self.rename):
            raise RuleError("--map holds the key steps in its own order; put --subtree, "
                            "--keep, --drop and --rename steps into the recipe instead",
                            self.loaded_recipe.path if self.loaded_recipe else None)

    def given(self) -> tuple[str, ...]:
        """The options set away from their defaults, spelled as on the command line: what a
        mode that runs no rules names when it refuses them (they would change nothing)."""
        default = NormalizeOptions()
        spelled = {"strip_prefixes": "--strip-prefix", "recipe": "--map",
                   "ema": "--prefer-ema" if self.ema == "prefer" else "--ema"}
        return tuple(spelled.get(f.name, "--" + f.name.replace("_", "-")) for f in fields(self)
                     if getattr(self, f.name) != getattr(default, f.name))

    @property
    def loaded_recipe(self) -> Recipe | None:
        return self.recipe if isinstance(self.recipe, Recipe) else None

    @property
    def key_steps(self) -> tuple[Step, ...]:
        """The key-surgery steps in the order they run."""
        if self.loaded_recipe is not None:
            return self.loaded_recipe.steps
        return recipe_of(self.subtree, self.keep, self.drop, self.rename)


def _check(ok: bool, name: str, expected: str, value: object) -> None:
    if not ok:
        raise OptionError(f"normalize option {name} must be {expected}, not {value!r}")


@dataclass(frozen=True)
class Normalized:
    checkpoint: Checkpoint
    results: tuple[RuleResult, ...]

    def result(self, rule: str) -> RuleResult | None:
        """The result of the rule named ``rule`` (renderers find rules by name)."""
        return next((r for r in self.results if r.rule == rule), None)


def build_rules(options: NormalizeOptions, *, lazy: bool = False,
                require_prefix_match: bool = True) -> list[NormalizeRule]:
    """The rules in order; ``lazy`` leaves every copy to the writers (``Pending`` leaves)."""
    return [
        Select(options.select, options.ema,
               hint=not any(p in ("model.", AUTO) for p in options.strip_prefixes)),
        MapToCPU(),
        ConvertObjects(),
        StripPrefixes(tuple(options.strip_prefixes), wrappers=not options.keep_prefixes,
                      require_match=require_prefix_match),
        *key_rules(options.key_steps, require_match=require_prefix_match),
        *([Dequantize(options.dequantize, lazy=lazy)] if options.dequantize else []),
        CastDtype(options.dtype, lazy=lazy),
        CompactTensors(lazy=lazy),
    ]


def apply_rules(checkpoint: Checkpoint, options: NormalizeOptions | None = None, *,
                lazy: bool = False, require_prefix_match: bool = True,
                rules: Sequence[NormalizeRule] | None = None) -> Normalized:
    """Apply every rule in order; the source checkpoint is left as it was.

    ``ckptport.normalize`` is this function: the rules alone, no file written.

    Args:
        checkpoint: what ``ckptport.read`` gives.
        options: ``NormalizeOptions`` (select, prefixes, key steps, dtype).
        lazy: defer every copy to the writers, one tensor at a time (for writing); the
            default gives real, compact torch tensors.
        require_prefix_match: a ``--strip-prefix`` that no key carries is an error (off
            for ``diff``, where it may be on one side only).
        rules: replaces the built-in list (``build_rules(options)`` plus a rule of your
            own, for example); ``options`` are then unused.

    Returns:
        ``Normalized``: the new checkpoint and each rule's ``RuleResult``.

    Raises:
        SelectionError, RuleError, OptionError: a rule cannot apply without losing data.
    """
    results = []
    if rules is None:
        rules = build_rules(options or NormalizeOptions(), lazy=lazy,
                            require_prefix_match=require_prefix_match)
    for rule in rules:
        checkpoint, result = rule(checkpoint)
        results.append(result)
    if not lazy:
        from ..readers import materialize

        checkpoint = materialize(checkpoint)
    return Normalized(checkpoint, tuple(results))


# the rules that choose keys: an option of theirs that matches nothing is a typo
SELECTING = frozenset({"select", "strip-prefixes", "subtree", "keep-drop", "rename"})


def check_selection(checkpoint: Checkpoint, options: NormalizeOptions) -> None:
    """The error ``normalize`` would raise for an option that selects nothing in
    ``checkpoint`` (a ``--select`` key it lacks, a ``--keep`` no key matches, a
    ``--strip-prefix`` no key carries), for commands that take the options but may not
    run the rules (``check`` without ``--finite`` or ``--against``). Only the rules that
    choose keys run, on names: no tensor byte is read, no object converted."""
    for rule in build_rules(options, lazy=True):
        if rule.name in SELECTING:
            checkpoint, _ = rule(checkpoint)


normalize = apply_rules  # the library's name for the rules alone; the CLI's is normalize_file
