"""Readers: one per container format or layout, one resolver, one dispatch.

``resolve`` decides once what a path names: the readers' layouts are asked,
in ``READERS`` order and from names alone, whether the path is one of theirs
(a DCP, DeepSpeed or rank-file folder, a shard set, a model folder) and which
files it covers; a plain file is opened and ``open_checkpoint`` hands it to
the one reader that claims its bytes. Folder searches (``discover``),
``check``, hub folders, snapshots and provenance ask the same layouts
(``layout_of``) and get the same files. Every command reads through here:
``inspect``, ``check`` and the manifest get described tensors (no torch),
``normalize`` and ``diff`` the same checkpoint and read tensor bytes by
position, and ``ckptport.read`` turns the described tensors into torch
tensors mapped from the file. No reader executes code from the file unless
the caller passes ``trust=True``.

To add a reader: write a module with a class that has ``format``,
``claims(source)`` (from the bytes of a file) and ``load(source, options)``;
to add a layout, a class with ``layout(folder, names, name, tag)`` (from
names) and ``load``; and add an instance to ``READERS`` below.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ..checkpoint import Checkpoint, Format, SourceFacts
from ..dtypes import DType
from ..errors import CkptportError, CodeArchiveError, InputError, OptionError
from ..sources import MemorySource, open_source
from ..tensors import to_torch
from ..tree import SCALARS, is_tensor, map_tree
from ..unpickle.values import Device, Size
from . import budget
from .base import (
    Layout,
    LayoutReader,
    Loader,
    Names,
    NotDescribable,
    Reader,
    ReadOptions,
    Source,
    Where,
)
from .dcp import DcpReader
from .deepspeed import DeepSpeedReader
from .folders import ModelFolder, TrainingState, listing, not_one_checkpoint
from .hf_dcp import HfShardsReader
from .legacy import LegacyReader
from .megatron import MegatronReader
from .pipeline import PipelineReader
from .ranks import RankFilesReader
from .safetensors import SafetensorsReader
from .shards import ShardsReader
from .torch_zip import TorchScriptReader, TorchZipReader
from .universal import UniversalReader
from .verl import VerlReader

if TYPE_CHECKING:
    import torch

    from ..remote import RemotePath

__all__ = ["read", "describe", "resolve", "open_checkpoint", "load_bytes", "materialize",
           "READERS", "Reader", "LayoutReader", "Layout", "ReadOptions", "Source",
           "NotDescribable", "layout_of", "is_checkpoint_folder", "is_folder_of_checkpoints",
           "check_named", "tag_for", "tag_somewhere", "read_already"]


def layout_of(folder: Where, names: Names, name: str | None = None, tag: str | None = None
              ) -> Layout | None:
    """What ``folder`` (``names`` its entries) or its file ``name`` (``names`` None) is as
    one checkpoint: the first layout of ``READERS`` that names it; None: no layout's.

    ``folder`` is a ``Path`` or a remote folder (a ``RemotePath``); a layout that is
    broken as named (a ``latest`` naming no tag) is an ``InputError``.
    """
    for reader in READERS:
        if isinstance(reader, LayoutReader):
            found = reader.layout(folder, names, name, tag)
            if found is not None:
                return found
    return None


def _local_layout(given: Path, tag: str | None) -> Layout | None:
    if given.is_dir():
        return layout_of(given, listing(given), None, tag)
    return layout_of(given.parent, None, given.name, tag)


def resolve(path: str | os.PathLike[str], tag: str | None = None) -> Source:
    """What ``path`` names, decided once by the readers' layouts, and opened; ``tag`` picks
    a tagged layout's tag (a DeepSpeed save folder's; default: the one ``latest`` names)."""
    from ..remote.urls import is_remote

    if is_remote(path):  # a URL: opened by range, then read as a local file is
        if tag is not None:
            raise OptionError(f"--tag {tag}: the path is not a DeepSpeed checkpoint folder",
                              path)
        from ..remote import location
        from .remote import resolve_url

        return resolve_url(cast("RemotePath", location(path)))  # is_remote: a URL's
    given = Path(path)
    layout = _local_layout(given, tag)
    if tag is not None and (layout is None or layout.tag is None):
        raise OptionError(f"--tag {tag}: the path is not a DeepSpeed checkpoint folder", path)
    return source_of(given, layout)


def source_of(given: Where, layout: Layout | None) -> Source:
    """The source a layout names (its files, read by its reader), or the file ``given``
    (or the layout's one file) opened, its container sniffed from its bytes (a remote one
    opened by range, ``readers.remote``)."""
    from ..containers.sniff import sniff

    if layout is not None and layout.many is not None:
        raise InputError(layout.many, given)
    if layout is not None and layout.reader is not None:
        return Source(given, layout.main, layout.files, layout.format, index=layout.index,
                      layout=layout)
    if layout is None and given.is_dir():
        raise not_one_checkpoint(given)
    target = given if layout is None else layout.main
    if isinstance(target, Path):
        file = open_source(target)
    else:
        from ..remote.objects import opened

        file = opened(target)
    fmt = sniff(file)
    check_named(target, fmt)
    return Source(given, target, (target,), fmt, file, layout=layout)


def check_named(target: Where, fmt: Format | None) -> None:
    """Refuse a file whose name makes loaders pick another reader than its bytes need."""
    if target.name.lower().endswith(".safetensors") and fmt is not Format.SAFETENSORS:
        raise InputError(f"is named .safetensors but is {'a ' + fmt if fmt else 'not'} a "
                         "safetensors file: torch.load reads *.safetensors with the "
                         "safetensors library, which cannot read it, so readers would "
                         "disagree; rename it", target)


def is_checkpoint_folder(path: Path) -> bool:
    """A folder that is one checkpoint (not a folder of them: that is folder mode's); a
    layout broken as named is one, so that reading it says why."""
    if not path.is_dir():
        return False
    try:
        layout = _local_layout(path, None)
    except CkptportError:
        return True
    return layout is not None and layout.many is None


def is_folder_of_checkpoints(path: str | os.PathLike[str]) -> bool:
    """Folder mode's SRC: a local folder that is not one checkpoint, or a bucket folder or
    hub repository whose names no layout reads as one checkpoint (its listing decides, as
    a local folder's entries do; a broken layout is one checkpoint, read to say why)."""
    from ..remote.urls import RemotePath

    if not isinstance(path, RemotePath):
        return Path(path).is_dir() and not is_checkpoint_folder(Path(path))
    from ..remote import folder_names

    names = folder_names(path)
    if names is None:  # an object
        return False
    try:
        layout = layout_of(path, names)
    except CkptportError:
        return False
    return layout is None or layout.many is not None


def tag_for(path: object, tag: str | None) -> str | None:
    """``--tag`` where it applies: a tagged layout (a DeepSpeed save folder); any other path
    reads as is (one whose layout is broken gets it, so that reading it says why)."""
    if tag is None or not isinstance(path, (str, os.PathLike)) or not Path(path).is_dir():
        return None
    try:
        layout = _local_layout(Path(path), None)
    except CkptportError:
        return tag
    return tag if layout is not None and layout.tag is not None else None


def tag_somewhere(paths: Iterable[object], tag: str | None) -> None:
    """Refuse ``--tag`` when none of ``paths`` is a DeepSpeed save folder: each would be
    read as it is, and the run would pass for the tag the user named."""
    if tag is not None and not any(tag_for(p, tag) for p in paths):
        raise OptionError(f"--tag {tag}: no path given is a DeepSpeed checkpoint folder")


def _load_file(path: Where, options: ReadOptions) -> Checkpoint:
    return open_checkpoint(path, trust=options.trust, lenient=options.lenient,
                           max_expansion=options.max_expansion)


# the registry, in the order layouts are asked (names) and files claimed (bytes)
READERS: tuple[Reader | LayoutReader, ...] = (
    TorchZipReader(), TorchScriptReader(), LegacyReader(), SafetensorsReader(),
    MegatronReader(_load_file), DcpReader(_load_file), UniversalReader(_load_file),
    PipelineReader(_load_file), DeepSpeedReader(_load_file),
    VerlReader(RankFilesReader(_load_file)), RankFilesReader(_load_file), TrainingState(),
    HfShardsReader(), ShardsReader(_load_file), ModelFolder())


def _reader_for(source: Source) -> Loader:
    if source.layout is not None and source.layout.reader is not None:
        return source.layout.reader
    for reader in READERS:
        if not isinstance(reader, LayoutReader) and reader.claims(source):
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


def read_already(trust: bool = False, max_expansion: float | None = None,
                 tag: str | None = None) -> None:
    """For an API handed a ``Checkpoint`` instead of a path: the options of a read, given,
    would be ignored (it is read already), so each is an ``OptionError``."""
    OptionError.only_with("a path to read, not a Checkpoint (read already)", False, [
        ("trust", trust), ("max_expansion", max_expansion), ("tag", tag)])


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


def load_bytes(file: MemorySource) -> Checkpoint:
    """A checkpoint held in memory (a value ``torch.save``'d inside a DCP item)."""
    from ..containers.sniff import sniff

    source = Source(file.path, file.path, (file.path,), sniff(file), file)
    if source.format not in (Format.TORCH_ZIP, Format.TORCH_LEGACY):
        raise InputError("an embedded value that is not a torch.save'd pickle", file.path)
    return open_checkpoint(source)


def materialize(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint with torch tensors (views of the mapped file) and torch values.

    One leaf under two names (tied) becomes one torch tensor; leaves over one
    storage become views of one torch storage.
    """
    storages: dict[int, torch.UntypedStorage] = {}
    made: dict[int, object] = {}

    def leaf(path: tuple[object, ...], value: object) -> object:
        if type(value) in SCALARS:  # most leaves of a big tree: nothing to make
            return value
        if id(value) not in made:
            made[id(value)] = _torch_value(value, storages)
        return made[id(value)]

    return checkpoint.with_tree(map_tree(checkpoint.tree, leaf))


def _torch_value(value: object, storages: dict[int, torch.UntypedStorage]) -> object:
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
