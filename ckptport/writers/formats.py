"""The output formats ckptport writes: one open registry, shaped like the readers'.

Each ``OutputFormat`` says what ``--to`` calls it, which DST extensions
choose it, whether it is one file or a folder, the names the hub gives a set
of its files, and how to make its writer (imported when used: the ``.pth``
writer needs torch). Planning DST, ``--to``'s choices, shard sets and folder
mode all read this table, so a new format is one module and one
``register`` call:

- a file format makes a ``FileFormat``: ``write(tree, file, dst, options,
  advance)`` into an open file and ``verify(path, tree, written, options,
  advance)`` of the result; staging, fsync, shard sets and publishing are
  done for it;
- a folder format makes a ``Writer``: ``write(checkpoint, destination,
  options)`` stages and publishes the folder itself (DCP).

This module imports nothing heavy: the CLI reads it to offer ``--to``.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import OptionError

__all__ = ["Kind", "OutputFormat", "FORMATS", "register", "by_extension", "refuse_untaken"]


class Kind(enum.Enum):
    FILE = "file"
    FOLDER = "folder"


@dataclass(frozen=True)
class OutputFormat:
    """One output format. ``factory`` is ``"module:Class"`` or a callable making the writer.

    ``extensions`` choose it from DST's name (the first one is what folder mode
    names its outputs); ``shard_stem`` names a hub shard set of these files
    (``model`` -> ``model-00001-of-00002.safetensors``), None when it has none;
    ``shard_extension``: what those shards are named with when it is not the format's
    own (the hub's ``pytorch_model-….bin`` for .pth); ``metadata``: its files record
    their provenance (the source's sha256, the rules applied, a safetensors source's own
    metadata); ``one_name_per_tensor``: a file stores each tensor once, under one name
    (safetensors), so a shard set leaves tied names out as the hub does, where a pickle
    keeps every name over one storage. ``takes``: the write options its writer reads,
    spelled as on the command line (``--anchor``: what a pickle records; ``--dcp-key``);
    any other one given is refused (``refuse_untaken``), not silently left out.
    """

    name: str
    kind: Kind
    factory: str | Callable[[], object]
    extensions: tuple[str, ...] = ()
    shard_stem: str | None = None
    shard_extension: str | None = None
    metadata: bool = False  # records where it came from (``writers.provenance``)
    one_name_per_tensor: bool = False
    takes: frozenset[str] = frozenset()

    def make(self) -> object:
        """The writer (a ``FileFormat`` for files, a ``Writer`` for folders: ``kind`` says
        which, so the caller that checked it casts)."""
        if callable(self.factory):
            return self.factory()
        module, _, name = self.factory.partition(":")
        return getattr(importlib.import_module(module), name)()

    @property
    def extension(self) -> str:
        """What a file of this format is named with (folder mode, shard sets)."""
        return self.extensions[0] if self.extensions else ""


FORMATS: dict[str, OutputFormat] = {}


def register(fmt: OutputFormat) -> OutputFormat:
    """Add (or replace) a format; every command offers it from then on."""
    FORMATS[fmt.name] = fmt
    return fmt


register(OutputFormat("pth", Kind.FILE, "ckptport.writers.pth:PthFile",
                      (".pth", ".pt", ".bin", ".ckpt", ".pth.tar", ".pt.tar"),
                      shard_stem="pytorch_model", shard_extension=".bin",
                      takes=frozenset({"--anchor"})))
register(OutputFormat("safetensors", Kind.FILE, "ckptport.writers.safetensors:SafetensorsFile",
                      (".safetensors",), shard_stem="model", metadata=True,
                      one_name_per_tensor=True, takes=frozenset({"--metadata"})))
register(OutputFormat("dcp", Kind.FOLDER, "ckptport.writers.dcp:DcpWriter",
                      takes=frozenset({"--dcp-key"})))


def refuse_untaken(fmt: OutputFormat, *, anchor: str = "cpu", dcp_key: str | None = None,
                   metadata: str = "keep") -> None:
    """An ``OptionError`` for a write option of ``normalize`` given (away from its default)
    that ``fmt`` does not take: its files would be written as if it had not been given."""
    given = (("--anchor", anchor != "cpu"), ("--dcp-key", dcp_key),
             ("--metadata", metadata != "keep"))
    for option, value in given:
        takers = " or ".join(f.name for f in FORMATS.values() if option in f.takes)
        OptionError.only_with(f"a {takers} output, not {fmt.name}", option in fmt.takes,
                              [(option, value)])


def by_extension(filename: str) -> tuple[str, OutputFormat] | None:
    """The (extension, format) a file name ends with, the longest extension first."""
    lowered = filename.lower()
    found = [(ext, fmt) for fmt in FORMATS.values() for ext in fmt.extensions
             if lowered.endswith(ext)]
    return max(found, key=lambda item: len(item[0])) if found else None
