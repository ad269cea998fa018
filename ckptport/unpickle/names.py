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

Then the resolved name is classed, never by how it is spelled or capitalised:

- ``ALLOWED``: ckptport builds it (through a wrapper that checks arguments);
- ``CODE``: anything that executes, imports, opens files or sockets, spawns
  or evaluates. The standard library is a closed world (``stdlib``): every
  global of it is code-running but the few data-only ones it lists; beyond
  it, decided by module (serializers that run code, networking, installers,
  torch's and numpy's code-running helpers);
- ``INERT``: any other class, recorded by name and never constructed. A
  third-party name the file *calls* cannot be proven harmless: reports name
  it in a tier of its own (``check`` code CKP012), apart from code-running
  names.
"""

from __future__ import annotations

import _compat_pickle
import enum
from dataclasses import dataclass

from . import stdlib

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


# Beyond the standard library: modules whose globals execute, import, read or write
# things. Matched as a module path prefix: ``torch.jit`` covers its submodules.
CODE_MODULES = frozenset({
    # Python 2 spellings that no compatibility table renames at protocol >= 3
    "__builtin__", "exceptions", "commands", "copy_reg", "cPickle", "imp",
    # serializers that run code on load
    "dill", "cloudpickle", "joblib", "yaml", "jsonpickle", "pandas.io",
    # networks, installers
    "requests", "httpx", "aiohttp", "urllib3", "paramiko", "setuptools", "pip",
    "pkg_resources", "_distutils_hack",
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
# Third-party names known to be classes (a REDUCE of one constructs it). Exact
# names: capitalisation never decides.
_KNOWN_CLASSES = frozenset({"torch.nn.parameter.Buffer"})


def _module_of(resolved: str) -> str:
    return resolved.rpartition(".")[0]


def is_code(resolved: str, allowed: frozenset[str] | set[str] = frozenset()) -> bool:
    """True when importing or calling ``resolved`` can run code, by module and name."""
    if resolved in allowed:
        return False
    if resolved in CODE_NAMES:
        return True
    parts = resolved.split(".")
    if any(p.startswith("__") and p.endswith("__") for p in parts[1:]):
        return True  # dunder attributes reach the interpreter's machinery
    if stdlib.is_stdlib(resolved):
        return not stdlib.is_data(resolved)
    head = _module_of(resolved).split(".")
    if any(".".join(head[:i]) in CODE_MODULES for i in range(1, len(head) + 1)):
        return True
    return parts[0] == "numpy"  # numpy beyond the allowed rebuilders


def classify(resolved: str, dotted: bool, allowed: frozenset[str] | set[str]) -> Kind:
    """The kind of a resolved global; ``dotted`` when the name part walks attributes."""
    if resolved in allowed:
        return Kind.ALLOWED
    if dotted or is_code(resolved, allowed):
        return Kind.CODE
    return Kind.INERT


def known_class(resolved: str) -> bool:
    """A name proven to be a class: the standard library's data classes, and a few exact ones."""
    return resolved in _KNOWN_CLASSES or stdlib.is_data(resolved)
