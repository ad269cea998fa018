"""What folder mode will do: the checkpoints of SRC_DIR, the name each gets under DST_DIR,
this part's share of them, and the outcomes decided before any conversion (two sources of one
output name, training state without weights). ``folder`` carries the plan out.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...analysis.manifests import options_of
from ...errors import InputError, OptionError, OutputError
from ...readers.discover import Found, Where, discover, folder_of, inside
from ...remote.urls import RemotePath, is_remote
from ...rules import NormalizeOptions
from ...tree import TextEnum
from ...writers.formats import FORMATS, Kind, OutputFormat, by_extension, refuse_untaken
from ...writers.plan import file_extension

__all__ = ["FolderOptions", "Status", "FileOutcome", "Task", "plan_folder", "in_part",
           "relative", "location_of"]


@dataclass(frozen=True)
class FolderOptions:
    options: NormalizeOptions = field(default_factory=NormalizeOptions)
    to: str = "pth"
    anchor: str = "cpu"
    overwrite: bool = False  # redo every file, whatever the journal says
    verify: bool = True
    jobs: int | None = None
    part: tuple[int, int] | None = None  # (I, N), 1 <= I <= N
    dry_run: bool = False
    max_expansion: float | None = None  # readers.budget's ratio
    metadata: str = "keep"  # a safetensors source's own metadata: keep or drop
    create_pr: bool = False  # a hub DST_DIR: one pull request instead of one commit

    def key(self) -> str:
        """What decides an output's bytes: a journal entry counts only under the same key."""
        return json.dumps({"options": options_of(self.options), "to": self.to,
                           "anchor": self.anchor,
                           **({"metadata": self.metadata} if self.metadata != "keep" else {})},
                          sort_keys=True)


class Status(TextEnum):
    """What became of one checkpoint of the folder."""

    CONVERTED = "converted"
    SKIPPED = "skipped"  # done before, from the same bytes and options
    UNWEIGHTED = "no weights"  # training state (optimizer, RNG): not converted (--select all)
    FAILED = "failed"
    PLANNED = "planned"  # a dry run


@dataclass(frozen=True)
class FileOutcome:
    source: str  # relative to SRC_DIR
    output: str  # relative to DST_DIR
    status: Status
    reason: str = ""
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Task:
    found: Found
    source: str
    output: str
    size: int


def in_part(relative: str, part: tuple[int, int] | None) -> bool:
    """Whether ``relative`` falls in part I of N: the same answer on every machine."""
    if part is None:
        return True
    index, count = part
    digest = int.from_bytes(hashlib.sha256(relative.encode()).digest()[:8], "big")
    return digest % count == index - 1


_OTHER_EXTENSIONS = (".tar", ".pkl", ".pickle")  # what checkpoints are also named, not written


def relative(path: Where, root: Where) -> str:
    """``path``'s name below the folder ``root`` (``/``-separated, as on every machine)."""
    if isinstance(path, Path) and isinstance(root, Path):
        return path.relative_to(root).as_posix()
    assert isinstance(path, RemotePath) and isinstance(root, RemotePath)
    return path.url.key[len(folder_of(root).url.key):].rstrip("/")


def _output_name(found: Found, src: Where, fmt: OutputFormat) -> str:
    """``a/b/model.pth.tar`` -> ``a/b/model.pth``; a shard set or DCP folder -> its folder."""
    relative_path = relative(found.path, src)
    if relative_path.endswith(".index.json"):  # the set's weights name, in its folder
        relative_path = relative_path.removesuffix(".index.json")
    name = relative_path.rsplit("/", 1)[-1]
    known = by_extension(name)
    other = next((ext for ext in _OTHER_EXTENSIONS if name.lower().endswith(ext)), "")
    extension = known[0] if known else other
    if extension and len(name) > len(extension):
        relative_path = relative_path[:-len(extension)]
    return relative_path + (fmt.extension if fmt.kind is Kind.FILE else "")


def location_of(given: str | os.PathLike[str], dst: bool) -> Where:
    """SRC_DIR or DST_DIR: a local folder, a bucket folder (``s3://BUCKET/PREFIX/``, a URL
    ending in ``/``) or a hub repository (or a folder of one)."""
    if not is_remote(os.fspath(given)):
        return Path(given)
    from ...remote import location

    url = location(given)
    assert isinstance(url, RemotePath)
    if url.url.scheme == "hf" or url.url.scheme == "s3" and \
            (not url.url.key or url.url.key.endswith("/")):
        return url
    if dst:
        raise OutputError("folder mode writes to a local folder, s3://BUCKET/PREFIX/ (a URL "
                          "ending in '/') or hf://ORG/REPO[@BRANCH][/PATH]", url)
    raise InputError("folder mode reads a local folder, s3://BUCKET/PREFIX/ (a URL ending "
                     "in '/') or hf://ORG/REPO[@REVISION]", url)


def _overlap(src: Where, dst: Where) -> bool:
    """Whether the two folders lie inside one another (the outputs would be found as
    sources next time, or overwrite them)."""
    if isinstance(src, Path) and isinstance(dst, Path):
        return inside(dst, src) or inside(src, dst)
    if isinstance(src, RemotePath) and isinstance(dst, RemotePath):
        a, b = folder_of(src).url, folder_of(dst).url
        return (a.scheme, a.host, a.repo_type) == (b.scheme, b.host, b.repo_type) and \
            (a.key.startswith(b.key) or b.key.startswith(a.key))
    return False


_UNWEIGHTED = ("training state (optimizer, scheduler or RNG state), no model weights: not "
               "converted; --select all converts it")


def plan_folder(src: Where, dst: Where, settings: FolderOptions
                ) -> tuple[list[Task], list[FileOutcome], list[tuple[str, str]]]:
    """The files of this part to convert, the outcomes the plan decides (collisions, as
    failures; training state, as not converted), and non-checkpoints."""
    fmt = FORMATS.get(settings.to)
    if fmt is None:
        raise OutputError(f"unknown output format {settings.to!r} (known: "
                          f"{', '.join(FORMATS)})", dst)
    refuse_untaken(fmt, anchor=settings.anchor, metadata=settings.metadata)
    if isinstance(src, Path) and not src.is_dir():
        raise InputError("is not a folder", src)
    if _overlap(src, dst):
        raise OutputError(f"and {src} lie inside one another; write the outputs elsewhere", dst)
    try:
        found = discover(src)
    except OSError as exc:
        raise InputError(f"cannot search the folder: {exc.strerror or exc}", src) from None
    if not found.checkpoints:
        raise InputError("is a directory with no checkpoint in it (no checkpoint file, shard "
                         "set, DCP or Hugging Face folder below it)", src)
    if isinstance(dst, Path) and file_extension(dst):
        raise OptionError(f"is a folder of checkpoints, which folder mode writes to a folder, "
                          f"but DST {dst} names a file; name a folder", src)
    tasks: list[Task] = []
    decided: list[FileOutcome] = []
    taken: dict[str, str] = {}
    for item in found.checkpoints:
        source = relative(item.path, src)
        if not in_part(source, settings.part):
            continue
        output = _output_name(item, src, fmt)
        if output in taken:
            decided.append(FileOutcome(source, output, Status.FAILED,
                                      f"its output {output} is also {taken[output]}'s; rename "
                                      "one of them"))
            continue
        taken[output] = source
        size = sum(p.stat().st_size for p in item.files if p.is_file())
        if not item.weights and settings.options.select != "all":
            decided.append(FileOutcome(source, output, Status.UNWEIGHTED, _UNWEIGHTED, size))
            continue
        tasks.append(Task(item, source, output, size))
    others = [(relative(p, src), why) for p, why in found.others
              if in_part(relative(p, src), settings.part)]
    return tasks, decided, others
