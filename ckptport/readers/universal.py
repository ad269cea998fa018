"""Read DeepSpeed universal checkpoints (``ds_to_universal``): the fp32 weights, by parameter.

``ds_to_universal`` turns a ZeRO save into a folder independent of the
world size: ``zero/NAME/fp32.pt`` holds each parameter's (and buffer's)
whole fp32 tensor under ``param`` (``cat_dim`` says how tensor parallelism
would slice it again; at ZeRO-3 the bare tensor), beside ``exp_avg.pt`` and
the rest of its optimizer state, and a copy of the model states (``mp_rank_00_model_states.pt``, one
``zero_pp_rank_R_…`` per rank at ZeRO-3). The weights are the ``fp32.pt``
tensors, in the order of the model states' ``module``, tied names restored
from ``shared_params`` and buffers a ZeRO-3 conversion leaves out taken
from the module (as ``zero_to_fp32`` does); the model states copy is the
half-precision module, which a DeepSpeed tag folder reader would
take for stage 0. Nothing is gathered: each weight is its file's tensor,
described in place.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import cast

from ..checkpoint import Checkpoint, Format
from ..dtypes import DTYPES, dtype_of
from ..errors import InputError
from ..tensors import Pending
from ..tree import Key, TensorLeaf, Tree, is_tensor
from .base import Layout, Names, ReadOptions, Source, Where, local
from .layouts import LayoutError, merged_facts, or_problem

__all__ = ["UniversalReader", "FORMAT"]

FORMAT = Format("deepspeed-universal")
ZERO = "zero"
MASTER = "fp32.pt"
_STATES = re.compile(r"(?:zero_pp_rank_0_)?mp_rank_00_model_states\.pt")
_KEYS = frozenset({"param", "cat_dim"})

LoadFile = Callable[[Path, ReadOptions], Checkpoint]


class UniversalReader:
    format = FORMAT

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A folder holding ``zero/`` and rank 0's model states: the states and every
        ``zero/NAME/fp32.pt``."""
        if names is None or f"{ZERO}/" not in names:
            return None
        states = sorted(n for n in names if _STATES.fullmatch(n))
        if not states:
            return None
        if not isinstance(folder, Path):  # a remote folder: read local ones
            return Layout(folder, (), self, FORMAT)
        try:
            params = sorted(p for p in (folder / ZERO).iterdir() if p.is_dir())
        except OSError as exc:
            raise InputError.from_os_error(exc, folder / ZERO) from None
        masters = tuple(p / MASTER for p in params if (p / MASTER).is_file())
        return Layout(folder, (folder / states[-1], *masters), self, FORMAT)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        folder, files = local(source.main, FORMAT), tuple(map(local, source.files))
        return or_problem(lambda: self._load(folder, files, options), folder, FORMAT, files,
                          "deepspeed universal", options.lenient)

    def _load(self, folder: Path, files: tuple[Path, ...], options: ReadOptions
              ) -> Checkpoint:
        states = self.load_file(files[0], options)
        parts = [states]
        if states.source.refused_globals:  # lenient: name them, read nothing further
            return Checkpoint({}, merged_facts(folder, FORMAT, parts, files[:1], {}))
        held = states.tree if isinstance(states.tree, dict) else {}
        module = held.get("module")
        if not isinstance(module, dict):
            raise InputError("has no 'module': not DeepSpeed model states", files[0])
        masters = {path.parent.name: path for path in files[1:]}
        made: dict[str, TensorLeaf] = {}
        for key, path in masters.items():
            part = self.load_file(path, options)
            parts.append(part)
            if part.source.refused_globals:  # lenient: name them
                return Checkpoint({}, merged_facts(folder, FORMAT, parts, files, {}))
            made[key] = _master(part.tree, module.get(key), path)
        tree = _ordered(module, made, held, folder)
        metadata = {"framework": "deepspeed universal checkpoint", "master_dtype": "float32",
                    "parameters": str(len(tree))}
        version = held.get("ds_version")
        if isinstance(version, str):
            metadata["deepspeed_version"] = version
        extra = [k for k in made if k not in module]
        notes = (f"{ZERO}/ names {len(extra)} tensors the module does not "
                 f"({', '.join(extra[:3])}); kept after the module's",) if extra else ()
        return Checkpoint(tree, merged_facts(folder, FORMAT, parts, files, metadata, notes))


def _ordered(module: dict[Key, Tree], made: dict[str, TensorLeaf], states: dict[Key, Tree],
             folder: Path) -> dict[Key, Tree]:
    """The weights in the module's order: a tied name (``shared_params``) its target's;
    each other name its ``fp32.pt``; a buffer the universal save left out, the module's, in
    fp32; then the ``fp32.pt`` of names the module lacks."""
    buffers = states.get("buffer_names")
    buffers = set(buffers) if isinstance(buffers, list) else set()
    shared = states.get("shared_params")
    shared = shared if isinstance(shared, dict) else {}
    tree: dict[Key, Tree] = OrderedDict()
    missing: list[Key] = []
    for key, copy in module.items():
        if shared.get(key) in made:  # a tie, as zero_to_fp32 restores it (the tied name's
            tree[key] = made[shared[key]]  # own fp32.pt is the half-precision copy, cast)
        elif key in made:
            tree[key] = made[key]
        elif key in buffers and is_tensor(copy):
            tree[key] = copy if copy.dtype == DTYPES["float32"] else Pending(
                copy, DTYPES["float32"])
        elif is_tensor(copy):
            missing.append(key)
        else:
            tree[key] = copy
    if missing:
        raise LayoutError(f"has no {ZERO}/{missing[0]}/{MASTER} for the module's "
                          f"{missing[0]!r} ({len(missing)} of its tensors have none: "
                          f"{', '.join(map(str, missing[:4]))}): a partly copied universal "
                          "checkpoint, or frozen parameters of a ZeRO-3 save, which "
                          "ds_to_universal leaves out (read the original save folder)", folder)
    tree.update((k, v) for k, v in made.items() if k not in tree)
    return tree


def _master(value: Tree, copy: Tree, path: Path) -> TensorLeaf:
    """The fp32 tensor of one ``fp32.pt`` (``{'param': …}``, a bare tensor at ZeRO-3),
    checked against the module's copy of it."""
    if is_tensor(value):
        value = {"param": value}
    if not isinstance(value, dict) or not is_tensor(value.get("param")) or set(value) - _KEYS:
        held = ", ".join(map(str, value)) if isinstance(value, dict) else type(value).__name__
        raise InputError(f"is not a universal checkpoint parameter ('param' and 'cat_dim' "
                         f"only; holds {held})", path)
    param = cast("TensorLeaf", value["param"])  # is_tensor: checked above
    if param.dtype != DTYPES["float32"]:
        raise InputError(f"holds a {dtype_of(param).name} 'param', not the fp32 weight", path)
    if is_tensor(copy) and copy.numel() and tuple(copy.shape) != tuple(param.shape):
        raise LayoutError(f"{path.parent.name}: {MASTER} holds {list(param.shape)}, the "
                          f"module {list(copy.shape)}: files of different models", path.parent)
    return param
