"""The unpickler: CPython's C unpickler, with every global answered by ckptport.

Why this cannot run code from the file. A pickle can only do what its
opcodes do: push values, build containers, look up a global
(``find_class``), call what is on the stack (``REDUCE``/``NEWOBJ``/
``INST``/``OBJ``), set an object's state (``BUILD``) and ask for a
persistent object (``persistent_load``). Here:

- ``find_class`` is ckptport's: it imports nothing the file names (only
  torch's own modules, to see what a torch name reaches: ``reach``). A name
  resolves (``names.resolve``) to a checked wrapper (``Allowed``), an inert
  marker, or a fresh stand-in class that records what the file does with
  it; a name that reaches code (``names.judge``) is refused on sight (or,
  for ``inspect``/``check``, recorded so the report can name it), and so
  is a ``getattr`` that reaches code or a call of a resolved function;
- ``persistent_load`` is ckptport's: it only resolves storage records the
  container located;
- so every callable the pickle can reach is one of ckptport's wrappers or
  stand-ins, and every object it can ``BUILD`` is a builtin container,
  a frozen slotted stand-in, or a record whose ``__setstate__`` checks
  its argument (``values``).

Before unpickling, ``scan`` walks the opcodes so that nothing the C
unpickler would allocate from a lying length is reached, and the C stack
is sized for the deepest tuple the data could build (tuples hash
recursively in C). After it, ``settle`` checks the tree's shape and turns
stand-ins into the tree's vocabulary.
"""

from __future__ import annotations

import io
import pickle
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from ..dtypes import DType
from ..tensors import StorageInfo
from ..tree import Tree, paused_gc
from . import names
from .allowed import allowed_names, getattr_record, table
from .names import Kind, Name
from .scan import Scan, ScanError, scan, tuple_depth_bound
from .settle import Settled, settle
from .torch_values import storage_class
from .values import Allowed, CodeReached, Marker, Recorded, Refusal, StorageRef, record_class

__all__ = ["Unpickled", "PickleRefused", "StorageHook", "unpickle", "allowed_names",
           "REFUSED_PREFIX", "bounded"]

REFUSED_PREFIX = "refused: the file needs globals outside the weights-only allowlist:"
SAFE_TUPLE_DEPTH = 20_000  # nesting the default C stack survives with a wide margin
STACK_BYTES_PER_LEVEL = 160
MAX_STACK = 1 << 30
_MAX_LEVELS = (MAX_STACK - (8 << 20)) // STACK_BYTES_PER_LEVEL  # what the biggest stack holds
_STORAGE_KEY = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_LOCATION = re.compile(r"[a-z_]{1,32}(:\d{1,6})?")

StorageHook = Callable[[str, DType, str, int], StorageInfo]


class PickleRefused(Exception):
    """The pickle is refused; ``names`` are the code-running globals it named, if any.

    ``position`` is where a malformed pickle went wrong; ``seen`` every
    global resolved before that point (reports name them even then).
    """

    def __init__(self, message: str, names_: tuple[Name, ...] = (),
                 seen: tuple[Name, ...] = (), position: int | None = None,
                 truncated: bool = False) -> None:
        super().__init__(message)
        self.names = names_
        self.seen = seen
        self.position = position
        self.truncated = truncated  # the data ran out: a longer read may complete it


@dataclass(frozen=True)
class Unpickled:
    """A pickle read: its settled value and every fact reports need about it."""

    value: Tree
    scan: Scan
    globals: tuple[Name, ...]
    dangerous: tuple[Name, ...] = ()
    unproven: tuple[str, ...] = ()  # unknown names called without proof they are classes
    calls: tuple[str, ...] = ()  # recorded calls normalize refuses
    storages: dict[str, StorageInfo] = field(default_factory=dict)
    shares_storages: bool = False  # some storage is referenced by more than one tensor
    materialized: int = 0  # bytes its tensors hold once made real, each view on its own
    largest: tuple[tuple[str, int], ...] = ()  # its biggest tensors: (path, bytes)


# -- one load -------------------------------------------------------------------------


@dataclass(frozen=True)
class _CodeHook:
    """What a load does when the file reaches code through an attribute or a call:
    refuses it, or (a report's lenient read) records the name."""

    lenient: bool
    seen: dict[str, Name]
    dangerous: dict[str, Name]

    def __call__(self, name: str, message: str) -> None:
        if not self.lenient:
            raise CodeReached(f"{REFUSED_PREFIX.removesuffix(':')}: {message}", name)
        self.dangerous.setdefault(name, self.seen.get(name) or Name(name, name))


class _Load:
    """The state of unpickling one pickle: what it named, made and asked for."""

    def __init__(self, protocol: int, storage: StorageHook | None, lenient: bool,
                 module_sources: bool = False) -> None:
        self.protocol, self.storage_hook, self.lenient = protocol, storage, lenient
        self.module_sources = module_sources
        self.table = table()
        self.allowed = allowed_names()
        self.seen: dict[str, Name] = {}
        self.dangerous: dict[str, Name] = {}
        self.registry: list[Recorded] = []
        self.classes: dict[str, type[Recorded]] = {}
        self.storages: dict[str, StorageRef] = {}
        self.references: Counter[str] = Counter()  # persistent loads per storage
        # neither holds the load itself: a cycle would keep every storage alive past the load
        self.code = code = _CodeHook(lenient, self.seen, self.dangerous)
        self.getattr = Allowed("builtins.getattr", lambda target=None, name=None, *default:
                               getattr_record(target, name, default, code))

    def find(self, module: str, name: str) -> object:
        resolved = names.resolve(module, name, self.protocol)
        self.seen.setdefault(resolved.resolved, resolved)
        if "Storage" in name:  # torch resolves these by name, whatever the module says
            marker = storage_class(name)
            if marker is not None:
                return marker
        if resolved.resolved == "builtins.getattr":
            return self.getattr
        value = self.table.get(resolved.resolved)
        if value is not None:
            return value
        verdict = names.judge(resolved.resolved, "." in name, self.allowed)
        dangerous = verdict.kind is Kind.CODE
        if dangerous:
            if resolved.resolved not in names.RECOGNIZED_CALLS and not self.lenient:
                raise PickleRefused(f"{REFUSED_PREFIX} {resolved}"
                                    f"{verdict.reaches(resolved.resolved)}, which can run code; "
                                    "nothing was run", (resolved,))
            self.dangerous.setdefault(resolved.resolved, resolved)
        made = self.classes.get(resolved.resolved)
        if made is None:
            made = record_class(resolved.resolved, dangerous, self.registry, self.lenient,
                                runs=verdict.called, on_code=self.code)
            self.classes[resolved.resolved] = made
        return made

    def persistent(self, pid: object) -> StorageRef | type[Recorded]:
        if self.module_sources and isinstance(pid, tuple) and pid and \
                pid[0] in ("module", b"module"):
            return _module_class(pid)
        if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage", b"storage"):
            shown = pid[0] if isinstance(pid, tuple) and pid else type(pid).__name__
            raise Refusal(f"a persistent id other than a storage ({shown!r})")
        if self.storage_hook is None:
            raise Refusal("a persistent id where none is expected")
        if len(pid) not in (5, 6) or (len(pid) == 6 and pid[5] is not None):
            raise Refusal(f"a malformed storage persistent id of {len(pid)} fields")
        _, storage_type, key, location, numel = pid[:5]
        if isinstance(location, bytes):
            location = location.decode("ascii", "replace")
        if isinstance(key, bytes):
            key = key.decode("ascii", "replace")
        if not (isinstance(storage_type, Marker) and storage_type.kind == "storage"
                and storage_type.dtype is not None):
            raise Refusal(f"a storage of type {type(storage_type).__name__}")
        if not (isinstance(key, str) and _STORAGE_KEY.fullmatch(key) and isinstance(location, str)
                and _LOCATION.fullmatch(location) and type(numel) is int and numel >= 0):
            raise Refusal("a malformed storage persistent id")
        dtype = storage_type.dtype
        known = self.storages.get(key)
        self.references[key] += 1
        if known is not None:
            if known.dtype != dtype or known.info.declared_bytes != numel * dtype.itemsize:
                raise Refusal(f"storage {key} is declared twice, differently")
            return known
        info = self.storage_hook(key, dtype, location, numel)
        ref = StorageRef(info, dtype)
        self.storages[key] = ref
        return ref


def _module_class(pid: tuple[object, ...]) -> type[Recorded]:
    """A legacy file's ``('module', class, source_file, source)``: torch.save(model) records
    each module class's source this way and ``torch.load`` only compares it with the
    installed source (a warning). The class is the data: the stand-in ``find_class`` made."""
    if len(pid) != 4 or not (isinstance(pid[1], type) and issubclass(pid[1], Recorded)) or \
            not all(part is None or isinstance(part, (str, bytes)) for part in pid[2:]):
        raise Refusal("a persistent id other than a storage or a module class's source record "
                      "('module', class, file, source)")
    return pid[1]


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: BinaryIO, load: _Load) -> None:
        super().__init__(file, encoding="utf-8")  # what torch.load passes
        self._load = load

    def find_class(self, module: str, name: str) -> object:  # noqa: D102 - the gate itself
        return self._load.find(module, name)

    def persistent_load(self, pid: object) -> object:
        return self._load.persistent(pid)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, TypeError) and "does not support item assignment" in text:
        kind = text.split("'")[1] if "'" in text else "object"
        kind = "argparse.Namespace" if kind == "Namespace" else kind
        return f"SETITEM on a {kind}, not a dict"
    if isinstance(exc, TypeError) and "unhashable type" in text:
        return f"a dict key or set item that cannot be one ({text})"
    if isinstance(exc, MemoryError):
        return "it asks for more memory than there is"
    return text


def bounded(data: bytes, found: Scan,
            unpickler: Callable[[BinaryIO], pickle.Unpickler]) -> Tree:
    """Run ``unpickler(stream).load()`` over a scanned pickle with the C stack it may need.

    Collection passes are paused (millions of small containers make them
    dominate), and a pickle that could nest tuples deeply is unpickled in a
    thread whose stack holds that depth (tuples hash recursively in C).
    """
    window = io.BufferedReader(io.BytesIO(memoryview(data)[found.start:found.end]),
                               buffer_size=max(found.end - found.start, 1))
    result: list[Tree] = []
    failure: list[BaseException] = []

    def work() -> None:
        with paused_gc():
            try:
                result.append(unpickler(window).load())
            except BaseException as exc:  # re-raised below, in the calling thread
                failure.append(exc)

    depth = tuple_depth_bound(data, found.start, found.end, _MAX_LEVELS)
    if depth <= SAFE_TUPLE_DEPTH:
        work()
    else:
        _in_big_stack(work, depth)
    if failure:
        raise failure[0]
    return result[0]


def _in_big_stack(work: Callable[[], None], depth: int) -> None:
    """Run ``work`` in a thread whose C stack holds ``depth`` levels of tuple hashing."""
    size = depth * STACK_BYTES_PER_LEVEL + (8 << 20)
    if size > MAX_STACK:
        raise PickleRefused(f"the pickle could nest tuples {depth} deep, more than ckptport "
                            "will hash safely")
    previous = threading.stack_size(size - size % 4096)
    try:
        worker = threading.Thread(target=work, name="ckptport-unpickle")
        worker.start()
    finally:
        threading.stack_size(previous)
    worker.join()


def _run(data: bytes, found: Scan, load: _Load) -> Tree:
    """C-unpickle one scanned pickle; returns the value or raises ``PickleRefused``."""
    try:
        return bounded(data, found, lambda stream: _Unpickler(stream, load))
    except (PickleRefused, KeyboardInterrupt, SystemExit):
        raise
    except CodeReached as exc:
        reached = load.seen.get(exc.name) or Name(exc.name, exc.name)
        raise PickleRefused(str(exc), (reached,), seen=tuple(load.seen.values())) from None
    except Refusal as exc:
        raise PickleRefused(str(exc), seen=tuple(load.seen.values())) from None
    except BaseException as exc:
        raise PickleRefused(f"corrupt pickle: {_describe(exc)}",
                            seen=tuple(load.seen.values())) from None


def unpickle(data: bytes, start: int = 0, *, storage: StorageHook | None = None,
             lenient: bool = False, module_sources: bool = False) -> Unpickled:
    """Read the pickle at ``data[start:]`` without running anything from it.

    ``storage(key, dtype, location, numel)`` locates a persistent storage in
    the container. ``lenient`` (``inspect``, ``check``) records code-running
    globals instead of refusing them; nothing is run either way.
    ``module_sources``: the pickle may record module classes' sources as
    persistent ids (legacy ``torch.save(model)``).
    """
    try:
        found = scan(data, start)
    except ScanError as exc:
        seen = _names_before(data, start, exc.position, storage) if lenient else ()
        raise PickleRefused(str(exc), seen=seen, position=exc.position,
                            truncated=exc.truncated) from None
    load = _Load(found.protocol, storage, lenient, module_sources)
    value = _run(data, found, load)
    try:
        with paused_gc():
            settled: Settled = settle(value, load.registry)
    except Refusal as exc:
        raise PickleRefused(str(exc), seen=tuple(load.seen.values())) from None
    if settled.calls and not lenient:
        first = settled.calls[0]
        raise PickleRefused(f"{REFUSED_PREFIX} {load.seen.get(first, Name(first, first))}, "
                            "which the file calls to build a value: torch.load would run it, "
                            "ckptport never does; nothing was run",
                            (load.seen.get(first, Name(first, first)),))
    return Unpickled(settled.value, found, tuple(load.seen.values()),
                     tuple(load.dangerous.values()), settled.unproven, settled.calls,
                     {key: ref.info for key, ref in load.storages.items()},
                     any(count > 1 for count in load.references.values()),
                     settled.materialized, settled.largest)


def _names_before(data: bytes, start: int, end: int, storage: StorageHook | None
                  ) -> tuple[Name, ...]:
    """The globals a broken pickle names before it breaks: what ``torch.load`` would reach."""
    if end <= start:
        return ()
    load = _Load(_protocol(data, start), storage, lenient=True)
    truncated = bytes(data[start:end]) + b"."  # the unpickler stops here at the latest
    try:
        _run(truncated, Scan(0, len(truncated), load.protocol), load)
    except PickleRefused:
        pass
    return tuple(load.seen.values())


def _protocol(data: bytes, start: int) -> int:
    return data[start + 1] if len(data) > start + 1 and data[start] == 0x80 else 0
