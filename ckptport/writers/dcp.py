"""Write a ``torch.distributed.checkpoint`` folder, so cleaned weights go back to training.

torch's own ``dcp.save`` writes the folder (no process group needed); it
goes into a temp folder beside DST, is read back by ckptport's safe DCP
reader and compared bit for bit, and only then renamed into place. With
``overwrite``, an existing DST is moved aside first and removed after.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..checkpoint import Checkpoint, KeyPath, format_path, is_tensor, map_tree
from ..compare import tree_mismatches
from ..errors import OutputError, VerificationError
from ..lazy import materialize
from ..progress import Progress, no_progress
from . import OutputFormat, WriteResult, count_tensors, same_file, unique_bytes
from .atomic import TEMP_SUFFIX, fsync_dir

__all__ = ["write_dcp"]


def write_dcp(checkpoint: Checkpoint, dst: str | os.PathLike[str], *, overwrite: bool = False,
              verify: bool = True, progress: Progress = no_progress,
              precommit: Callable[[], None] = lambda: None) -> WriteResult:
    import torch.distributed.checkpoint as dcp

    from ..readers.dcp import read_dcp

    folder = Path(dst)
    _check_representable(checkpoint.tree, (), folder)
    if any(same_file(folder, f) or same_file(folder, f.parent) for f in checkpoint.source.files):
        raise OutputError("is the source; write the DCP folder elsewhere", folder)
    if folder.exists() and not overwrite:
        raise OutputError("exists; pass --overwrite to replace it", folder)
    total = unique_bytes(checkpoint.tree)
    try:
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.",
                                        suffix=TEMP_SUFFIX))
    except FileNotFoundError:
        raise OutputError("folder does not exist", folder.parent) from None
    try:
        advance = progress(f"writing {folder.name}", total)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(_materialized(checkpoint.tree),
                     storage_writer=dcp.FileSystemWriter(staging), no_dist=True)
        advance(total)
        if verify:
            problems = tree_mismatches(checkpoint.tree, read_dcp(staging).tree,
                                       on_tensor=progress(f"verifying {folder.name}", total))
            if problems:
                raise VerificationError("written DCP folder reads back different: "
                                        + "; ".join(problems), folder)
        precommit()
        _swap_in(staging, folder)
    except OSError as exc:
        raise OutputError(f"cannot write: {exc.strerror or exc}", folder) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return WriteResult(folder, OutputFormat.DCP, count_tensors(checkpoint.tree), total, verify)


def _materialized(tree: Any) -> Any:
    """dcp.save needs every tensor at once: deferred casts are computed here."""
    return map_tree(tree, lambda path, value: materialize(value) if is_tensor(value) else value)


def _check_representable(node: Any, path: KeyPath, folder: Path) -> None:
    """DCP flattens containers to key paths in which an int means a list index."""
    if isinstance(node, list):
        raise OutputError(f"DCP cannot keep the list at {format_path(path)} (it flattens lists "
                          "into key paths); write .pth", folder)
    if isinstance(node, Mapping):
        for key, value in node.items():
            if not isinstance(key, str):
                raise OutputError(f"DCP cannot keep the non-string key {key!r} under "
                                  f"{format_path(path)}; write .pth", folder)
            _check_representable(value, (*path, key), folder)


def _swap_in(staging: Path, folder: Path) -> None:
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old.",
                                    suffix=TEMP_SUFFIX))
        os.replace(folder, old / folder.name)
    os.rename(staging, folder)
    fsync_dir(folder.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
