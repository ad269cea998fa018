"""Read pickles without running them: the scan, the engine, the allow-list, the settle pass.

- ``names``: what a global resolves to and which kind it is (one table),
  judged by what it reaches (``reach``: the object full unpickling would get);
- ``scan``: a bounded walk over the opcodes before anything is unpickled;
- ``engine``: the C unpickler with ckptport's ``find_class`` and
  ``persistent_load``; the only entry point is ``unpickle``;
- ``values``, ``torch_values``, ``numpy_values``, ``data_records``,
  ``distributed_values``, ``torchao_values``: what the pickle is given
  instead of real objects, and the checks they make;
- ``settle``: the tree's shape checked, stand-ins turned into the tree's
  vocabulary.
"""

from __future__ import annotations

from .engine import PickleRefused, StorageHook, Unpickled, allowed_names, unpickle
from .names import Kind, Name, classify, resolve

__all__ = ["PickleRefused", "StorageHook", "Unpickled", "allowed_names", "unpickle", "Kind",
           "Name", "classify", "resolve"]
