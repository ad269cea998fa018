"""What the readers of rank-file layouts share: merged facts and layout problems.

A sharded checkpoint is many files read as one (DeepSpeed's rank files, a
folder of FSDP rank files). Its facts are the union of its files' facts;
a layout that does not make one checkpoint (a rank missing, world sizes
that disagree, leftovers of an earlier run, shards that do not tile) is a
``LayoutError`` for conversions, and for reports (``inspect``, ``check``,
read leniently) a checkpoint that names the problem under ``PROBLEMS`` in
its metadata, which ``check`` reports as CKP013.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..errors import InputError
from ..remote.urls import Where
from .budget import largest

__all__ = ["PROBLEMS", "LayoutError", "merged_facts", "layout_problem", "or_problem",
           "missing_ranks"]

PROBLEMS = "layout.problems"


class LayoutError(InputError):
    """Rank files that do not make one checkpoint; the message names what is wrong."""


def merged_facts(path: Where, fmt: Format, parts: list[Checkpoint], files: tuple[Where, ...],
                 metadata: dict[str, str], notes: tuple[str, ...] = ()) -> SourceFacts:
    """One checkpoint's facts from the rank files it was assembled from."""
    locations: dict[str, int] = {}
    names: dict[str, None] = {}
    refused: dict[str, None] = {}
    unproven: dict[str, None] = {}
    spellings: dict[str, str] = {}
    origins: dict[str, Where] = {}
    for part in parts:
        facts = part.source
        for name in (*facts.globals, *facts.refused_globals, *facts.unproven):
            origins.setdefault(name, facts.origins.get(name, facts.path))
        for location, count in facts.storage_locations.items():
            locations[location] = locations.get(location, 0) + count
        names.update(dict.fromkeys(facts.globals))
        refused.update(dict.fromkeys(facts.refused_globals))
        unproven.update(dict.fromkeys(facts.unproven))
        spellings.update(facts.spellings)
        notes = (*notes, *(n for n in facts.notes if n not in notes))
    return SourceFacts(materialized=sum(p.source.materialized for p in parts),
                       largest=largest(item for p in parts for item in p.source.largest),
                       path=path, format=fmt, size=sum(f.stat().st_size for f in files),
                       storage_locations=dict(sorted(locations.items())),
                       globals=tuple(names), metadata=metadata, refused_globals=tuple(refused),
                       files=files, spellings=spellings, unproven=tuple(unproven),
                       notes=notes, origins=origins)


def missing_ranks(ranks: Collection[int], world: int) -> tuple[int, int] | None:
    """The first rank below ``world`` that has no file, and how many lack one; None if none.

    ``world`` comes from the file (a partition count, a mesh): it is never walked, so a
    forged 10**12 costs no more than the files there are.
    """
    present = sum(1 for rank in ranks if 0 <= rank < world)
    if present == world:
        return None
    return next(rank for rank in range(world) if rank not in ranks), world - present


def layout_problem(folder: Where, fmt: Format, files: tuple[Where, ...], framework: str,
                   problems: list[str]) -> Checkpoint:
    """A report's reading of a layout that does not make one checkpoint: no tensors, the
    problems named."""
    return Checkpoint({}, merged_facts(folder, fmt, [], files, {
        "framework": framework, PROBLEMS: "\n".join(problems)}))


def or_problem(read: Callable[[], Checkpoint], folder: Where, fmt: Format,
               files: tuple[Where, ...], framework: str, lenient: bool) -> Checkpoint:
    """``read()``; for a report (``lenient``), a layout that is not one checkpoint is read
    as its problem (``layout_problem``) instead of refused."""
    try:
        return read()
    except LayoutError as exc:
        if not lenient:
            raise
        return layout_problem(folder, fmt, files, framework, [exc.message])
