"""What every reader shares: the source resolved once, the options, the interface.

A ``Layout`` is what a path names as one checkpoint, decided by the reader
that knows the layout, from names alone: the path it reads and every file it
covers. A ``Source`` is a path resolved once: its layout, or a checkpoint
file (its container sniffed from its bytes, opened for positional reads).
A ``Reader`` claims a file from its bytes, a ``LayoutReader`` names its
layouts; either loads a source into a ``Checkpoint`` whose tensors are
described (``TensorInfo``, read by position when needed) wherever the format allows;
``ckptport.read`` turns those into torch tensors afterwards, so the
torch-free path (inspect, check, manifest) and the torch path (normalize,
diff, read) start from the same parse of the same bytes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, cast, runtime_checkable

from ..checkpoint import Checkpoint, Format, SourceFacts, shared_storages
from ..errors import CkptportError, InputError, UnsafeCheckpointError
from ..remote.urls import Where
from ..sources import SourceFile
from ..tree import Tree
from ..unpickle import PickleRefused, Unpickled
from .budget import largest

if TYPE_CHECKING:
    from ..containers.shard_index import ShardIndex

__all__ = ["ReadOptions", "Layout", "Source", "Loader", "Reader", "LayoutReader", "Names",
           "Where", "local", "refusal",
           "pickle_facts", "NotDescribable"]

_T = TypeVar("_T")

# a folder's entries by name: files as named, folders with a trailing "/"; None where a
# file was named (a layout named by one file, a shard index, needs no listing)
Names = frozenset[str] | None


@dataclass(frozen=True)
class ReadOptions:
    """How to read: ``trust`` unpickles with full Python (runs code; the user vouched);
    ``lenient`` (reports) keeps code-running globals as inert records so they can be
    named, instead of refusing the file. Nothing is ever run without ``trust``.
    """

    trust: bool = False
    lenient: bool = False
    max_expansion: float | None = None  # readers.budget's ratio (None: the default)


@dataclass(frozen=True)
class Layout:
    """One checkpoint as its reader names it, from names alone.

    ``main`` is what is read (a folder, a shard index, a model folder's
    weights file) and ``files`` every file the layout covers: what every
    command snapshots, hashes, records and gates, one list for all. ``reader``
    loads it (None: ``main`` is one file, read by the reader that claims its
    bytes). ``tag`` is the tag a tagged layout picked (DeepSpeed); ``quiet``
    the files beside it that the layout names but that hold no checkpoint
    (``latest``, ``config.json``), which a folder search does not list as
    unchecked; ``many`` says why the folder is a folder of checkpoints rather
    than one (each of its files read on its own), ``unweighted`` which of
    those hold training state and no model weights (an optimizer, a scheduler,
    RNG state: folder mode skips them unless ``--select all``).
    """

    main: Where
    files: tuple[Where, ...]
    reader: Loader | None = None
    format: Format | None = None
    tag: str | None = None
    quiet: tuple[Where, ...] = ()
    many: str | None = None
    unweighted: tuple[Where, ...] = ()
    index: ShardIndex | None = None


@dataclass(frozen=True)
class Source:
    """A path resolved once: its layout, the file or folder to read, every file it covers.

    ``file`` is the open checkpoint file (single-file sources), ``format``
    its container from its bytes; ``index`` the parsed shard index;
    ``layout`` what the path names, when a reader's layout named it.
    """

    path: Where
    main: Where
    files: tuple[Where, ...]
    format: Format | None = None
    file: SourceFile | None = None
    index: ShardIndex | None = None
    layout: Layout | None = field(default=None, compare=False, repr=False)
    parses: dict[str, object] = field(default_factory=dict, compare=False, repr=False)

    def parsed(self, what: str, parse: Callable[[], _T]) -> _T:
        """The container parsed once (``zip``, ``header``), shared by every reader that asks."""
        if what not in self.parses:
            self.parses[what] = parse()
        return cast("_T", self.parses[what])  # what parse made: one parse per name


class NotDescribable(Exception):
    """The reader cannot describe this source without torch: read it with torch instead."""


class Loader(Protocol):
    """What loads a source: a container format's ``Reader``, or the reader a ``Layout`` names."""

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        """The checkpoint, tensors described where the format allows (torch-free)."""
        ...


class Reader(Loader, Protocol):
    """One container format: which files it claims, from their bytes, and how it loads them."""

    format: Format

    def claims(self, source: Source) -> bool: ...


@runtime_checkable
class LayoutReader(Protocol):
    """A layout of files: which paths are one, from names alone, and which files it covers.

    ``layout(folder, names, name, tag)`` answers for ``folder`` itself (``name`` None,
    ``names`` its entries) or for its file ``name`` (``names`` None); None: not this
    layout. It may read a name-bearing file (a ``latest``, a shard index), never a
    checkpoint's bytes, and refuses (``InputError``) a layout it knows to be broken.
    The layout's ``reader`` then loads the source.
    """

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None: ...


def local(path: Where, fmt: Format | None = None) -> Path:
    """``path`` where a reader reads files on this machine (a DCP, DeepSpeed or rank-file
    folder): their layouts name local folders only and ``resolve_url`` refuses a remote
    one, so a remote path here is refused in the same words, never read as the local path
    its redacted URL spells."""
    if isinstance(path, Path):
        return path
    raise InputError(f"is a {fmt or 'checkpoint'} folder, which is read from local files; "
                     "remote sources are files, shard sets and model folders: download the "
                     "folder and read it locally", path)


def refusal(exc: PickleRefused, path: os.PathLike[str]) -> CkptportError:
    """A pickle refusal in the words of the error family, naming the file."""
    named = exc.names or tuple(n for n in exc.seen if _is_code(n.resolved))
    spellings = {n.resolved: n.raw for n in named if n.raw != n.resolved}
    if exc.names:
        return UnsafeCheckpointError(path, tuple(n.resolved for n in named), str(exc),
                                     spellings)
    return InputError(str(exc), path, dangerous=tuple(n.resolved for n in named),
                      spellings=spellings)


def _is_code(name: str) -> bool:
    from ..unpickle import Kind, allowed_names, classify

    return classify(name, False, allowed_names()) is Kind.CODE


def pickle_facts(path: Where, fmt: Format, size: int, tree: Tree,
                 pickles: Iterable[Unpickled], *, trusted: bool = False,
                 files: tuple[Where, ...] = (), metadata: dict[str, str] | None = None
                 ) -> SourceFacts:
    """Source facts from the pickles a file was read from."""
    pickles = list(pickles)
    locations: Counter[str] = Counter()
    names: dict[str, str] = {}
    dangerous: dict[str, None] = {}
    unproven: dict[str, None] = {}
    for unpickled in pickles:
        locations.update(info.location for info in unpickled.storages.values())
        for name in unpickled.globals:
            names.setdefault(name.resolved, name.raw)
        dangerous.update(dict.fromkeys(n.resolved for n in unpickled.dangerous))
        unproven.update(dict.fromkeys(unpickled.unproven))
    return SourceFacts(
        path=path, format=fmt, size=size, storage_locations=dict(sorted(locations.items())),
        globals=tuple(names),
        shared_storages=shared_storages(tree) if any(u.shares_storages for u in pickles) else (),
        metadata=metadata or {}, trusted=trusted, refused_globals=tuple(dangerous),
        files=files, spellings={k: v for k, v in names.items() if k != v},
        unproven=tuple(unproven), materialized=sum(u.materialized for u in pickles),
        largest=largest(item for u in pickles for item in u.largest))
