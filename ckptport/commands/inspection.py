"""``ckptport inspect``: what is in a checkpoint, without running or reading it.

The file is read for a report (leniently: code-running globals are kept as
named records, never run) and surveyed (``analysis.survey``); no tensor byte
is read unless ``with_hash`` asks for the files' sha256, and torch is not
imported for zip, legacy and safetensors files or shard sets.
"""

from __future__ import annotations

import os

from ..analysis.survey import DEFAULT_DEPTH, InspectReport, survey
from ..checkpoint import Checkpoint
from ..readers import open_checkpoint, read_already
from ..sources import sha256_files

__all__ = ["inspect", "InspectReport"]


def inspect(path: str | os.PathLike[str] | Checkpoint, *, depth: int = DEFAULT_DEPTH,
            with_hash: bool = False, tag: str | None = None) -> InspectReport:
    """Describe a checkpoint without running or loading it.

    Args:
        path: any checkpoint ckptport reads, or an already read ``Checkpoint``.
        depth: levels of the layout tree to list.
        with_hash: also compute the sha256 of the files (reads every byte): the digest
            ``normalize`` records as ``ckptport.source_sha256``.
        tag: a DeepSpeed save folder's tag (default: the one ``latest`` names).

    Returns:
        An ``InspectReport``: format, layout, tensors, parameters, bytes by dtype,
        recorded devices, wrapper prefixes, blocking objects and globals.

    Raises:
        OptionError: ``tag`` with a ``Checkpoint`` (read already).
        CkptportError: the path cannot be read at all.
    """
    if isinstance(path, Checkpoint):
        read_already(tag=tag)
    checkpoint = path if isinstance(path, Checkpoint) else \
        open_checkpoint(path, lenient=True, tag=tag)
    sha256 = sha256_files(checkpoint.source.files) if with_hash else None
    return survey(checkpoint, depth=depth, sha256=sha256)
