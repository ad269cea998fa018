"""What every reader shares: the source resolved once, the options, the interface.

A ``Source`` is what a path names, decided once: a checkpoint file (its
container sniffed from its bytes, opened for positional reads), a shard
set (its index parsed), a DCP folder. A ``Reader`` claims sources and
loads them into a ``Checkpoint`` whose tensors are described
(``TensorInfo``, read by position when needed) wherever the format allows;
``ckptport.read`` turns those into torch tensors afterwards, so the
torch-free path (inspect, check, manifest) and the torch path (normalize,
diff, read) start from the same parse of the same bytes.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..checkpoint import Checkpoint, Format, SourceFacts, shared_storages
from ..errors import CkptportError, InputError, UnsafeCheckpointError
from ..sources import SourceFile
from ..unpickle import PickleRefused, Unpickled
from .budget import largest

if TYPE_CHECKING:
    from ..containers.shard_index import ShardIndex

__all__ = ["ReadOptions", "SourceKind", "Source", "Reader", "refusal", "pickle_facts",
           "NotDescribable"]


@dataclass(frozen=True)
class ReadOptions:
    """How to read: ``trust`` unpickles with full Python (runs code; the user vouched);
    ``lenient`` (reports) keeps code-running globals as inert records so they can be
    named, instead of refusing the file. Nothing is ever run without ``trust``.
    """

    trust: bool = False
    lenient: bool = False
    max_expansion: float | None = None  # readers.budget's ratio (None: the default)


class SourceKind(str, enum.Enum):
    FILE = "file"
    SHARDS = "shards"
    DCP = "dcp"
    DEEPSPEED = "deepspeed"
    RANKS = "ranks"


@dataclass(frozen=True)
class Source:
    """A path resolved once: what it is, the file to read, every file its bytes come from.

    ``file`` is the open checkpoint file (single-file sources), ``format``
    its container from its bytes; ``index`` the parsed shard index.
    """

    path: Path
    kind: SourceKind
    main: Path
    files: tuple[Path, ...]
    format: Format | None = None
    file: SourceFile | None = None
    index: ShardIndex | None = None
    parses: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def parsed(self, what: str, parse: Callable[[], Any]) -> Any:
        """The container parsed once (``zip``, ``header``), shared by every reader that asks."""
        if what not in self.parses:
            self.parses[what] = parse()
        return self.parses[what]


class NotDescribable(Exception):
    """The reader cannot describe this source without torch: read it with torch instead."""


class Reader(Protocol):
    """One container format: which sources it claims, and how it loads them."""

    format: Format

    def claims(self, source: Source) -> bool: ...

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        """The checkpoint, tensors described where the format allows (torch-free)."""
        ...


def refusal(exc: PickleRefused, path: Path) -> CkptportError:
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


def pickle_facts(path: Path, fmt: Format, size: int, tree: Any,
                 pickles: Iterable[Unpickled], *, trusted: bool = False,
                 files: tuple[Path, ...] = (), metadata: dict[str, str] | None = None
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
