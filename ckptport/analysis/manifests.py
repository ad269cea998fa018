"""Manifests: the identity of a checkpoint's weights, whatever the container.

What a manifest lists and how its weights digest is defined is ``digest``'s
(re-exported here, where callers make and read manifests). This module makes
one from a checkpoint (normalized with the options it records: ``check
--against-manifest`` normalizes the artifact with the same options), writes,
reads and compares them. The file also records its schema version, the
tool's version and those options.

Hashing reads each unique tensor once, by position, on every core
(hashlib releases the GIL); memory is one read buffer per worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from ..checkpoint import Checkpoint
from ..dtypes import dtype_of
from ..errors import CkptportError, InputError, OptionError, OutputError
from ..parallel import run_all
from ..progress import Progress, no_progress
from ..rules import NormalizeOptions, apply_rules
from ..rules.quantized import quantization_of
from ..rules.recipes import recipe_from_json
from ..tensors import ViewKey, chunks, nbytes, view_key
from ..tree import TensorLeaf, format_path, iter_tensors
from .digest import SCHEMA, TIE_BY, VERSION, Manifest, TensorEntry, weights_digest
from .ties import canonical_ties, declared_ties

__all__ = ["Manifest", "TensorEntry", "ManifestComparison", "SCHEMA", "VERSION", "manifest_of",
           "build_manifest", "load_manifest", "manifest_from_json", "write_manifest", "is_manifest",
           "compare_manifests", "against_manifest", "WrittenDigests", "options_of",
           "manifest_options", "tied_elsewhere", "weights_digest", "unproven_alias",
           "options_from_json"]

MAX_MANIFEST_BYTES = 256 << 20  # a manifest lists tensors, not their bytes
_HEX = frozenset("0123456789abcdef")
_T = TypeVar("_T")


def options_of(options: NormalizeOptions) -> dict[str, object]:
    """The options as the manifest records them; key surgery only when used (so manifests
    made without it are as before, and older ckptport versions still read them)."""
    made: dict[str, object] = {"select": options.select, "ema": options.ema,
                               "strip_prefixes": list(options.strip_prefixes),
                               "keep_prefixes": options.keep_prefixes, "dtype": options.dtype}
    keys = {"subtree": options.subtree, "keep": list(options.keep), "drop": list(options.drop),
            "rename": [list(pair) for pair in options.rename],
            "map": options.loaded_recipe.to_json() if options.loaded_recipe else None,
            "dequantize": options.dequantize}
    made.update((name, value) for name, value in keys.items() if value)
    return made


def _digest(leaf: TensorLeaf) -> str:
    sha = hashlib.sha256()
    for piece in chunks(leaf):
        sha.update(piece)
    return sha.hexdigest()


class WrittenDigests:
    """The sha256 of each tensor as a writer streams it (``normalize --manifest``).

    ``tap`` wraps the pieces a writer writes; the manifest is then made from
    the bytes written, with no second pass over the data.
    """

    def __init__(self) -> None:
        self.done: dict[ViewKey, str] = {}
        self._lock = threading.Lock()

    def tap(self, leaf: TensorLeaf, pieces: Iterable[bytes | memoryview]
            ) -> Iterator[bytes | memoryview]:
        sha = hashlib.sha256()
        for piece in pieces:
            sha.update(piece)
            yield piece
        with self._lock:
            self.done[view_key(leaf)] = sha.hexdigest()


def build_manifest(checkpoint: Checkpoint, options: NormalizeOptions, *,
                   jobs: int | None = None, known: Mapping[ViewKey, str] | None = None,
                   progress: Progress = no_progress,
                   declared: bool | None = None) -> Manifest:
    """The manifest of a normalized checkpoint's tensors; ``known`` digests are not redone.

    Names sharing one tensor are a tie known by storage; ``declared`` is what the model's
    ``config.json`` says of tied embeddings (``ties.declared_ties``), deciding whether a
    stored copy of an embedding joins a tie (``ties.canonical_ties``).
    """
    named: dict[ViewKey, list[tuple[str, TensorLeaf]]] = {}
    for path, leaf in iter_tensors(checkpoint.tree):
        named.setdefault(view_key(leaf), []).append((format_path(path), leaf))
    known = known or {}
    todo = [(key, names[0][1]) for key, names in named.items() if key not in known]
    advance = progress("hashing", sum(nbytes(leaf) for _, leaf in todo))

    def digest(item: tuple[ViewKey, TensorLeaf]) -> str:
        value = _digest(item[1])
        advance(nbytes(item[1]))
        return value

    hashed = dict(zip((key for key, _ in todo),
                      run_all(digest, todo, jobs=jobs, size=lambda item: nbytes(item[1])),
                      strict=True))
    entries = []
    for key, names in named.items():
        sha = known.get(key) or hashed[key]
        for name, leaf in names:
            tied = tuple(sorted(other for other, _ in names if other != name))
            entries.append(TensorEntry(name, _dtype_name(leaf), tuple(leaf.shape), nbytes(leaf),
                                       sha, tied, tie_by="storage" if tied else None))
    duplicate = _first_duplicate(e.name for e in entries)
    if duplicate is not None:
        raise OutputError(f"two tensors are both named {duplicate!r}; a manifest names each "
                          "tensor once", checkpoint.source.path)
    return Manifest(tuple(sorted(canonical_ties(entries, declared), key=lambda e: e.name)),
                    options_of(options), quantization=quantization_of(checkpoint))


def _dtype_name(leaf: TensorLeaf) -> str:
    return str(dtype_of(leaf)).removeprefix("torch.")


def _first_duplicate(names: Iterable[str]) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def manifest_of(checkpoint: Checkpoint, options: NormalizeOptions | None = None, *,
                jobs: int | None = None, progress: Progress = no_progress,
                known: Callable[[Checkpoint], Mapping[ViewKey, str]] | None = None) -> Manifest:
    """The checkpoint normalized with ``options``, its weights listed and hashed (torch-free
    for zip, legacy, safetensors and shard sets, unless ``options`` cast); ``known`` gives
    the digests some other pass already made of the normalized checkpoint's tensors
    (``sign`` hashes them with the files)."""
    options = options or NormalizeOptions()
    normalized = apply_rules(checkpoint, options, lazy=True)
    return build_manifest(normalized.checkpoint, options, jobs=jobs, progress=progress,
                          known=None if known is None else known(normalized.checkpoint),
                          declared=declared_ties(checkpoint.source.path))


def write_manifest(made: Manifest, path: str | os.PathLike[str], *,
                   overwrite: bool = True) -> Path:
    """Write the manifest atomically (a temp file in the same folder, then renamed)."""
    from ..writers.staging import os_error, staged_file

    target = Path(path)
    try:
        with staged_file(target, overwrite=overwrite) as out:
            out.file.write(made.to_json().encode())
            out.sync()
            out.publish()
    except OSError as exc:
        raise os_error(exc, target) from exc
    return target


# -- reading a manifest ---------------------------------------------------------------


def is_manifest(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file that starts as a JSON object naming ckptport's schema."""
    target = Path(path)
    if not target.is_file():
        return False
    try:
        with target.open("rb") as f:
            head = f.read(4096).lstrip()
    except OSError:
        return False
    return head[:1] == b"{" and SCHEMA.encode() in head


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """A manifest file, checked field by field; ``InputError`` naming the file and field."""
    target = Path(path)
    try:
        size = target.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise InputError(f"is {size} bytes, too large for a manifest", target)
        text = target.read_bytes().decode("utf-8")
        doc = json.loads(text, parse_constant=_no_constant)
    except OSError as exc:
        raise InputError.from_os_error(exc, target) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"not a ckptport manifest: not JSON ({exc})", target) from None
    return manifest_from_json(doc, target)


def manifest_from_json(doc: object, target: Path, label: str = "manifest") -> Manifest:
    """A manifest from its parsed JSON (a file's, or a weights attestation's predicate),
    checked field by field; ``InputError`` naming ``target`` and the ``label``'s field."""
    field_ = _Fields(target, label)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(f"not a ckptport manifest: no \"schema\": \"{SCHEMA}\"", target)
    version = field_.get(doc, "version", int)
    if version > VERSION:
        raise InputError(f"{label} schema version {version} is newer than this ckptport reads "
                         f"({VERSION}); upgrade ckptport", target)
    if version < 1:
        raise InputError(f"{label} field \"version\" is {version}, not a schema version",
                         target)
    options = field_.get(doc, "options", dict)
    entries = [field_.entry(raw, index)
               for index, raw in enumerate(field_.get(doc, "tensors", list))]
    duplicate = _first_duplicate(e.name for e in entries)
    if duplicate is not None:
        raise InputError(f"{label} lists the tensor {duplicate!r} twice", target)
    false_alias = unproven_alias(entries)
    if false_alias is not None:
        raise InputError(f"{label} field \"alias_of\" of {false_alias!r} names no tensor of "
                         "the same dtype, shape and content that stands for itself (an alias "
                         "would hide a tensor from the digest)", target)
    quantization = doc.get("quantization", {})
    if not isinstance(quantization, dict):
        raise InputError("manifest field \"quantization\" is not an object", target)
    made_with = doc.get("made_with", {})
    if not isinstance(made_with, dict):
        raise InputError(f"{label} field \"made_with\" is not an object", target)
    made = Manifest(tuple(sorted(entries, key=lambda e: e.name)), options, version,
                    str(doc.get("ckptport", "")), quantization, made_with)
    if doc.get("digest") != made.digest:
        raise InputError(f"{label} field \"digest\" does not match its tensors (edited or "
                         "corrupt)", target)
    try:
        manifest_options(made)
    except (ValueError, TypeError, CkptportError) as exc:
        cause = exc.message if isinstance(exc, CkptportError) else exc
        raise InputError(f"{label} field \"options\": {cause}", target) from None
    return made


def unproven_alias(entries: Iterable[TensorEntry]) -> str | None:
    """The first name claimed to be an alias of a tensor that is not its equal.

    An alias is left out of the digest, so the claim is checked: it must name an
    entry that stands for itself with the same dtype, shape, size and sha256.
    """
    listed = list(entries)
    by_name = {e.name: e for e in listed}
    for entry in listed:
        if entry.alias_of is None:
            continue
        head = by_name.get(entry.alias_of)
        if head is None or head.alias_of is not None or head.name == entry.name or (
                head.dtype, head.shape, head.nbytes, head.sha256) != (
                entry.dtype, entry.shape, entry.nbytes, entry.sha256):
            return entry.name
    return None


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


class _Fields:
    """Typed access to a manifest's fields; a missing or mistyped one names itself."""

    def __init__(self, path: Path, label: str = "manifest") -> None:
        self.path = path
        self.label = label

    def mapping(self, value: object, where: str) -> dict[str, object]:
        if not isinstance(value, dict):
            raise InputError(f"{self.label} field {where} is not an object", self.path)
        return value

    def get(self, doc: Mapping[str, object], name: str, kind: type[_T], where: str = "",
            default: _T | None = None) -> _T:
        """The field of exactly type ``kind`` (a JSON ``true`` is no int)."""
        label = f"{where}.{name}" if where else name
        if name not in doc:
            if default is not None:
                return default
            raise InputError(f"{self.label} field \"{label}\" is missing", self.path)
        value = doc[name]
        if type(value) is not kind or not isinstance(value, kind):
            raise InputError(f"{self.label} field \"{label}\" is a {type(value).__name__}, "
                             f"not a {kind.__name__}", self.path)
        return value

    def entry(self, raw: object, index: int) -> TensorEntry:
        """``tensors[index]``, each field checked."""
        where, label, target = f"tensors[{index}]", self.label, self.path
        item = self.mapping(raw, where)
        shape: list[object] = self.get(item, "shape", list, where)
        sizes = tuple(n for n in shape if type(n) is int and n >= 0)
        if len(sizes) != len(shape):
            raise InputError(f"{label} field {where}.shape is not a list of sizes", target)
        sha = self.get(item, "sha256", str, where)
        if len(sha) != 64 or not set(sha) <= _HEX:
            raise InputError(f"{label} field {where}.sha256 is not a sha256", target)
        tied: list[object] = self.get(item, "tied", list, where, default=[])
        alias_of = self.get(item, "alias_of", str, where, default="") or None
        tie_by = self.get(item, "tie_by", str, where, default="") or None
        if tie_by is not None and tie_by not in TIE_BY:
            raise InputError(f"{label} field {where}.tie_by is {tie_by!r}, not one of "
                             f"{', '.join(TIE_BY)}", target)
        return TensorEntry(self.get(item, "name", str, where), self.get(item, "dtype", str, where),
                           sizes, self.get(item, "nbytes", int, where), sha,
                           tuple(str(t) for t in tied), alias_of, tie_by)


def manifest_options(made: Manifest) -> NormalizeOptions:
    """The normalize options a manifest was made with (to make the artifact's alike)."""
    return options_from_json(made.options)


def options_from_json(recorded: Mapping[str, object]) -> NormalizeOptions:
    """Normalize options as ``options_of`` records them (a manifest's, a derivation's)."""
    # Any: JSON values, each field's own; NormalizeOptions checks their types and values
    raw: dict[str, Any] = dict(recorded)
    known = {"select", "ema", "strip_prefixes", "keep_prefixes", "dtype", "subtree", "keep",
             "drop", "rename", "map", "dequantize"}
    unknown = set(raw) - known
    if unknown:
        raise OptionError(f"unknown option {sorted(unknown)[0]!r}")
    for name in ("keep", "drop"):
        if name in raw:
            raw[name] = tuple(raw[name])
    if "rename" in raw:
        raw["rename"] = tuple(tuple(pair) for pair in raw["rename"])
    if "map" in raw:
        raw["recipe"] = recipe_from_json(raw.pop("map"), "manifest options")
    return NormalizeOptions(**raw)  # checks every field's type and value


# -- comparing ------------------------------------------------------------------------


def tied_elsewhere(entry: TensorEntry, other: Mapping[str, TensorEntry]) -> bool:
    """A name one side lacks that it records as tied to a tensor the other side holds with
    the same content: the hub leaves tied names out of its files (not a difference)."""
    return any(name in other and (other[name].sha256, other[name].dtype, other[name].shape)
               == (entry.sha256, entry.dtype, entry.shape) for name in entry.tied)


def _one_side(mine: Mapping[str, TensorEntry], theirs: Mapping[str, TensorEntry]
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Names only in ``mine``: (differences, names tied to a tensor ``theirs`` holds)."""
    only = [name for name in mine if name not in theirs]
    return (tuple(n for n in only if not tied_elsewhere(mine[n], theirs)),
            tuple(n for n in only if tied_elsewhere(mine[n], theirs)))


@dataclass(frozen=True)
class ManifestComparison:
    """Two manifests tensor by tensor: what ``diff`` reports and ``check`` gates on (CKP010).

    ``changed`` pairs the entries of names both list whose dtype, shape or content
    differ (expected, actual); ``tied_*`` are names one side lacks that are the same
    tensor as one the other side holds (a note, never a finding).
    """

    expected: Manifest
    actual: Manifest
    compared: int
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    tied_missing: tuple[str, ...]
    tied_unexpected: tuple[str, ...]
    changed: tuple[tuple[TensorEntry, TensorEntry], ...]


def compare_manifests(expected: Manifest, actual: Manifest) -> ManifestComparison:
    want, have = expected.by_name(), actual.by_name()
    missing, tied_missing = _one_side(want, have)
    unexpected, tied_unexpected = _one_side(have, want)
    changed = tuple((entry, have[name]) for name, entry in want.items() if name in have
                    and (entry.dtype, entry.shape, entry.sha256)
                    != (have[name].dtype, have[name].shape, have[name].sha256))
    return ManifestComparison(expected, actual, sum(1 for n in want if n in have), missing,
                              unexpected, tied_missing, tied_unexpected, changed)


def against_manifest(checkpoint: Checkpoint, expected: Manifest, *, jobs: int | None = None,
                     progress: Progress = no_progress) -> ManifestComparison:
    """``check --against-manifest``: the artifact normalized as the manifest was, compared."""
    actual = manifest_of(checkpoint, manifest_options(expected), jobs=jobs, progress=progress)
    return compare_manifests(expected, actual)
