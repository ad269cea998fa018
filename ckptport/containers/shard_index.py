"""A Hugging Face shard index (``*.index.json``), parsed strictly and checked against its folder.

The index is data from the file like any other: shard names that are
absolute, climb out with ``..``, sit in a subfolder, have another extension,
or are links leading out of the index's folder are refused, as are missing
shards and JSON on which parsers could disagree (duplicate keys).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING

from ..checkpoint import Format
from ..errors import InputError
from ..sources import check_regular
from ..tree import KEY_ALIASES

if TYPE_CHECKING:
    from ..remote.urls import Where

__all__ = ["ShardIndex", "parse_index", "SHARD_EXTENSIONS", "MAX_INDEX_BYTES"]

SHARD_EXTENSIONS = {".safetensors": Format.SAFETENSORS_SHARDS, ".bin": Format.TORCH_SHARDS,
                    ".pt": Format.TORCH_SHARDS, ".pth": Format.TORCH_SHARDS}
MAX_INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class ShardIndex:
    """The set's format, its key -> shard map and its shard files, in name order."""

    path: Where
    format: Format
    weight_map: dict[str, str]
    shards: tuple[Where, ...]
    # ckptport's record of tied names it left out (alias -> kept name), a claim the
    # reader checks; the hub's own sets have none
    aliases: dict[str, str] = field(default_factory=dict)


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"the key {next(k for k in keys if keys.count(k) > 1)!r} appears twice")
    return dict(pairs)


def _load(index: Where) -> tuple[dict[str, str], dict[str, str]]:
    size = check_regular(index).st_size if isinstance(index, Path) else index.opened().size
    if size > MAX_INDEX_BYTES:
        raise InputError(f"shard index larger than {MAX_INDEX_BYTES >> 20} MiB", index)
    try:
        raw = index.read_bytes()
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"shard index is not valid JSON: {exc}", index) from None
    except OSError as exc:
        raise InputError.from_os_error(exc, index) from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise InputError("shard index has no weight_map of names to shard files", index)
    metadata = doc.get("metadata")
    aliases = metadata.get(KEY_ALIASES) if isinstance(metadata, dict) else None
    if aliases is None:
        return weight_map, {}
    if not (isinstance(aliases, dict) and all(
            isinstance(k, str) and isinstance(v, str) and k not in weight_map and v in weight_map
            for k, v in aliases.items())):
        raise InputError(f"shard index metadata {KEY_ALIASES!r} must map names the set leaves "
                         "out to names it holds", index)
    return weight_map, aliases


def _shard_path(index: Where, name: str, extension: str) -> Where:
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if (posix.is_absolute() or windows.is_absolute() or len(posix.parts) != 1
            or len(windows.parts) != 1 or name in {".", ".."}):
        raise InputError(f"shard index names {name!r}: shard names must be plain file names "
                         "in the index's folder", index)
    if Path(name).suffix != extension:
        raise InputError(f"shard index names {name!r}, not a {extension} file like its index",
                         index)
    shard = index.parent / name
    if not isinstance(shard, Path):  # a remote index's: named next to it, opened when read
        return shard
    if not shard.exists() and not shard.is_symlink():
        raise InputError(f"shard {name} named by the index is missing", index)
    if Path(os.path.realpath(shard)).parent != Path(os.path.realpath(index.parent)):
        raise InputError(f"shard {name} is a link to a file outside the index's folder", index)
    check_regular(shard)
    return shard


def parse_index(index: Where) -> ShardIndex:
    """The index at ``index``: a local one checked against its folder, a remote one (a
    ``RemotePath``, its pinned object fetched) with its shards named next to it rather than
    looked up on disk."""
    weight_map, aliases = _load(index)
    extension = Path(index.name.removesuffix(".index.json")).suffix
    if extension not in SHARD_EXTENSIONS:
        raise InputError(f"cannot tell the shard format from the index name {index.name!r}",
                         index)
    shards = tuple(sorted({_shard_path(index, name, extension)
                           for name in weight_map.values()}))
    return ShardIndex(index, SHARD_EXTENSIONS[extension], weight_map, shards, aliases)
