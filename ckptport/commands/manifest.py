"""``ckptport manifest``: list a checkpoint's normalized weights with their sha256.

The manifest itself (its schema, digest, reading and comparing) is
``ckptport.analysis.manifests``; this command reads the source and writes it.
"""

from __future__ import annotations

import os

from ..analysis.manifests import Manifest, manifest_of, write_manifest
from ..checkpoint import Checkpoint
from ..progress import Progress, no_progress
from ..readers import open_checkpoint, read_already
from ..rules import NormalizeOptions

__all__ = ["manifest", "write_manifest"]


def manifest(src: str | os.PathLike[str] | Checkpoint,
             options: NormalizeOptions | None = None, *, jobs: int | None = None,
             trust: bool = False, max_expansion: float | None = None,
             tag: str | None = None, progress: Progress = no_progress) -> Manifest:
    """The manifest of ``src``'s weights, normalized with ``options``.

    Args:
        src: any checkpoint ckptport reads, or an already read ``Checkpoint``.
        options: which weights and keys (``--select``, ``--strip-prefix``, key steps…);
            recorded in the manifest so ``check --against-manifest`` does the same.
        jobs: hashing threads (default: every core).
        trust: unpickle with full Python (runs code from the file).
        max_expansion: the read budget's ratio (``readers.budget``).
        tag: a DeepSpeed save folder's tag (default: the one ``latest`` names).

    Returns:
        The ``Manifest``: per-tensor sha256 of canonical bytes and one weights digest, the
        same for the same weights in any container.

    Raises:
        OptionError: ``trust``, ``max_expansion`` or ``tag`` with a ``Checkpoint`` (read).
        CkptportError: the source cannot be read or normalized.
    """
    if isinstance(src, Checkpoint):
        read_already(trust, max_expansion, tag)
    checkpoint = src if isinstance(src, Checkpoint) else \
        open_checkpoint(src, trust=trust, max_expansion=max_expansion, tag=tag)
    return manifest_of(checkpoint, options, jobs=jobs, progress=progress)
