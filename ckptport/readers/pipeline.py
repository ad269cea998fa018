"""Read DeepSpeed pipeline-parallel checkpoints: the ``PipelineModule``'s state dict.

A ``PipelineModule`` saves each of its layers, from the stage that holds
it, to ``layer_XX-model_states.pt`` in the tag folder (``layer_XX-model_YY-…``
under tensor parallelism: model-parallel rank YY's slice); the engine's
``mp_rank_00_model_states.pt`` holds no module (``module`` is None). One
state dict is the layers' in order, each key as the ``PipelineModule`` names
it: the layer's index, then the layer's own key (``2.weight``). These are the
module's weights as trained (bf16 in a bf16 run; a pipeline engine's
optimizer records no parameter names to rebuild fp32 masters by). Tensor-
parallel slices of model-parallel ranks above 0 are not consolidated:
refused with the reason.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from ..checkpoint import Checkpoint, Format
from ..errors import InputError
from ..tree import Tree
from .base import Layout, Names, ReadOptions, Source, Where, local
from .deepspeed import LATEST, tag_folder
from .layouts import LayoutError, merged_facts, missing_ranks, or_problem
from .ranks import one_claim

__all__ = ["PipelineReader", "FORMAT"]

FORMAT = Format("deepspeed-pipeline")
_LAYER = re.compile(r"layer_(\d+)(?:-model_(\d+))?-model_states\.pt")

LoadFile = Callable[[Path, ReadOptions], Checkpoint]


def _layers(names: frozenset[str]) -> list[str]:
    return sorted(n for n in names if _LAYER.fullmatch(n))


class PipelineReader:
    format = FORMAT

    def __init__(self, load_file: LoadFile) -> None:
        self.load_file = load_file

    def layout(self, folder: Where, names: Names, name: str | None, tag: str | None
               ) -> Layout | None:
        """A tag folder holding ``layer_XX-…model_states.pt`` files, or the save folder whose
        ``latest`` (or ``tag``) names one: its layer files."""
        if names is None or not isinstance(folder, Path):
            return None
        chosen = folder
        if not _layers(names):
            if LATEST not in names:
                return None
            tagged = tag_folder(folder, tag)  # refuses a bad latest as DeepSpeed's reader does
            if tagged is None or not _layers(frozenset(p.name for p in tagged.iterdir())):
                return None
            chosen = tagged
        elif tag is not None:
            tag_folder(folder, tag)  # a tag folder has no tags: refused with the ones there
        inside = frozenset(p.name for p in chosen.iterdir())
        quiet = tuple(folder / n for n in (LATEST, "zero_to_fp32.py", "zero_to_torch.py")
                      if n in names)
        engine = tuple(chosen / n for n in sorted(inside) if n.endswith("_states.pt")
                       and not _LAYER.fullmatch(n))  # the engine's and optimizer's state
        return Layout(chosen, tuple(chosen / n for n in _layers(inside)), self, FORMAT,
                      chosen.name, quiet, unweighted=engine)

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        folder, files = local(source.main, FORMAT), tuple(map(local, source.files))
        return or_problem(lambda: self._load(folder, files, options), folder, FORMAT, files,
                          "deepspeed pipeline", options.lenient)

    def _load(self, folder: Path, files: tuple[Path, ...], options: ReadOptions
              ) -> Checkpoint:
        claims: dict[int, list[Path]] = {}
        for path in files:
            match = _LAYER.fullmatch(path.name)
            assert match is not None  # the layout's files are layer files by name
            if match[2] is not None and int(match[2]):
                raise InputError(f"holds {path.name}: model-parallel rank {int(match[2])}'s "
                                 "slice of a layer; tensor-parallel pipeline checkpoints are "
                                 "not consolidated, only model_00", folder)
            claims.setdefault(int(match[1]), []).append(path)
        one_claim(claims, folder, "layer")
        last = max(claims)
        missing = missing_ranks(set(claims), last + 1)
        if missing:
            raise LayoutError(f"layer {missing[0]} of layers 0..{last} has no file "
                              f"(layer_{missing[0]:02d}-model_states.pt; {missing[1]} missing): "
                              "a stage did not save, or the folder was partly copied", folder)
        tree: dict[str, Tree] = OrderedDict()
        parts = []
        for index in sorted(claims):
            path = claims[index][0]
            part = self.load_file(path, options)
            parts.append(part)
            if part.source.refused_globals:  # lenient: name them, read nothing further
                return Checkpoint({}, merged_facts(folder, FORMAT, parts, files, {}))
            if not isinstance(part.tree, dict):
                raise InputError("is not a layer's state dict", path)
            tree.update((f"{index}.{key}", value) for key, value in part.tree.items())
        metadata = {"framework": "deepspeed pipeline", "tag": folder.name,
                    "layers": str(last + 1), "master_dtype": "module"}
        notes = ("the PipelineModule's own weights, as trained (a pipeline engine's optimizer "
                 "records no names to rebuild fp32 masters by)",)
        return Checkpoint(tree, merged_facts(folder, FORMAT, parts, files, metadata, notes))
