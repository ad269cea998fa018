"""Read torch zip checkpoints (``.pt .pth .bin .ckpt``), TorchScript archives, torch.package.

The archive is parsed strictly (``containers.zipfmt``); ``data.pkl`` goes
through ckptport's unpickler, whose storages are the archive's ``data/KEY``
records, located by offset and checked to hold exactly the bytes the pickle
declares. Tensors are described, and read by position when needed.

A zip holding ``constants.pkl`` is TorchScript: loading it runs its code,
so it is refused unless ``--trust``; described, its storages and the
devices they were recorded on are read from its ``data.pkl`` like a
checkpoint's. A zip holding Python sources is a torch.package archive,
which imports the code it carries: refused, named as such.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from ..checkpoint import Checkpoint, Format
from ..containers.zipfmt import ZipArchive, parse_zip
from ..dtypes import DType
from ..errors import CodeArchiveError, InputError
from ..quant.torchao_layout import flatten
from ..tensors import Blob, StorageInfo
from ..unpickle import PickleRefused, Unpickled, unpickle
from ..unpickle.values import Refusal
from .base import ReadOptions, Source, Where, pickle_facts, refusal
from .trusted import load_torchscript, load_trusted

__all__ = ["TorchZipReader", "TorchScriptReader", "archive", "TORCHSCRIPT_REFUSAL"]

TORCHSCRIPT_REFUSAL = ("a TorchScript archive (torch.jit.save): loading one runs its code, so "
                       "ckptport refuses it; with --trust its parameters and buffers are "
                       "extracted into a state dict")


def archive(source: Source) -> ZipArchive:
    file = source.file
    assert file is not None
    return source.parsed("zip", lambda: parse_zip(file))


def _kind(records: Mapping[str, object], path: Where) -> str:
    if "constants.pkl" in records:
        return "torchscript"
    if ".data/extern_modules" in records or ("data.pkl" not in records and any(
            name.endswith(".py") for name in records)):
        raise CodeArchiveError("a torch.package archive (torch.package.PackageExporter): "
                               "loading it imports the Python code it carries; ckptport reads "
                               "torch.save checkpoints, not packages", path)
    if "data.pkl" not in records:
        raise InputError("zip archive has no data.pkl: not a torch checkpoint", path)
    return "checkpoint"


def unpickle_archive(zipped: ZipArchive, options: ReadOptions) -> Unpickled:
    """``data.pkl`` through ckptport's unpickler, its storages the archive's records."""
    path = zipped.source.path
    order = zipped.read("byteorder") if "byteorder" in zipped.records else b"little"
    if order not in (b"little", b"big"):
        raise InputError(f"unknown byte order {order[:20]!r} in the archive", path)
    swap = order.decode() != sys.byteorder

    def storage(key: str, dtype: DType, location: str, numel: int) -> StorageInfo:
        name = f"data/{key}"
        record = zipped.records.get(name)
        nbytes = numel * dtype.itemsize
        if record is None:
            raise Refusal(f"storage record {name} is missing from the archive")
        if not record.stored:
            raise Refusal(f"storage record {name} is compressed: torch.load(mmap=True) would "
                          "read its compressed bytes as the tensor, plain torch.load inflate "
                          "them; refused")
        if record.size != nbytes:
            raise Refusal(f"storage record {name} holds {record.size} bytes but the pickle "
                          f"declares {nbytes}")
        blob = Blob(zipped.source, record.data_offset, nbytes, name=f"record {name}",
                    member=record.name)
        return StorageInfo(key, location, dtype, nbytes, blob, big_endian=swap)

    data = zipped.read("data.pkl")
    try:
        unpickled = unpickle(data, storage=storage, lenient=options.lenient)
    except PickleRefused as exc:
        raise refusal(exc, path) from None
    if unpickled.scan.end != len(data):  # torch ignores them; a scanner looking there is fooled
        raise InputError(f"{len(data) - unpickled.scan.end} bytes of trailing data after the "
                         "pickle's STOP in data.pkl", path)
    return unpickled


class TorchZipReader:
    format = Format.TORCH_ZIP

    def claims(self, source: Source) -> bool:
        if source.format is not Format.TORCH_ZIP:
            return False
        return _kind(archive(source).records, source.main) == "checkpoint"

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        if options.trust:
            return load_trusted(source, self.format)
        zipped = archive(source)
        unpickled = unpickle_archive(zipped, options)
        tree, metadata = flatten(unpickled.value, source.main, options.lenient)  # torchao's
        return Checkpoint(tree, pickle_facts(
            source.main, self.format, zipped.source.size, tree, [unpickled], metadata=metadata))


class TorchScriptReader:
    """TorchScript: described without running it; its weights extracted only with ``--trust``."""

    format = Format.TORCHSCRIPT

    def claims(self, source: Source) -> bool:
        return source.format is Format.TORCH_ZIP and \
            _kind(archive(source).records, source.main) == "torchscript"

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        zipped = archive(source)
        if options.trust:
            recorded = self.recorded(zipped)
            return load_torchscript(source, recorded)
        if not options.lenient:
            raise CodeArchiveError(TORCHSCRIPT_REFUSAL, source.main)
        unpickled = unpickle_archive(zipped, ReadOptions(lenient=True))
        return Checkpoint(unpickled.value, pickle_facts(
            source.main, self.format, zipped.source.size, unpickled.value, [unpickled]))

    @staticmethod
    def recorded(zipped: ZipArchive) -> dict[str, int]:
        """The devices the archive recorded for its storages, read without running it."""
        try:
            unpickled = unpickle_archive(zipped, ReadOptions(lenient=True))
        except InputError:
            return {}
        counts: dict[str, int] = {}
        for info in unpickled.storages.values():
            counts[info.location] = counts.get(info.location, 0) + 1
        return dict(sorted(counts.items()))
