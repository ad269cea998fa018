"""Read Megatron-core ``dist_checkpointing`` folders (``torch_dist``), without megatron.

``megatron.core.dist_checkpointing.save`` with the default ``torch_dist``
backend writes one folder: every rank's part of the sharded tensors as a
torch.distributed.checkpoint save (``.metadata``, ``__R_I.distcp``), the state
that is not sharded (``iteration``, RNG state, config values) as one
``torch.save`` file, ``common.pt``, and ``metadata.json`` naming the backends
(``{"sharded_backend": "torch_dist", ...}``), written last. NeMo 2 checkpoints
keep the same folder as ``weights/`` beside ``context/`` (the model's config,
as NeMo's own serialized objects: never read).

The folder is one checkpoint, as megatron's ``dist_checkpointing.load`` returns
it whole: the DCP tensors assembled (``DcpReader``: chunks proven to tile each
tensor, byte ranges checked against each data file), under ``model`` by their
sharded keys as Megatron's trainers keep them (the distributed optimizer's,
keyed ``optimizer.…``, under ``optimizer``: training state, never weights),
``ShardedObject``s beside them under theirs (``KEY/shard_OFFSETS_SHAPE``, each a
``torch.save``'d value read by ckptport's unpickler), merged with ``common.pt``
read as any checkpoint file is; a key in both is refused. Megatron's
``.metadata`` carries the save plans of every rank beside DCP's metadata
(``all_local_plans``; older versions pickle them as megatron's own
``MCoreSavePlan``, optimizer saves an ``MCoreMetadata``): those names are read
as inert records of their state, never constructed, never imported, and nothing
reads them. Other backends (``zarr``, the older
``torch`` per-tensor files) are refused naming ``metadata.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

from ..checkpoint import Checkpoint, Format
from ..errors import InputError
from ..sources import check_regular
from ..tree import Key, Tree
from .base import Layout, Names, ReadOptions, Source, Where, local
from .dcp import METADATA_FILE, DcpReader
from .folders import listing
from .layouts import LayoutError, merged_facts, or_problem

__all__ = ["MegatronReader", "FORMAT"]

FORMAT = Format("megatron-dist")
FRAMEWORK = "megatron.core.dist_checkpointing (torch_dist)"
CONFIG, COMMON, WEIGHTS, CONTEXT = "metadata.json", "common.pt", "weights/", "context/"
MODEL, OPTIMIZER = "model", "optimizer"
_MAX_CONFIG = 1 << 20  # metadata.json holds a few names and versions
_PLANS = "torch.distributed.checkpoint.planner"
_MCORE = "megatron.core.dist_checkpointing.strategies.torch"
# what megatron pickles into .metadata beyond DCP's metadata: read as inert records
RECORDS = (f"{_PLANS}.SavePlan", f"{_PLANS}.WriteItem", f"{_PLANS}.WriteItemType",
           f"{_PLANS}.TensorWriteData", f"{_MCORE}.MCoreSavePlan", f"{_MCORE}.MCoreMetadata")


def _is_save(names: Names) -> bool:
    """A megatron save folder by its names: ``metadata.json`` beside DCP files or
    ``common.pt``."""
    return names is not None and CONFIG in names and (
        METADATA_FILE in names or COMMON in names or any(n.endswith(".distcp") for n in names))


def _covered(folder: Path, names: frozenset[str]) -> tuple[Path, ...]:
    return tuple(folder / n for n in sorted(names) if n in (CONFIG, COMMON, METADATA_FILE)
                 or n.endswith(".distcp"))


class MegatronReader(DcpReader):
    """A megatron ``torch_dist`` save folder, or a NeMo 2 checkpoint holding one."""

    format = FORMAT
    records = RECORDS

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """The save folder's files; for a NeMo 2 folder (``context/`` and ``weights/``) those
        of ``weights/``, its context named as holding no checkpoint."""
        if names is None or not isinstance(folder, Path):
            return None
        if _is_save(names):
            return Layout(folder, _covered(folder, names), self, FORMAT)
        if WEIGHTS in names and CONTEXT in names:
            weights = folder / WEIGHTS.rstrip("/")
            inner = listing(weights)
            if _is_save(inner):
                context = folder / CONTEXT.rstrip("/")
                quiet = tuple(context / n for n in sorted(listing(context)) if "/" not in n)
                return Layout(weights, _covered(weights, inner), self, FORMAT, quiet=quiet)
        return None

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        # chunks that do not tile a tensor: CKP013 in reports
        return or_problem(lambda: self._megatron(source, options), source.main, FORMAT,
                          source.files, FRAMEWORK, options.lenient)

    def _megatron(self, source: Source, options: ReadOptions) -> Checkpoint:
        folder = local(source.main, FORMAT)
        backends = _backends(folder / CONFIG)
        common_path = folder / COMMON
        if common_path not in source.files:
            raise LayoutError(f"{COMMON} is missing: megatron writes the state that is not "
                              "sharded there (a partly copied save)", folder)
        sharded = self._load(source, options)
        common = self.load_file(common_path, options)
        state = common.tree
        if not isinstance(state, dict):
            if not (options.lenient and common.source.refused_globals):
                raise InputError(f"holds {type(state).__name__}, not the dict megatron saves",
                                 common_path)
            state = {}  # a report's reading of a file that would run code: its globals count
        tree = _grouped(cast("dict[Key, Tree]", sharded.tree))  # DcpReader._load: a dict
        both = sorted(set(state) & set(tree), key=str)
        if both:
            raise InputError(f"{both[0]!r} is both in {COMMON} and in the sharded state: "
                             "files of different saves", folder)
        metadata = {"framework": FRAMEWORK, **{f"megatron.{k}": str(v) for k, v in
                                               backends.items()},
                    **sharded.source.metadata}
        facts = merged_facts(folder, FORMAT, [sharded, common], source.files, metadata)
        return Checkpoint({**state, **tree}, facts)


def _grouped(items: dict[Key, Tree]) -> dict[Key, Tree]:
    """The sharded items as megatron's trainers hold them: the model's tensors under
    ``model``, the distributed optimizer's (keys ``optimizer.…``) under ``optimizer``, by
    their sharded keys; ``ShardedObject``s beside them under theirs."""
    from ..tree import is_tensor

    grouped: dict[Key, Tree] = {}
    for key, value in items.items():
        if not is_tensor(value):
            grouped[key] = value
        else:
            home = OPTIMIZER if isinstance(key, str) and key.startswith(f"{OPTIMIZER}.") \
                else MODEL
            cast("dict[Key, Tree]", grouped.setdefault(home, {}))[key] = value
    return grouped


def _backends(path: Path) -> dict[str, str | int | float | bool]:
    """``metadata.json``: the backends megatron saved with; only ``torch_dist`` and a
    ``torch`` common file are read."""
    check_regular(path)
    try:
        if path.stat().st_size > _MAX_CONFIG:
            raise InputError(f"is over {_MAX_CONFIG} bytes: not megatron's metadata", path)
        config = json.loads(path.read_bytes())
    except OSError as exc:
        raise InputError.from_os_error(exc, path) from None
    except ValueError as exc:
        raise InputError(f"is not JSON: {exc}", path) from None
    if not isinstance(config, dict):
        raise InputError("is not megatron's metadata (a JSON object)", path)
    backend, common = config.get("sharded_backend"), config.get("common_backend", "torch")
    if backend != "torch_dist" or common != "torch":
        raise InputError(f"names the {backend!r} backend with a {common!r} common file: "
                         "ckptport reads megatron's torch_dist saves (convert others with "
                         "megatron's own dist_checkpointing)", path)
    return {k: v for k, v in config.items() if type(v) in (str, int, float, bool)}
