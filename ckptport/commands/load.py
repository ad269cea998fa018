"""The one-liners users want instead of ``torch.load(map_location=…)`` + prefix surgery.

``load_state_dict`` reads any supported checkpoint safely and returns a
plain state dict (wrapper prefixes stripped, objects converted) on the
device asked for. ``load_into`` also matches keys to the model whether the
model, the checkpoint, or both are wrapped (DataParallel, DDP,
torch.compile, FSDP), and on a mismatch raises one error that lists the
missing and unexpected keys, their closest matches and the prefix that
would fix them.

Both take the key-surgery arguments of ``normalize`` (``subtree=``,
``keep=``, ``drop=``, ``rename=``, ``map=``), applied in the same order.
``load_into`` never reports success for a load that did not happen: a model
built on the ``meta`` device gets the checkpoint's tensors assigned (on
``device``, in ``dtype``), a shape mismatch is a ``StateDictMismatchError``
naming the tensors (or skipped and reported with
``ignore_mismatched_sizes``), and a load that matched no key is an error.
"""

from __future__ import annotations

import difflib
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..errors import CkptportError, OptionError, SelectionError, StateDictMismatchError
from ..quant import QuantError, config_of, recognize
from ..readers import read
from ..rules import NormalizeOptions, Recipe, apply_rules, is_state_dict, strip_key
from ..tree import rebuild_dict

if TYPE_CHECKING:
    import torch

__all__ = ["load_state_dict", "load_into", "LoadResult"]

SHOWN_KEYS = 5


def with_keys(options: NormalizeOptions | None, *, subtree: str | None = None,
              keep: Sequence[str] = (), drop: Sequence[str] = (),
              rename: Sequence[tuple[str, str]] = (),
              map: Recipe | str | os.PathLike[str] | None = None) -> NormalizeOptions | None:  # noqa: A002
    """``options`` with the key-surgery keywords of the Python API added (``map``: a recipe
    file, as ``--map``); one given both ways is an ``OptionError``, since one of the two
    would be dropped without a word."""
    if not (subtree or keep or drop or rename or map):
        return options
    base = options or NormalizeOptions()
    twice = [name for name, mine, theirs in (
        ("subtree", subtree, base.subtree), ("keep", keep, base.keep), ("drop", drop, base.drop),
        ("rename", rename, base.rename), ("map", map, base.recipe)) if mine and theirs]
    if twice:
        raise OptionError(f"{', '.join(twice)}: given both as a keyword and in options; "
                          "give each once")
    return replace(base, subtree=subtree or base.subtree, keep=tuple(keep) or base.keep,
                   drop=tuple(drop) or base.drop, rename=tuple(rename) or base.rename,
                   recipe=map or base.recipe)


def load_state_dict(
    path: str | os.PathLike[str],
    device: str | torch.device | None = None,
    *,
    options: NormalizeOptions | None = None,
    trust: bool = False,
    subtree: str | None = None,
    keep: Sequence[str] = (),
    drop: Sequence[str] = (),
    rename: Sequence[tuple[str, str]] = (),
    map: Recipe | str | os.PathLike[str] | None = None,  # noqa: A002 (the CLI's --map)
    max_expansion: float | None = None,
    tag: str | None = None,
    dequantize: str | None = None,
) -> OrderedDict[str, torch.Tensor]:
    """A plain state dict from any checkpoint, ready for ``model.load_state_dict``.

    Args:
        path: any checkpoint ckptport reads.
        device: move the tensors there (``"cuda:0"``, ``"mps"``); default: they stay
            mapped from the file (copy-on-write).
        options: ``NormalizeOptions``; ``subtree``, ``keep``, ``drop``, ``rename`` and
            ``map`` are ``normalize``'s key steps, added to them.
        trust: unpickle with full Python (runs code from the file).
        max_expansion: the read budget's ratio (``readers.budget``), as ``--max-expansion``.
        tag: a DeepSpeed save folder's tag (default: the one ``latest`` names).
        dequantize: ``"bfloat16"``, ``"float16"`` or ``"float32"``: each quantized weight
            as one plain tensor, as ``--dequantize`` (docs/quantized.md).

    Returns:
        An ``OrderedDict`` of tensors, wrapper prefixes stripped, module versions kept.

    Raises:
        CkptportError: the file cannot be read, or the selected part is no state dict.
    """
    options = with_keys(options, subtree=subtree, keep=keep, drop=drop, rename=rename, map=map)
    if dequantize is not None:
        if options is not None and options.dequantize is not None:
            raise OptionError("dequantize: given both as a keyword and in options; give it once")
        options = replace(options or NormalizeOptions(), dequantize=dequantize)
    normalized = apply_rules(read(path, trust=trust, max_expansion=max_expansion, tag=tag),
                             options)
    state = normalized.checkpoint.tree
    if not is_state_dict(state):
        raise SelectionError("the selected part is not a state dict of tensors; pass "
                             "options=NormalizeOptions(select=...)", os.fspath(path))
    tensors = cast("OrderedDict[str, torch.Tensor]", state)  # read() makes torch tensors
    if device is not None:
        tensors = rebuild_dict(tensors, [(k, _to(v, device, path)) for k, v in tensors.items()])
    return tensors


def _to(tensor: torch.Tensor, device: str | torch.device, path: str | os.PathLike[str]
        ) -> torch.Tensor:
    try:
        return tensor.to(device)
    except (AssertionError, RuntimeError, ValueError) as exc:  # no such device here
        raise CkptportError(f"cannot move the weights to {device}: {str(exc).splitlines()[0]}",
                            os.fspath(path)) from None


Mismatch = tuple[str, tuple[int, ...], tuple[int, ...]]  # name, checkpoint shape, model shape


@dataclass(frozen=True)
class LoadResult:
    """What the load did: model keys the checkpoint did not fill (``missing``, which also
    lists tensors still on ``meta`` that no checkpoint key could fill, such as
    non-persistent buffers), checkpoint keys left over (``unexpected``), tensors skipped
    for their shape (``mismatched``: name, checkpoint shape, model shape) and how many
    model tensors were loaded."""

    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: tuple[Mismatch, ...] = ()
    loaded: int = 0


def load_into(model: torch.nn.Module, path: str | os.PathLike[str], *, strict: bool = True,
              options: NormalizeOptions | None = None, trust: bool = False,
              subtree: str | None = None, keep: Sequence[str] = (), drop: Sequence[str] = (),
              rename: Sequence[tuple[str, str]] = (),
              map: Recipe | str | os.PathLike[str] | None = None,  # noqa: A002 (--map)
              device: str | torch.device | None = None, dtype: torch.dtype | None = None,
              ignore_mismatched_sizes: bool = False, max_expansion: float | None = None,
              tag: str | None = None, dequantize: str | None = None) -> LoadResult:
    """Load ``path`` into ``model``, wrapped or not, on the model's own keys.

    A model with tensors on ``meta`` (built under ``torch.device("meta")``)
    gets the checkpoint's tensors assigned (``assign=True``), each moved to
    ``device`` (default: the CPU, or the tensor's own device when it is not
    on meta) and, when floating point, cast to ``dtype`` (default: the
    dtype the model declared); ties the model declared stay tied. A model
    with real tensors is loaded in place (copies), then moved with
    ``model.to(device, dtype)`` when those are given.

    A tensor whose shape differs from the model's is an error naming it,
    even with ``strict=False``; ``ignore_mismatched_sizes=True`` skips it
    (the model keeps its own) and lists it in ``mismatched``. A load that
    filled no model tensor is always an error.

    Args:
        model: the module to fill (on real devices, or on ``meta``).
        path: any checkpoint ckptport reads.
        strict: missing or unexpected keys are an error (shape mismatches always are).
        options, subtree, keep, drop, rename, map: as ``load_state_dict``.
        device, dtype: where and as what the tensors go (see above).
        ignore_mismatched_sizes: skip tensors whose shape differs, listing them.
        max_expansion, tag, dequantize: as ``load_state_dict``. Without ``dequantize``, a
            quantized weight's codes or scales that would be cast into a model tensor of
            another dtype are refused (``QuantError``): the cast would be a wrong weight.

    Returns:
        A ``LoadResult``: ``missing``, ``unexpected``, ``mismatched`` and ``loaded``.

    Raises:
        StateDictMismatchError: keys or shapes do not match (naming them), or nothing
            was loaded.
        CkptportError: the file cannot be read.
    """
    import torch

    where = os.fspath(path)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise CkptportError(f"dtype={dtype!r}: give a floating-point torch.dtype (it applies "
                            "to floating-point tensors only)", where)
    options = with_keys(options, subtree=subtree, keep=keep, drop=drop, rename=rename, map=map)
    state = load_state_dict(path, options=options, trust=trust, max_expansion=max_expansion,
                            tag=tag, dequantize=dequantize)
    model_state = model.state_dict(keep_vars=True)
    model_keys = list(model_state)
    renamed = _on_model_keys(model, state, model_state, dtype, where)
    mismatched = tuple((k, tuple(renamed[k].shape), tuple(t.shape))  # in the model's order
                       for k, t in model_state.items()
                       if k in renamed and tuple(renamed[k].shape) != tuple(t.shape))
    if mismatched and not ignore_mismatched_sizes:
        raise StateDictMismatchError(_shapes(mismatched), where)
    for name, _, _ in mismatched:
        del renamed[name]
    skipped = {name for name, _, _ in mismatched}
    missing = tuple(k for k in model_keys if k not in renamed and k not in skipped)
    unexpected = tuple(k for k in renamed if k not in model_state)
    loaded = len(model_keys) - len(missing) - len(skipped)
    if not loaded:
        raise StateDictMismatchError("the checkpoint filled no tensor of the model: "
                                     + _explain(missing, unexpected), where)
    if strict and (missing or unexpected):
        raise StateDictMismatchError(_explain(missing, unexpected), where)
    _assign(model, renamed, model_state, device, dtype, path)
    left = _left_on_meta(model, missing)  # listed as missing: the caller must fill them
    unfillable = tuple(name for name in left if name not in skipped)
    if unfillable and strict:
        raise StateDictMismatchError(
            f"{len(unfillable)} model tensors are still on meta and no checkpoint key fills "
            f"them: {_listing(unfillable, ())} (non-persistent buffers are not in "
            "checkpoints: build them on a real device, or pass strict=False and fill them "
            "yourself)", where)
    return LoadResult((*missing, *left), unexpected, mismatched, loaded)


def _on_model_keys(model: torch.nn.Module, state: OrderedDict[str, torch.Tensor],
                   model_state: Mapping[str, object], dtype: torch.dtype | None,
                   where: str) -> dict[str, torch.Tensor]:
    """``state`` under the model's own keys (a wrapped model's ``module.`` put back), the
    keys the model ties filled, module versions kept; a quantized part that would be cast
    refused."""
    by_stripped = {strip_key(key) or key: key for key in model_state}
    renamed = rebuild_dict(state, [(by_stripped.get(k, k), v) for k, v in state.items()])
    _refuse_quantized_casts(renamed, model_state, dtype, where)
    _fill_ties(model_state, renamed)
    versions = getattr(state, "_metadata", None)
    if versions is not None:
        renamed._metadata = _versions_for(model, versions)  # type: ignore[attr-defined]
    return renamed


def _assign(model: torch.nn.Module, renamed: dict[str, torch.Tensor],
            model_state: Mapping[str, object], device: str | torch.device | None,
            dtype: torch.dtype | None, path: str | os.PathLike[str]) -> None:
    """Load ``renamed`` into ``model``: assigned, placed and retied where the model is on
    meta; else copied in place, then the model moved to ``device``/``dtype`` if given."""
    import torch

    where = os.fspath(path)
    on_meta = any(t.is_meta for t in model_state.values() if isinstance(t, torch.Tensor))
    if on_meta:
        for key, value in list(renamed.items()):
            target = model_state.get(key)
            if isinstance(target, torch.Tensor):
                renamed[key] = _placed(value, target, device, dtype, path)
    try:
        model.load_state_dict(renamed, strict=False, assign=on_meta)
    except RuntimeError as exc:  # what the checks above cannot foresee: one line, our type
        raise StateDictMismatchError(f"torch refused the load: {str(exc).splitlines()[-1]}",
                                     where) from None
    if on_meta:
        _retie(model, model_state)
    elif device is not None or dtype is not None:
        try:
            model.to(device=device, dtype=dtype)
        except (AssertionError, RuntimeError, ValueError) as exc:  # no such device here
            raise CkptportError(f"cannot move the model to {device}: "
                                f"{str(exc).splitlines()[0]}", where) from None


def _refuse_quantized_casts(state: Mapping[str, torch.Tensor],
                            model_state: Mapping[str, object], dtype: torch.dtype | None,
                            where: str) -> None:
    """A quantized part loaded into a model tensor of another dtype would be cast as numbers
    (``copy_`` and ``to`` do it silently): refused, naming ``dequantize=``."""
    import torch

    for name, weight in recognize(state, config_of(Path(where)), where).owner.items():
        target = model_state.get(name)
        if not isinstance(target, torch.Tensor):  # not in the model, or its extra state
            continue
        kind = dtype if dtype is not None and target.is_floating_point() else target.dtype
        if kind != state[name].dtype:
            raise QuantError(f"{name}: the {state[name].dtype} part of {weight.scheme.name} "
                             f"weight {weight.name} would be cast to {kind} as numbers; pass "
                             "dequantize='bfloat16' (or float16, float32)", where)


def _shapes(mismatched: tuple[Mismatch, ...]) -> str:
    shown = "; ".join(f"{name}: checkpoint {list(ckpt)}, model {list(own)}"
                      for name, ckpt, own in mismatched[:SHOWN_KEYS])
    more = f"; … {len(mismatched) - SHOWN_KEYS} more" if len(mismatched) > SHOWN_KEYS else ""
    return (f"{len(mismatched)} tensors differ in shape from the model's: {shown}{more}; pass "
            "ignore_mismatched_sizes=True to keep the model's own (a new head)")


def _placed(value: torch.Tensor, target: torch.Tensor, device: str | torch.device | None,
            dtype: torch.dtype | None, path: str | os.PathLike[str]) -> torch.Tensor:
    """A checkpoint tensor as it will be assigned: on ``device``, floating ones in ``dtype``
    (defaults: the model tensor's own device, the CPU for meta, and its own dtype)."""
    place = device if device is not None else ("cpu" if target.is_meta else target.device)
    kind = dtype if dtype is not None and target.is_floating_point() else target.dtype
    moved = _to(value, place, path)
    return moved.to(kind) if moved.dtype != kind else moved


def _retie(model: torch.nn.Module, before: Mapping[str, object]) -> None:
    """Names that were one Parameter before an assigning load are one again after it
    (``assign=True`` wraps each name's tensor in its own Parameter)."""
    first: dict[int, str] = {}
    for key, tensor in before.items():
        owner = first.setdefault(id(tensor), key)
        if owner != key:
            module, _, leaf = key.rpartition(".")
            source_module, _, source_leaf = owner.rpartition(".")
            shared = getattr(model.get_submodule(source_module), source_leaf)
            setattr(model.get_submodule(module), leaf, shared)


def _left_on_meta(model: torch.nn.Module, missing: tuple[str, ...]) -> tuple[str, ...]:
    """Parameters and buffers still on meta that ``missing`` does not already list."""
    listed = set(missing)
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return tuple(name for name, tensor in named if tensor.is_meta and name not in listed)


def _fill_ties(model_state: Mapping[str, object], loaded: dict[str, torch.Tensor]) -> None:
    """Fill model keys the model ties to a key the checkpoint holds (``lm_head`` = embedding).

    Files saved the hub's way leave tied names out; the model itself says
    which of its tensors are one, and loading one fills the other. A tensor
    on meta has no storage to compare, so there the Parameter object tells.
    """
    import torch

    tensors = {key: t for key, t in model_state.items()  # not the modules' extra state
               if isinstance(t, torch.Tensor) and t.numel()}
    owner: dict[int, str] = {}
    for key, tensor in tensors.items():
        if key in loaded:
            owner.setdefault(_identity(tensor), key)
    for key, tensor in tensors.items():
        if key not in loaded:
            source = owner.get(_identity(tensor))
            if source is not None and tuple(tensors[source].shape) == tuple(tensor.shape):
                loaded[key] = loaded[source]


def _identity(tensor: torch.Tensor) -> int:
    return id(tensor) if tensor.is_meta else int(tensor.data_ptr())


def _versions_for(model: torch.nn.Module, versions: Mapping[str, object]
                  ) -> OrderedDict[str, object]:
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
