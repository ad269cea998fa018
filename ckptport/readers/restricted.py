"""ckptport's own unpickler, for files the weights-only fast path refuses.

Since PyTorch 2.6 ``torch.load`` refuses most training checkpoints
(argparse, omegaconf, Lightning hyper-parameters, custom config classes,
pickle protocol 4 and above) and the usual advice, ``weights_only=False``,
runs any code in the file. This module reads such files without running
anything: it is an opcode interpreter (``pickletools.genops`` decodes the
opcodes; the stack machine is ours), so no part of the standard unpickler
ever resolves a name.

- Globals resolve only through the allow-list table (``allowlist``); the
  callables there are wrappers that check their arguments first.
- Any other class becomes an ``ObjectRecord``: its qualified name and the
  data it was pickled with, inert, reported by name; a function that is not
  allowed is never called: the load is refused naming it.
- Globals that can run code (``is_dangerous``) are refused on sight.
- Tensors are rebuilt by torch's own rebuild functions from storages that
  are lazy slices of a private memory map of the file, after ckptport has
  checked that every view stays inside its storage.
- ``lenient`` (for ``inspect`` and ``check``) records refused calls and
  dangerous globals instead of raising, so a report can name them all;
  nothing is run in either mode.
"""

from __future__ import annotations

import math
import mmap
import pickletools
import re
import sys
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from ..checkpoint import Format, format_path, iter_tensors
from ..errors import InputError, UnsafeCheckpointError
from . import allowlist
from .allowlist import Allowed, RestrictedArgumentError

__all__ = ["ObjectRecord", "GlobalRef", "Backref", "RestrictedLoad", "load_restricted",
           "settle", "check_tensor_sizes", "MAX_NODES", "MAX_DEPTH", "TorchRebuilders",
           "unpickle_zip_data", "REBUILD_NAMES", "Refused"]

MAX_NODES = 10_000_000  # objects the tree may expand to when shared references are followed
MAX_DEPTH = 300  # nesting ckptport's recursive rules handle without exhausting the stack
MAX_TENSOR_BYTES_OVER_STORAGE = 1 << 30  # an expanded view may outgrow its storage by this
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_STORAGE_KEY = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_COMPAT_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}
_REFUSED = "refused: the file needs globals outside the weights-only allowlist:"
_UNSUPPORTED_OPS = {"EXT1", "EXT2", "EXT4", "NEXT_BUFFER", "READONLY_BUFFER"}


@dataclass(frozen=True)
class GlobalRef:
    """A global outside the allow-list, kept by name; it was never imported."""

    name: str
    dangerous: bool = False


@dataclass(eq=False)
class ObjectRecord:
    """An instance of a class outside the allow-list: its name and its pickled data.

    ``kind`` is ``instance`` for a class, ``call`` for a refused function
    call kept only in lenient mode. Mutable while the pickle fills it in
    (``BUILD``, ``SETITEMS``, ``APPENDS``); plain data once loaded.
    """

    name: str
    kind: str = "instance"
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    state: Any = None
    items: dict[Any, Any] = field(default_factory=dict)
    listitems: list[Any] = field(default_factory=list)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Backref:
    """Where a reference cycle (``child._parent`` back to its parent) was cut."""

    target: str


@dataclass(frozen=True)
class RestrictedLoad:
    tree: Any
    locations: dict[str, int]
    globals: tuple[str, ...]
    refused: tuple[str, ...]  # dangerous globals and refused calls (lenient mode only)


@dataclass(frozen=True)
class _Copyreg:
    """``copyreg`` helpers pickle emits for ``object.__reduce_ex__``; handled inline."""

    name: str


_COPYREG = {f"copyreg.{n}": _Copyreg(n) for n in ("_reconstructor", "__newobj__", "__newobj_ex__")}


class _Cursor:
    """A file-like view of bytes or an mmap; ``read(n)`` never allocates past the end."""

    def __init__(self, buf: Any, pos: int = 0, end: int | None = None) -> None:
        self.buf, self.pos = buf, pos
        self.end = len(buf) if end is None else end

    def read(self, n: int = -1) -> bytes:
        stop = self.end if n < 0 else min(self.end, self.pos + n)
        data = bytes(self.buf[self.pos:stop])
        self.pos = stop
        return data

    def readline(self) -> bytes:
        nl = self.buf.find(b"\n", self.pos, self.end)
        return self.read(self.end - self.pos if nl < 0 else nl + 1 - self.pos)

    def tell(self) -> int:
        return self.pos


class _Refused(Exception):
    """A refusal inside the machine; ``load_restricted`` turns it into the error type."""

    def __init__(self, message: str, names: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.names = names


class _Machine:
    """The pickle stack machine: one instance per pickle."""

    def __init__(self, table: dict[str, Any], persistent_load: Callable[[Any], Any] | None,
                 lenient: bool, seen: dict[str, None], refused: dict[str, None]) -> None:
        self.table, self.persistent_load, self.lenient = table, persistent_load, lenient
        self.seen, self.refused = seen, refused
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}

    def load(self, cursor: _Cursor) -> Any:
        frame_end = -1
        try:
            for opcode, arg, pos in pickletools.genops(cast(IO[bytes], cursor)):
                assert pos is not None  # genops gives positions for a stream with tell()
                if pos < frame_end < cursor.pos:  # genops has read the opcode's argument
                    raise _Refused(f"an opcode at byte {pos} crosses the end of its FRAME")
                name = opcode.name
                if name == "FRAME":
                    if pos < frame_end:
                        raise _Refused(f"a FRAME at byte {pos} starts inside another frame")
                    frame_end = cursor.pos + cast(int, arg)
                    if frame_end > cursor.end:
                        raise _Refused(f"a FRAME at byte {pos} claims {arg} bytes but only "
                                       f"{cursor.end - cursor.pos} remain")
                elif name == "STOP":
                    if len(self.stack) != 1 or self.marks:
                        raise _Refused("the pickle stops with a malformed stack")
                    return self.stack.pop()
                else:
                    self.step(name, arg)
        except (ValueError, EOFError, OverflowError) as exc:
            raise _Refused(f"corrupt pickle: {exc}") from None
        except (IndexError, KeyError) as exc:
            raise _Refused(f"corrupt pickle: {type(exc).__name__} {exc}") from None
        except TypeError as exc:  # unhashable dict keys and the like
            raise _Refused(f"corrupt pickle: {exc}") from None
        raise _Refused("the pickle has no STOP")

    # -- the stack -----------------------------------------------------------

    def pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def step(self, name: str, arg: Any) -> None:
        stack = self.stack
        if name == "PROTO":
            if not 0 <= arg <= 5:
                raise _Refused(f"unsupported pickle protocol {arg}")
        elif name in _CONSTANTS:
            stack.append(_CONSTANTS[name]())
        elif name in _ARG_PUSH:
            stack.append(bytearray(arg) if name == "BYTEARRAY8" else arg)
        elif name == "MARK":
            self.marks.append(stack)
            self.stack = []
        elif name == "POP":
            if stack:
                stack.pop()
            else:
                self.pop_mark()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            stack.append(stack[-1])
        elif name in ("LIST", "TUPLE", "FROZENSET"):
            kind = {"LIST": list, "TUPLE": tuple, "FROZENSET": frozenset}[name]
            items = self.pop_mark()
            self.stack.append(kind(items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(stack) < n:
                raise IndexError("stack underflow")
            packed = tuple(stack[-n:])
            del stack[-n:]
            stack.append(packed)
        elif name == "DICT":
            items = self.pop_mark()
            self.stack.append(dict(zip(items[::2], items[1::2], strict=True)))
        elif name in ("APPEND", "APPENDS"):
            items = [stack.pop()] if name == "APPEND" else self.pop_mark()
            self.extend(self.stack[-1], items)
        elif name in ("SETITEM", "SETITEMS"):
            items = stack[-2:] if name == "SETITEM" else self.pop_mark()
            if name == "SETITEM":
                del stack[-2:]
            self.set_items(self.stack[-1], items)
        elif name == "ADDITEMS":
            items = self.pop_mark()
            target = self.stack[-1]
            if type(target) is not set:
                raise _Refused(f"ADDITEMS on a {type(target).__name__}, not a set")
            target.update(items)
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if arg not in self.memo:
                raise _Refused(f"the pickle reads memo entry {arg}, which was never stored")
            stack.append(self.memo[arg])
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            self.memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = stack[-1]
        elif name in ("PERSID", "BINPERSID"):
            pid = arg if name == "PERSID" else stack.pop()
            if self.persistent_load is None:
                raise _Refused("a persistent id where none is expected")
            self.stack.append(self.persistent_load(pid))
        elif name in ("GLOBAL", "INST"):
            module, _, qualname = arg.partition(" ")
            target = self.resolve(module, qualname)
            if name == "GLOBAL":
                stack.append(target)
            else:
                self.stack.append(self.call(target, tuple(self.pop_mark())))
        elif name == "STACK_GLOBAL":
            qualname, module = stack.pop(), stack.pop()
            if not isinstance(module, str) or not isinstance(qualname, str):
                raise _Refused("STACK_GLOBAL with a module or name that is not a string")
            stack.append(self.resolve(module, qualname))
        elif name == "REDUCE":
            args = stack.pop()
            func = stack.pop()
            stack.append(self.call(func, args))
        elif name == "OBJ":
            items = self.pop_mark()
            self.stack.append(self.call(items[0], tuple(items[1:])))
        elif name in ("NEWOBJ", "NEWOBJ_EX"):
            kwargs = stack.pop() if name == "NEWOBJ_EX" else {}
            args = stack.pop()
            cls = stack.pop()
            stack.append(self.new(cls, args, kwargs))
        elif name == "BUILD":
            state = stack.pop()
            self.build(stack[-1], state)
        else:
            why = "is not supported" if name in _UNSUPPORTED_OPS else "is unknown"
            raise _Refused(f"pickle opcode {name} {why}")

    # -- globals, calls, objects ---------------------------------------------

    def resolve(self, module: str, qualname: str) -> Any:
        module = _COMPAT_MODULES.get(module, module)
        name = f"{module}.{qualname}"
        self.seen[name] = None
        if name in self.table:
            return self.table[name]
        if name in _COPYREG:
            return _COPYREG[name]
        if not allowlist.is_dangerous(name):
            return GlobalRef(name)
        if not self.lenient:
            raise _Refused(f"{_REFUSED} {name}, which can run code; nothing was run", (name,))
        self.refused[name] = None
        return GlobalRef(name, dangerous=True)

    def call(self, func: Any, args: Any) -> Any:
        if not isinstance(args, tuple):
            raise _Refused(f"a call with arguments of type {type(args).__name__}, not a tuple")
        if isinstance(func, Allowed):
            return self.allowed(func, args)
        if isinstance(func, _Copyreg):
            if func.name == "_reconstructor" and len(args) == 3:
                cls, _base, value = args
                return self.new(cls, () if value is None else (value,), {})
            if func.name == "__newobj__" and args:
                return self.new(args[0], args[1:], {})
            if func.name == "__newobj_ex__" and len(args) == 3:
                return self.new(*args)
            raise _Refused(f"copyreg.{func.name} with unexpected arguments")
        if isinstance(func, GlobalRef):
            if not func.dangerous and _looks_like_class(func.name):
                return ObjectRecord(func.name, args=args)
            return self.refuse_call(func.name, args, func.dangerous)
        if isinstance(func, ObjectRecord):  # calling what a call returned or an instance
            return self.refuse_call(func.name, args, func.kind == "call")
        raise _Refused(f"the pickle calls a {_kind(func)}, which is not a function")

    def allowed(self, func: Allowed, args: tuple[Any, ...], new: bool = False) -> Any:
        try:
            return func.new(*args) if new and func.new else func.call(*args)
        except (RestrictedArgumentError, TypeError, ValueError, RuntimeError) as exc:
            raise _Refused(f"{func.name}: {exc}") from None

    def refuse_call(self, name: str, args: tuple[Any, ...], dangerous: bool) -> ObjectRecord:
        """Refuse a call; in lenient mode keep it as a record (dangerous names listed)."""
        if not self.lenient:
            raise _Refused(f"{_REFUSED} {name}, a function ckptport never calls; nothing "
                           "was run", (name,))
        if dangerous:
            self.refused[name] = None
        return ObjectRecord(name, kind="call", args=args)

    def new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        if not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise _Refused("NEWOBJ with malformed arguments")
        if isinstance(cls, Allowed) and cls.new and not kwargs:
            return self.allowed(cls, args, new=True)
        if isinstance(cls, GlobalRef):
            if cls.dangerous:
                return self.refuse_call(cls.name, args, True)
            return ObjectRecord(cls.name, args=args, kwargs=dict(kwargs))
        raise _Refused(f"the pickle creates a {_kind(cls)} in a way ckptport does not support")

    def extend(self, target: Any, items: list[Any]) -> None:
        if type(target) is list:
            target.extend(items)
        elif isinstance(target, ObjectRecord):
            target.listitems.extend(items)
        else:
            raise _Refused(f"APPEND on a {_kind(target)}, not a list")

    def set_items(self, target: Any, items: list[Any]) -> None:
        if len(items) % 2:
            raise _Refused("SETITEMS with an odd number of items")
        if type(target) in (dict, OrderedDict, Counter):
            pass
        elif isinstance(target, ObjectRecord):
            target = target.items
        else:
            raise _Refused(f"SETITEM on a {_kind(target)}, not a dict")
        for key, value in zip(items[::2], items[1::2], strict=True):
            target[key] = value

    def build(self, target: Any, state: Any) -> None:
        if isinstance(target, ObjectRecord):
            if isinstance(target.state, dict) and isinstance(state, dict):
                target.state.update(state)
            else:
                target.state = state
            return
        try:
            allowlist.build_state(target, state)
        except RestrictedArgumentError as exc:
            raise _Refused(f"BUILD on a {_kind(target)}: {exc}") from None


_CONSTANTS: dict[str, Callable[[], Any]] = {
    "NONE": lambda: None, "NEWTRUE": lambda: True, "NEWFALSE": lambda: False,
    "EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_TUPLE": tuple, "EMPTY_SET": set,
}
_ARG_PUSH = frozenset({
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "BYTEARRAY8", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
})


def _looks_like_class(name: str) -> bool:
    """A CapWords last component: pickle REDUCEs a class to instantiate it."""
    return name.rsplit(".", 1)[-1][:1].isupper()


def _kind(value: Any) -> str:
    if isinstance(value, (GlobalRef, ObjectRecord)):
        return value.name
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


# -- tensors -----------------------------------------------------------------


class TorchRebuilders:
    """Real tensors: torch's own rebuild functions, called once ``_Tensors`` checked the view.

    The restricted unpickler's logic is generic; what a storage, a tensor or
    a parameter becomes is decided by a rebuilders object passed in. This
    one makes torch objects; ``describe.Recorders`` makes descriptions of
    them without importing torch. The methods of both:

    - ``values()``: torch's globals as pickle values (dtypes, storage
      classes, ``torch.Tensor``), keyed by qualified name;
    - ``storage_dtype(value)``: a storage class's dtype, None for other values;
    - ``itemsize(dtype)``; ``typed(untyped, dtype)``: a loader's bytes as a storage
      that has ``size()`` (elements) and ``element_size()``;
    - ``tensor(storage, offset, size, stride, requires_grad, metadata)`` and
      ``legacy_tensor(storage, offset, size, stride)``;
    - ``is_plain_tensor(value)``, ``parameter(data, requires_grad, state)``;
    - ``tensor_types()`` (the classes a tensor may be rebuilt as) and
      ``from_type(func, new_type, args, state)``.
    """

    def values(self) -> dict[str, Any]:
        return {}  # already in ``allowlist.restricted_table``

    def storage_dtype(self, value: Any) -> Any:
        import torch

        if not isinstance(value, type):
            return None
        if issubclass(value, torch.UntypedStorage):
            return torch.uint8
        return value.dtype if issubclass(value, torch.storage._LegacyStorage) else None

    def itemsize(self, dtype: Any) -> int:
        import torch

        return int(torch._utils._element_size(dtype))

    def typed(self, untyped: Any, dtype: Any) -> Any:
        import torch

        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    def tensor(self, storage: Any, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
               requires_grad: bool, metadata: Any) -> Any:
        import torch

        return torch._utils._rebuild_tensor_v2(storage, offset, torch.Size(size), stride,
                                               requires_grad, OrderedDict(), metadata)

    def legacy_tensor(self, storage: Any, offset: int, size: tuple[int, ...],
                      stride: tuple[int, ...]) -> Any:
        import torch

        return torch._utils._rebuild_tensor(storage, offset, torch.Size(size), stride)

    def is_plain_tensor(self, value: Any) -> bool:
        import torch

        return type(value) is torch.Tensor

    def parameter(self, data: Any, requires_grad: bool, state: Any) -> Any:
        import torch

        parameter = torch._utils._rebuild_parameter(data, requires_grad, OrderedDict())
        return torch._utils._set_obj_state(parameter, state) if state else parameter

    def tensor_types(self) -> tuple[Any, ...]:
        import torch

        return torch.Tensor, torch.nn.Parameter

    def from_type(self, func: Any, new_type: Any, args: tuple[Any, ...], state: Any) -> Any:
        import torch

        return torch._tensor._rebuild_from_type_v2(func, new_type, args, state)


class _Tensors:
    """Tensor rebuild entries for the table: argument checks, then the rebuilders' calls.

    Only storages this reader made (``storages``) are accepted, and every
    view must lie inside its storage, so torch never sees a bad offset.
    """

    def __init__(self, rebuilders: Any = None) -> None:
        self.rebuilders = rebuilders if rebuilders is not None else TorchRebuilders()
        self.storages: set[int] = set()

    def entries(self) -> list[Allowed]:
        return [
            Allowed("torch._utils._rebuild_tensor_v2", self.rebuild_v2),
            Allowed("torch._utils._rebuild_tensor", self.rebuild),
            Allowed("torch._utils._rebuild_parameter", self.parameter),
            Allowed("torch._utils._rebuild_parameter_with_state", self.parameter),
            Allowed("torch._tensor._rebuild_from_type_v2", self.from_type),
        ]

    def check_view(self, storage: Any, offset: Any, size: Any, stride: Any) -> None:
        if id(storage) not in self.storages:
            raise RestrictedArgumentError("a tensor over something that is not a storage")
        offset = allowlist.nonnegative_ints((offset,), "storage offset")[0]
        size = allowlist.nonnegative_ints(size, "size")
        stride = allowlist.nonnegative_ints(stride, "stride")
        if len(size) != len(stride):
            raise RestrictedArgumentError(f"size {size} and stride {stride} differ in length")
        numel = math.prod(size)
        itemsize = storage.element_size()
        available = storage.size()
        if numel and offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) >= \
                available:
            raise RestrictedArgumentError(
                f"a tensor of size {size}, stride {stride} at offset {offset} reaches past "
                f"its storage of {available} elements")
        if numel * itemsize > max(available * itemsize, MAX_TENSOR_BYTES_OVER_STORAGE):
            raise RestrictedArgumentError(
                f"a tensor of size {size} would need {numel * itemsize} bytes from a storage "
                f"of {available * itemsize}; refused before allocating")

    def rebuild_v2(self, storage: Any, offset: Any, size: Any, stride: Any,
                   requires_grad: Any, hooks: Any, metadata: Any = None) -> Any:
        self.check_view(storage, offset, size, stride)
        _no_hooks(hooks)
        if type(requires_grad) is not bool or not (metadata is None or _bool_dict(metadata)):
            raise RestrictedArgumentError("malformed tensor flags")
        return self.rebuilders.tensor(storage, offset, tuple(size), tuple(stride),
                                      requires_grad, metadata)

    def rebuild(self, storage: Any, offset: Any, size: Any, stride: Any) -> Any:
        self.check_view(storage, offset, size, stride)
        return self.rebuilders.legacy_tensor(storage, offset, tuple(size), tuple(stride))

    def parameter(self, data: Any, requires_grad: Any, hooks: Any, state: Any = None) -> Any:
        if not self.rebuilders.is_plain_tensor(data) or type(requires_grad) is not bool:
            raise RestrictedArgumentError("a Parameter of something that is not a tensor")
        _no_hooks(hooks)
        _plain_state(state)
        return self.rebuilders.parameter(data, requires_grad, state)

    def from_type(self, func: Any, new_type: Any, args: Any, state: Any) -> Any:
        if not (isinstance(func, Allowed) and func.name.startswith("torch._utils._rebuild")
                and any(new_type is t for t in self.rebuilders.tensor_types())
                and isinstance(args, tuple)):
            raise RestrictedArgumentError("a tensor subclass outside the allow-list")
        _plain_state(state)
        return self.rebuilders.from_type(func, new_type, args, state)


def _no_hooks(hooks: Any) -> None:
    if not isinstance(hooks, dict) or hooks:
        raise RestrictedArgumentError("tensors with backward hooks are not data")


def _bool_dict(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and type(v) is bool for k, v in value.items())


def _plain_state(state: Any) -> None:
    """Parameter state becomes attributes: plain names only, never dunders."""
    if not state:
        return
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and not k.startswith("__") for k in state):
        raise RestrictedArgumentError("tensor state must be a dict of plain attribute names")


# -- storages and containers -------------------------------------------------


@dataclass(frozen=True)
class _Pid:
    dtype: Any
    key: str
    location: str
    numel: int


def _parse_pid(pid: Any, storage_dtype: Callable[[Any], Any], fields: int) -> _Pid:
    if not isinstance(pid, tuple) or not pid or pid[0] not in ("storage", b"storage"):
        shown = pid[0] if isinstance(pid, tuple) and pid else type(pid).__name__
        raise _Refused(f"a persistent id other than a storage ({shown!r})")
    if len(pid) != fields or (fields == 6 and pid[5] is not None):
        raise _Refused(f"a malformed storage persistent id of {len(pid)} fields")
    _, storage_type, key, location, numel = pid[:5]
    dtype = storage_dtype(storage_type)
    if dtype is None:
        raise _Refused(f"a storage of type {_kind(storage_type)}")
    if isinstance(location, bytes):
        location = location.decode("ascii", "replace")
    if not (isinstance(key, str) and _STORAGE_KEY.fullmatch(key) and isinstance(location, str)
            and type(numel) is int and numel >= 0):
        raise _Refused("a malformed storage persistent id")
    return _Pid(dtype, key, location, numel)


class _Storages:
    """The persistent loader: a typed storage per key, made when the pickle first names it.

    ``make(pid, nbytes)`` returns the untyped bytes: a slice of a private
    memory map of the file, or a meta storage (sizes without memory), or
    (``describe``) a record of where they are; ``tensors.rebuilders`` types them.
    Only values of the table are accepted as storage types.
    """

    def __init__(self, tensors: _Tensors, table: dict[str, Any], fields: int,
                 make: Callable[[_Pid, int], Any]) -> None:
        self.tensors, self.fields, self.make = tensors, fields, make
        rebuilders = tensors.rebuilders
        known = {id(v): rebuilders.storage_dtype(v) for v in table.values()
                 if not isinstance(v, Allowed)}
        self.storage_dtype: Callable[[Any], Any] = lambda value: known.get(id(value))
        self.cache: dict[str, Any] = {}
        self.declared: dict[str, _Pid] = {}
        self.locations: Counter[str] = Counter()

    def __call__(self, pid: Any) -> Any:
        parsed = _parse_pid(pid, self.storage_dtype, self.fields)
        if parsed.key not in self.cache:
            rebuilders = self.tensors.rebuilders
            nbytes = parsed.numel * rebuilders.itemsize(parsed.dtype)
            typed = rebuilders.typed(self.make(parsed, nbytes), parsed.dtype)
            self.cache[parsed.key] = typed
            self.declared[parsed.key] = parsed
            self.tensors.storages.add(id(typed))
            self.locations[parsed.location] += 1
        return self.cache[parsed.key]


def _file_slicer(path: Path, locate: Callable[[_Pid, int], int],
                 swap: bool = False) -> Callable[[_Pid, int], Any]:
    """Storages as slices of one copy-on-write map of the file: nothing is read yet."""
    import torch

    size = path.stat().st_size
    overall = torch.UntypedStorage.from_file(str(path), False, size)

    def make(pid: _Pid, nbytes: int) -> Any:
        offset = locate(pid, nbytes)
        if not nbytes:
            return torch.UntypedStorage(0)
        untyped = overall[offset:offset + nbytes]
        if swap:
            untyped.byteswap(pid.dtype)
        return untyped

    return make


def _meta(pid: _Pid, nbytes: int) -> Any:
    import torch

    return torch.UntypedStorage(nbytes, device="meta")


def _load_zip(path: Path, lenient: bool, seen: dict[str, None],
              refused: dict[str, None]) -> tuple[Any, Counter[str]]:
    import torch

    try:
        reader: Any = torch._C.PyTorchFileReader(str(path))  # the stubs lack has_record
        data = reader.get_record("data.pkl")
        order = reader.get_record("byteorder") if reader.has_record("byteorder") else b"little"
    except RuntimeError as exc:
        raise _Refused(f"corrupt zip: {_first_line(exc)}") from None

    def locate(pid: _Pid, nbytes: int) -> int:
        name = f"data/{pid.key}"
        try:
            if not reader.has_record(name):
                raise _Refused(f"storage record {name} is missing from the archive")
            size = reader.get_record_size(name)
            if size < nbytes:
                raise _Refused(f"storage record {name} holds {size} bytes but the pickle "
                               f"declares {nbytes}")
            return int(reader.get_record_offset(name))
        except RuntimeError as exc:  # a record torch cannot locate: compressed, encrypted
            raise _Refused(f"corrupt zip record {name}: {_first_line(exc)}") from None

    swap = bytes(order).decode("ascii", "replace") != sys.byteorder
    return unpickle_zip_data(data, _file_slicer(path, locate, swap), lenient=lenient,
                             seen=seen, refused=refused)


def unpickle_zip_data(data: bytes, make: Callable[[_Pid, int], Any], *, lenient: bool,
                      seen: dict[str, None], refused: dict[str, None],
                      rebuilders: Any = None) -> tuple[Any, Counter[str]]:
    """A torch zip's ``data.pkl`` through the machine: (tree, storage locations).

    ``make(pid, nbytes)`` locates a storage's bytes in the archive (and
    checks the record holds them); ``rebuilders`` decides what storages and
    tensors become (``TorchRebuilders`` by default). ``seen`` and
    ``refused`` collect the globals met. Raises ``_Refused``.
    """
    tensors = _Tensors(rebuilders)
    table = allowlist.restricted_table(tensors.entries(), tensors.rebuilders.values())
    storages = _Storages(tensors, table, 5, make)
    cursor = _Cursor(data)
    tree = _Machine(table, storages, lenient, seen, refused).load(cursor)
    if cursor.pos != cursor.end:
        raise _Refused(f"{cursor.end - cursor.pos} bytes of trailing data after the pickle's "
                       "STOP in data.pkl")
    return tree, storages.locations


def _load_legacy(path: Path, lenient: bool, seen: dict[str, None],
                 refused: dict[str, None]) -> tuple[Any, Counter[str]]:
    """The legacy layout: magic, protocol, sys info, the object, storage keys, raw storages.

    Storage offsets are known only once the object pickle has been read, so
    it is read twice: first over meta storages (every check, no memory) to
    learn each storage's dtype and size, then over the file's bytes.
    """
    tensors = _Tensors()
    table = allowlist.restricted_table(tensors.entries())
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cursor = _Cursor(buf)
        header = [_Machine(table, None, False, {}, {}).load(cursor) for _ in range(3)]
        if header[0] != LEGACY_MAGIC or header[1] != LEGACY_PROTOCOL:
            raise _Refused("not a torch legacy checkpoint (bad magic number or protocol)")
        if not isinstance(header[2], dict) or header[2].get("little_endian") is not True:
            raise _Refused("a big-endian or malformed legacy checkpoint")
        start = cursor.pos
        dry = _Storages(tensors, table, 6, _meta)
        _Machine(table, dry, lenient, {}, {}).load(cursor)
        keys = _Machine(table, None, False, {}, {}).load(cursor)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _Refused("malformed storage key list")
        offsets = _legacy_offsets(buf, cursor.pos, keys, dry.declared)

        def locate(pid: _Pid, nbytes: int) -> int:
            if pid.key not in offsets:
                raise _Refused(f"storage {pid.key} is missing from the file")
            return offsets[pid.key]

        storages = _Storages(tensors, table, 6, _file_slicer(path, locate))
        tree = _Machine(table, storages, lenient, seen, refused).load(_Cursor(buf, start))
    return tree, storages.locations


def _legacy_offsets(buf: Any, pos: int, keys: list[str],
                    declared: dict[str, _Pid]) -> dict[str, int]:
    rebuilders = TorchRebuilders()
    missing = [key for key in declared if key not in keys]
    if missing:
        raise _Refused(f"storage {missing[0]} is missing from the file")
    offsets = {}
    for key in keys:
        if key not in declared:
            raise _Refused(f"storage {key} is listed but no tensor declares it")
        pid = declared[key]
        if pos + 8 > len(buf):
            raise _Refused(f"storage {key} is missing: the file ends at byte {len(buf)}")
        count = int.from_bytes(buf[pos:pos + 8], "little", signed=True)
        nbytes = pid.numel * rebuilders.itemsize(pid.dtype)
        if count != pid.numel:
            raise _Refused(f"storage {key} holds {count} elements but the pickle declares "
                           f"{pid.numel}")
        if pos + 8 + nbytes > len(buf):
            raise _Refused(f"storage {key} runs past the end of the file (truncated)")
        offsets[key] = pos + 8
        pos += 8 + nbytes
    if pos != len(buf):
        raise _Refused(f"{len(buf) - pos} bytes of trailing data after the last storage")
    return offsets


# -- the tree after loading --------------------------------------------------


def _children(node: Any) -> Iterator[tuple[Any, Any]]:
    """(slot, child) pairs; slot None where the container cannot be changed."""
    if isinstance(node, dict):
        yield from node.items()
    elif isinstance(node, list):
        yield from enumerate(node)
    elif isinstance(node, (tuple, set, frozenset)):
        for child in node:
            yield None, child
    elif isinstance(node, ObjectRecord):
        for name in ("args", "kwargs", "state", "items", "listitems"):
            yield name, getattr(node, name)


def _settle(tree: Any) -> Any:
    """Refuse memo bombs and deep nesting; cut reference cycles at mutable containers.

    A pickle can share one list a billion times over (memo references) or
    build a list that contains itself; every rule after the reader walks the
    tree recursively, so both must be settled here, once, iteratively.
    """
    sizes: dict[int, int] = {}
    on_path: dict[int, str] = {id(tree): "<root>"}
    stack: list[tuple[Any, Iterator[tuple[Any, Any]], str, int]] = [
        (tree, _children(tree), "", 1)]
    while stack:
        node, children, path, total = stack[-1]
        for slot, child in children:
            if not isinstance(child, (dict, list, tuple, set, frozenset, ObjectRecord)):
                total += 1
                continue
            if id(child) in on_path:
                if slot is None or isinstance(node, (set, frozenset)):
                    raise _Refused(f"a reference cycle through an immutable container at {path}")
                _replace(node, slot, Backref(on_path[id(child)]))
                total += 1
                continue
            if id(child) in sizes:
                total += sizes[id(child)]
                if total > MAX_NODES:
                    raise _Refused(f"shared references expand to more than {MAX_NODES} objects "
                                   "(a memo bomb)")
                continue
            if len(stack) >= MAX_DEPTH:
                raise _Refused(f"the pickle nests deeper than {MAX_DEPTH} levels")
            child_path = ".".join(p for p in (path, "" if slot is None else str(slot)) if p)
            stack[-1] = (node, children, path, total)
            on_path[id(child)] = child_path or "<root>"
            stack.append((child, _children(child), child_path, 1))
            break
        else:
            stack.pop()
            del on_path[id(node)]
            sizes[id(node)] = total
            if total > MAX_NODES:
                raise _Refused(f"shared references expand to more than {MAX_NODES} objects "
                               "(a memo bomb)")
            if stack:
                parent, siblings, parent_path, parent_total = stack[-1]
                stack[-1] = (parent, siblings, parent_path, parent_total + total)
    return tree


def settle(tree: Any) -> Any:
    """The tree, fit for recursive rules; an ``InputError`` (without a path) if not."""
    try:
        return _settle(tree)
    except _Refused as exc:
        raise InputError(str(exc)) from None


def check_tensor_sizes(tree: Any) -> None:
    """Refuse views that would allocate far more than their storage once copied.

    A stride-0 view of one element can claim petabytes; the weights-only
    reader accepts it, and compacting it (normalize) would try to allocate.
    """
    for key_path, tensor in iter_tensors(tree):
        logical = tensor.numel() * tensor.element_size()
        if logical > max(tensor.untyped_storage().nbytes(), MAX_TENSOR_BYTES_OVER_STORAGE):
            raise InputError(f"tensor {format_path(key_path)} of size {tuple(tensor.shape)} "
                             f"would need {logical} bytes from a storage of "
                             f"{tensor.untyped_storage().nbytes()}; refused before allocating")


def _replace(node: Any, slot: Any, value: Any) -> None:
    if isinstance(node, ObjectRecord):
        setattr(node, slot, value)
    else:
        node[slot] = value


def load_restricted(path: Path, fmt: Format, *, lenient: bool = False) -> RestrictedLoad:
    """Read a torch zip or legacy file with the restricted unpickler; nothing in it runs."""
    seen: dict[str, None] = {}
    refused: dict[str, None] = {}
    loader = _load_zip if fmt is Format.TORCH_ZIP else _load_legacy
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TypedStorage deprecation, once per storage
            tree, locations = loader(path, lenient, seen, refused)
    except _Refused as exc:
        if exc.names:
            raise UnsafeCheckpointError(path, exc.names, str(exc)) from None
        raise InputError(str(exc), path) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {_first_line(exc)}", path) from None
    return RestrictedLoad(tree, dict(sorted(locations.items())), tuple(seen), tuple(refused))


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


REBUILD_NAMES = frozenset(entry.name for entry in _Tensors().entries())
Refused = _Refused  # what ``unpickle_zip_data`` raises; ``load_restricted`` words it for users
