"""The canonical tie form: which name stands for a tensor known under several names.

A model that ties its output embedding to its input embedding holds one
tensor under two names. Containers disagree on how to keep it: a ``.pth``
stores it once under both names (one storage), ckptport's safetensors and
shard sets store it once and record the other names as aliases, the hub's
``save_pretrained`` leaves the tied name out (models re-tie it on load), and
a tool that clones before saving stores it twice. For the weights digest to
be the same in all of these, a tie is one line of the digest, under one name:

- the names **standing for** a tie are its names the hub keeps: names of a
  tied output (a path with an ``lm_head`` or ``embed_out`` module, BERT's
  ``cls.predictions.decoder``) never stand while another name is there,
  encoder/decoder ``embed_tokens`` (T5, BART, OPT) stand only over outputs;
  the other names of the tie are its **aliases**, left out of the digest
  (``alias_of`` names the first standing name in sorted order). Two ordinary
  names of one tensor both stand, as the same weights stored apart do;
- a tie is **known** by storage (one tensor under several names in the file, or
  ckptport's own alias record), or — for a copy stored apart — from the model
  folder's ``config.json`` ``tie_word_embeddings``, or, where nothing declares
  it, by the hub's convention: an output embedding (2-D, not empty) whose dtype,
  shape and content are those of a name that stands before it. The last is a
  guess, and is marked so (``tie_by: "convention"``) for the reports to say.

An omitted name needs no knowing: the name that stands is the one the hub keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from .digest import TensorEntry, TieBy

__all__ = ["stands_for", "canonical_ties", "declared_ties"]

_OUTPUTS = (("lm_head",), ("embed_out",), ("cls", "predictions", "decoder"))
_SIDE_INPUTS = (("encoder", "embed_tokens"), ("decoder", "embed_tokens"))
_MAX_CONFIG_BYTES = 1 << 20  # a model config, not a checkpoint


def _contains(parts: Sequence[str], run: Sequence[str]) -> bool:
    return any(tuple(parts[i:i + len(run)]) == tuple(run) for i in range(len(parts)))


def _rank(name: str) -> int:
    """0 for a name that may stand for a tie, 1 for a side input, 2 for a tied output."""
    parts = name.split(".")
    if any(_contains(parts, run) for run in _OUTPUTS):
        return 2
    return 1 if any(_contains(parts, run) for run in _SIDE_INPUTS) else 0


def stands_for(names: Iterable[str]) -> str:
    """The name that stands for a tie in the digest: the one the hub keeps."""
    return min(names, key=lambda name: (_rank(name), name))


def canonical_ties(entries: list[TensorEntry], declared: bool | None) -> list[TensorEntry]:
    """Entries with each tie's outputs marked as aliases of the name that stands for it.

    ``entries`` carry their storage ties in ``tied`` (and ``tie_by="storage"``). In a
    tie, the names of the lowest rank stand (a line each: a tie of two ordinary names is
    two lines, as the same weights stored apart are); the others are aliases. A stored
    copy of an embedding joins the tie it copies per ``declared``, the model's
    ``tie_word_embeddings``: ``False`` folds nothing (equal content is what the model
    asked for), ``True`` folds as declared, ``None`` by the hub's convention (a guess).
    """
    head: dict[str, str] = {}
    for entry in entries:
        if entry.tied:
            names = (entry.name, *entry.tied)
            low = min(_rank(name) for name in names)
            if _rank(entry.name) > low:
                head[entry.name] = stands_for(names)
    copies: dict[str, str] = {}
    if declared is not False:
        standing = {(e.dtype, e.shape, e.sha256): e for e in sorted(
            (e for e in entries if e.name not in head and len(e.shape) == 2 and e.nbytes),
            key=lambda e: (_rank(e.name), e.name), reverse=True)}  # the lowest rank wins
        for entry in entries:
            copied = standing.get((entry.dtype, entry.shape, entry.sha256))
            if not entry.tied and copied is not None and _rank(copied.name) < _rank(entry.name):
                head[entry.name] = copies[entry.name] = copied.name
    tied_to = {e.name: e.tied for e in entries}
    joined: dict[str, set[str]] = {}  # a copy's tie: the names of the tensor it copies
    for name, rep in copies.items():
        joined.setdefault(rep, {rep, *tied_to[rep]}).add(name)
    by: TieBy = "config" if declared else "convention"
    made = []
    for entry in entries:
        group = next((g for g in joined.values() if entry.name in g), None)
        tied = tuple(sorted(group - {entry.name})) if group else entry.tied
        made.append(replace(entry, tied=tied, alias_of=head.get(entry.name),
                            tie_by=entry.tie_by or (by if group else None)))
    return made


def declared_ties(path: object) -> bool | None:
    """The ``tie_word_embeddings`` of the local model folder ``path`` is or is in (its
    ``config.json``); ``None`` where none says (a remote source's config is not fetched:
    its stored copies are judged by the convention, and said so)."""
    if not isinstance(path, Path):
        return None
    try:
        config = (path if path.is_dir() else path.parent) / "config.json"
        if not config.is_file() or config.stat().st_size > _MAX_CONFIG_BYTES:
            return None
        doc = json.loads(config.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None  # a config we cannot read declares nothing: the convention decides
    value = doc.get("tie_word_embeddings") if isinstance(doc, dict) else None
    return value if isinstance(value, bool) else None
