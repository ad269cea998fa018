"""``ckptport diff``: do two checkpoints hold the same weights, in any formats?

Reads both sides (paths, already read checkpoints, or a manifest on either
side) and hands them to the comparison engine (``analysis.diffing``), which
normalizes both alike and compares every leaf by its path.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ..analysis.diffing import DiffReport, Side, Tolerance, compare_checkpoints, from_manifests
from ..analysis.manifests import (
    Manifest,
    compare_manifests,
    is_manifest,
    load_manifest,
    manifest_of,
    manifest_options,
)
from ..checkpoint import Checkpoint
from ..errors import OptionError, RuleError
from ..progress import Progress, no_progress
from ..readers import open_checkpoint, read_already, tag_for, tag_somewhere
from ..rules import NormalizeOptions, Recipe

__all__ = ["diff", "DiffReport", "BY_VALUE"]

Input = str | os.PathLike[str] | Checkpoint
# what the options that compare values or normalize need: a manifest side holds sha256s,
# and the other side is normalized as the manifest records
BY_VALUE = ("two checkpoints, not a manifest (it is compared by sha256, normalized as it "
            "records)")


def diff(
    a: Input,
    b: Input,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    cast: bool = False,
    options: NormalizeOptions | None = None,
    raw: bool = False,
    trust: bool = False,
    map_a: Recipe | str | os.PathLike[str] | None = None,
    map_b: Recipe | str | os.PathLike[str] | None = None,
    max_expansion: float | None = None,
    tag: str | None = None,
    progress: Progress = no_progress,
) -> DiffReport:
    """Compare ``a`` and ``b`` after normalizing both alike (A is the reference).

    Args:
        a, b: checkpoint paths, already read ``Checkpoint``s, or manifests (``ckptport
            manifest``): a manifest side compares tensors by name, dtype, shape and sha256,
            the other side normalized as the manifest records.
        atol, rtol: equal when ``|a - b| <= atol + rtol * |a|``; exact by default (NaN
            equals NaN, ``-0.0`` equals ``0.0``).
        cast: compare tensors of different dtypes by value instead of failing them.
        options: how both sides are normalized; ``raw=True`` compares as stored.
        trust: unpickle both with full Python (runs code from the files).
        map_a, map_b: a key recipe (``--map FILE``) for one side only, so a renamed
            checkpoint compares with its source.
        max_expansion: the read budget's ratio (``readers.budget``).
        tag: a DeepSpeed save folder's tag, for a side that is one.

    Returns:
        A ``DiffReport``; ``report.equal`` is the verdict.

    Raises:
        OptionError: ``raw`` with normalize options; with a manifest side, an option it
            would not apply (``raw``, a tolerance, ``cast``, normalize options, a map).
        CkptportError: either side cannot be read.
    """
    if raw and (options is not None or map_a is not None or map_b is not None):
        raise OptionError("raw=True compares as stored; it takes no normalize options")
    tolerance = Tolerance(atol, rtol, cast)
    if all(isinstance(x, Checkpoint) for x in (a, b)):
        read_already(trust, max_expansion, tag)
    tag_somewhere((a, b), tag)
    if any(not isinstance(x, Checkpoint) and is_manifest(x) for x in (a, b)):
        if map_a is not None or map_b is not None:
            raise RuleError("--map-a/--map-b: a manifest side is normalized as the manifest "
                            "records; make the manifest with --map instead")
        OptionError.only_with(BY_VALUE, False, [
            ("--raw", raw), ("--atol", atol), ("--rtol", rtol), ("--cast", cast),
            *((option, True) for option in (options.given() if options else ()))])
        return _with_manifest(a, b, tolerance, trust, (max_expansion, tag), progress)
    reading = (max_expansion, tag)
    return compare_checkpoints(_read(a, trust, reading), _read(b, trust, reading),
                               tolerance, options_a=_mapped(options, map_a),
                               options_b=_mapped(options, map_b), raw=raw, progress=progress)


def _read(source: Input, trust: bool, reading: tuple[float | None, str | None]) -> Checkpoint:
    """``reading``: the budget's ratio and the DeepSpeed tag."""
    if isinstance(source, Checkpoint):
        return source
    max_expansion, tag = reading
    return open_checkpoint(source, trust=trust, max_expansion=max_expansion,
                           tag=tag_for(Path(source), tag))


def _mapped(options: NormalizeOptions | None,
            recipe: Recipe | str | os.PathLike[str] | None) -> NormalizeOptions | None:
    """One side's options: the shared ones, with that side's recipe."""
    if recipe is None:
        return options
    if options is not None and options.key_steps:
        raise RuleError("--map-a/--map-b: the key steps of --map, --subtree, --keep, --drop "
                        "and --rename apply to both sides; give one side's steps in its map")
    return replace(options or NormalizeOptions(), recipe=recipe)


def _with_manifest(a: Input, b: Input, tolerance: Tolerance, trust: bool,
                   reading: tuple[float | None, str | None], progress: Progress
                   ) -> DiffReport:
    """A manifest on one side (or both): the other is normalized as the manifest records
    and hashed, then the two manifests are compared."""
    given = next(load_manifest(x) for x in (a, b) if not isinstance(x, Checkpoint)
                 and is_manifest(x))
    options = manifest_options(given)

    def side(source: Input) -> tuple[Side, Manifest]:
        if not isinstance(source, Checkpoint) and is_manifest(source):
            made = load_manifest(source)
            return Side(str(source), "manifest", len(made.tensors),
                        (f"weights digest {made.digest}",)), made
        checkpoint = _read(source, trust, reading)
        made = manifest_of(checkpoint, options, progress=progress)
        return Side(str(checkpoint.source.path), "normalized as the manifest records",
                    len(made.tensors), (f"weights digest {made.digest}",)), made

    side_a, made_a = side(a)
    side_b, made_b = side(b)
    return from_manifests(side_a, side_b, compare_manifests(made_a, made_b), tolerance)
