"""Find every checkpoint under a folder: what ``check DIR`` gates and folder mode converts.

A gate over a folder must look at every regular file that any loader could
open, whatever its name: ``torch.load`` opens a ``.PT``, a ``.pth.tar`` or a
file with no extension alike, and unpickles any file whose bytes start a
pickle. So every regular file is classified by its bytes; shard sets and
DCP folders are one checkpoint each (their index or metadata, and the files
they name), and every other file is a checkpoint or a listed non-checkpoint
with the reason, never silently passed over. Links are not followed out of
the folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..containers.sniff import sniff
from ..errors import CkptportError, InputError
from ..sources import open_source
from .dcp import METADATA_FILE, is_dcp
from .deepspeed import tag_files
from .ranks import rank_files

__all__ = ["Found", "Discovery", "discover", "inside"]

@dataclass(frozen=True)
class Found:
    """One checkpoint: a file, a shard index, or a DCP folder; ``files`` it covers."""

    path: Path
    files: tuple[Path, ...]


@dataclass
class Discovery:
    checkpoints: list[Found] = field(default_factory=list)
    others: list[tuple[Path, str]] = field(default_factory=list)


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (links resolved) lies under ``root``."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def _classify(path: Path) -> str | None:
    """None when a loader could open ``path`` as a checkpoint, else why not."""
    try:
        source = open_source(path)
    except CkptportError as exc:
        return exc.message
    try:
        if source.size == 0:
            return "empty"
        try:  # the sniff every reader uses: what it names, a loader opens
            if sniff(source) is not None:
                return None
        except InputError:  # a tar, a polyglot: a checkpoint file, reported unreadable
            return None
        head = source.read(0, min(source.size, 8))
        return f"not a checkpoint: torch.load cannot open it (starts with {head.hex()})"
    except CkptportError as exc:
        return exc.message
    finally:
        source.close()


def _rank_set(folder: Path) -> tuple[Path, ...] | None:
    """A DeepSpeed tag folder's rank files, or a set of two or more per-rank files: one
    checkpoint (a single ``model_rank0.pt`` stays a file)."""
    files = tag_files(folder)
    if files:
        return files
    ranks = rank_files(folder)
    return tuple(ranks.values()) if ranks is not None and len(ranks) > 1 else None


def discover(root: Path) -> Discovery:
    """Every checkpoint under ``root`` and every other file, in path order."""
    from ..containers.shard_index import parse_index

    found = Discovery()
    covered: set[Path] = set()
    for folder, dirs, names in os.walk(root, followlinks=False):
        here = Path(folder)
        dirs.sort()
        if is_dcp(here):
            files = (here / METADATA_FILE, *sorted(here.glob("*.distcp")))
            found.checkpoints.append(Found(here, files))
            covered.update(files)
        elif (ranked := _rank_set(here)) is not None:
            found.checkpoints.append(Found(here, ranked))
            covered.update(ranked)
        for name in sorted(names):
            if name.endswith(".index.json"):
                index = here / name
                try:
                    files = (index, *parse_index(index).shards)
                except CkptportError:
                    files = (index,)
                found.checkpoints.append(Found(index, files))
                covered.update(files)
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path in covered:
                continue
            if path.is_symlink() and not inside(path, root):
                found.others.append((path, "a link to a file outside the folder; not followed"))
                continue
            reason = _classify(path)
            if reason is None:
                found.checkpoints.append(Found(path, (path,)))
            else:
                found.others.append((path, reason))
    found.checkpoints.sort(key=lambda item: str(item.path))
    return found
