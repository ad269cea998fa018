"""Write a Hugging Face shard set: shards of at most ``max_shard_size`` + an index.

Names follow the hub (``model-00001-of-00003.safetensors`` /
``pytorch_model-00001-of-00003.bin``, index ``{"metadata": {"total_size":
…}, "weight_map": {…}}``); one shard is written as ``model.safetensors`` /
``pytorch_model.bin`` with no index, as ``save_pretrained`` does. Tied
names follow the hub too: in a safetensors set a key that is the same
tensor as another is left out (a safetensors file stores a tensor once under
one name; models re-tie it on load, ``load_into`` fills it), so the index
never maps a key to a shard that does not hold it, and the index's metadata
records the names left out (``ckptport.aliases``) so ckptport reads the set
back whole; a ``.bin`` shard's pickle holds both names over one storage, as
does a set of one file. Every file is
written into a temp folder inside DST and verified there; then the shards
move into DST and the index last, so an index never names a shard that is
not complete; stale weight files of the same naming pattern are removed
after that. Where the files go is a ``Sink``: a local folder, or a remote
one (``writers.remote``) that uploads each file as soon as it is verified,
so local disk holds one shard at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from ..checkpoint import Checkpoint
from ..errors import OutputError, OutputExistsError
from ..tensors import ViewKey, nbytes, storage_key, view_key
from ..tree import KEY_ALIASES, TensorLeaf, is_state_dict, is_tensor, rebuild_dict
from .base import WriteOptions, WriteResult, count_tensors, emit, unique_bytes
from .formats import OutputFormat
from .plan import Destination, same_file
from .staging import fsync_dir, os_error, staged_file, staged_folder

if TYPE_CHECKING:
    from ..remote.urls import RemotePath

__all__ = ["ShardsWriter", "split_shards", "ShardNames", "without_aliases", "Sink",
           "LocalFolder"]


@dataclass(frozen=True)
class ShardNames:
    """The hub's file names for one output format."""

    stem: str
    extension: str

    @classmethod
    def of(cls, fmt: OutputFormat) -> ShardNames:
        """The hub's names for a set of ``fmt``'s files (``pytorch_model-…bin`` for .pth)."""
        return cls(fmt.shard_stem or fmt.name, fmt.shard_extension or fmt.extension)

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


Tensors = Mapping[str, TensorLeaf]  # what a shard set holds: a flat state dict of tensors


def without_aliases(state: Tensors) -> tuple[Tensors, dict[str, str]]:
    """The state dict with tied names left out, as the hub saves it; alias -> kept name."""
    kept: dict[ViewKey | None, str] = {}
    items, aliases = [], {}
    for key, tensor in state.items():
        identity = view_key(tensor) if storage_key(tensor) is not None else None
        if identity in kept:  # an empty tensor is never an alias (nothing to share)
            aliases[key] = kept[identity]
            continue
        if identity is not None:
            kept[identity] = key
        items.append((key, tensor))
    return rebuild_dict(state, items), aliases


def split_shards(state: Tensors, max_size: int) -> list[list[str]]:
    """Keys grouped into shards in order; tensors sharing a storage stay together."""
    groups: OrderedDict[int | ViewKey, list[str]] = OrderedDict()
    sizes: dict[int | ViewKey, int] = {}
    for key, tensor in state.items():
        storage = storage_key(tensor)
        group = view_key(tensor) if storage is None else storage
        groups.setdefault(group, []).append(key)
        sizes[group] = max(sizes.get(group, 0), nbytes(tensor))
    shards: list[list[str]] = [[]]
    used = 0
    for group, keys in groups.items():
        if shards[-1] and used + sizes[group] > max_size:
            shards.append([])
            used = 0
        shards[-1] += keys
        used += sizes[group]
    return shards


class Sink(Protocol):
    """Where a shard set goes: files are written and verified in ``staging()``, handed to
    ``staged`` one by one as each is verified, then published together, index last."""

    location: Path | RemotePath

    def check(self, checkpoint: Checkpoint, names: ShardNames, overwrite: bool) -> None:
        """Refuse before writing: the set would replace a source, or exists unasked."""

    def staging(self) -> contextlib.AbstractContextManager[Path]: ...

    def staged(self, path: Path) -> None:
        """``path`` is complete and verified in the staging folder."""

    def publish(self, staging: Path, files: list[str], names: ShardNames) -> None:
        """Make ``files`` (the index last) appear; remove the set's stale files."""


class LocalFolder:
    """A shard set in a local folder: staged in a temp folder inside it, renamed in."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.location: Path | RemotePath = folder

    def check(self, checkpoint: Checkpoint, names: ShardNames, overwrite: bool) -> None:
        folder = self.folder
        for source in checkpoint.source.files:
            if same_file(source.parent, folder) and names.is_ours(source.name):
                raise OutputError(f"holds the source {source.name}; write the set elsewhere",
                                  folder)
        if folder.is_dir() and not overwrite:
            existing = sorted(p.name for p in folder.iterdir() if names.is_ours(p.name))
            if existing:
                raise OutputExistsError(f"already holds {', '.join(existing[:3])}; pass "
                                        "--overwrite to replace the set", folder)

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        self.folder.mkdir(parents=True, exist_ok=True)
        with staged_folder(self.folder, "shards") as staging:
            yield staging

    def staged(self, path: Path) -> None:
        """Nothing to do: the file stays in the staging folder until published."""

    def publish(self, staging: Path, files: list[str], names: ShardNames) -> None:
        for name in files:  # the index is last in ``files``
            os.replace(staging / name, self.folder / name)
        for stale in self.folder.iterdir():
            if names.is_ours(stale.name) and stale.name not in files:
                stale.unlink()
        fsync_dir(self.folder)


class ShardsWriter:
    """A shard set in the folder DST (or another ``Sink``), in the hub's layout."""

    def __init__(self, fmt: OutputFormat, sink: Sink | None = None) -> None:
        self.format = fmt
        self.sink = sink

    def write(self, checkpoint: Checkpoint, destination: Destination,
              options: WriteOptions) -> WriteResult:
        sink: Sink = self.sink or LocalFolder(destination.path)
        folder = destination.path
        tree = checkpoint.tree
        state = cast("Tensors", tree) if is_state_dict(tree) else None  # of tensors, checked:
        if state is None or not all(is_tensor(v) for v in state.values()):
            raise OutputError("a shard set holds a flat state dict of tensors, and the selected "
                              "data holds more (e.g. --select all); write a single .pth",
                              sink.location)
        names = ShardNames.of(self.format)
        sink.check(checkpoint, names, options.overwrite)
        # a file that stores each tensor once under one name (safetensors) leaves tied names
        # out, as the hub does; a pickle (.bin) keeps both names over one storage
        kept, aliases = without_aliases(state) if self.format.one_name_per_tensor else \
            (state, {})
        assert destination.shard_size is not None
        groups = split_shards(kept, destination.shard_size)
        if len(groups) == 1:  # one file: it stores each tied tensor once and names the others
            kept, aliases, groups = state, {}, [list(state)]
        try:
            with sink.staging() as staging:
                files = self._write_staged(staging, kept, groups, names, options, aliases, sink)
                options.precommit()
                sink.publish(staging, files, names)
        except OSError as exc:
            raise os_error(exc, folder) from exc
        notes = (f"left {len(aliases)} tied names out of the shards, as the hub does (models "
                 "re-tie them on load; the index records them as ckptport.aliases): "
                 + ", ".join(f"{a} = {k}" for a, k in aliases.items()),) if aliases else ()
        return WriteResult(sink.location, self.format.name, count_tensors(kept),
                           unique_bytes(kept), options.verify,
                           files=tuple(sink.location / name for name in files), notes=notes)

    def _write_staged(self, staging: Path, state: Tensors, groups: list[list[str]],
                      names: ShardNames, options: WriteOptions,
                      aliases: Mapping[str, str], sink: Sink) -> list[str]:
        weight_map: dict[str, str] = {}
        files = []
        for number, keys in enumerate(groups, start=1):
            name = names.shard(number, len(groups))
            shard = rebuild_dict(state, [(key, state[key]) for key in keys])  # keeps _metadata
            with staged_file(staging / name, overwrite=False) as out:
                emit(self.format, shard, out, options)
                out.publish()
            sink.staged(staging / name)
            weight_map.update(dict.fromkeys(keys, name))
            files.append(name)
        if len(groups) > 1:
            metadata: dict[str, object] = {"total_size": unique_bytes(state)}
            if aliases:
                metadata[KEY_ALIASES] = dict(sorted(aliases.items()))
            index = {"metadata": metadata, "weight_map": weight_map}
            with staged_file(staging / names.index, overwrite=False) as out:
                out.file.write(json.dumps(index, indent=2, sort_keys=True).encode() + b"\n")
                out.sync()
                out.publish()
            sink.staged(staging / names.index)
            files.append(names.index)
        return files
