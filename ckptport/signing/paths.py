"""Where signatures lie: beside a file ``X`` as ``X.sig`` and ``X.weights.sig``, in a model
folder as ``model.sig`` and ``model.weights.sig``."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OptionError

__all__ = ["FOLDER_SIGNATURE", "attestation_path", "signature_paths", "subject_name"]

FOLDER_SIGNATURE = "model.sig"


def attestation_path(signature: Path) -> Path:
    """Where the weights attestation of the OMS signature ``signature`` lies."""
    stem = signature.name.removesuffix(".sig")
    return signature.with_name(f"{stem}.weights.sig")


def signature_paths(model: str | os.PathLike[str], output: Path | None = None, *,
                    folder: bool | None = None) -> tuple[Path, Path]:
    """(OMS signature, weights attestation) for ``model``: beside a file, in a folder
    (``folder`` says which for a model not written yet)."""
    if output is None:
        if not isinstance(model, Path):
            raise OptionError("a remote source's signature has no place beside it: name the "
                              "file (-o FILE / --signature FILE)")
        inside = model.is_dir() if folder is None else folder
        output = model / FOLDER_SIGNATURE if inside else model.with_name(model.name + ".sig")
    return output, attestation_path(output)


def subject_name(src: str | os.PathLike[str]) -> str:
    """The name a statement gives ``src``: its last part (a folder's, a URL's)."""
    return Path(str(src).rstrip("/")).name or str(src)
