"""Write a Hugging Face shard set: shards of at most ``max_shard_size`` + an index.

Names follow the hub (``model-00001-of-00003.safetensors`` /
``pytorch_model-00001-of-00003.bin``, index ``{"metadata": {"total_size":
…}, "weight_map": {…}}``); one shard is written as ``model.safetensors`` /
``pytorch_model.bin`` with no index, as ``save_pretrained`` does. Tensors
that share a storage land in the same shard. Every file is written into a
temp folder beside DST and verified there; then the shards move into DST
and the index last, so an index never names a shard that is not complete;
stale weight files of the same naming pattern are removed after that.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import Checkpoint, rebuild_dict
from ..errors import OutputError
from ..progress import Progress, no_progress
from ..rules.select import is_state_dict
from ..tensorops import view_key
from . import OutputFormat, WriteResult, count_tensors, emit, same_file, unique_bytes
from .atomic import TEMP_SUFFIX, atomic_file, fsync_dir

if TYPE_CHECKING:
    from .safetensors import MetadataValue

__all__ = ["write_shards", "parse_size", "split_shards", "ShardNames"]

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """``5GB`` (decimal, as the hub counts), ``500MiB`` (binary) or plain bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", text.upper())
    if not match or match.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB, 2GiB)")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size <= 0:
        raise ValueError(f"shard size must be positive, not {text!r}")
    return size


@dataclass(frozen=True)
class ShardNames:
    """The hub's file names for one output format."""

    stem: str
    extension: str

    @classmethod
    def of(cls, kind: OutputFormat) -> ShardNames:
        if kind is OutputFormat.SAFETENSORS:
            return cls("model", ".safetensors")
        return cls("pytorch_model", ".bin")

    def shard(self, number: int, count: int) -> str:
        if count == 1:
            return self.single
        return f"{self.stem}-{number:05d}-of-{count:05d}{self.extension}"

    @property
    def single(self) -> str:
        return f"{self.stem}{self.extension}"

    @property
    def index(self) -> str:
        return f"{self.single}.index.json"

    def is_ours(self, name: str) -> bool:
        """A weight file of this naming pattern (what a new set replaces)."""
        pattern = rf"{re.escape(self.stem)}(-\d{{5}}-of-\d{{5}})?{re.escape(self.extension)}"
        return name == self.index or re.fullmatch(pattern, name) is not None


def split_shards(state: Mapping[str, Any], max_size: int) -> list[list[str]]:
    """Keys grouped into shards in order; tied tensors stay together."""
    groups: OrderedDict[Any, list[str]] = OrderedDict()
    sizes: dict[Any, int] = {}
    for key, tensor in state.items():
        storage = view_key(tensor)
        group = storage[0] if storage else ("empty", key)
        groups.setdefault(group, []).append(key)
        sizes[group] = max(sizes.get(group, 0), tensor.numel() * tensor.element_size())
    shards: list[list[str]] = [[]]
    used = 0
    for group, keys in groups.items():
        if shards[-1] and used + sizes[group] > max_size:
            shards.append([])
            used = 0
        shards[-1] += keys
        used += sizes[group]
    return shards


def write_shards(
    checkpoint: Checkpoint,
    dst: str | os.PathLike[str],
    *,
    kind: OutputFormat,
    max_shard_size: int,
    anchor: str = "cpu",
    overwrite: bool = False,
    verify: bool = True,
    metadata: Mapping[str, MetadataValue] | None = None,
    progress: Progress = no_progress,
    precommit: Callable[[], None] = lambda: None,
) -> WriteResult:
    """Write ``checkpoint`` (a state dict) as a shard set in the folder ``dst``."""
    folder = Path(dst)
    state = checkpoint.tree
    if not is_state_dict(state) or any(not hasattr(v, "numel") for v in state.values()):
        raise OutputError("a shard set holds a flat state dict of tensors, and the selected "
                          "data holds more (e.g. --select all); write a single .pth", folder)
    names = ShardNames.of(kind)
    _check_folder(checkpoint, folder, names, overwrite)
    groups = split_shards(state, max_shard_size)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder, prefix=".shards.", suffix=TEMP_SUFFIX))
        try:
            files = _write_staged(staging, state, groups, names, kind, anchor, verify,
                                  metadata or {}, progress)
            precommit()
            _publish(staging, folder, files, names)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", folder) from exc
    return WriteResult(folder, kind, count_tensors(state), unique_bytes(state), verify,
                       files=tuple(folder / name for name in files))


def _check_folder(checkpoint: Checkpoint, folder: Path, names: ShardNames,
                  overwrite: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise OutputError("exists and is not a folder; a shard set is written into a folder",
                          folder)
    for source in checkpoint.source.files:
        if same_file(source.parent, folder) and names.is_ours(source.name):
            raise OutputError(f"holds the source {source.name}; write the set elsewhere", folder)
    if folder.is_dir() and not overwrite:
        existing = sorted(p.name for p in folder.iterdir() if names.is_ours(p.name))
        if existing:
            raise OutputError(f"already holds {', '.join(existing[:3])}; pass --overwrite to "
                              "replace the set", folder)


def _write_staged(staging: Path, state: Mapping[str, Any], groups: list[list[str]],
                  names: ShardNames, kind: OutputFormat, anchor: str, verify: bool,
                  metadata: Mapping[str, MetadataValue], progress: Progress) -> list[str]:
    weight_map: dict[str, str] = {}
    files = []
    for number, keys in enumerate(groups, start=1):
        name = names.shard(number, len(groups))
        shard = rebuild_dict(state, [(key, state[key]) for key in keys])  # keeps _metadata
        with atomic_file(staging / name, overwrite=False) as out:
            emit(kind, shard, out, anchor=anchor, verify=verify, metadata=metadata,
                 progress=progress)
            out.publish()
        weight_map.update(dict.fromkeys(keys, name))
        files.append(name)
    if len(groups) > 1:
        index = {"metadata": {"total_size": unique_bytes(state)}, "weight_map": weight_map}
        with atomic_file(staging / names.index, overwrite=False) as out:
            out.file.write(json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")
            out.sync()
            out.publish()
        files.append(names.index)
    return files


def _publish(staging: Path, folder: Path, files: list[str], names: ShardNames) -> None:
    for name in files:  # the index is last in ``files``
        os.replace(staging / name, folder / name)
    for stale in folder.iterdir():
        if names.is_ours(stale.name) and stale.name not in files:
            stale.unlink()
    fsync_dir(folder)
