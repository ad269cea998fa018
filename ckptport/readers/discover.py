"""Find every checkpoint under a folder: what ``check DIR`` gates and folder mode converts.

A gate over a folder must look at every regular file that any loader could
open, whatever its name: ``torch.load`` opens a ``.PT``, a ``.pth.tar`` or a
file with no extension alike, and unpickles any file whose bytes start a
pickle. So every folder and file is first asked of the readers' layouts
(``readers.layout_of``, the question ``resolve`` asks): a DCP, DeepSpeed or
rank-file folder and a shard set are one checkpoint each, covering the files
their layout names (a layout broken as named, a ``latest`` naming no tag, is
one checkpoint that reading reports); every other file is classified by its
bytes: a checkpoint, or a listed non-checkpoint with the reason, never
silently passed over, unless a layout names it as its own and it holds no
checkpoint (a model folder's ``config.json``, a save folder's ``latest``).
Links are not followed out of the folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..containers.sniff import sniff
from ..errors import CkptportError, InputError
from ..sources import open_source

__all__ = ["Found", "Discovery", "discover", "inside"]

@dataclass(frozen=True)
class Found:
    """One checkpoint: a file, a shard index, or a DCP folder; ``files`` it covers;
    ``weights`` False for training state a layout says holds no model weights."""

    path: Path
    files: tuple[Path, ...]
    weights: bool = True


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


def discover(root: Path) -> Discovery:
    """Every checkpoint under ``root`` and every other file, in path order."""
    from . import layout_of

    found = Discovery()
    covered: set[Path] = set()
    quiet: set[Path] = set()
    unweighted: set[Path] = set()

    def take(path: Path, folder: Path, names: frozenset[str] | None, name: str | None
             ) -> None:
        try:
            layout = layout_of(folder, names, name)
        except CkptportError as exc:  # broken as named: one checkpoint, reported when read
            if exc.path is None or Path(exc.path) not in covered:  # not reported already
                found.checkpoints.append(Found(path, (path,) if name else ()))
                covered.add(path)
            return
        if layout is None:
            return
        quiet.update(layout.quiet)
        unweighted.update(layout.unweighted)
        if layout.many is not None:
            return
        if layout.reader is None or set(layout.files) <= covered:
            return  # one file, classified by its bytes below; or found already
        found.checkpoints.append(Found(Path(layout.main), layout.files))
        covered.update(layout.files)

    for folder, dirs, names in os.walk(root, followlinks=False):
        here = Path(folder)
        dirs.sort()
        for name in sorted(names):  # files that name a layout (a shard index)
            take(here / name, here, None, name)
        take(here, here, frozenset([*names, *(d + "/" for d in dirs)]), None)
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
                found.checkpoints.append(Found(path, (path,), path not in unweighted))
            elif path not in quiet:
                found.others.append((path, reason))
    found.checkpoints.sort(key=lambda item: str(item.path))
    return found
