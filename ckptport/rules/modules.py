"""The state dict of a model pickled whole, rebuilt from its record without running it.

``torch.save(model)`` pickles the module objects: classes the reader
usually cannot import, and loading them runs their code. ckptport records
each module inertly (its ``__dict__``), so the state dict can be rebuilt
exactly as ``nn.Module.state_dict()`` builds it: each module's parameters,
then its persistent buffers (``_non_persistent_buffers_set`` left out,
``None`` entries skipped), then its children in order, with one
``_metadata`` entry per module holding its version (2 for torch's batch
and instance norms, 1 for every other class). Tied parameters stay one
tensor. A pickled ``torch.fx.GraphModule`` arrives as a call that would
recompile the code stored in the file; its first argument is the module's
``__dict__``, read the same way.

What cannot be reproduced without running the class's code is refused,
naming the module: a registered state-dict hook. A class's own
``get_extra_state`` cannot be seen in a record at all (see the README).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, TypeGuard, cast

from ..errors import RuleError
from ..tree import ObjectRecord, Tree, is_tensor, type_name

if TYPE_CHECKING:
    import torch

    from ..remote.urls import Where

__all__ = ["is_module", "module_state_dict", "GRAPH_MODULE_CALLS"]

GRAPH_MODULE_CALLS = ("torch.fx.graph_module.reduce_graph_module",
                      "torch.fx.graph_module.reduce_package_graph_module",
                      "torch.fx.graph_module.reduce_deploy_graph_module")
_MODULE_KEYS = ("_parameters", "_buffers", "_modules")
_VERSION_2 = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
              "LazyBatchNorm3d", "SyncBatchNorm", "InstanceNorm1d", "InstanceNorm2d",
              "InstanceNorm3d", "LazyInstanceNorm1d", "LazyInstanceNorm2d", "LazyInstanceNorm3d")
_HOOKS = ("_state_dict_hooks", "_state_dict_pre_hooks")


def _state(value: Tree) -> Mapping[str, Tree] | None:
    """The ``__dict__`` a module record carries, or None if ``value`` is not a module."""
    if not isinstance(value, ObjectRecord):
        return None
    state = value.state
    if value.name in GRAPH_MODULE_CALLS and value.args and isinstance(value.args[0], Mapping):
        state = value.args[0]
    if isinstance(state, Mapping) and all(isinstance(state.get(k), Mapping)
                                          for k in _MODULE_KEYS):
        return cast("Mapping[str, Tree]", state)  # a module's __dict__: attribute names
    return None


def _is_torch_module(value: Tree) -> TypeGuard[torch.nn.Module]:
    torch_nn = getattr(sys.modules.get("torch"), "nn", None)
    return torch_nn is not None and isinstance(value, torch_nn.Module)


def is_module(value: Tree) -> bool:
    """A recorded ``nn.Module`` (or, read with ``--trust``, a live one)."""
    return _state(value) is not None or _is_torch_module(value)


def _class(value: ObjectRecord) -> str:
    return "torch.fx.graph_module.GraphModule" if value.name in GRAPH_MODULE_CALLS \
        else value.name


def _version(class_name: str) -> int:
    module, _, short = class_name.rpartition(".")
    return 2 if module.startswith("torch.nn.modules.") and short in _VERSION_2 else 1


def module_state_dict(root: Tree, where: str, path: Where | None
                      ) -> tuple[dict[str, Tree], tuple[str, ...]]:
    """What ``root.state_dict()`` returns, and notes for the report."""
    if _is_torch_module(root):  # read with --trust: the user vouched for running its code
        return root.state_dict(), ()
    result: OrderedDict[str, Tree] = OrderedDict()
    metadata: OrderedDict[str, dict[str, int]] = OrderedDict()
    classes: list[str] = []

    def walk(record: ObjectRecord, prefix: str) -> None:
        state = _state(record)
        assert state is not None
        name = prefix[:-1] or "<root>"
        for hook in _HOOKS:
            if state.get(hook):
                kind = "pre-hook" if "pre" in hook else "hook"
                raise RuleError(f"module {name} ({_class(record)}) has a registered state_dict "
                                f"{kind} ({hook}): its state dict cannot be rebuilt without "
                                "running that code; use --trust if you vouch for the file",
                                path)
        metadata[prefix[:-1]] = {"version": _version(_class(record))}
        classes.append(_class(record))
        # a set of buffer names, as nn.Module keeps it
        skipped = cast("Collection[str]", state.get("_non_persistent_buffers_set") or ())
        for kind in ("_parameters", "_buffers"):  # Mappings, as _state checked
            for key, value in cast("Mapping[str, Tree]", state[kind]).items():
                if value is None or (kind == "_buffers" and key in skipped):
                    continue
                if not is_tensor(value):
                    raise RuleError(f"module {name} ({_class(record)}): {key} is "
                                    f"{type_name(value)}, not a tensor", path)
                result[prefix + key] = value
        for key, child in cast("Mapping[str, Tree]", state["_modules"]).items():
            if child is None:
                continue
            if not isinstance(child, ObjectRecord) or _state(child) is None:
                raise RuleError(f"module {name} ({_class(record)}): submodule {key} is "
                                f"{type_name(child)}, not a recorded module", path)
            walk(child, f"{prefix}{key}.")

    assert isinstance(root, ObjectRecord)  # is_module(root), and not a live one: a record
    walk(root, "")
    result._metadata = metadata  # type: ignore[attr-defined]
    return result, _notes(where, classes)


def _notes(where: str, classes: list[str]) -> tuple[str, ...]:
    """What the report says of the modules rebuilt: each class, and what a class that is
    not torch's may add that the file cannot show."""
    counts: dict[str, int] = {}
    for name in classes:
        counts[name] = counts.get(name, 0) + 1
    listing = ", ".join(f"{n} ×{c}" if c > 1 else n for n, c in counts.items())
    notes = [f"modules of {where}: {listing}"]
    custom = [n for n in counts if not n.startswith("torch.")]
    if custom:
        notes.append(f"{', '.join(custom)} {'is' if len(custom) == 1 else 'are'} not torch's: "
                     "entries its own code adds to state_dict() (get_extra_state, an overridden "
                     "state_dict) cannot be seen in the file and are not included")
    return tuple(notes)
