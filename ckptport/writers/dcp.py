"""Write a ``torch.distributed.checkpoint`` folder, so cleaned weights go back to training.

torch's own ``dcp.save`` writes the folder (no process group needed), laid
out as ``torch_save_to_dcp`` lays out a ``torch.save`` checkpoint: nested
dicts and lists flattened into key paths (dict keys become strings, as DCP
makes them). ``dcp_key`` nests the tree under one key, so training code can
``dcp.load({"model": model.state_dict()}, ...)``. The folder is staged
beside DST with normal permissions, read back by ckptport's DCP reader and
compared bit for bit with the source read again, and only then renamed into
place. DCP keeps no state-dict ``_metadata`` (module versions) and no ties
(each name is stored on its own; the report says so).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..checkpoint import Checkpoint
from ..compare import tie_groups, tree_mismatches
from ..errors import VerificationError
from ..tensors import to_torch
from ..tree import TensorLeaf, Tree, is_tensor
from .base import WriteOptions, WriteResult, count_tensors, unique_bytes
from .plan import Destination
from .pth import require_torch_dtypes
from .staging import os_error, publish_folder, staged_folder
from .verify import Independent

if TYPE_CHECKING:
    import torch

__all__ = ["DcpWriter"]


def _dcp_tree(value: Tree, storages: dict[int, torch.UntypedStorage], renamed: list[str],
              originals: dict[int, TensorLeaf]) -> Tree:
    """The tree as DCP stores it: torch tensors, string keys (DCP stringifies them);
    ``originals`` maps each torch tensor made to the leaf it was made from."""
    if isinstance(value, Mapping):
        out: dict[str, Tree] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                renamed.append(repr(key))
            out[str(key)] = _dcp_tree(item, storages, renamed, originals)
        return out
    if isinstance(value, (list, tuple)):
        return [_dcp_tree(item, storages, renamed, originals) for item in value]
    if not is_tensor(value):
        return value
    made = to_torch(value, storages)
    originals[id(made)] = value
    return made


class DcpWriter:
    """A ``torch.distributed.checkpoint`` folder (a folder format: it stages the folder)."""

    def write(self, checkpoint: Checkpoint, destination: Destination,
              options: WriteOptions) -> WriteResult:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import save

        from ..readers import open_checkpoint

        folder = destination.path
        require_torch_dtypes(checkpoint.tree, folder)
        renamed: list[str] = []
        originals: dict[int, TensorLeaf] = {}
        tree = _dcp_tree(checkpoint.tree, {}, renamed, originals)
        if options.dcp_key:
            tree = {options.dcp_key: tree}
        total = unique_bytes(tree)
        try:
            with staged_folder(folder.parent, folder.name) as staging:
                advance = options.progress(f"writing {folder.name}", total)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    save(tree, storage_writer=FileSystemWriter(staging), no_dist=True)
                advance(total)
                if options.verify:  # against the source read again, not what was handed on
                    with Independent() as independent:
                        problems = tree_mismatches(
                            tree, open_checkpoint(staging).tree,
                            on_tensor=options.progress(f"verifying {folder.name}", total),
                            expected_pieces=lambda t: independent(originals.get(id(t), t)),
                            jobs=options.jobs, ties=False)
                    if problems:
                        raise VerificationError("written DCP folder reads back different: "
                                                + "; ".join(problems), folder)
                options.precommit()
                publish_folder(staging, folder)
        except OSError as exc:
            raise os_error(exc, folder) from exc
        notes = [f"DCP keeps dict keys as strings: {', '.join(renamed[:5])}"
                 + (" …" if len(renamed) > 5 else "")] if renamed else []
        ties = tie_groups(tree)
        if ties:
            notes.append(f"DCP stores every name on its own: {len(ties)} tied tensors are "
                         f"written once per name ({', '.join(ties[0])}, …)")
        return WriteResult(folder, "dcp", count_tensors(tree), total, options.verify,
                           notes=tuple(notes))
