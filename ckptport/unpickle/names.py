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

Then the resolved name is classed, never by how it is spelled or capitalised,
first by its text, then by what it reaches (``reach``): ``torch.os`` is the
module ``os``, ``torch.save`` is ``torch.serialization.save``, and the object
is classed by its kind and home, from the same table:

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

By what it reaches (``judge``; ``tests/unpickle/test_reach.py`` walks every
allowed module's attributes): a module is code-running (it holds everything
its code can do, and no pickle of a value names one); so is what a resolved
package's name leads to but cannot be followed without running code; a class
or function is classed by its home (``torch.os.system`` is ``posix.system``);
another value by its type's home, any value of a standard-library type but a
scalar being live state of the process (``sys.modules``). A resolved function,
unlike a class, runs when the file calls it: that call is code-running too.
A package ckptport does not import is read from its source (``imports``):
a name its source imports (``pkg.mod.os``, ``from subprocess import run``)
is judged as what it names; what it defines is judged by its text, never
allowed, its calls CKP012's tier.
"""

from __future__ import annotations

import _compat_pickle
import enum
from dataclasses import dataclass

from . import stdlib
from .reach import RESOLVED_PACKAGES, SCALAR_HOMES, Reach, Reached, reach

__all__ = ["Name", "Kind", "Verdict", "resolve", "classify", "judge", "judge_attribute",
           "is_code", "known_class", "unresolved_package", "CODE_MODULES", "CODE_NAMES",
           "RECOGNIZED_CALLS"]

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
    # torch's tools that write, rewrite, unpickle or run files when called or constructed
    # (SummaryWriter(logdir) makes the folder; show_pickle and model_dump unpickle theirs)
    "torch.utils.tensorboard", "torch.utils.show_pickle", "torch.utils.model_dump",
    "torch.utils.hipify", "torch.utils.bottleneck", "torch.utils.benchmark",
    "torch.utils.model_zoo",
})
CODE_NAMES = frozenset({
    "torch.load", "torch.save", "torch.compile", "torch.from_file", "torch.set_default_device",
    "torch.storage._load_from_bytes",
    # torch's functions outside those modules that import, resolve, open or set anything
    # named by their arguments (tests/unpickle/test_reach.py finds them by their bytecode)
    "torch._utils._import_dotted_name", "torch._utils._type", "torch._utils.try_import",
    "torch._utils._set_obj_state", "torch._utils._augment_memory_snapshot_stack_traces",
    "torch._utils._augment_frames",
    "torch.set_default_tensor_type", "torch._register_device_module",
    "torch._import_device_backends", "torch._load_global_deps", "torch._preload_cuda_lib",
    "torch.storage._StorageBase.from_file", "torch.storage.TypedStorage.from_file",
    "torch.storage.UntypedStorage.from_file", "torch.storage._LegacyStorage.from_file",
    "numpy.load", "numpy.save", "numpy.savez",
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


@dataclass(frozen=True)
class Verdict:
    """A name's kind, what it reaches (None: not resolved), and whether calling it runs code.

    ``called`` is true of resolved functions: the file may hold one as a value
    (an activation), but a call of it runs it.
    """

    kind: Kind
    reached: Reached | None = None
    called: bool = False

    def reaches(self, path: str) -> str:
        """``" (it reaches the module os)"`` where the object is not what the text says."""
        if self.reached is None or (self.reached.home == path and self.reached.kind not in (
                Reach.MODULE, Reach.UNRESOLVED)):
            return ""
        return f" (it reaches {self.reached})"


_ALLOWED = Verdict(Kind.ALLOWED)
_CODE = Verdict(Kind.CODE)
_INERT = Verdict(Kind.INERT)  # judged by its text alone
_MAX_IMPORTS = 16  # a name imported from a name imported from …: past this, code-running


def judge(resolved: str, dotted: bool, allowed: frozenset[str] | set[str]) -> Verdict:
    """The verdict on a resolved global; ``dotted`` when the name part walks attributes."""
    if resolved in allowed:
        return _ALLOWED
    if dotted or is_code(resolved, allowed):
        return _CODE
    module, _, name = resolved.rpartition(".")
    return _by_reach(reach(module, name), None)


def judge_attribute(owner: str, name: str) -> Verdict:
    """The verdict on ``builtins.getattr(owner, name)``, ``owner`` a global the file names.

    What a resolved class named by its own name defines itself (a nested
    class, a method, an enum member) shares the class's tier, bar the exact
    code-running names (``CODE_NAMES``); anything else the attribute reaches
    is judged by its home.
    """
    made = f"{owner}.{name}"
    if stdlib.is_stdlib(made) or made.startswith("numpy."):  # closed tables: code unless data
        return _CODE if is_code(made) else _INERT
    module, _, short = owner.rpartition(".")
    holder = reach(module, short)
    canonical = holder is not None and holder.kind is Reach.CLASS and holder.home == owner
    return _by_reach(reach(module, f"{short}.{name}"), owner if canonical else None)


def _by_reach(reached: Reached | None, owner: str | None, depth: int = 0) -> Verdict:
    """``owner``: the class the attribute was taken from, when it is named where it lives."""
    if reached is None:
        return _INERT
    if reached.kind is Reach.NAME:  # judged as each name it may be, through their imports
        if depth >= _MAX_IMPORTS or any(is_code(home) for home in reached.homes):
            return Verdict(Kind.CODE, reached)
        named = [_by_reach(reach(*home.rsplit(".", 1)), None, depth + 1)
                 for home in reached.homes]
        kind = Kind.CODE if any(v.kind is Kind.CODE for v in named) else Kind.INERT
        return Verdict(kind, reached, called=kind is Kind.INERT and any(v.called for v in named))
    if reached.kind in (Reach.MODULE, Reach.UNRESOLVED):
        return Verdict(Kind.CODE, reached)
    home = reached.home
    own = owner is not None and (home == owner or home.startswith(owner + "."))
    code = home in CODE_NAMES if own else is_code(home)
    if reached.kind is Reach.VALUE:
        live = home not in SCALAR_HOMES and stdlib.is_stdlib(home)  # sys.modules, a registry
        return Verdict(Kind.CODE if code or (live and not own) else Kind.INERT, reached)
    if code:
        return Verdict(Kind.CODE, reached)
    return Verdict(Kind.INERT, reached, called=reached.kind is Reach.FUNCTION)


def classify(resolved: str, dotted: bool, allowed: frozenset[str] | set[str]) -> Kind:
    """The kind of a resolved global; ``dotted`` when the name part walks attributes."""
    return judge(resolved, dotted, allowed).kind


def unresolved_package(resolved: str) -> str | None:
    """The package of a name judged by its text alone: ckptport never imports it to look."""
    top = resolved.split(".", 1)[0]
    return None if top in RESOLVED_PACKAGES or top == "numpy" or stdlib.is_stdlib(resolved) \
        else top


def known_class(resolved: str) -> bool:
    """A name proven to be a class: the standard library's data classes, and a few exact ones."""
    return resolved in _KNOWN_CLASSES or stdlib.is_data(resolved)
