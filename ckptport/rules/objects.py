"""Turn everything that is not plain data into plain data: a closure, not a best effort.

After this rule the tree holds only what a consumer's plain
``torch.load(weights_only=True)`` accepts and what safetensors metadata can
carry: None, bool, int, float, complex, str, bytes, sets, lists, tuples,
dicts (a state dict's ``OrderedDict`` and ``_metadata`` kept) and tensors.
Everything else is converted, and each conversion is a change in the report:

- ``torch.Size`` -> tuple, ``torch.device`` -> ``"cuda:1"``, a dtype ->
  ``"torch.bfloat16"``, ``nn.Parameter`` -> a plain tensor;
- ``argparse.Namespace``, ``defaultdict``, ``Counter`` -> dict;
- frozensets -> sets, bytearrays -> bytes; slices and ranges ->
  ``[start, stop, step]`` (writers sort a set's items, so the bytes do not
  depend on hashing);
- numpy scalars -> Python numbers (``longdouble`` rounded to float64, said
  so), numpy arrays -> tensors (or lists where torch has no such dtype);
- datetimes -> ISO text, ``Decimal``/``Fraction``/``UUID`` -> text;
- objects of classes outside the allow-list (inert records) -> dicts naming
  their class (``{"__class__": "omegaconf.dictconfig.DictConfig", ...}``).

Anything that still is not plain data is a ``RuleError`` naming the key and
the type, never a silent loss.
"""

from __future__ import annotations

import argparse
import datetime
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, cast

from ..checkpoint import Checkpoint
from ..dtypes import DType
from ..errors import RuleError
from ..tensors import Blob, StorageInfo, TensorInfo, contiguous_strides
from ..tree import (
    Backref,
    GlobalRef,
    Key,
    KeyPath,
    ObjectRecord,
    RecordKind,
    TensorLeaf,
    Tree,
    format_path,
    is_tensor,
    rebuild_dict,
    type_name,
)
from .base import Change, RuleResult

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

__all__ = ["ConvertObjects", "record_dict", "PLAIN_SCALARS"]

PLAIN_SCALARS = (type(None), bool, int, float, complex, str, bytes)


@dataclass(frozen=True)
class ConvertObjects:
    name: str = "convert-objects"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        converter = _Converter(checkpoint)
        tree = converter.convert(checkpoint.tree, ())
        changes = tuple(converter.changes)
        summary = f"converted {len(changes)} objects" if changes else "nothing to convert"
        return checkpoint.with_tree(tree), RuleResult(self.name, changes, summary)


class _Converter:
    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint = checkpoint
        self.changes: list[Change] = []
        self.done: dict[int, TensorLeaf] = {}  # one object under two names stays one value (ties)

    def convert(self, value: Tree, path: KeyPath) -> Tree:
        kind = type(value)
        if kind in PLAIN_SCALARS:
            return value
        if kind is list or kind is tuple:  # the casts say what ``kind`` proved (as children)
            made = [self.convert(v, (*path, i)) for i, v in enumerate(cast("list[Tree]", value))]
            return made if kind is list else tuple(made)
        if kind is dict or kind is OrderedDict:
            return self.mapping(cast("dict[Key, Tree]", value), path)
        if kind is set:
            return {self.convert(v, (*path, "<item>")) for v in cast("set[Tree]", value)}
        if is_tensor(value):
            return self.tensor(value, path)
        plain, note = self.plain(value, path)
        before = type_name(value)
        after = type_name(plain)
        self.changes.append(Change(format_path(path), "converted",
                                   f"{before} -> {after}{note}"))
        return self.convert(plain, path)

    def mapping(self, value: dict[Key, Tree], path: KeyPath) -> dict[Key, Tree]:
        items = []
        for key, item in value.items():
            if type(key) not in PLAIN_SCALARS and type(key) is not tuple:  # a Size, a DType
                key = self.convert(key, (*path, "<key>"))
            items.append((key, self.convert(item, (*path, key))))
        rebuilt = rebuild_dict(value, items)
        versions = getattr(value, "_metadata", None)
        if versions is not None:
            rebuilt._metadata = self.convert(versions, (*path, "_metadata"))  # type: ignore[attr-defined]
        return rebuilt

    def tensor(self, value: TensorLeaf, path: KeyPath) -> TensorLeaf:
        if id(value) in self.done:
            return self.done[id(value)]
        result = value
        if isinstance(value, TensorInfo) and (value.parameter or value.requires_grad):
            result = replace(value, parameter=False, requires_grad=False)
        elif not isinstance(value, TensorInfo) and getattr(value, "requires_grad", False) or \
                type(value).__name__ == "Parameter":
            result = cast("torch.Tensor", value).detach().requires_grad_(False)  # not a Leaf
        if result is not value:
            kind = "torch.nn.parameter.Parameter" if getattr(value, "parameter", True) \
                else "tensor (requires_grad)"
            self.changes.append(Change(format_path(path), "converted", f"{kind} -> tensor"))
        self.done[id(value)] = result
        return result

    def plain(self, value: Tree, path: KeyPath) -> tuple[Tree, str]:
        """One step toward plain data, and a note when the step loses something."""
        for test, convert in _CONVERSIONS:
            if test(value):
                try:
                    with warnings.catch_warnings():  # numpy's overflow notes: not the user's
                        warnings.simplefilter("ignore")
                        return convert(value)
                except (ValueError, TypeError, OverflowError) as exc:
                    raise RuleError(f"{format_path(path)} holds {_a(type_name(value))} that "
                                    f"cannot become plain data: {exc}",
                                    self.checkpoint.source.path) from None
        if isinstance(value, ObjectRecord):
            config = _omegaconf(value)
            if config is not _NOT_CONFIG:
                return config, " (as OmegaConf.to_container(resolve=False) gives it)"
            special = _record_value(value)
            return (special, "") if special is not None else (record_dict(value), "")
        raise RuleError(f"{format_path(path)} holds {_a(type_name(value))}, which ckptport "
                        "cannot turn into plain data; leave it out with --select",
                        self.checkpoint.source.path)


def _a(name: str) -> str:
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


def _is_numpy(value: Tree) -> bool:
    return type(value).__module__.split(".")[0] == "numpy"


def _numpy(value: Tree) -> tuple[Tree, str]:
    import numpy as np

    if isinstance(value, np.generic):
        if isinstance(value, np.longdouble):
            return float(value), " (rounded to float64)"
        if isinstance(value, np.clongdouble):
            return complex(value), " (rounded to complex128)"
        if isinstance(value, (np.datetime64, np.timedelta64)):
            return str(value), ""
        return value.item(), ""
    if isinstance(value, np.dtype):
        return str(value), ""
    if isinstance(value, np.ndarray):
        return _array(value)
    raise TypeError(type(value))


def _array(array: npt.NDArray[np.generic]) -> tuple[Tree, str]:
    """A numpy array as a tensor over its bytes, or a list where torch has no such dtype."""
    import numpy as np

    from ..dtypes import DTYPES

    native = array.astype(array.dtype.newbyteorder("<")) if array.dtype.byteorder == ">" \
        else array
    match = next((d for d in DTYPES.values() if d.numpy and np.dtype(d.numpy) == native.dtype),
                 None)
    if match is None and not array.size:
        _bounded_empty(array.shape)
    if match is None:
        if array.dtype.kind == "M":  # datetime64: ISO text, as numpy writes it
            return np.datetime_as_string(cast("npt.NDArray[np.datetime64]", array)).tolist(), ""
        if array.dtype.kind == "m":
            return [str(v) for v in array.ravel()], ""
        if array.dtype.kind == "f":
            return _array(array.astype(np.float64))[0], " (rounded to float64)"
        return array.tolist(), ""
    data = np.ascontiguousarray(native).tobytes()
    shape = tuple(int(n) for n in array.shape)
    storage = StorageInfo("numpy", "cpu", match, len(data), Blob.of_bytes(data, "numpy array"))
    return TensorInfo(match, shape, contiguous_strides(shape), 0, storage), ""


MAX_EMPTY_ROWS = 1 << 20  # empty lists an empty array may become (it holds no bytes)


def _bounded_empty(shape: tuple[int, ...]) -> None:
    """An empty array becomes nested empty lists: as many as its shape claims, from no data.

    ``S4`` of shape (30000000, 0) is 30 M lists from a few bytes of pickle.
    """
    rows, made = 1, 0
    for size in shape:
        if not size:
            break
        rows *= size
        made += rows
        if made > MAX_EMPTY_ROWS:
            raise ValueError(f"an empty array of shape {shape} would become more than "
                             f"{MAX_EMPTY_ROWS} empty lists (it holds no values)")


def _torch_value(value: Tree) -> tuple[Tree, str]:
    name = type(value).__name__
    if name == "Size":
        return tuple(cast("tuple[int, ...]", value)), ""
    if name == "device":
        return str(value), ""
    if name == "dtype":
        return str(value), ""
    raise TypeError(type(value))


def _is_torch_value(value: Tree) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ in ("Size", "device",
                                                                           "dtype")


# Any: each conversion receives the value its test proved the type of (a slice, a date, ...)
_CONVERSIONS: list[tuple[Callable[[Tree], bool], Callable[[Any], tuple[Tree, str]]]] = [
    (lambda v: type(v).__qualname__ == "Size" and isinstance(v, tuple),
     lambda v: (tuple(v), "")),
    (lambda v: type(v).__qualname__ == "device" and hasattr(v, "type"), lambda v: (str(v), "")),
    (lambda v: isinstance(v, DType), lambda v: (str(v), "")),
    (_is_torch_value, _torch_value),
    (lambda v: isinstance(v, argparse.Namespace), lambda v: (dict(vars(v)), "")),
    (lambda v: isinstance(v, Counter), lambda v: (dict(v), "")),
    (lambda v: isinstance(v, Mapping), lambda v: (dict(v), "")),
    (lambda v: isinstance(v, frozenset), lambda v: (set(v), "")),
    (lambda v: isinstance(v, set), lambda v: (set(v), "")),
    (lambda v: isinstance(v, complex), lambda v: (complex(v), "")),
    (lambda v: isinstance(v, (slice, range)), lambda v: ([v.start, v.stop, v.step], "")),
    (lambda v: isinstance(v, bytearray), lambda v: (bytes(v), "")),
    (lambda v: isinstance(v, tuple), lambda v: (tuple(v), "")),
    (lambda v: isinstance(v, str), lambda v: (str(v), "")),
    (lambda v: isinstance(v, int), lambda v: (int(v), "")),
    (lambda v: isinstance(v, float), lambda v: (float(v), "")),
    (lambda v: isinstance(v, GlobalRef), lambda v: ({"__global__": v.name}, "")),
    (lambda v: isinstance(v, Backref), lambda v: ({"__backref__": v.target}, "")),
    (_is_numpy, _numpy),
    (lambda v: isinstance(v, (datetime.date, datetime.time)), lambda v: (v.isoformat(), "")),
    (lambda v: isinstance(v, datetime.timedelta), lambda v: (str(v), "")),
    (lambda v: isinstance(v, (Decimal, Fraction)), lambda v: (str(v), "")),
]


def _record_value(record: ObjectRecord) -> str | None:
    """Standard-library values a record can be read as, exactly, without running anything."""
    args = record.args
    try:
        if record.name in ("datetime.datetime", "datetime.date", "datetime.time") and \
                1 <= len(args) <= 2 and isinstance(args[0], bytes):
            kind: Callable[..., datetime.date | datetime.time] = getattr(
                datetime, record.name.rpartition(".")[2])
            if len(args) == 1:
                return kind(args[0]).isoformat()  # the pickle form: bytes C checks
            zone = _timezone(args[1])
            return None if zone is None else kind(args[0], zone).isoformat()
        if record.name == "datetime.timedelta":
            delta = _timedelta(record)
            return None if delta is None else str(delta)
        if record.name in ("decimal.Decimal", "fractions.Fraction", "uuid.UUID") and \
                len(args) == 1 and isinstance(args[0], (str, int)):
            return str(args[0])
        if record.name == "fractions.Fraction" and len(args) == 2 and \
                all(type(a) is int for a in args):
            return str(Fraction(*cast("tuple[int, int]", args)))
        if record.name in ("uuid.UUID",) and isinstance(record.state, dict) and \
                type(record.state.get("int")) is int:
            return f"{record.state['int']:032x}"
    except (ValueError, TypeError, OverflowError):
        return None
    return None


_NOT_CONFIG = object()
_CONFIGS = ("omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig")


def _omegaconf(record: ObjectRecord) -> Tree:
    """An omegaconf config as its plain content, the way ``OmegaConf.to_container`` gives it.

    A ``DictConfig``/``ListConfig`` pickles its ``_content``: value nodes
    (``omegaconf.nodes.*`` holding ``_val``) and nested configs, plus
    metadata and parent links that ``to_container`` drops. Interpolations
    (``"${...}"``) and missing values (``"???"``) stay as the text they are.
    """
    state = record.state
    if record.name in _CONFIGS and isinstance(state, dict) and "_content" in state:
        content = state["_content"]
        if isinstance(content, dict):
            return {key: _config_value(value) for key, value in content.items()}
        if isinstance(content, list):
            return [_config_value(value) for value in content]
        return content  # None, "???" or an interpolation of the whole node
    return _NOT_CONFIG


def _config_value(node: Tree) -> Tree:
    if isinstance(node, ObjectRecord):
        config = _omegaconf(node)
        if config is not _NOT_CONFIG:
            return config
        if node.name.startswith("omegaconf.nodes.") and isinstance(node.state, dict) and \
                "_val" in node.state:
            return node.state["_val"]
    return node


def _timedelta(record: Tree) -> datetime.timedelta | None:
    if isinstance(record, ObjectRecord) and record.name == "datetime.timedelta" and \
            len(record.args) <= 3 and all(type(a) is int for a in record.args):
        return datetime.timedelta(*cast("tuple[int, ...]", record.args))
    return None


def _timezone(record: Tree) -> datetime.timezone | None:
    """A ``datetime.timezone`` record (offset, optional name) as the real, immutable value."""
    if not (isinstance(record, ObjectRecord) and record.name == "datetime.timezone"
            and 1 <= len(record.args) <= 2):
        return None
    offset = _timedelta(record.args[0])
    name = record.args[1:]
    if offset is None or not all(type(n) is str for n in name):
        return None
    return datetime.timezone(offset, *cast("tuple[str, ...]", name))


def record_dict(record: ObjectRecord) -> dict[str, Tree]:
    """An object record as a plain dict: its class, then the data it was pickled with.

    A dict state (the usual ``__dict__``) is spread into the dict; other
    parts keep dunder keys so nothing from the file is lost or confused
    with an attribute.
    """
    out: dict[str, Tree] = {"__class__": record.name}
    if record.kind is RecordKind.CALL:
        out = {"__call__": record.name}
    parts = {"__args__": list(record.args), "__kwargs__": record.kwargs,
             "__items__": record.items, "__list__": record.listitems}
    out.update((key, part) for key, part in parts.items() if part)
    state = record.state
    if isinstance(state, dict) and all(isinstance(k, str) and k not in out for k in state):
        out.update(state)
    elif state is not None:
        out["__state__"] = state
    return out
