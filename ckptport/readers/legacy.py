"""Read torch's legacy (non-zip) checkpoints: ``_use_new_zipfile_serialization=False``.

The layout is five pickles in a row — a magic number, a protocol version,
system facts, the object, the storage keys — then each storage as an
8-byte element count and its raw bytes. Storage offsets are known only
once the object pickle has named every storage's dtype and size, so the
object pickle is read twice: first to learn the storages, then with each
storage located in the file. Everything after the last storage is refused,
as is a file that is also a tar archive (``torch.load`` would read that
instead; ``containers.sniff`` refuses it before this reader is asked).

A file whose first pickle is not the magic number is not a torch
checkpoint, whatever it does: its globals are still named (``torch.load``
would have run that first pickle), and it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint import Checkpoint, Format
from ..dtypes import DType
from ..errors import InputError
from ..quant.torchao_layout import flatten
from ..sources import SourceFile
from ..tensors import Blob, StorageInfo
from ..tree import type_name
from ..unpickle import PickleRefused, StorageHook, Unpickled, unpickle
from ..unpickle.values import Refusal
from .base import ReadOptions, Source, pickle_facts, refusal
from .trusted import load_trusted

__all__ = ["LegacyReader", "LEGACY_MAGIC", "LEGACY_PROTOCOL"]

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_FIRST_READ = 1 << 20


@dataclass(frozen=True)
class _Declared:
    dtype: DType
    numel: int


class _Layout:
    """The five pickles and the storage table of one legacy file."""

    def __init__(self, source: SourceFile, options: ReadOptions) -> None:
        self.source, self.options = source, options
        self.data = source.read(0, min(source.size, _FIRST_READ))
        self.read: list[Unpickled] = []  # every pickle read so far, for what they would run

    def pickle(self, start: int, storage: StorageHook | None = None) -> Unpickled:
        """The pickle at ``start``, reading more of the file while it runs past what is read.

        Every one of the five is read alike (leniently for reports): ``torch.load`` runs
        each, so a payload in the magic-number pickle is named like one in the object."""
        while True:
            try:
                done = unpickle(self.data, start, storage=storage, lenient=self.options.lenient,
                                module_sources=storage is not None)
                self.read.append(done)
                return done
            except PickleRefused as exc:
                if not exc.truncated or len(self.data) == self.source.size:
                    raise
            self.data = self.source.read(0, min(self.source.size, 4 * len(self.data)))

    def load(self) -> tuple[Unpickled, list[Unpickled]]:
        """The object pickle, read with every storage located; and all five pickles.

        An error after a pickle that names code-running globals still names them:
        ``torch.load`` would have run that pickle before failing."""
        try:
            return self._load()
        except InputError as exc:
            met = [name for done in self.read for name in done.dangerous]
            raise exc.naming(tuple(n.resolved for n in met),
                             {n.resolved: n.raw for n in met if n.raw != n.resolved}) from None
        except PickleRefused as exc:
            exc.seen = (*exc.seen, *(name for done in self.read for name in done.dangerous))
            raise

    def _load(self) -> tuple[Unpickled, list[Unpickled]]:
        magic = self.pickle(0)
        if magic.value != LEGACY_MAGIC:
            raise InputError(f"not a torch checkpoint: the file is a bare pickle of "
                             f"{_shown(magic.value)} (torch.load would run it, then fail)")
        protocol = self.pickle(magic.scan.end)
        info = self.pickle(protocol.scan.end)
        if protocol.value != LEGACY_PROTOCOL:
            raise InputError("not a torch legacy checkpoint (bad protocol version)")
        if not isinstance(info.value, dict) or info.value.get("little_endian") is not True:
            raise InputError("a big-endian or malformed legacy checkpoint")
        start = info.scan.end
        declared: dict[str, _Declared] = {}

        def learn(key: str, dtype: DType, location: str, numel: int) -> StorageInfo:
            declared[key] = _Declared(dtype, numel)
            return StorageInfo(key, location, dtype, numel * dtype.itemsize,
                               Blob.of_bytes(b""))

        first = self.pickle(start, learn)
        keys = self.pickle(first.scan.end)
        if not isinstance(keys.value, list) or not all(isinstance(k, str) for k in keys.value):
            raise InputError("malformed storage key list")
        offsets = self._offsets(keys.scan.end, keys.value, declared)

        def locate(key: str, dtype: DType, location: str, numel: int) -> StorageInfo:
            if key not in offsets:
                raise Refusal(f"storage {key} is missing from the file")
            nbytes = numel * dtype.itemsize
            return StorageInfo(key, location, dtype, nbytes,
                               Blob(self.source, offsets[key], nbytes, name=f"storage {key}"))

        found = self.pickle(start, locate)
        self.read.remove(first)  # read again with the storages located: ``found``
        return found, self.read

    def _offsets(self, pos: int, keys: list[str], declared: dict[str, _Declared]
                 ) -> dict[str, int]:
        missing = [key for key in declared if key not in keys]
        if missing:
            raise InputError(f"storage {missing[0]} is missing from the file")
        offsets: dict[str, int] = {}
        size = self.source.size
        for key in keys:
            if key not in declared or key in offsets:
                raise InputError(f"storage {key} is listed but no tensor declares it, or "
                                 "listed twice")
            if pos + 8 > size:
                raise InputError(f"storage {key} is missing: the file ends at byte {size}")
            count = int.from_bytes(self.source.read(pos, 8), "little", signed=True)
            expected = declared[key]
            if count != expected.numel:
                raise InputError(f"storage {key} holds {count} elements but the pickle "
                                 f"declares {expected.numel}")
            nbytes = count * expected.dtype.itemsize
            if pos + 8 + nbytes > size:
                raise InputError(f"storage {key} runs past the end of the file (truncated)")
            offsets[key] = pos + 8
            pos += 8 + nbytes
        if pos != size:
            raise InputError(f"{size - pos} bytes of trailing data after the last storage")
        return offsets


def _shown(value: object) -> str:
    return f"a {type_name(value)}" if not isinstance(value, (int, str)) else repr(value)[:40]


class LegacyReader:
    format = Format.TORCH_LEGACY

    def claims(self, source: Source) -> bool:
        return source.format is Format.TORCH_LEGACY

    def load(self, source: Source, options: ReadOptions) -> Checkpoint:
        if options.trust:
            return load_trusted(source, self.format)
        assert source.file is not None
        try:
            unpickled, pickles = _Layout(source.file, options).load()
        except PickleRefused as exc:
            raise refusal(exc, source.main) from None
        except InputError as exc:
            raise exc.at(source.main) from None
        tree, metadata = flatten(unpickled.value, source.main, options.lenient)  # torchao's
        return Checkpoint(tree, pickle_facts(
            source.main, self.format, source.file.size, tree, pickles, metadata=metadata))
