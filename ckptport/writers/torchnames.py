"""Stand-ins for the torch globals a ``.pth`` pickle names, so it is made without torch.

``import torch`` costs one to two seconds. A ``.pth`` pickle names only a
few torch globals (``torch._utils._rebuild_tensor_v2``/``_v3``, a storage
class, a dtype), and pickle writes a global as its module and name and
nothing else. The writer pickles these stand-ins, which live here under
torch's names, then rewrites this module's name to torch's in each
``GLOBAL`` opcode: protocol 2 has no frames or offsets, so the result is,
byte for byte, the pickle the real objects give (tested). torch is then
imported on another thread while the records are written, for the
verification that follows (``imported_meanwhile``).

A pickle that holds this module's marker anywhere else (a string of the
user's spelling it) is pickled again with the real torch objects.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import NoReturn

from ..dtypes import DTYPES, STORAGE_CLASSES, DType

__all__ = ["standin", "real", "storage_class", "to_torch_names", "imported_meanwhile"]

MARKER = b"c" + __name__.encode() + b"\n"  # the start of a GLOBAL opcode naming this module
_UTILS = ("_rebuild_tensor_v2", "_rebuild_tensor_v3")
# where pickle finds the torch objects (their ``__module__``); every other one is in ``torch``
_MODULES = {**dict.fromkeys(_UTILS, "torch._utils"), "UntypedStorage": "torch.storage"}


class _Global:
    """Pickles as the global ``ckptport.writers.torchnames.<name>``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> str:
        return self.name

    def __call__(self, *args: object) -> NoReturn:  # pickle takes only callables as constructors
        raise TypeError(f"torch.{self.name} stands in for pickling, it is never called")


# dtype -> its legacy storage class (what ``torch.storage._dtype_to_storage_type_map`` says)
_STORAGE_OF = {d.name: cls for cls, d in STORAGE_CLASSES.items() if cls != "Storage"}

for _name in (*_UTILS, "UntypedStorage", *_STORAGE_OF.values(),
              *(d.name for d in DTYPES.values() if d.in_torch)):
    globals()[_name] = _Global(_name)


def storage_class(dtype: DType) -> str | None:
    """The legacy storage class torch pickles a tensor of ``dtype`` with (``_rebuild_tensor_v2``),
    or None for dtypes without one (``_rebuild_tensor_v3``, an ``UntypedStorage``)."""
    return _STORAGE_OF.get(dtype.name)


def standin(name: str) -> object:
    """The stand-in for ``torch.<name>`` (or ``torch._utils.<name>``)."""
    return globals()[name]


def real(name: str) -> object:
    """The torch object itself."""
    import torch

    return getattr(torch._utils if name in _UTILS else torch, name)


def to_torch_names(pickled: bytes, used: int) -> bytes | None:
    """``pickled`` with torch's module names in place of this module's, or None when the
    marker appears other than in the ``used`` globals (pickle again with the real ones)."""
    if pickled.count(MARKER) != used:
        return None
    for name, module in _MODULES.items():
        pickled = pickled.replace(MARKER + name.encode() + b"\n",
                                  b"c" + module.encode() + b"\n" + name.encode() + b"\n")
    return pickled.replace(MARKER, b"ctorch\n")


def _import_torch() -> None:
    # a failure is raised again, with its cause, where torch is needed (verification)
    with contextlib.suppress(Exception):
        import torch  # noqa: F401


@contextlib.contextmanager
def imported_meanwhile() -> Iterator[None]:
    """Import torch on a thread while the block runs (the writing: kernel copies and CRCs,
    which leave the interpreter free), and wait for it at the end, so no import is under
    way when the caller goes on (a fork then would copy a held import lock)."""
    thread = threading.Thread(target=_import_torch, name="ckptport-import-torch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
