"""Read a Hugging Face shard set (``*.index.json`` + shards) as one checkpoint.

Each shard is read by the reader of its own format; the set is their state
dicts joined, checked against the index: no key in two shards, none placed
against the index, none the index lists but no shard holds. (A key the
hub's ``save_pretrained`` leaves out because it is tied to another is
simply not in the set; ``load_into`` fills it from the model's own ties. A
set ckptport wrote records the names it left out in the index's metadata,
``ckptport.aliases``, checked against the weight map and restored here.)
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Callable

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..containers.shard_index import ShardIndex, parse_index
from ..errors import InputError
from ..quant.torchao_layout import gathered, indexed_as
from ..tree import Tree
from .base import Layout, Names, ReadOptions, Source, Where
from .budget import largest as biggest
from .layouts import LayoutError, layout_problem

__all__ = ["ShardsReader"]

LoadFile = Callable[[Where, ReadOptions], Checkpoint]


# the hub's shard names: "model-00002-of-00003.safetensors", "pytorch_model-00001-of-00002.bin"
_NUMBERED = re.compile(r"(.+)-([0-9]+)-of-([0-9]+)(\.[A-Za-z]+)")


def numbered_shards(index: ShardIndex) -> None:
    """Refuse an index whose shards are numbered (``-00002-of-00003``) but are not one save's
    whole set: a shard no key names (its tensors would be silently left out: a cut index),
    a number two files claim, or numbers of different counts (files of two saves). An
    index naming its shards otherwise makes no such claim."""
    matches = [_NUMBERED.fullmatch(shard.name) for shard in index.shards]
    if not matches or not all(matches):
        return
    kinds = {(m[1], m[4], int(m[3])) for m in matches if m}
    if len(kinds) > 1:
        raise LayoutError(f"names shards of {len(kinds)} different sets ("
                          f"{', '.join(sorted({m.string for m in matches if m})[:3])}): files of "
                          "different saves", index.path)
    (_, _, count), = kinds
    claims: dict[int, list[str]] = {}
    for m in matches:
        if m:
            claims.setdefault(int(m[2]), []).append(m.string)
    doubled = next((names for names in claims.values() if len(names) > 1), None)
    if doubled:
        raise LayoutError(f"names one shard as {len(doubled)} files ({', '.join(doubled)}): "
                          "one shard, one file", index.path)
    named = ", ".join(map(str, sorted(claims)))
    absent = sorted(set(range(1, count + 1)) - set(claims))
    if absent:
        raise LayoutError(f"its weight map names shards {named} of {count}: shard {absent[0]} "
                          "is named by no key (a cut index leaves its tensors out)", index.path)
    if max(claims) > count:
        raise LayoutError(f"its weight map names shards {named} of {count}: shard "
                          f"{max(claims)} is past the count", index.path)


class ShardsReader:
    format = Format.SAFETENSORS_SHARDS

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A ``*.index.json`` named, or the one in ``folder``: the index and its shards."""
        if names is not None:
            indexes = sorted(n for n in names if n.endswith(".index.json"))
            if len(indexes) > 1:  # a folder of shard sets, each read on its own
                return Layout(folder, (), many=f"holds several shard indexes "
                              f"({', '.join(indexes)}); name one")
            name = indexes[0] if indexes else None
        if name is None or not name.endswith(".index.json"):
            return None
        parsed = parse_index(folder / name)
        return Layout(parsed.path, (parsed.path, *parsed.shards), self, parsed.format,
                      index=parsed)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        index = source.index
        assert index is not None
        try:
            numbered_shards(index)
        except LayoutError as exc:
            if not options.lenient:
                raise
            return layout_problem(index.path, index.format, source.files, "shard set",
                                  [exc.message])
        tree: OrderedDict[str, Tree] = OrderedDict()
        owner: dict[str, str] = {}
        parts: list[tuple[Where, SourceFacts]] = []
        for shard in index.shards:
            part = self.load_file(shard, options)
            _merge(tree, owner, part, shard, index)
            parts.append((shard, part.source))
        missing = [key for key in index.weight_map if key not in owner]
        if missing:
            raise InputError(f"the index lists {len(missing)} keys no shard holds "
                             f"(first: {missing[0]!r})", index.path)
        for alias, kept in index.aliases.items():  # ckptport's own sets: tied names back
            tree[alias] = tree[kept]
        return Checkpoint(tree, _facts(index, parts, source.files, options.trust))


def _merge(tree: OrderedDict[str, Tree], owner: dict[str, str], part: Checkpoint,
           shard: Where, index: ShardIndex) -> None:
    """One shard's state dict into the set's, each key from the shard the index names (a
    torchao subclass's parts by the weight they are of)."""
    state = part.tree
    if not isinstance(state, dict):
        raise InputError(f"shard {shard.name} is not a state dict", index.path)
    for key, value in state.items():
        if key in owner:
            raise InputError(f"key {key!r} is in two shards: {owner[key]} and "
                             f"{shard.name}", index.path)
        listed = key if key in index.weight_map else indexed_as(key, part.source.metadata)
        if index.weight_map.get(listed) != shard.name:
            raise InputError(f"key {key!r} is in {shard.name} but the index puts it in "
                             f"{index.weight_map.get(listed, 'no shard')}", index.path)
        owner[key] = owner[listed] = shard.name
        tree[key] = value
    versions = getattr(state, "_metadata", None)
    if versions is not None:  # every shard carries the state dict's module versions
        tree._metadata = versions  # type: ignore[attr-defined]


def _facts(index: ShardIndex, parts: list[tuple[Where, SourceFacts]], files: tuple[Where, ...],
           trusted: bool) -> SourceFacts:
    """The set's facts from its shards' (their notes named by shard, the index's ties,
    torchao's metadata gathered)."""
    locations: Counter[str] = Counter()
    found: dict[str, None] = {}
    spellings: dict[str, str] = {}
    shared: list[tuple[str, ...]] = []
    refused: dict[str, None] = {}
    unproven: dict[str, None] = {}
    notes: list[str] = []
    materialized = 0
    largest: list[tuple[str, int]] = []
    origins: dict[str, Where] = {}
    for shard, facts in parts:
        for name in (*facts.globals, *facts.refused_globals, *facts.unproven):
            origins.setdefault(name, shard)
        locations.update(facts.storage_locations)
        found.update(dict.fromkeys(facts.globals))
        spellings.update(facts.spellings)
        refused.update(dict.fromkeys(facts.refused_globals))
        unproven.update(dict.fromkeys(facts.unproven))
        shared += facts.shared_storages
        materialized += facts.materialized
        largest += facts.largest
        notes += [f"{shard.name}: {note}" for note in facts.notes]
    if index.aliases:
        shared += [(kept, *sorted(a for a, k in index.aliases.items() if k == kept))
                   for kept in dict.fromkeys(index.aliases.values())]
    return SourceFacts(
        path=index.path, format=index.format,
        size=sum(s.stat().st_size for s in index.shards),
        storage_locations=dict(sorted(locations.items())), globals=tuple(found),
        shared_storages=tuple(shared), trusted=trusted, files=files,
        spellings=spellings, refused_globals=tuple(refused), unproven=tuple(unproven),
        notes=tuple(notes), materialized=materialized, largest=biggest(largest),
        origins=origins, metadata=gathered([facts.metadata for _, facts in parts]))
