"""Read a Hugging Face shard set (``*.index.json`` + shards) as one checkpoint.

The index is data from the file like any other: shard names that are
absolute, climb out with ``..``, sit in a subfolder or have another
extension are refused, as are missing shards, keys the index promises but
no shard holds, and keys held by two shards. Each shard is read lazily by
its own reader, so the set costs no more memory than its parts.
"""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..errors import InputError

__all__ = ["read_shards", "find_index", "SHARD_EXTENSIONS", "shard_files"]

SHARD_EXTENSIONS = {".safetensors": Format.SAFETENSORS_SHARDS, ".bin": Format.TORCH_SHARDS,
                    ".pt": Format.TORCH_SHARDS, ".pth": Format.TORCH_SHARDS}
MAX_INDEX_BYTES = 64 << 20


def find_index(folder: Path) -> Path | None:
    """The one ``*.index.json`` in ``folder``; None when there is none."""
    indexes = sorted(folder.glob("*.index.json"))
    if len(indexes) > 1:
        names = ", ".join(p.name for p in indexes)
        raise InputError(f"holds several shard indexes ({names}); name one", folder)
    return indexes[0] if indexes else None


def _load_index(index: Path) -> dict[str, str]:
    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise InputError(f"shard index larger than {MAX_INDEX_BYTES >> 20} MiB", index)
        doc = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"shard index is not valid JSON: {exc}", index) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", index) from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise InputError("shard index has no weight_map of names to shard files", index)
    return weight_map


def _shard_path(index: Path, name: str, extension: str) -> Path:
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if (posix.is_absolute() or windows.is_absolute() or len(posix.parts) != 1
            or len(windows.parts) != 1 or name in {".", ".."}):
        raise InputError(f"shard index names {name!r}: shard names must be plain file names "
                         "in the index's folder", index)
    if Path(name).suffix != extension:
        raise InputError(f"shard index names {name!r}, not a {extension} file like its index",
                         index)
    return index.parent / name


def shard_files(index: Path) -> tuple[Format, dict[str, str], list[Path]]:
    """The set's format, its weight map and its validated shard paths, in order."""
    weight_map = _load_index(index)
    stem = index.name.removesuffix(".index.json")
    extension = Path(stem).suffix
    if extension not in SHARD_EXTENSIONS:
        raise InputError(f"cannot tell the shard format from the index name {index.name!r}",
                         index)
    shards = sorted({_shard_path(index, name, extension) for name in weight_map.values()})
    for shard in shards:
        if not shard.is_file():
            raise InputError(f"shard {shard.name} named by the index is missing", index)
    return SHARD_EXTENSIONS[extension], weight_map, shards


def read_shards(index: Path, *, trust: bool = False,
                read_part: Callable[[Path], Checkpoint] | None = None) -> Checkpoint:
    """The set as one checkpoint; ``read_part`` reads a shard (``describe`` passes its own)."""
    from . import read_file

    def read_one(shard: Path) -> Checkpoint:
        return read_part(shard) if read_part is not None else read_file(shard, trust=trust)

    fmt, weight_map, shards = shard_files(index)
    tree: OrderedDict[str, Any] = OrderedDict()
    owner: dict[str, str] = {}
    locations: Counter[str] = Counter()
    found_globals: dict[str, None] = {}
    shared: list[tuple[str, ...]] = []
    for shard in shards:
        part = read_one(shard)
        state = part.tree
        if not isinstance(state, dict):
            raise InputError(f"shard {shard.name} is not a state dict", index)
        for key, value in state.items():
            if key in owner:
                raise InputError(f"key {key!r} is in two shards: {owner[key]} and {shard.name}",
                                 index)
            if weight_map.get(key) != shard.name:
                raise InputError(f"key {key!r} is in {shard.name} but the index puts it in "
                                 f"{weight_map.get(key, 'no shard')}", index)
            owner[key] = shard.name
            tree[key] = value
        versions = getattr(state, "_metadata", None)
        if versions is not None:  # every shard carries the state dict's module versions
            tree._metadata = versions  # type: ignore[attr-defined]
        locations.update(part.source.storage_locations)
        found_globals.update(dict.fromkeys(part.source.globals))
        shared += part.source.shared_storages
    missing = [key for key in weight_map if key not in owner]
    if missing:
        raise InputError(f"the index lists {len(missing)} keys no shard holds "
                         f"(first: {missing[0]!r})", index)
    return Checkpoint(tree, SourceFacts(
        path=index, format=fmt, size=sum(s.stat().st_size for s in shards),
        storage_locations=dict(sorted(locations.items())), globals=tuple(found_globals),
        shared_storages=tuple(shared), trusted=trust, files=(index, *shards),
    ))
