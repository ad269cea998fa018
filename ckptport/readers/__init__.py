"""Readers: one per container format, one resolver, one dispatch.

``resolve`` decides once what a path names (a checkpoint file, a shard set,
a DCP folder, a Hugging Face model folder) and opens it; ``open_checkpoint``
hands the source to the one reader that claims it. Every command reads
through here: ``inspect``, ``check`` and the manifest get described
tensors (no torch), ``normalize`` and ``diff`` the same checkpoint and read
tensor bytes by position, and ``ckptport.read`` turns the described
tensors into torch tensors mapped from the file. No reader executes code
from the file unless the caller passes ``trust=True``.

To add a reader: write a module with a class that has ``format``,
``claims(source)`` and ``load(source, options)``, and add an instance to
``READERS`` below.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..dtypes import DType
from ..errors import CkptportError, CodeArchiveError, InputError, OptionError
from ..sources import SourceFile, open_source
from ..tensors import to_torch
from ..tree import SCALARS, is_tensor, map_tree
from ..unpickle.values import Device, Size
from . import budget
from .base import NotDescribable, Reader, ReadOptions, Source, SourceKind
from .dcp import DcpReader, dcp_metadata
from .deepspeed import DeepSpeedReader, tag_files, tag_folder
from .folders import FolderKind, folder_kind, not_one_checkpoint, weights_file
from .legacy import LegacyReader
from .ranks import RankFilesReader, rank_files
from .safetensors import SafetensorsReader
from .shards import ShardsReader
from .torch_zip import TorchScriptReader, TorchZipReader

__all__ = ["read", "describe", "resolve", "open_checkpoint", "load_bytes", "materialize",
           "READERS", "Reader", "ReadOptions", "Source", "SourceKind", "NotDescribable",
           "is_checkpoint_folder", "check_named"]


def resolve(path: str | os.PathLike[str], tag: str | None = None) -> Source:
    """What ``path`` names, decided once (``readers.folders`` for a folder) and opened;
    ``tag`` picks a DeepSpeed save folder's tag (default: the one ``latest`` names)."""
    from ..containers.shard_index import find_index, parse_index
    from ..containers.sniff import sniff
    from ..remote.urls import is_remote

    if tag is not None and (is_remote(path) or not (
            Path(path).is_dir() and folder_kind(Path(path)) is FolderKind.DEEPSPEED)):
        raise OptionError(f"--tag {tag}: the path is not a DeepSpeed checkpoint folder", path)
    if is_remote(path):  # a URL: opened by range, then read as a local file is
        from ..remote import location
        from .remote import resolve_url

        return resolve_url(location(path))  # type: ignore[arg-type]
    given = Path(path)
    target = given
    if given.is_dir():
        kind = folder_kind(given)
        if kind is FolderKind.DCP:
            return Source(given, SourceKind.DCP, given, (dcp_metadata(given),), Format.DCP)
        if kind is FolderKind.DEEPSPEED:
            folder = tag_folder(given, tag)
            assert folder is not None
            return Source(given, SourceKind.DEEPSPEED, folder, tag_files(folder))
        if kind is FolderKind.RANKS:
            ranks = rank_files(given)
            assert ranks is not None
            return Source(given, SourceKind.RANKS, given, tuple(ranks.values()))
        if kind is FolderKind.CHECKPOINTS:
            raise not_one_checkpoint(given)
        index = find_index(given)
        target = index if index is not None else weights_file(given)
    if target.name.endswith(".index.json"):
        parsed = parse_index(target)
        return Source(given, SourceKind.SHARDS, target, (target, *parsed.shards),
                      parsed.format, index=parsed)
    file = open_source(target)
    fmt = sniff(file)
    check_named(target, fmt)
    return Source(given, SourceKind.FILE, target, (target,), fmt, file)


def check_named(target: Path, fmt: Format | None) -> None:
    """Refuse a file whose name makes loaders pick another reader than its bytes need."""
    if target.name.lower().endswith(".safetensors") and fmt is not Format.SAFETENSORS:
        raise InputError(f"is named .safetensors but is {'a ' + fmt if fmt else 'not'} a "
                         "safetensors file: torch.load reads *.safetensors with the "
                         "safetensors library, which cannot read it, so readers would "
                         "disagree; rename it", target)


def is_checkpoint_folder(path: Path) -> bool:
    """A folder that is one checkpoint (not a folder of them: that is folder mode's)."""
    return path.is_dir() and folder_kind(path) is not FolderKind.CHECKPOINTS


def _load_file(path: Path, options: ReadOptions) -> Checkpoint:
    return open_checkpoint(path, trust=options.trust, lenient=options.lenient,
                           max_expansion=options.max_expansion)


READERS: tuple[Reader, ...] = (TorchZipReader(), TorchScriptReader(), LegacyReader(),
                               SafetensorsReader(), ShardsReader(_load_file),
                               DcpReader(_load_file), DeepSpeedReader(_load_file),
                               RankFilesReader(_load_file))


def _reader_for(source: Source) -> Reader:
    for reader in READERS:
        if reader.claims(source):
            return reader
    if source.file is not None and source.format is None:
        head = source.file.read(0, min(source.file.size, 8))
        raise InputError(f"not a PyTorch or safetensors checkpoint (starts with {head.hex()})",
                         source.main)
    raise InputError("not a checkpoint ckptport reads", source.main)


def open_checkpoint(path: str | os.PathLike[str] | Source, *, trust: bool = False,
                    lenient: bool = False, max_expansion: float | None = None,
                    tag: str | None = None) -> Checkpoint:
    """The checkpoint at ``path``, tensors described where the format allows (no torch).

    Its tensors may stand for at most ``max_expansion`` times the file's bytes
    (``readers.budget``): a strict read beyond that is an ``InputError``; a lenient one
    (reports) keeps the count for ``check`` to report.
    """
    source = path if isinstance(path, Source) else resolve(path, tag)
    ratio = budget.ratio_of(max_expansion)
    options = ReadOptions(trust=trust, lenient=lenient, max_expansion=ratio)
    try:
        checkpoint = _reader_for(source).load(source, options)
        if not lenient:
            budget.enforce(checkpoint, ratio)
        return checkpoint
    except RecursionError:
        raise InputError("the checkpoint nests too deeply to read", source.main) from None
    except CodeArchiveError:
        raise
    except CkptportError as exc:
        if lenient and exc.dangerous:
            return _names_only(source, exc)
        raise


def _names_only(source: Source, exc: CkptportError) -> Checkpoint:
    """A report's view of a file that names code-running globals and is also unreadable.

    What matters first about such a file is what full unpickling would run
    (the pickle reaches those globals before it breaks), so reports name
    them as for any other code-running file and say in a note why nothing
    else is shown.
    """
    size = source.file.size if source.file is not None else 0
    return Checkpoint({}, SourceFacts(
        path=source.main, format=source.format or Format.TORCH_ZIP, size=size,
        files=source.files, refused_globals=exc.dangerous, spellings=dict(exc.spellings),
        globals=exc.dangerous,
        notes=(f"nothing shown past the code-running globals: {exc.message}",)))


def load_bytes(file: SourceFile) -> Checkpoint:
    """A checkpoint held in memory (a value ``torch.save``'d inside a DCP item)."""
    from ..containers.sniff import sniff

    source = Source(file.path, SourceKind.FILE, file.path, (file.path,), sniff(file), file)
    if source.format not in (Format.TORCH_ZIP, Format.TORCH_LEGACY):
        raise InputError("an embedded value that is not a torch.save'd pickle", file.path)
    return open_checkpoint(source)


def materialize(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint with torch tensors (views of the mapped file) and torch values.

    One leaf under two names (tied) becomes one torch tensor; leaves over one
    storage become views of one torch storage.
    """
    storages: dict[int, object] = {}
    made: dict[int, object] = {}

    def leaf(path: tuple[object, ...], value: object) -> object:
        if type(value) in SCALARS:  # most leaves of a big tree: nothing to make
            return value
        if id(value) not in made:
            made[id(value)] = _torch_value(value, storages)
        return made[id(value)]

    return checkpoint.with_tree(map_tree(checkpoint.tree, leaf))


def _torch_value(value: object, storages: dict[int, object]) -> object:
    if is_tensor(value):
        return to_torch(value, storages)
    if isinstance(value, (Size, Device)):
        import torch

        return torch.Size(value) if isinstance(value, Size) else torch.device(str(value))
    if isinstance(value, DType):
        return value.to_torch()
    return value


def read(path: str | os.PathLike[str], *, trust: bool = False,
         max_expansion: float | None = None, tag: str | None = None) -> Checkpoint:
    """Read any checkpoint ckptport reads, without running code from it (unless ``trust``).

    Args:
        path: a file, a shard set or model folder, a DCP, DeepSpeed or rank-file folder,
            or a URL (``hf://``, ``s3://``, ``https://``: the ``remote`` extra).
        trust: unpickle with full Python: runs code from the file (only for files you
            vouch for).
        max_expansion: the read budget's ratio (``readers.budget``).
        tag: a DeepSpeed save folder's tag (default: the one ``latest`` names).

    Returns:
        A ``Checkpoint``: the tree as stored (wrapper prefixes, optimizer and all), its
        tensors CPU tensors backed by the file (copy-on-write), and the source's facts.

    Raises:
        InputError: missing, corrupt, truncated, ambiguous, or beyond the budget.
        UnsafeCheckpointError: the file names globals that would run code.
    """
    return materialize(open_checkpoint(path, trust=trust, max_expansion=max_expansion,
                                       tag=tag))


def describe(path: str | os.PathLike[str]) -> Checkpoint:
    """Describe any checkpoint without importing torch where the format allows."""
    return open_checkpoint(path, lenient=True)
