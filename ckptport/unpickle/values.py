"""The stand-ins a pickle is given instead of real objects, and the values they become.

While a pickle runs, every object it can touch is either a builtin value the
unpickler itself makes (str, int, list, dict, ...) or one of these: frozen
and slotted, so ``BUILD`` cannot rewrite them, or with a ``__setstate__`` of
ckptport's that checks what it is given. No real torch or numpy object, no
shared singleton, and no function of ckptport's own is ever handed to the
pickle, so nothing it does can reach code or corrupt memory.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, NoReturn, cast

from ..dtypes import DType
from ..sealed import sealed
from ..tensors import StorageInfo
from ..tree import Key, ObjectRecord, RecordKind, Tree

__all__ = ["Size", "Device", "Marker", "Allowed", "StorageRef", "Unsupported",
           "DefaultDict", "Namespace", "Refusal", "CodeReached", "CodeHook", "refuse_code",
           "Recorded", "record_class", "BytesRecord"]


class Refusal(ValueError):
    """A stand-in refuses its arguments; the engine words it with the global's name."""


class CodeReached(Refusal):
    """The file reaches something that runs code through an attribute or a call: ``name``."""

    def __init__(self, message: str, name: str) -> None:
        super().__init__(message)
        self.name = name


# what a stand-in does when the file reaches code through it: (name, message) -> None;
# the engine's refuses (a read) or records the name (a report's lenient read)
CodeHook = Callable[[str, str], None]


def refuse_code(name: str, message: str) -> None:
    """The strict hook: whatever reaches code is refused on sight."""
    raise CodeReached(message, name)


class Size(tuple[int, ...]):
    """``torch.Size`` without torch: a tuple of non-negative ints that prints as torch does."""

    __slots__ = ()
    __module__ = "torch"
    __qualname__ = "Size"

    def __repr__(self) -> str:
        return f"torch.Size([{', '.join(map(str, self))}])"


Size.__name__ = "Size"


@sealed
@dataclass(frozen=True, slots=True)
class Device:
    """``torch.device`` without torch."""

    type: str
    index: int | None = None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self) -> str:
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"


Device.__module__, Device.__qualname__ = "torch", "device"


@sealed
@dataclass(frozen=True, slots=True)
class Marker:
    """A global used as a value: a storage class, a tensor class, a layout, a builtin type.

    ``dtype`` is the element type of a storage class.
    """

    name: str
    kind: str
    dtype: DType | None = None

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise Refusal(f"the file calls {self.name}, which ckptport takes only as a type: "
                      "constructing one (torch would allocate it) is refused")


@sealed
@dataclass(frozen=True, slots=True)
class Allowed:
    """An allowed callable global: ``call`` checks its arguments, then builds the value."""

    name: str
    call: Callable[..., Tree]  # each takes what its global takes, as the pickle passes it

    def __call__(self, *args: object, **kwargs: object) -> Tree:
        return self.call(*args, **kwargs)


@sealed
@dataclass(frozen=True, slots=True)
class StorageRef:
    """What a persistent id resolves to: a typed view of one storage record."""

    info: StorageInfo
    dtype: DType


@sealed
@dataclass(frozen=True, slots=True)
class Unsupported:
    """A tensor of a kind ckptport does not convert (sparse, nested, quantized, meta)."""

    kind: str
    detail: str = ""


class DefaultDict(dict[Key, Tree]):
    """``collections.defaultdict`` as plain data: the factory is named, never called."""

    __slots__ = ("default_factory",)
    default_factory: object  # whatever the pickle names as the factory


_ORDER = itertools.count()


class _ReadOnlyType(type):
    """A class handed to a pickle: a ``BUILD`` on the class itself must not rewrite it
    (for a real class, that would change it for the whole process)."""

    def __setattr__(cls, name: str, value: object) -> None:
        raise Refusal(f"the file sets the attribute {name!r} on the global "
                      f"{cls.__dict__.get('record_name') or cls.__qualname__}")


class Namespace(argparse.Namespace, metaclass=_ReadOnlyType):
    """``argparse.Namespace`` for the pickle; ``settle`` hands back a real one."""

    __module__, __qualname__ = "argparse", "Namespace"


class Recorded(ObjectRecord, metaclass=_ReadOnlyType):
    """Base of the classes ckptport hands the pickle for names it records.

    ``NEWOBJ`` (and ``copyreg._reconstructor``) make an instance through
    ``__new__`` alone, as a class is made; a ``REDUCE`` calls the class,
    which runs ``__init__`` too: ``called`` tells the two apart, and
    ``order`` says which came first, for ``check``'s verdict on whether
    the name is provably a class.
    """

    record_name: ClassVar[str] = ""
    attribute: ClassVar[bool] = False  # taken by builtins.getattr from another stand-in
    runs: ClassVar[bool] = False  # a resolved function: a call of it runs it
    on_code: ClassVar[CodeHook] = staticmethod(refuse_code)
    called: bool  # instance fields set in __new__, beyond ObjectRecord's
    order: int
    dangerous: ClassVar[bool] = False
    lenient: ClassVar[bool] = False  # a report's reading: record calls on instances too
    registry: ClassVar[list[Recorded]]

    def __new__(cls, *args: Tree, **kwargs: Tree) -> Recorded:
        self = object.__new__(cls)
        # the fields ObjectRecord's __init__ would set, set directly: files hold millions
        self.__dict__.update(name=cls.record_name, kind=RecordKind.INSTANCE, args=args,
                             kwargs=kwargs, state=None, items={}, listitems=[], called=False,
                             order=next(_ORDER))
        cls.registry.append(self)
        return self

    def __init__(self, *args: Tree, **kwargs: Tree) -> None:  # only when the file calls it
        self.called = True
        if self.runs:
            type(self).on_code(self.record_name, f"the file calls {self.record_name}, a "
                               "function: full unpickling would run it; nothing was run")

    def __call__(self, *args: Tree, **kwargs: Tree) -> Recorded:
        """The file calls what a call returned (``methodcaller(...)(obj)``): code, whatever
        the name. Refused, or for a report recorded under the same name."""
        if not self.lenient:
            raise Refusal(f"the file calls an object made by {self.record_name}: full "
                          "unpickling would run its code")
        return type(self)(*args, **kwargs)

    def __setstate__(self, state: Tree) -> None:
        if isinstance(self.state, dict) and isinstance(state, dict):
            self.state.update(state)
        else:
            self.state = state

    def __setitem__(self, key: Key, value: Tree) -> None:
        self.items[key] = value

    def append(self, value: Tree) -> None:
        self.listitems.append(value)

    def extend(self, values: Iterable[Tree]) -> None:
        self.listitems.extend(values)


def record_class(name: str, dangerous: bool, registry: list[Recorded],
                 lenient: bool = False, attribute: bool = False, runs: bool = False,
                 on_code: CodeHook = refuse_code) -> type[Recorded]:
    """A fresh stand-in class for ``name``; its instances land in ``registry``.

    ``attribute``: the stand-in is an attribute a pickle took from a class's stand-in
    (``builtins.getattr``), not a global the file names. ``runs``: ``name`` is a
    function, and ``on_code`` is told when the file calls it.
    """
    short = name.rpartition(".")[2] or "Recorded"
    attrs = {"record_name": name, "dangerous": dangerous, "registry": registry,
             "lenient": lenient, "attribute": attribute, "runs": runs,
             "on_code": staticmethod(on_code), "__qualname__": short,
             "__module__": name.rpartition(".")[0] or "ckptport"}
    made: type[Recorded] = _ReadOnlyType(short, (Recorded,), attrs)  # type: ignore[assignment]
    return made


class BytesRecord(Recorded):
    """``io.BytesIO``: its bytes are the data (TransformerEngine keeps ``_extra_state`` so)."""

    record_name = "io.BytesIO"
    registry: ClassVar[list[Recorded]] = []

    def __new__(cls, *args: Tree, **kwargs: Tree) -> BytesRecord:
        self = object.__new__(cls)
        ObjectRecord.__init__(self, cls.record_name, RecordKind.INSTANCE, args, dict(kwargs))
        self.called, self.order = True, -1
        return self

    def __setstate__(self, state: Tree) -> None:
        if not (isinstance(state, tuple) and len(state) == 3 and isinstance(state[0], bytes)
                and type(state[1]) is int and (state[2] is None or isinstance(state[2], dict))):
            raise Refusal("io.BytesIO state must be (bytes, position, dict)")
        self.state = state

    def value(self) -> bytes:
        if isinstance(self.state, tuple):
            return cast(bytes, self.state[0])  # __setstate__ took only (bytes, int, dict)
        if self.args and isinstance(self.args[0], (bytes, bytearray)):
            return bytes(self.args[0])
        return b""
