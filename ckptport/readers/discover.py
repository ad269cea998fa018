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

A bucket folder or a hub repository (a ``RemotePath``) is walked the same
way from its listing (``remote.folder_files``): its files are opened by
range, their versions pinned (``RemotePath.opened``), and asked the same
questions; nothing else is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..containers.sniff import sniff
from ..errors import CkptportError, InputError
from ..remote.urls import RemotePath
from ..sources import SourceFile, open_source
from .base import Where

__all__ = ["Found", "Discovery", "discover", "inside", "Where", "folder_of"]


@dataclass(frozen=True)
class Found:
    """One checkpoint: a file, a shard index, or a DCP folder; ``files`` it covers;
    ``weights`` False for training state a layout says holds no model weights."""

    path: Where
    files: tuple[Where, ...]
    weights: bool = True


@dataclass
class Discovery:
    checkpoints: list[Found] = field(default_factory=list)
    others: list[tuple[Where, str]] = field(default_factory=list)


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` (links resolved) lies under ``root``."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def folder_of(path: RemotePath) -> RemotePath:
    """A remote folder's location with its key ending in ``/`` (``hf://ORG/REPO`` and a
    hub DST_DIR's ``hf://ORG/REPO/PATH`` name folders without it), so that
    ``folder / name`` names a file in it."""
    key = path.url.key
    if not key or key.endswith("/"):
        return path
    return RemotePath(replace(path.url, key=key + "/"), path.pins, path.opener,
                      path.transfers)


def _walk(root: Where) -> Iterator[tuple[Where, list[str], list[str]]]:
    """``os.walk`` (links not followed) of a local folder; of a remote one, the same from its
    listing: each folder with its subfolders' and files' names, top down, in order."""
    if isinstance(root, Path):
        for folder, dirs, names in os.walk(root, followlinks=False):
            dirs.sort()  # walked in order
            yield Path(folder), dirs, sorted(names)
        return
    from ..remote import folder_files

    tree: dict[str, tuple[set[str], list[str]]] = {"": (set(), [])}
    for name in folder_files(root):
        folder, _, file = name.rpartition("/")
        parts = folder.split("/") if folder else []
        for depth in range(len(parts)):
            above = "/".join(parts[:depth])
            tree.setdefault(above, (set(), []))[0].add(parts[depth])
            tree.setdefault("/".join(parts[:depth + 1]), (set(), []))
        tree[folder][1].append(file)
    base = folder_of(root)

    def visit(folder: str) -> Iterator[tuple[Where, list[str], list[str]]]:
        dirs, files = tree[folder]
        here = base / f"{folder}/" if folder else base
        yield here, sorted(dirs), sorted(files)
        for sub in sorted(dirs):
            yield from visit(f"{folder}/{sub}" if folder else sub)

    yield from visit("")


def _opened(path: Where) -> SourceFile:
    """The file, opened to be read by position (a remote one: its version pinned)."""
    if isinstance(path, Path):
        return open_source(path)
    from ..remote.objects import opened

    return opened(path)


def _classify(path: Where) -> str | None:
    """None when a loader could open ``path`` as a checkpoint, else why not."""
    try:
        source = _opened(path)
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
        if isinstance(path, Path):  # a remote object stays open: its version is pinned
            source.close()


def discover(root: Where) -> Discovery:
    """Every checkpoint under ``root`` and every other file, in path order."""
    search = _Search()
    walked = list(_walk(root))
    for here, dirs, names in walked:
        for name in names:  # files that name a layout (a shard index)
            search.take(here / name, here, None, name)
        search.take(here, here, frozenset([*names, *(d + "/" for d in dirs)]), None)
    found = search.found
    for here, _, names in walked:
        for name in names:
            path = here / name
            if path in search.covered:
                continue
            if isinstance(path, Path) and isinstance(root, Path) and path.is_symlink() and \
                    not inside(path, root):  # a remote listing holds no links
                found.others.append((path, "a link to a file outside the folder; not followed"))
                continue
            reason = _classify(path)
            if reason is None:
                found.checkpoints.append(Found(path, (path,), path not in search.unweighted))
            elif path not in search.quiet:
                found.others.append((path, reason))
    found.checkpoints.sort(key=lambda item: str(item.path))
    return found


@dataclass
class _Search:
    """What the layouts found so far: checkpoints, the files they cover, the files they name
    as holding none (``quiet``) and as holding no model weights (``unweighted``)."""

    found: Discovery = field(default_factory=Discovery)
    covered: set[Where] = field(default_factory=set)
    quiet: set[Where] = field(default_factory=set)
    unweighted: set[Where] = field(default_factory=set)

    def take(self, path: Where, folder: Where, names: frozenset[str] | None,
             name: str | None) -> None:
        """Ask the layouts about ``folder`` (``names`` its entries) or its file ``name``."""
        from . import layout_of

        try:
            layout = layout_of(folder, names, name)
        except CkptportError as exc:  # broken as named: one checkpoint, reported when read
            named = exc.path if isinstance(exc.path, RemotePath) or exc.path is None \
                else Path(exc.path)
            if named is None or named not in self.covered:  # not reported already
                self.found.checkpoints.append(Found(path, (path,) if name else ()))
                self.covered.add(path)
            return
        if layout is None:
            return
        self.quiet.update(layout.quiet)
        self.unweighted.update(layout.unweighted)
        if layout.many is not None:
            return
        if layout.reader is None or set(layout.files) <= self.covered:
            return  # one file, classified by its bytes below; or found already
        self.found.checkpoints.append(Found(layout.main, layout.files))
        self.covered.update(layout.files)
