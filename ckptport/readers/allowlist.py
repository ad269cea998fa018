"""The harmless globals ckptport lets the weights-only unpickler build.

Real training checkpoints hold ``argparse.Namespace`` hyper-parameters,
numpy scalars and arrays, ``torch.Size`` and ``OrderedDict``. None of these
can run code when rebuilt, so they are allowed — for one ``torch.load`` call
at a time (``torch.serialization.safe_globals``), never process-wide, so
ckptport never widens what other code in the user's process accepts.

numpy pickles name their helpers ``numpy.core.*`` (numpy 1) or
``numpy._core.*`` (numpy 2); both spellings map to the installed functions.
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["safe_globals", "allowed_names", "Allowed", "RestrictedArgumentError",
           "is_dangerous", "restricted_table", "build_state", "nonnegative_ints",
           "torch_default_names", "is_allowed"]


def _numpy_entries() -> list[Any]:
    try:
        import numpy as np
    except ImportError:  # numpy objects then stay refused, naming the global
        return []
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    entries: list[Any] = [np.ndarray, np.dtype]
    for name in ("scalar", "_reconstruct"):
        func = getattr(multiarray, name)
        entries += [(func, f"numpy.{core}.multiarray.{name}") for core in ("core", "_core")]
    dtype_classes = {type(np.dtype(code)) for code in np.typecodes["All"] if code not in "O"}
    entries += sorted(dtype_classes, key=lambda cls: cls.__name__)
    return entries


def safe_globals() -> list[Any]:
    """Entries for ``torch.serialization.safe_globals``."""
    import torch

    return [argparse.Namespace, collections.OrderedDict, torch.Size, *_numpy_entries()]


def allowed_names() -> frozenset[str]:
    """Qualified names of the allowlist, to tell what a refusal was about."""
    names = set()
    for entry in safe_globals():
        if isinstance(entry, tuple):
            names.add(entry[1])
        else:
            names.add(f"{entry.__module__}.{entry.__qualname__}")
    return frozenset(names)


# --------------------------------------------------------------------------
# The restricted unpickler's table. ``torch.load(weights_only=True)`` is the
# fast path; when it refuses, ``restricted.py`` interprets the pickle itself
# and resolves every global through ``resolve`` below. Only names in this
# table map to real Python objects; every callable is a wrapper that checks
# its arguments before calling the library (so ``bytearray(10**12)`` or a
# numpy shape of a terabyte never allocates). Anything else is never
# imported: it becomes a ``GlobalRef`` the unpickler records by name.


@dataclass(frozen=True)
class Allowed:
    """A harmless callable global: ``call`` rebuilds it from pickled arguments.

    ``new`` is how ``NEWOBJ`` / ``copyreg._reconstructor`` create an empty
    instance that ``BUILD`` then fills; ``None`` when the class never
    arrives that way.
    """

    name: str
    call: Callable[..., Any]
    new: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        return self.call(*args)


class RestrictedArgumentError(ValueError):
    """A pickled call to an allowed global has arguments ckptport will not pass on."""


# Modules whose globals execute, import, read or write things. A file naming
# any of them is hostile or broken: refused by normalize, an error in check.
DANGEROUS_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "_posixsubprocess", "sys", "builtins", "pickle",
    "_pickle", "pickletools", "dill", "cloudpickle", "joblib", "marshal", "shelve", "importlib",
    "imp", "zipimport", "pkgutil", "runpy", "timeit", "code", "codeop", "pty", "shutil",
    "socket", "ctypes", "multiprocessing", "threading", "_thread", "asyncio", "signal",
    "webbrowser", "pdb", "bdb", "trace", "profile", "cProfile", "operator", "_operator",
    "functools", "_functools", "types", "inspect", "gc", "io", "_io", "codecs", "_codecs",
    "copyreg", "fileinput", "linecache", "tempfile", "glob", "tarfile", "zipfile", "urllib",
    "http", "ftplib", "smtplib", "requests", "setuptools", "distutils", "sysconfig", "site",
    "venv", "ensurepip", "numpy.lib.npyio", "numpy.testing", "numpy.f2py", "torch.hub",
    "torch.jit", "torch.package", "torch.serialization", "torch.fx", "torch.ops",
    "torch._C", "torch.multiprocessing", "torch.distributed.rpc", "torch.utils.cpp_extension",
    "torch._dynamo", "torch._inductor", "torch._ops",
    "torch._weights_only_unpickler",
})
DANGEROUS_NAMES = frozenset({
    "torch.load", "torch.save", "torch.compile", "torch.from_file", "numpy.load",
    "numpy.fromfile", "numpy.save", "numpy.loadtxt", "numpy.genfromtxt", "numpy.memmap",
    "torch.classes", "torch.library", "torch.storage._load_from_bytes",
})
_DANGEROUS_SEGMENTS = frozenset({"eval", "exec", "system", "popen", "spawn", "getattr",
                                 "setattr", "delattr", "globals", "locals", "compile", "open",
                                 "loads", "load", "execfile", "__import__", "import_module"})


def is_dangerous(qualname: str) -> bool:
    """True for globals that run, import or touch files when called or looked up.

    Dotted attribute paths through dunders (``builtins.print.__class__``)
    are dangerous too: they reach objects the name alone does not say.
    """
    if qualname in DANGEROUS_NAMES:
        return True
    parts = qualname.split(".")
    if any(p.startswith("__") and p.endswith("__") for p in parts):
        return True
    if any(p in _DANGEROUS_SEGMENTS for p in parts[1:]):
        return True
    return any(".".join(parts[:i]) in DANGEROUS_MODULES for i in range(1, len(parts)))


def nonnegative_ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(
        type(v) is int and v >= 0 for v in value
    ):
        raise RestrictedArgumentError(f"{what} must be a tuple of non-negative ints")
    return tuple(value)


def _bytes_like(value: Any, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, list) and all(type(v) is int and 0 <= v < 256 for v in value):
        return bytes(value)
    raise RestrictedArgumentError(f"{what} takes bytes, not {type(value).__name__}")


def _encode(text: Any, encoding: Any = "latin1") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for ``bytes``: latin-1 text only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RestrictedArgumentError("_codecs.encode takes (str, 'latin1')")
    return text.encode("latin-1")


def _set_of(kind: type) -> Callable[..., Any]:
    def build(items: Any = ()) -> Any:
        if not isinstance(items, (list, tuple, set, frozenset)):
            raise RestrictedArgumentError(f"{kind.__name__} takes a list")
        return kind(items)

    return build


def _bytes_call(kind: type) -> Callable[..., Any]:
    def build(data: Any = b"", encoding: Any = None) -> Any:
        if isinstance(data, str) and encoding in ("latin1", "latin-1"):
            return kind(_encode(data, encoding))
        return kind(_bytes_like(data, kind.__name__))

    return build


def _numbers(kind: type) -> Callable[..., Any]:
    def build(*args: Any) -> Any:
        if len(args) > 2 or not all(type(a) in (int, float) for a in args):
            raise RestrictedArgumentError(f"{kind.__name__} takes numbers")
        return kind(*args)

    return build


def _ordered_dict(items: Any = ()) -> Any:
    if not isinstance(items, (list, tuple, dict)):
        raise RestrictedArgumentError("OrderedDict takes a list of pairs")
    return collections.OrderedDict(items)


def _counter(items: Any = ()) -> Any:
    if not isinstance(items, dict):
        raise RestrictedArgumentError("Counter takes a dict")
    return collections.Counter(items)


def _size(dims: Any = ()) -> Any:
    import torch

    return torch.Size(nonnegative_ints(dims, "torch.Size"))


def _device(kind: Any, index: Any = None) -> Any:
    import torch

    if not isinstance(kind, str) or (index is not None and type(index) is not int):
        raise RestrictedArgumentError("torch.device takes (str, int)")
    return torch.device(kind) if index is None else torch.device(kind, index)


def _namespace(*args: Any) -> argparse.Namespace:
    if args:
        raise RestrictedArgumentError("argparse.Namespace takes no positional arguments")
    return argparse.Namespace()


def _slice(*args: Any) -> slice:
    if len(args) > 3 or not all(a is None or type(a) is int for a in args):
        raise RestrictedArgumentError("slice takes ints")
    return slice(*args)


def _base_entries() -> list[Allowed]:
    return [
        Allowed("collections.OrderedDict", _ordered_dict, _ordered_dict),
        Allowed("collections.Counter", _counter, _counter),
        Allowed("argparse.Namespace", _namespace, _namespace),
        Allowed("builtins.set", _set_of(set)),
        Allowed("builtins.frozenset", _set_of(frozenset)),
        Allowed("builtins.bytearray", _bytes_call(bytearray)),
        Allowed("builtins.bytes", _bytes_call(bytes)),
        Allowed("builtins.complex", _numbers(complex)),
        Allowed("builtins.slice", _slice),
        Allowed("_codecs.encode", _encode),
        Allowed("torch.Size", _size),
        Allowed("torch.device", _device),
    ]


def _numpy_table() -> dict[str, Any]:
    try:
        import numpy as np
    except ImportError:
        return {}
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]

    def dtype(spec: Any, align: Any = False, copy: Any = False) -> Any:
        if not isinstance(spec, str) or type(align) is not bool or type(copy) is not bool:
            raise RestrictedArgumentError("numpy.dtype takes (str, bool, bool)")
        return np.dtype(spec, align, copy)

    def reconstruct(subtype: Any, shape: Any, code: Any) -> Any:
        if subtype is not np.ndarray or tuple(nonnegative_ints(shape, "shape")) != (0,):
            raise RestrictedArgumentError("numpy _reconstruct takes (ndarray, (0,), code)")
        return multiarray._reconstruct(np.ndarray, (0,), _bytes_like(code, "code"))

    def scalar(kind: Any, data: Any = None) -> Any:
        if not isinstance(kind, np.dtype) or kind.hasobject:
            raise RestrictedArgumentError("numpy scalar takes a non-object dtype")
        return multiarray.scalar(kind, _bytes_like(data, "numpy scalar"))

    def frombuffer(buffer: Any, kind: Any, shape: Any, order: Any = "C") -> Any:
        data = _bytes_like(buffer, "numpy buffer")
        dims = nonnegative_ints(shape, "shape")
        if not isinstance(kind, np.dtype) or kind.hasobject or order not in ("C", "F"):
            raise RestrictedArgumentError("numpy _frombuffer takes a plain dtype")
        if math.prod(dims) * kind.itemsize != len(data):
            raise RestrictedArgumentError("numpy array shape does not match its bytes")
        return np.frombuffer(data, dtype=kind).reshape(dims, order=order).copy()

    table: dict[str, Any] = {"numpy.ndarray": np.ndarray}
    for core in ("numpy.core", "numpy._core"):
        table[f"{core}.multiarray._reconstruct"] = Allowed(f"{core}.multiarray._reconstruct",
                                                           reconstruct)
        table[f"{core}.multiarray.scalar"] = Allowed(f"{core}.multiarray.scalar", scalar)
        table[f"{core}.numeric._frombuffer"] = Allowed(f"{core}.numeric._frombuffer",
                                                       frombuffer)
    table["numpy.dtype"] = Allowed("numpy.dtype", dtype)
    for code in np.typecodes["All"]:
        kind = type(np.dtype(code))
        if code != "O":
            table[f"{kind.__module__}.{kind.__qualname__}"] = kind
    return table


def _torch_table() -> dict[str, Any]:
    """dtypes and storage classes as values; tensor rebuilds via ``tensor_rebuilds``."""
    import torch

    table: dict[str, Any] = {"torch.Tensor": torch.Tensor,
                             "torch.nn.parameter.Parameter": torch.nn.Parameter,
                             "torch.UntypedStorage": torch.UntypedStorage,
                             "torch.storage.UntypedStorage": torch.UntypedStorage}
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            table[f"torch.{name}"] = value
        elif (name.endswith("Storage") and isinstance(value, type)
              and issubclass(value, torch.storage._LegacyStorage)):
            table[f"torch.{name}"] = value
    return table


@functools.cache
def _plain_table() -> dict[str, Any]:
    """The entries that need no torch: builtins, collections, argparse, numpy."""
    table: dict[str, Any] = {entry.name: entry for entry in _base_entries()}
    # bases named by copyreg._reconstructor: data here, never called
    table.update({f"builtins.{kind.__name__}": kind for kind in (object, dict, list)})
    table.update(_numpy_table())
    return table


@functools.cache
def _static_table() -> dict[str, Any]:
    return {**_plain_table(), **_torch_table()}


def is_allowed(qualname: str) -> bool:
    """True for globals plain weights-only loading or ckptport's restricted reader accept."""
    return qualname in torch_default_names() or qualname in _static_table()


def restricted_table(extra: list[Allowed],
                     torch_values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Qualified name -> the object a GLOBAL resolves to.

    ``extra`` are the unpickler's own entries (tensor rebuilds, which close
    over its storages), so they are added per call. ``torch_values``, when
    given, stands in for torch's dtypes, storage classes, ``torch.Size`` and
    the like (``describe`` records them without importing torch).
    """
    base = {**_plain_table(), **torch_values} if torch_values else _static_table()
    return {**base, **{entry.name: entry for entry in extra}}


def build_state(target: Any, state: Any) -> None:
    """``BUILD`` on an allowed object: plain attributes, or numpy's checked state.

    ``OrderedDict`` carries a state dict's ``_metadata`` this way and
    ``argparse.Namespace`` its fields; numpy arrays and dtypes restore
    through their own ``__setstate__`` once the shape is known to match the
    bytes. Dunder names are never set.
    """
    if type(target) in (collections.OrderedDict, collections.Counter, argparse.Namespace):
        if isinstance(state, tuple) and len(state) == 2 and state[1] is None:
            state = state[0]
        if not isinstance(state, dict) or not all(
                isinstance(k, str) and not k.startswith("__") for k in state):
            raise RestrictedArgumentError("state must be a dict of plain attribute names")
        for key, value in state.items():
            setattr(target, key, value)
        return
    import numpy as np

    if type(target) is np.ndarray:
        _check_array_state(state)
    elif not isinstance(target, np.dtype) or not isinstance(state, tuple):
        raise RestrictedArgumentError("not an object ckptport restores state into")
    try:
        target.__setstate__(state)
    except (TypeError, ValueError) as exc:
        raise RestrictedArgumentError(str(exc)) from None


def _check_array_state(state: Any) -> None:
    import numpy as np

    if not isinstance(state, tuple) or len(state) not in (4, 5):
        raise RestrictedArgumentError("malformed numpy array state")
    shape, kind, _fortran, raw = state[-4:]
    count = math.prod(nonnegative_ints(shape, "numpy shape"))
    if not isinstance(kind, np.dtype):
        raise RestrictedArgumentError("numpy array state without a dtype")
    expected = count if kind.hasobject else count * kind.itemsize
    if len(raw) != expected if isinstance(raw, (bytes, list)) else True:
        raise RestrictedArgumentError("numpy array shape does not match its data")


@functools.cache
def torch_default_names() -> frozenset[str]:
    """Globals plain ``torch.load(weights_only=True)`` accepts with no extra allowlist.

    What a consumer of an exported artifact will run: anything beyond this
    set makes their ``torch.load`` fail.
    """
    from torch import _weights_only_unpickler

    return frozenset(_weights_only_unpickler._get_allowed_globals())
