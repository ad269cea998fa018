"""The allow-list: every global ckptport builds, each through a wrapper that checks its arguments.

Only names in this table map to something a pickle can call or use; the
callables are ckptport's wrappers (``Allowed``), which refuse arguments that
would allocate from the file's say-so (``bytearray(10**12)``), iterate
something lazy, or build an object in an unusual way. Real classes appear
only where building them runs none of their code and their state is plain
data (``OrderedDict``, ``Counter``); ``argparse.Namespace`` is a read-only
subclass, so a ``BUILD`` on the class cannot change the real one. torch's and
numpy's names come from ``torch_values`` and ``numpy_values``, torchao's from
``torchao_values``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from functools import cache
from pathlib import PurePath, PurePosixPath, PureWindowsPath

from ..tree import Tree
from . import names
from .distributed_values import distributed_table
from .names import Kind
from .numpy_values import numpy_table
from .torch_values import torch_table
from .torchao_values import torchao_table
from .values import (
    Allowed,
    BytesRecord,
    CodeHook,
    DefaultDict,
    Marker,
    Namespace,
    Recorded,
    Refusal,
    record_class,
    refuse_code,
)

__all__ = ["table", "allowed_names", "getattr_record"]


def _concrete(value: object, what: str) -> object:
    if type(value) not in (list, tuple, set, frozenset, dict, str, bytes, bytearray):
        raise Refusal(f"{what} takes a list, not {type(value).__name__}")
    return value


def _collection(kind: type) -> Callable[..., Tree]:
    def build(items: object = ()) -> Tree:
        return kind(_concrete(items, kind.__name__))

    return build


def _mapping(kind: type) -> Callable[..., Tree]:
    """OrderedDict and Counter from what their pickles pass: nothing, pairs or a dict."""
    def build(items: object = ()) -> Tree:
        if type(items) not in (list, tuple, dict):
            raise Refusal(f"{kind.__name__} takes a list of pairs, not "
                          f"{type(items).__name__}")
        return kind(items)

    return build


def _bytes_call(kind: type[bytes] | type[bytearray]) -> Callable[..., bytes | bytearray]:
    def build(data: object = b"", encoding: object = None) -> bytes | bytearray:
        if isinstance(data, str) and encoding in ("latin1", "latin-1"):
            return kind(data.encode("latin-1"))
        if isinstance(data, (bytes, bytearray)):
            return kind(data)
        if type(data) is list and all(type(v) is int and 0 <= v < 256 for v in data):
            return kind(data)
        raise Refusal(f"{kind.__name__} takes bytes, not {type(data).__name__} (a size would "
                      "allocate from the file's say-so)")

    return build


def _scalar_call(kind: type) -> Callable[..., Tree]:
    def build(*args: object) -> Tree:
        if len(args) > 1 or any(type(a) not in (int, float, str, bool) or
                                (isinstance(a, str) and len(a) > 4096) for a in args):
            raise Refusal(f"{kind.__name__} takes one number or short string")
        return kind(*args)

    return build


def _complex(*args: object) -> complex:
    numbers = [a for a in args if type(a) is int or type(a) is float]
    if len(args) > 2 or len(numbers) != len(args):
        raise Refusal("complex takes numbers")
    return complex(*numbers)


def _slice(*args: object) -> slice:
    bounds = [a for a in args if a is None or type(a) is int]
    if len(args) > 3 or len(bounds) != len(args):
        raise Refusal("slice takes ints")
    return slice(*bounds)


def _range(*args: object) -> range:
    ints = [a for a in args if type(a) is int]
    if not 1 <= len(args) <= 3 or len(ints) != len(args):
        raise Refusal("range takes ints")
    return range(*ints)


def _type_tag(value: Tree, tag: object) -> Tree:
    """TorchScript's annotation of a container's element type: the value is the data."""
    if not isinstance(tag, str):
        raise Refusal("restore_type_tag takes a type name")
    return value


def _encode(text: object, encoding: object = "latin1") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for ``bytes``: latin-1 text only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise Refusal("_codecs.encode takes (str, 'latin1')")
    return text.encode("latin-1")


def _defaultdict(factory: object = None) -> DefaultDict:
    made = DefaultDict()
    made.default_factory = factory  # named in reports; never called
    return made


def _path(kind: type[PurePath]) -> Callable[..., str]:
    def build(*parts: object) -> str:
        texts = [p for p in parts if isinstance(p, str)]
        if len(texts) != len(parts):
            raise Refusal("a path takes strings")
        return str(kind(*texts))

    return build


def getattr_record(target: object, name: object, default: tuple[object, ...],
                   on_code: CodeHook) -> type[Recorded]:
    """``getattr(Class, "NAME")`` as pickles use it for enum members and methods
    (ultralytics' ``Detect.forward``, FSDP's enum members). The target is always
    ckptport's inert stand-in of a class, never a real object, so the result is an
    inert reference too: a stand-in named ``Class.NAME``.

    One public attribute of a global the file names, and only one: a chain of them
    (``PurePath._flavour.os.system``) or a private attribute walks from a harmless
    class to anything, and those are refused. What the attribute reaches is judged
    as a global is (``names.judge_attribute``): a standard-library attribute beyond
    the data names, a module, a function defined elsewhere that runs code
    (``torch.os`` + ``system``) is code-running, and ``on_code`` refuses or records
    it. A package's own attribute (``ShardedTensor.ProcessGroupState``) is that
    package's to answer for: called, it is CKP012's tier like any of its callables,
    or code-running if it is a resolved function.
    """
    if default or not (isinstance(target, type) and issubclass(target, Recorded)
                       and not target.dangerous and not target.attribute
                       and isinstance(name, str) and name.isidentifier()
                       and not name.startswith("_")):
        raise Refusal("the file calls builtins.getattr on something other than a recorded "
                      "class's plain attribute: full unpickling reaches anything that way")
    made = f"{target.record_name}.{name}"
    verdict = names.judge_attribute(target.record_name, name)
    code = verdict.kind is Kind.CODE
    if code:
        on_code(made, f"the file takes {made} with builtins.getattr"
                f"{verdict.reaches(made)}, which can run code; nothing was run")
    return record_class(made, code, target.registry, target.lenient, attribute=True,
                        runs=verdict.called, on_code=on_code)


def _getattr(target: object = None, name: object = None, *default: object) -> type[Recorded]:
    return getattr_record(target, name, default, refuse_code)


def _new(cls: object, args: tuple[Tree, ...]) -> Recorded | Namespace:
    """What ``cls.__new__(cls, *args)`` makes, for the classes a pickle may create that way."""
    if isinstance(cls, type) and issubclass(cls, Recorded):
        return cls.__new__(cls, *args)
    if cls is Namespace and not args:
        return Namespace()
    raise Refusal("creates an object ckptport does not create that way")


def _reconstructor(cls: object, base: object, state: Tree) -> Recorded | Namespace:
    if not (isinstance(base, Marker) and base.name == "builtins.object"):
        raise Refusal("copyreg._reconstructor over a base other than object")
    return _new(cls, () if state is None else (state,))


def _newobj(cls: object, *args: Tree) -> Recorded | Namespace:
    return _new(cls, args)


def _newobj_ex(cls: object, args: object, kwargs: object) -> Recorded | Namespace:
    if not isinstance(args, tuple) or kwargs:
        raise Refusal("copyreg.__newobj_ex__ with keyword arguments")
    return _new(cls, args)


def _plain_table() -> dict[str, object]:
    table: dict[str, object] = {
        "collections.OrderedDict": Allowed("collections.OrderedDict", _mapping(
            collections.OrderedDict)),
        "collections.Counter": Allowed("collections.Counter", _mapping(collections.Counter)),
        "argparse.Namespace": Namespace,
        "collections.defaultdict": Allowed("collections.defaultdict", _defaultdict),
        "builtins.set": Allowed("builtins.set", _collection(set)),
        "builtins.frozenset": Allowed("builtins.frozenset", _collection(frozenset)),
        "builtins.tuple": Allowed("builtins.tuple", _collection(tuple)),
        "builtins.list": Allowed("builtins.list", _collection(list)),
        "builtins.dict": Allowed("builtins.dict", _collection(dict)),
        "builtins.bytearray": Allowed("builtins.bytearray", _bytes_call(bytearray)),
        "builtins.bytes": Allowed("builtins.bytes", _bytes_call(bytes)),
        "builtins.complex": Allowed("builtins.complex", _complex),
        "builtins.slice": Allowed("builtins.slice", _slice),
        "builtins.object": Marker("builtins.object", "type"),
        "builtins.getattr": Allowed("builtins.getattr", _getattr),
        "_codecs.encode": Allowed("_codecs.encode", _encode),
        "copyreg._reconstructor": Allowed("copyreg._reconstructor", _reconstructor),
        "copyreg.__newobj__": Allowed("copyreg.__newobj__", _newobj),
        "copyreg.__newobj_ex__": Allowed("copyreg.__newobj_ex__", _newobj_ex),
        "io.BytesIO": BytesRecord,
        "_io.BytesIO": BytesRecord,
    }
    table["builtins.range"] = Allowed("builtins.range", _range)
    for name in ("build_intlist", "build_doublelist", "build_boollist", "build_tensorlist"):
        table[f"torch.jit._pickle.{name}"] = Allowed(f"torch.jit._pickle.{name}",
                                                     _collection(list))
    table["torch.jit._pickle.restore_type_tag"] = Allowed("torch.jit._pickle.restore_type_tag",
                                                          _type_tag)
    for kind in (int, float, str, bool):
        table[f"builtins.{kind.__name__}"] = Allowed(f"builtins.{kind.__name__}",
                                                     _scalar_call(kind))
    paths: tuple[tuple[str, type], ...] = (
        ("PosixPath", PurePosixPath), ("PurePosixPath", PurePosixPath),
        ("WindowsPath", PureWindowsPath), ("PureWindowsPath", PureWindowsPath),
        ("Path", PurePosixPath))
    for name, path_kind in paths:
        table[f"pathlib.{name}"] = Allowed(f"pathlib.{name}", _path(path_kind))
    return table


@cache
def table() -> dict[str, object]:
    """Qualified name -> what a pickle gets for it."""
    return {**_plain_table(), **torch_table(), **numpy_table(), **distributed_table(),
            **torchao_table()}


def allowed_names() -> frozenset[str]:
    """Every global ckptport builds (through a checked wrapper) or keeps as a value."""
    return frozenset(table())
