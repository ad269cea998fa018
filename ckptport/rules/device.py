"""Map every storage to the CPU, and say which devices the file recorded.

Described tensors keep the device their storage was saved on (``cuda:3``);
this rule rewrites it to ``cpu``, one storage at a time, so what the
writers record is what the rule did. Torch tensors on a device (API
callers' live tensors) are copied to the CPU.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from ..checkpoint import Checkpoint
from ..tensors import Pending, StorageInfo, TensorInfo, location
from ..tree import KeyPath, TensorLeaf, Tree, is_tensor, map_tree
from .base import Change, RuleResult

__all__ = ["MapToCPU"]


@dataclass(frozen=True)
class MapToCPU:
    name: str = "map-to-cpu"

    def __call__(self, checkpoint: Checkpoint) -> tuple[Checkpoint, RuleResult]:
        moved: Counter[str] = Counter()
        storages: dict[int, StorageInfo] = {}

        def leaf_to_cpu(value: TensorLeaf) -> TensorLeaf:
            if location(value) == "cpu":
                return value
            if isinstance(value, Pending):  # a lazy view read from the file: its source
                return replace(value, source=leaf_to_cpu(value.source))
            if isinstance(value, TensorInfo):
                storage = storages.get(id(value.storage))
                if storage is None:
                    moved[value.storage.location] += 1
                    storage = replace(value.storage, location="cpu")
                    storages[id(value.storage)] = storage
                return value.with_location(storage)
            if not isinstance(value, TensorInfo) and hasattr(value, "cpu"):
                moved[location(value)] += 1
                return value.cpu()
            return value

        def to_cpu(path: KeyPath, value: Tree) -> Tree:
            return leaf_to_cpu(value) if is_tensor(value) else value

        tree = map_tree(checkpoint.tree, to_cpu)
        recorded = dict(checkpoint.source.storage_locations)
        counts = {loc: n for loc, n in recorded.items() if loc != "cpu"} or dict(moved)
        changes = tuple(Change(loc, "mapped", f"{n} storages -> cpu")
                        for loc, n in sorted(counts.items()))
        summary = ", ".join(f"{n} storages {loc} -> cpu" for loc, n in sorted(counts.items()))
        return checkpoint.with_tree(tree), RuleResult(
            self.name, changes, summary or "all storages on cpu", {"recorded": recorded})
