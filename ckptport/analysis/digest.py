"""What a manifest is: an entry per tensor and the one weights digest over them.

A manifest lists every tensor of the normalized weights — name, dtype,
shape, byte count and the sha256 of its canonical bytes (contiguous,
row-major, little-endian: what ``chunks`` yields) — with the names tied to
it, and one **weights digest**: the sha256 of the sorted per-tensor lines

    ["name","dtype",[shape],nbytes,"sha256"]\\n...

(compact JSON, one line per tensor, sorted, joined by newlines, no trailing
newline). A tie — one tensor under several names — is one line, under the
name that stands for it (``ties``); its other names are listed with
``alias_of`` and left out of the digest, so a tied name stored, tied or
omitted as the hub omits it gives one digest. Key order, sharding and the
container do not enter it, so a ``.pth``, a ``.safetensors`` file, a shard
set, a DCP folder and a Hugging Face folder holding the same weights have
the same digest; a cast changes it. (Schema version 1 put every name in the
digest; such manifests still read and check with that definition.)

This is the record only, with no reading of checkpoints: ``ties`` decides
which name of a tie stands on these entries, ``manifests`` makes, reads and
compares them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from .._version import __version__

__all__ = ["Manifest", "TensorEntry", "SCHEMA", "VERSION", "TieBy", "TIE_BY", "weights_digest"]

SCHEMA = "ckptport.manifest"
VERSION = 2  # 2: a tie is one line of the digest (1: every name was)

TieBy = Literal["storage", "config", "convention"]
"""How a tie is known: by storage, from the model's ``config.json``, or by the hub's
convention (a guess, said so in the reports)."""
TIE_BY: tuple[TieBy, ...] = ("storage", "config", "convention")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    sha256: str
    tied: tuple[str, ...] = ()  # the other names of the same tensor (not in the digest)
    alias_of: str | None = None  # the name that stands for this tie (then not in the digest)
    tie_by: TieBy | None = None  # how the tie is known, on every name of a tie

    def line(self) -> str:
        return json.dumps([self.name, self.dtype, list(self.shape), self.nbytes, self.sha256],
                          separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Manifest:
    tensors: tuple[TensorEntry, ...]  # sorted by name
    options: Mapping[str, object]  # JSON values, as ``manifests.options_of`` records them
    digest: str = field(init=False)
    version: int = VERSION
    tool: str = __version__
    quantization: Mapping[str, object] = field(default_factory=dict)  # not in the digest
    # how the listed weights were made, not in the digest: {"map": {"path", "sha256"}}, the
    # recipe a normalize --manifest applied (options stay those that reproduce the output)
    made_with: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", weights_digest(self.tensors, self.version))

    def notes(self) -> tuple[str, ...]:
        """What the digest had to guess: aliases known only by the hub's convention."""
        return tuple(f"note: {t.name} is taken as a tie of {t.alias_of} (same content; the "
                     "hub's convention, no config.json declares it) and left out of the "
                     "digest" for t in self.tensors if t.alias_of and t.tie_by == "convention")

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def by_name(self) -> dict[str, TensorEntry]:
        return {t.name: t for t in self.tensors}

    def to_json(self) -> str:
        doc: dict[str, object] = {
            "schema": SCHEMA, "version": self.version, "ckptport": self.tool,
            "options": dict(self.options), "digest": self.digest,
            "tensor_count": len(self.tensors), "total_bytes": self.total_bytes,
            "tensors": [_entry_json(t) for t in self.tensors]}
        if self.quantization:
            doc["quantization"] = dict(self.quantization)
        if self.made_with:
            doc["made_with"] = dict(self.made_with)
        return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def _entry_json(entry: TensorEntry) -> dict[str, object]:
    made = {**asdict(entry), "shape": list(entry.shape), "tied": list(entry.tied)}
    for name in ("alias_of", "tie_by"):  # only on tied names: untied entries read as before
        if made[name] is None:
            del made[name]
    return made


def weights_digest(entries: Iterable[TensorEntry], version: int = VERSION) -> str:
    """The sha256 of the sorted lines: of the names standing for their tensors (version
    2), or of every name (version 1)."""
    lines = sorted(entry.line() for entry in entries if version < 2 or entry.alias_of is None)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
