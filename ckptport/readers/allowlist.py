"""The harmless globals ckptport lets the weights-only unpickler build.

Real training checkpoints hold ``argparse.Namespace`` hyper-parameters,
numpy scalars and arrays, ``torch.Size`` and ``OrderedDict``. The first
three kinds cannot run code when rebuilt, so torch's weights-only loader may
build them — for one ``torch.load`` call at a time
(``torch.serialization.safe_globals``), never process-wide, so ckptport
never widens what other code in the user's process accepts.

numpy objects are never handed to torch's loader: it applies a pickled
``BUILD`` state through numpy's own ``__setstate__``, and a forged dtype
state (an object field under ``hasobject=False``) makes numpy read pointers
from the file's bytes. They go to ckptport's restricted reader, whose numpy
wrappers accept only the dtype states numpy itself writes for plain dtypes.
numpy pickles name their helpers ``numpy.core.*`` (numpy 1) or
``numpy._core.*`` (numpy 2); both spellings map to the installed functions.
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["safe_globals", "allowed_names", "Allowed", "RestrictedArgumentError",
           "is_dangerous", "restricted_table", "build_state", "nonnegative_ints",
           "torch_default_names", "is_allowed"]


def safe_globals() -> list[Any]:
    """Entries for ``torch.serialization.safe_globals``: classes with no state to forge."""
    import torch

    return [argparse.Namespace, collections.OrderedDict, torch.Size]


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
        # copy=False would hand out numpy's shared builtin dtype, which BUILD then mutates;
        # numpy 1 wrote the flags as ints
        if not (isinstance(spec, str) and _PLAIN_DTYPE.fullmatch(spec)) or not (
                _flag(align) and _flag(copy) and copy):
            raise RestrictedArgumentError(f"numpy.dtype{(spec, align, copy)!r} is not a plain "
                                          "dtype as numpy pickles one (object, structured and "
                                          "shared dtypes are refused)")
        return np.dtype(spec, align, copy)

    def reconstruct(subtype: Any, shape: Any, code: Any) -> Any:
        if subtype is not np.ndarray or tuple(nonnegative_ints(shape, "shape")) != (0,):
            raise RestrictedArgumentError("numpy _reconstruct takes (ndarray, (0,), code)")
        return multiarray._reconstruct(np.ndarray, (0,), _bytes_like(code, "code"))

    def scalar(kind: Any, data: Any = None) -> Any:
        raw = _bytes_like(data, "numpy scalar")
        if len(raw) != _plain_dtype(kind).itemsize:
            raise RestrictedArgumentError("numpy scalar data does not match its dtype's size")
        return multiarray.scalar(kind, raw)

    def frombuffer(buffer: Any, kind: Any, shape: Any, order: Any = "C") -> Any:
        data = _bytes_like(buffer, "numpy buffer")
        dims = nonnegative_ints(shape, "shape")
        if order not in ("C", "F"):
            raise RestrictedArgumentError("numpy _frombuffer takes order C or F")
        if math.prod(dims) * _plain_dtype(kind).itemsize != len(data):
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
    elif isinstance(target, np.dtype):
        _check_dtype_state(target, state)
    else:
        raise RestrictedArgumentError("not an object ckptport restores state into")
    try:
        target.__setstate__(state)
    except (TypeError, ValueError) as exc:
        raise RestrictedArgumentError(str(exc)) from None


# dtype specs numpy writes for plain (non-object, unstructured) dtypes: numbers,
# bytes/str/void of a size, datetimes (their unit travels in the BUILD state)
_PLAIN_DTYPE = re.compile(r"b1|[iu][1248]|f(2|4|8|12|16)|c(8|16|24|32)|[SUV]\d{1,9}|[Mm]8")
_DATETIME_UNITS = frozenset({b"Y", b"M", b"W", b"D", b"h", b"m", b"s", b"ms", b"us", b"ns",
                             b"ps", b"fs", b"as", b"generic"})


def _flag(value: Any) -> bool:
    return type(value) in (bool, int) and value in (0, 1)


def _plain_data(value: Any) -> bool:
    """Only what numpy's own dtype states hold, so comparing them runs no file-made ``==``."""
    if isinstance(value, tuple):
        return all(_plain_data(v) for v in value)
    return value is None or type(value) in (int, str, bytes)


def _plain_dtype(kind: Any) -> Any:
    """``kind`` if it is a dtype without Python objects or fields, else refused."""
    import numpy as np

    if not isinstance(kind, np.dtype) or kind.hasobject or kind.names is not None \
            or kind.subdtype is not None:
        raise RestrictedArgumentError("numpy data of an object or structured dtype is refused")
    return kind


def _check_dtype_state(target: Any, state: Any) -> None:
    """Accept only a state numpy itself writes for a plain dtype of ``target``'s kind.

    numpy's ``__setstate__`` trusts its argument: a state naming an object
    field under flags that deny holding objects makes numpy treat file bytes
    as object pointers (memory corruption). Comparing with the states of
    genuine dtypes of the same kind, each byte order, shuts that door.
    """
    import numpy as np

    if not isinstance(state, tuple) or len(state) not in (8, 9) or not _plain_data(state):
        raise RestrictedArgumentError("a numpy dtype state that is not a plain dtype's "
                                      "(forged, structured or object dtypes are refused)")
    spec = f"{target.kind}{target.itemsize}" if target.kind not in "SUV" else target.str[1:]
    if target.kind in "Mm":
        metadata = state[8] if len(state) == 9 else None
        unit = metadata[1] if isinstance(metadata, tuple) and len(metadata) == 2 else None
        if not (isinstance(unit, tuple) and len(unit) == 4 and unit[0] in _DATETIME_UNITS
                and type(unit[1]) is int and 0 < unit[1] < 1 << 31):
            raise RestrictedArgumentError("malformed numpy datetime dtype state")
        name = unit[0].decode()
        spec = f"{target.kind}8" if name == "generic" else f"{target.kind}8[{unit[1]}{name}]"
    genuine = np.dtype(spec)
    variants = (genuine.newbyteorder("<"), genuine.newbyteorder(">"), genuine.newbyteorder("|"),
                genuine)
    if not any(state == variant.__reduce__()[2] for variant in variants):
        raise RestrictedArgumentError("a numpy dtype state that is not a plain dtype's "
                                      "(forged, structured or object dtypes are refused)")


def _check_array_state(state: Any) -> None:
    if not isinstance(state, tuple) or len(state) not in (4, 5) or (
            len(state) == 5 and state[0] != 1):
        raise RestrictedArgumentError("malformed numpy array state")
    shape, kind, fortran, raw = state[-4:]
    count = math.prod(nonnegative_ints(shape, "numpy shape"))
    if type(fortran) is not bool or not isinstance(raw, bytes) or len(raw) != count * \
            _plain_dtype(kind).itemsize:
        raise RestrictedArgumentError("numpy array shape does not match its data")


@functools.cache
def torch_default_names() -> frozenset[str]:
    """Globals plain ``torch.load(weights_only=True)`` accepts with no extra allowlist.

    What a consumer of an exported artifact will run: anything beyond this
    set makes their ``torch.load`` fail.
    """
    from torch import _weights_only_unpickler

    return frozenset(_weights_only_unpickler._get_allowed_globals())
