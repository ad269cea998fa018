"""The OMS signature over files, hashed and compared by ``model_signing`` itself.

The payload is what ``model_signing sign`` makes (its ``hashing.Config`` over
the model's files, its ``Payload``), so ``model_signing verify`` accepts it;
verifying hashes the files again with the serialization the signature
records (files or shards, sha256, blake2 or blake3, the paths it ignored),
as ``model_signing verify`` does, and names each file added, removed or
changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError, SignatureError
from .bundles import SignedStatement
from .keys import cause, need_library
from .onepass import TensorRanges, new_config, tapped_config

if TYPE_CHECKING:
    from model_signing import hashing, manifest
    from model_signing._signing.signing import Payload

__all__ = ["FILE_HASHES", "FilesComparison", "files_payload", "compare_files", "hash_model"]

FILE_HASHES = ("sha256", "blake3")


@dataclass(frozen=True)
class FilesComparison:
    """The files a signature lists against the files there now (names relative to the
    model; ``.`` for a single-file model)."""

    signature: Path
    by: str
    compared: int
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed)


def hash_model(model: Path, config: hashing.Config) -> manifest.Manifest:
    """``model_signing``'s manifest of ``model``'s files under ``config``; a file it cannot
    hash (a symlink, a special file) is an ``InputError`` naming the model."""
    try:
        return config.hash(model)
    except (ValueError, OSError) as exc:
        raise InputError(f"cannot hash its files: {cause(exc)}", model) from None


def files_payload(model: Path, ignored: Iterable[Path], algorithm: str,
                  ranges: TensorRanges | None = None, jobs: int | None = None) -> Payload:
    """``model_signing``'s payload over ``model``'s files, ``ignored`` (relative) left out
    with the git files, as ``model_signing sign`` leaves them out. With ``ranges`` (sha256
    only) each file is read once and the tensors lying in it are hashed on the way, their
    digests left in ``ranges.done`` (``onepass``)."""
    need_library()
    from model_signing._signing import signing

    config = tapped_config(ranges, jobs) if ranges is not None else \
        new_config().use_file_serialization(
            hashing_algorithm=algorithm)  # type: ignore[arg-type]  # one of FILE_HASHES
    config.set_ignored_paths(paths=list(ignored), ignore_git_paths=True)
    return signing.Payload(hash_model(model, config))


def compare_files(model: Path, signed: SignedStatement, ranges: TensorRanges | None = None,
                  jobs: int | None = None) -> FilesComparison:
    """``model``'s files now against an OMS statement (verified); with ``ranges``, a
    signature over whole files in sha256 is checked by the read that also hashes the
    tensors lying in them (``onepass``)."""
    need_library()
    from model_signing._signing import signing

    try:
        expected = signing.dsse_payload_to_manifest(signed.statement)
        args = dict(expected.serialization_type)
        method = args["method"]
        common = {"hashing_algorithm": args["hash_type"],
                  "allow_symlinks": bool(args["allow_symlinks"])}
        if method == "files" and args["hash_type"] == "sha256" and ranges is not None:
            config = tapped_config(ranges, jobs)
        elif method == "files":
            config = new_config().use_file_serialization(**common)
        elif method == "shards":
            config = new_config().use_shard_serialization(shard_size=args["shard_size"],
                                                          **common)
        else:
            raise ValueError(f"unknown serialization method {method!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise SignatureError(f"not a usable OMS statement: {cause(exc)}", signed.path) from None
    config.set_allow_symlinks(bool(args["allow_symlinks"]))
    config.add_ignored_paths(model_path=model, paths=args.get("ignore_paths", ()))
    actual = hash_model(model, config)
    want = {d.identifier: d.digest for d in expected.resource_descriptors()}
    have = {d.identifier: d.digest for d in actual.resource_descriptors()}
    return FilesComparison(
        signed.path, signed.by, len(want.keys() & have.keys()),
        added=tuple(sorted(have.keys() - want.keys())),
        removed=tuple(sorted(want.keys() - have.keys())),
        changed=tuple(sorted(n for n in want.keys() & have.keys() if want[n] != have[n])))
