"""What a name reaches: the object full unpickling would get, found without running the file.

A global is text (``torch.os``, ``torch.serialization``), but what
``torch.load(weights_only=False)`` does with it depends on the object the
text leads to: ``find_class`` imports the module and takes attributes, and
``torch.os`` is the module ``os``, ``torch.save`` is
``torch.serialization.save``. So a name is judged by what it reaches, found
here the way the unpickler finds it, with two differences that keep this
side effect free:

- only modules of packages ckptport already depends on and trusts to import
  (``RESOLVED_PACKAGES``: torch) are imported, and not for the names a
  pickled model holds (``snapshots``: torch.nn's classes and functions, so
  ``inspect`` and ``check`` of such a file stay torch-free); a name of any other package is
  never imported (importing runs that package's code) and is *unresolved*:
  never allowed, and reported as such;
- attributes are read statically (a module's ``vars``,
  ``inspect.getattr_static``): no property, descriptor or module
  ``__getattr__`` runs. An attribute that is not there statically (a lazily
  imported submodule, a name made on first access) is *unresolved* too, which
  for a resolved package is code-running: ckptport cannot tell what it
  reaches.

The object is then described by kind (module, class, function, other value)
and home: where it is defined (``__module__`` and ``__qualname__``), so
``names`` classes ``torch.os.system`` as ``posix.system``.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import inspect
import io
import sys
import types
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

from . import imports, stdlib
from .snapshots import TORCH_NN_CLASSES, TORCH_NN_FUNCTIONS

__all__ = ["RESOLVED_PACKAGES", "SCALAR_HOMES", "Reach", "Reached", "reach", "describe"]

# packages whose modules ckptport imports to see what a name reaches: its own dependency,
# whose import runs nothing from any file (numpy and the standard library are closed tables)
RESOLVED_PACKAGES = frozenset({"torch"})
_SCALARS = (int, float, complex, str, bytes, bool, type(None))
SCALAR_HOMES = frozenset(f"builtins.{kind.__name__}" for kind in _SCALARS)


class Reach(enum.Enum):
    MODULE = "module"
    CLASS = "class"
    FUNCTION = "function"  # anything callable that is not a class: calling it runs it
    VALUE = "value"  # an object that cannot be called
    NAME = "name"  # another module's name, imported under this one (read from source)
    UNRESOLVED = "unresolved"


@dataclass(frozen=True)
class Reached:
    """What a dotted path reaches: its kind and home (``posix.system``, ``os``).

    ``home`` of a value is its type's home; of an unresolved path, the path;
    of a name, every name the source may bind it to (``homes``), the first.
    ``why`` says, for an unresolved path, what could not be followed.
    """

    kind: Reach
    home: str
    why: str = ""
    homes: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind is Reach.UNRESOLVED:
            return f"something ckptport cannot resolve ({self.why})"
        if self.kind is Reach.VALUE:
            return f"a value of type {self.home}"
        if self.kind is Reach.NAME:
            return f"the name {' or '.join(self.homes)}, which its source imports"
        return f"the {self.kind.value} {self.home}"


_ROUTINES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType,
             types.MethodDescriptorType, types.WrapperDescriptorType, types.MethodWrapperType,
             types.ClassMethodDescriptorType)
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_QUALNAME = type.__dict__["__qualname__"]


def _class_home(cls: type) -> str | None:
    """Where a class is defined, read through ``type``'s own descriptors (no metaclass runs)."""
    module, qualname = _TYPE_MODULE.__get__(cls, type), _TYPE_QUALNAME.__get__(cls, type)
    return f"{module}.{qualname}" if type(module) is str and type(qualname) is str else None


def _routine_home(routine: object) -> str | None:
    """Where a function or a method of a C type is defined; its attributes are the type's."""
    if type(routine) is types.MethodType:
        routine = routine.__func__
        if type(routine) not in _ROUTINES:
            return None
    owner = getattr(routine, "__objclass__", None)  # a method descriptor of a C type
    bound = getattr(routine, "__self__", None)  # a C class method bound to its class
    module = getattr(routine, "__module__", None)
    qualname = getattr(routine, "__qualname__", None)
    if type(qualname) is not str:
        return None
    for holder in (owner, bound):
        if module is None and type(holder) is type:  # C types have no metaclass
            module = _TYPE_MODULE.__get__(holder, type)
    return f"{module}.{qualname}" if type(module) is str else None


def describe(value: object, path: str) -> Reached:
    """The kind and home of an object ``path`` reached, found without running any of its code.

    Only ``type(value)`` is asked of an arbitrary object (``isinstance`` would ask
    its ``__class__``, which a proxy object answers by running code).
    """
    kind = type(value)
    if issubclass(kind, types.ModuleType):
        name = vars(value).get("__name__")
        return Reached(Reach.MODULE, name if type(name) is str else path)
    if type(value) is staticmethod or type(value) is classmethod:
        value = value.__func__
        kind = type(value)
    if issubclass(kind, type):
        home = _class_home(cast(type, value))  # type(value) is a metaclass: value a class
        return Reached(Reach.CLASS, home) if home else Reached(
            Reach.UNRESOLVED, path, f"the class {path} does not say where it is defined")
    if kind in _ROUTINES or callable(value):  # a callable object is judged by its type
        home = _routine_home(value) if kind in _ROUTINES else _class_home(kind)
        return Reached(Reach.FUNCTION, home) if home else Reached(
            Reach.UNRESOLVED, path, f"the callable {path} does not say where it is defined")
    if kind in _SCALARS:
        return Reached(Reach.VALUE, f"builtins.{kind.__name__}")
    return Reached(Reach.VALUE, _class_home(kind) or f"{path} (of an unknown type)")


def _member(owner: object, name: str) -> object:
    """``getattr(owner, name)`` read statically; ``LookupError`` when it is not there so."""
    if isinstance(owner, types.ModuleType):
        found = vars(owner)
        if name not in found:
            raise LookupError(name)
        return found[name]
    try:
        return inspect.getattr_static(owner, name)
    except AttributeError:
        raise LookupError(name) from None


def _import(module: str) -> types.ModuleType | None:
    """A module of a resolved package, imported quietly; None when it cannot be."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        return loaded
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except (Exception, SystemExit):  # torch's own module failed to import: nothing reached
        return None


def _from_source(module: str, attributes: str) -> Reached | None:
    first, _, rest = attributes.partition(".")
    found = imports.bindings(module)
    if found is None:
        return None
    bound = found.get(first, ())
    if not bound:
        return Reached(Reach.MODULE, f"{module}.{first}") if imports.submodule(
            module, first) else None
    modules = [b.target for b in bound if b.kind == "module"]
    if modules:
        return Reached(Reach.MODULE, modules[0])
    homes = tuple(f"{b.target}.{rest}" if rest else b.target for b in bound)
    return Reached(Reach.NAME, homes[0], homes=homes)


@lru_cache(maxsize=4096)
def reach(module: str, attributes: str) -> Reached | None:
    """What ``module`` + ``attributes`` (dotted) reaches, as ``find_class`` and getattr would.

    A package ckptport does not import is read from its source (``imports``): a
    name it imports is a module or another module's name; anything else is None,
    judged by its text. The standard library and numpy are closed tables: None.
    """
    top = module.split(".", 1)[0]
    if top not in RESOLVED_PACKAGES:
        return None if top == "numpy" or top in stdlib.MODULES else _from_source(module,
                                                                                 attributes)
    path = f"{module}.{attributes}"
    if path in TORCH_NN_CLASSES:  # a pickled model's names, known without importing torch
        return Reached(Reach.CLASS, path)
    if path in TORCH_NN_FUNCTIONS:
        return Reached(Reach.FUNCTION, path)
    value: object = _import(module)
    if value is None:
        return Reached(Reach.UNRESOLVED, path, f"the module {module} cannot be imported here")
    walked = module
    for part in attributes.split("."):
        try:
            value = _member(value, part)
        except LookupError:
            return Reached(Reach.UNRESOLVED, path, f"{walked} has no attribute {part!r} until "
                           "code runs")
        walked = f"{walked}.{part}"
    return describe(value, path)
