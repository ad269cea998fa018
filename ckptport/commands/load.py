"""The one-liners users want instead of ``torch.load(map_location=…)`` + prefix surgery.

``load_state_dict`` reads any supported checkpoint safely and returns a
plain state dict (wrapper prefixes stripped, objects converted) on the
device asked for. ``load_into`` also matches keys to the model whether the
model, the checkpoint, or both are wrapped (DataParallel, DDP,
torch.compile, FSDP), and on a mismatch raises one error that lists the
missing and unexpected keys, their closest matches and the prefix that
would fix them.
"""

from __future__ import annotations

import difflib
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import CkptportError, SelectionError, StateDictMismatchError
from ..readers import read
from ..rules import NormalizeOptions, apply_rules, is_state_dict, strip_key
from ..tree import rebuild_dict

if TYPE_CHECKING:
    import torch

__all__ = ["load_state_dict", "load_into", "LoadResult"]

SHOWN_KEYS = 5


def load_state_dict(
    path: str | os.PathLike[str],
    device: str | torch.device | None = None,
    *,
    options: NormalizeOptions | None = None,
    trust: bool = False,
) -> OrderedDict[str, torch.Tensor]:
    """A plain state dict from any checkpoint, ready for ``model.load_state_dict``.

    Tensors stay mapped from the file (copy-on-write) unless ``device`` asks
    for another device (``"cuda:0"``, ``"mps"``).
    """
    normalized = apply_rules(read(path, trust=trust), options)
    state = normalized.checkpoint.tree
    if not is_state_dict(state):
        raise SelectionError("the selected part is not a state dict of tensors; pass "
                             "options=NormalizeOptions(select=...)", os.fspath(path))
    if device is not None:
        state = rebuild_dict(state, [(k, _to(v, device, path)) for k, v in state.items()])
    return state


def _to(tensor: torch.Tensor, device: str | torch.device, path: str | os.PathLike[str]
        ) -> torch.Tensor:
    try:
        return tensor.to(device)
    except (AssertionError, RuntimeError, ValueError) as exc:  # no such device here
        raise CkptportError(f"cannot move the weights to {device}: {str(exc).splitlines()[0]}",
                            os.fspath(path)) from None


@dataclass(frozen=True)
class LoadResult:
    """Keys of the model the checkpoint did not fill, and checkpoint keys left over."""

    missing: tuple[str, ...]
    unexpected: tuple[str, ...]


def load_into(model: torch.nn.Module, path: str | os.PathLike[str], *, strict: bool = True,
              options: NormalizeOptions | None = None, trust: bool = False) -> LoadResult:
    """Load ``path`` into ``model``, wrapped or not, on the model's own keys."""
    state = load_state_dict(path, options=options, trust=trust)
    model_state = model.state_dict(keep_vars=True)
    model_keys = list(model_state)
    by_stripped = {strip_key(key) or key: key for key in model_keys}
    renamed = rebuild_dict(state, [(by_stripped.get(k, k), v) for k, v in state.items()])
    _fill_ties(model_state, renamed)
    versions = getattr(state, "_metadata", None)
    if versions is not None:
        renamed._metadata = _versions_for(model, versions)  # type: ignore[attr-defined]
    missing = tuple(k for k in model_keys if k not in renamed)
    unexpected = tuple(k for k in renamed if k not in set(model_keys))
    if strict and (missing or unexpected):
        raise StateDictMismatchError(_explain(missing, unexpected), os.fspath(path))
    model.load_state_dict(renamed, strict=False)
    return LoadResult(missing, unexpected)


def _fill_ties(model_state: Mapping[str, Any], loaded: dict[str, Any]) -> None:
    """Fill model keys the model ties to a key the checkpoint holds (``lm_head`` = embedding).

    Files saved the hub's way leave tied names out; the model itself says
    which of its tensors are one, and loading one fills the other.
    """
    owner: dict[int, str] = {}
    for key, tensor in model_state.items():
        if key in loaded and hasattr(tensor, "data_ptr") and tensor.numel():
            owner.setdefault(tensor.data_ptr(), key)
    for key, tensor in model_state.items():
        if key not in loaded and hasattr(tensor, "data_ptr") and tensor.numel():
            source = owner.get(tensor.data_ptr())
            if source is not None and tuple(model_state[source].shape) == tuple(tensor.shape):
                loaded[key] = loaded[source]


def _versions_for(model: torch.nn.Module, versions: Mapping[str, Any]) -> OrderedDict[str, Any]:
    """Module versions under the model's own (possibly wrapped) module names."""
    names = {name: name for name, _ in model.named_modules()}
    by_stripped = {strip_key(f"{n}.").removesuffix(".") if n else "": n for n in names}
    return OrderedDict((by_stripped.get(k, k), v) for k, v in versions.items())


def _explain(missing: tuple[str, ...], unexpected: tuple[str, ...]) -> str:
    parts = []
    if missing:
        parts.append(f"{len(missing)} model keys missing from the checkpoint: "
                     + _listing(missing, unexpected))
    if unexpected:
        parts.append(f"{len(unexpected)} checkpoint keys the model does not have: "
                     + _listing(unexpected, missing))
    fix = _prefix_fix(missing, unexpected)
    if fix:
        parts.append(fix)
    return "; ".join(parts)


def _listing(keys: tuple[str, ...], others: tuple[str, ...]) -> str:
    shown = []
    for key in keys[:SHOWN_KEYS]:
        close = difflib.get_close_matches(key, others, n=1, cutoff=0.6)
        shown.append(f"{key} (closest: {close[0]})" if close else key)
    more = f", … {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(shown) + more


def _prefix_fix(missing: tuple[str, ...], unexpected: tuple[str, ...]) -> str:
    """The one prefix that, removed from one side's keys, makes them the other side's."""
    extra = _common_extra_prefix(unexpected, set(missing))
    if extra:
        return (f"the checkpoint keys carry the prefix {extra!r}: pass "
                f"options=NormalizeOptions(strip_prefixes=({extra!r},)) "
                f"(CLI: --strip-prefix {extra})")
    extra = _common_extra_prefix(missing, set(unexpected))
    if extra:
        return (f"the model's keys carry the prefix {extra!r}: load into "
                f"model.{extra.rstrip('.')} instead")
    return ""


def _common_extra_prefix(keys: tuple[str, ...], targets: set[str]) -> str:
    if not keys or not targets:
        return ""
    parts = keys[0].split(".")
    for cut in range(1, len(parts)):
        prefix = ".".join(parts[:cut]) + "."
        if all(k.startswith(prefix) and k[len(prefix):] in targets for k in keys):
            return prefix
    return ""
