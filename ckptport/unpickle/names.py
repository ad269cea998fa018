"""What a global named in a pickle resolves to, and what kind of thing it is.

Verdicts must be about what ``torch.load(weights_only=False)`` would do, so
a name is first resolved exactly as that unpickler resolves it:

- torch's own module renames (``torch.tensor`` is ``torch._tensor``);
- for protocol < 3, Python's compatibility tables (``_compat_pickle``):
  ``commands.Popen`` is ``subprocess.Popen``, ``__builtin__.long`` is
  ``builtins.int``, ``copy_reg`` is ``copyreg``;
- ``posix``/``nt`` are ``os``: all three are in the code-running table;
- a dotted name (``posixpath`` + ``os.system``) walks attributes, which can
  reach anything, so it is code-running unless the whole path is allowed.

Then one table classes the resolved name:

- ``ALLOWED``: ckptport builds it (through a wrapper that checks arguments);
- ``INERT``: a class ckptport records by name and never constructs;
- ``CODE``: anything that executes, imports, opens files or sockets,
  spawns or evaluates, decided by module (and torch's own code-running
  helpers), never by how the name is spelled or capitalised.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import enum
from dataclasses import dataclass

__all__ = ["Name", "Kind", "resolve", "classify", "is_code", "known_class",
           "CODE_MODULES", "CODE_NAMES", "RECOGNIZED_CALLS"]

# torch.serialization's load_module_mapping, applied before the compat tables
_TORCH_RENAMES = {"torch.tensor": "torch._tensor"}


@dataclass(frozen=True)
class Name:
    """A global as the file spells it (``raw``) and as the unpickler resolves it."""

    raw: str
    resolved: str

    def __str__(self) -> str:
        return self.resolved if self.raw == self.resolved else \
            f"{self.resolved} (named {self.raw} in the file)"


class Kind(enum.Enum):
    ALLOWED = "allowed"
    INERT = "inert"
    CODE = "code-running"


def resolve(module: str, name: str, protocol: int) -> Name:
    """The global ``module``/``name`` as Python's unpickler resolves it under ``protocol``."""
    raw = f"{module}.{name}"
    module = _TORCH_RENAMES.get(module, module)
    if protocol < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    return Name(raw, f"{module}.{name}")


# Modules whose globals execute, import, read or write things. Matched as a
# module path prefix: ``os`` covers ``os.path``; ``torch.jit`` covers its submodules.
CODE_MODULES = frozenset({
    # processes, shells, the OS
    "os", "posix", "nt", "posixpath", "ntpath", "genericpath", "subprocess",
    "_posixsubprocess", "commands", "pty", "tty", "shutil", "signal", "resource",
    "pwd", "grp", "fcntl", "mmap", "_winapi", "msvcrt", "winreg",
    # code: import, compile, evaluate, debug, profile
    "sys", "builtins", "__builtin__", "importlib", "imp", "zipimport", "pkgutil", "runpy",
    "code", "codeop", "pdb", "bdb", "trace", "profile", "cProfile", "timeit", "inspect", "gc",
    "types", "marshal", "ast", "dis", "pydoc", "doctest", "unittest", "ctypes", "_ctypes",
    "cffi", "operator", "_operator", "functools", "_functools", "itertools", "copy",
    "copyreg", "abc", "weakref", "_weakref", "atexit", "threading", "_thread",
    "multiprocessing", "_multiprocessing", "concurrent", "asyncio", "sched",
    # serializers that run code on load
    "pickle", "_pickle", "pickletools", "shelve", "dbm", "dill", "cloudpickle", "joblib",
    "yaml", "jsonpickle", "pandas.io",
    # files, archives, networks
    "io", "_io", "codecs", "_codecs", "fileinput", "linecache", "tempfile", "glob",
    "tarfile", "zipfile", "gzip", "bz2", "lzma", "zlib", "logging", "socket", "_socket",
    "ssl", "select", "selectors", "urllib", "http", "ftplib", "smtplib", "telnetlib",
    "xmlrpc", "webbrowser", "requests", "httpx", "aiohttp", "paramiko",
    # installers and environments
    "setuptools", "distutils", "pip", "sysconfig", "site", "venv", "ensurepip",
    # numpy's file and build machinery
    "numpy.lib.npyio", "numpy.testing", "numpy.f2py", "numpy.distutils", "numpy.ctypeslib",
    # torch's own code-running helpers
    "torch.hub", "torch.jit", "torch.package", "torch.serialization", "torch.fx",
    "torch.ops", "torch._ops", "torch._C", "torch.multiprocessing", "torch.distributed",
    "torch.utils.cpp_extension", "torch.utils.collect_env", "torch.utils.data",
    "torch.utils.hooks", "torch._dynamo", "torch._inductor", "torch.compiler",
    "torch.library", "torch.classes", "torch._weights_only_unpickler", "torch.export",
    "torch._export", "torch.onnx", "torch.testing", "torch.backends", "torch.cuda",
})
CODE_NAMES = frozenset({
    "torch.load", "torch.save", "torch.compile", "torch.from_file", "torch.set_default_device",
    "torch.storage._load_from_bytes", "numpy.load", "numpy.save", "numpy.savez",
    "numpy.savez_compressed", "numpy.savetxt", "numpy.loadtxt", "numpy.genfromtxt",
    "numpy.fromfile", "numpy.fromregex", "numpy.memmap", "numpy.load_library",
})
# Code-running constructors whose arguments ckptport can still read as data:
# kept as records (never called) so the weights inside can be extracted.
RECOGNIZED_CALLS = frozenset({
    "torch.fx.graph_module.reduce_graph_module",
    "torch.fx.graph_module.reduce_package_graph_module",
    "torch.fx.graph_module.reduce_deploy_graph_module",
})
# Names known to be classes (a REDUCE of one constructs it), for the verdict on
# recorded calls. Exact names: a module also holds functions (``uuid`` has
# ``_get_command_stdout``, which runs a command). Only inside packages whose
# own convention is that classes alone are CapWords is a CapWords name taken as a
# class (a name the package lacks makes torch.load fail before anything runs).
_KNOWN_CLASSES = frozenset({
    "collections.UserDict", "collections.UserList", "collections.UserString",
    "collections.deque", "torch.nn.parameter.Buffer", "typing.Any",
    "datetime.datetime", "datetime.date", "datetime.time", "datetime.timedelta",
    "datetime.timezone", "decimal.Decimal", "fractions.Fraction", "uuid.UUID",
    "pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath", "pathlib.PurePath",
    "pathlib.PurePosixPath", "pathlib.PureWindowsPath",
})
_CLASS_CONVENTION_PACKAGES = ("torch.nn.modules.", "torch.optim.", "omegaconf.")


# ``builtins`` is code-running but for its exception classes: a pickle holds them as
# values (an error type in a config) or builds one, and neither runs anything.
_HARMLESS_BUILTINS = frozenset(
    f"builtins.{name}" for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException))


def _module_of(resolved: str) -> str:
    return resolved.rpartition(".")[0]


def is_code(resolved: str, allowed: frozenset[str] | set[str] = frozenset()) -> bool:
    """True when importing or calling ``resolved`` can run code, by module and name."""
    if resolved in allowed or resolved in _HARMLESS_BUILTINS:
        return False
    if resolved in CODE_NAMES:
        return True
    parts = resolved.split(".")
    if any(p.startswith("__") and p.endswith("__") for p in parts[1:]):
        return True  # dunder attributes reach the interpreter's machinery
    module = _module_of(resolved)
    head = module.split(".")
    if any(".".join(head[:i]) in CODE_MODULES for i in range(1, len(head) + 1)):
        return True
    return resolved.split(".", 1)[0] == "numpy"  # numpy beyond the allowed rebuilders


def classify(resolved: str, dotted: bool, allowed: frozenset[str] | set[str]) -> Kind:
    """The kind of a resolved global; ``dotted`` when the name part walks attributes."""
    if resolved in allowed:
        return Kind.ALLOWED
    if dotted or is_code(resolved, allowed):
        return Kind.CODE
    return Kind.INERT


def known_class(resolved: str) -> bool:
    if resolved in _KNOWN_CLASSES or resolved in _HARMLESS_BUILTINS:
        return True
    short = resolved.rpartition(".")[2]
    return resolved.startswith(_CLASS_CONVENTION_PACKAGES) and short[:1].isupper()
