"""``ckptport normalize SRC_DIR DST_DIR``: every checkpoint of a folder, in parallel, resumable.

Checkpoints are found as ``check DIR`` finds them (``discover``: files by
their bytes, shard sets, DCP and Hugging Face folders; links never followed
out of SRC_DIR) and each is written to the same relative path under
DST_DIR with the target's extension, by ``normalize_file``: every
single-file promise (verified, atomic, deterministic) holds per file.

- **Workers**: ``jobs`` processes (default: every core), one file each at a
  time; a failing file is reported with its one-line reason and the rest go
  on.
- **Resumable**: each finished file is appended to a journal in DST_DIR
  (``.ckptport-journal/*.jsonl``, one JSON line per output, fsynced): the
  source's relative path, sha256, size and mtime, the options, the output's
  size and mtime. A later run skips a file whose journal entry matches the
  options and whose output is still as written, and whose source is
  unchanged (same size and mtime, or, when those changed, the same sha256);
  everything else is done again. ``overwrite`` ignores the journal.
- **Parts**: ``part=(I, N)`` takes the files whose relative path hashes to
  I of N (sha256, so every machine computes the same split with no
  coordination); each part keeps its own journal file.
- **Interrupted** (Ctrl-C, SIGTERM): files in progress leave nothing
  behind, finished ones stay and are journalled; run again to resume.
- **A bucket DST_DIR** (``s3://BUCKET/PREFIX/``): each output is uploaded and
  verified as ``normalize_file`` does for a URL; the journal is one small
  object per output under ``PREFIX/.ckptport-journal/PART/`` (S3 objects
  cannot be appended to), and an output counts as still as written while
  its size and ETag are those recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...analysis.manifests import options_of
from ...errors import (
    EXIT_FINDINGS,
    EXIT_OK,
    CkptportError,
    InputError,
    OptionError,
    OutputError,
)
from ...parallel import workers
from ...progress import Progress, no_progress
from ...readers.discover import Found, discover, inside
from ...remote.urls import RemotePath, is_remote
from ...rules import NormalizeOptions
from ...sources import sha256_files
from ...tree import TextEnum
from ...writers.formats import FORMATS, Kind, OutputFormat, by_extension
from ...writers.plan import file_extension

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["FolderOptions", "FileOutcome", "FolderReport", "normalize_folder", "plan_folder",
           "JOURNAL_DIR", "in_part"]

JOURNAL_DIR = ".ckptport-journal"


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
class FolderReport:
    src: Path
    dst: Path | RemotePath
    files: tuple[FileOutcome, ...]
    not_checkpoints: tuple[tuple[str, str], ...]  # files no loader opens, with the reason
    seconds: float
    part: tuple[int, int] | None = None
    counts: dict[str, int] = field(init=False)
    exit_code: int = field(init=False)

    def __post_init__(self) -> None:
        counts = {status.value: 0 for status in Status}
        for outcome in self.files:
            counts[outcome.status.value] += 1
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "exit_code", EXIT_FINDINGS if counts["failed"] else EXIT_OK)

    @property
    def bytes_in(self) -> int:
        return sum(f.bytes_in for f in self.files if f.status is Status.CONVERTED)

    @property
    def bytes_out(self) -> int:
        return sum(f.bytes_out for f in self.files if f.status is Status.CONVERTED)


@dataclass(frozen=True)
class _Task:
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


def _output_name(found: Found, src: Path, fmt: OutputFormat) -> str:
    """``a/b/model.pth.tar`` -> ``a/b/model.pth``; a shard set or DCP folder -> its folder."""
    path = found.path
    if path.name.endswith(".index.json"):  # the set's weights name, in its folder
        stem = path.name.removesuffix(".index.json")
        path = path.with_name(stem)
    relative = path.relative_to(src).as_posix()
    name = relative.rsplit("/", 1)[-1]
    known = by_extension(name)
    other = next((ext for ext in _OTHER_EXTENSIONS if name.lower().endswith(ext)), "")
    extension = known[0] if known else other
    if extension and len(name) > len(extension):
        relative = relative[:-len(extension)]
    return relative + (fmt.extension if fmt.kind is Kind.FILE else "")


def _folder(dst: str | os.PathLike[str]) -> Path | RemotePath:
    """DST_DIR: a local folder, or an ``s3://BUCKET/PREFIX/`` URL (the outputs are uploaded)."""
    if not is_remote(os.fspath(dst)):
        return Path(dst)
    from ...remote import location

    url = location(dst)
    if not isinstance(url, RemotePath) or url.url.scheme != "s3" or \
            not url.url.key.endswith("/") and url.url.key:
        raise OutputError("folder mode writes to a local folder or s3://BUCKET/PREFIX/ (a "
                          "URL ending in '/')", url)
    return url


_UNWEIGHTED = ("training state (optimizer, scheduler or RNG state), no model weights: not "
               "converted; --select all converts it")


def plan_folder(src: Path, dst: Path | RemotePath, settings: FolderOptions
                ) -> tuple[list[_Task], list[FileOutcome], list[tuple[str, str]]]:
    """The files of this part to convert, the outcomes the plan decides (collisions, as
    failures; training state, as not converted), and non-checkpoints."""
    fmt = FORMATS.get(settings.to)
    if fmt is None:
        raise OutputError(f"unknown output format {settings.to!r} (known: "
                          f"{', '.join(FORMATS)})", dst)
    if not src.is_dir():
        raise InputError("is not a folder", src)
    if isinstance(dst, Path) and (inside(dst, src) or inside(src, dst)):
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
    tasks: list[_Task] = []
    decided: list[FileOutcome] = []
    taken: dict[str, str] = {}
    for item in found.checkpoints:
        source = item.path.relative_to(src).as_posix()
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
        tasks.append(_Task(item, source, output, size))
    others = [(p.relative_to(src).as_posix(), why) for p, why in found.others
              if in_part(p.relative_to(src).as_posix(), settings.part)]
    return tasks, decided, others


# -- the journal ----------------------------------------------------------------------


def _journal_path(dst: Path, part: tuple[int, int] | None) -> Path:
    name = "all.jsonl" if part is None else f"part-{part[0]}-of-{part[1]}.jsonl"
    return dst / JOURNAL_DIR / name


def _read_journals(dst: Path) -> dict[str, dict[str, Any]]:
    """Every recorded output, by its relative path; the last record wins."""
    entries: dict[str, dict[str, Any]] = {}
    folder = dst / JOURNAL_DIR
    if not folder.is_dir():
        return entries
    for journal in sorted(folder.glob("*.jsonl")):
        try:
            lines = journal.read_text("utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a line cut by a crash: that output is redone
            if isinstance(entry, dict) and isinstance(entry.get("output"), str):
                entries[entry["output"]] = entry
    return entries


class _LocalOutputs:
    """DST_DIR on this machine: outputs are files, each part's journal one file."""

    def __init__(self, dst: Path) -> None:
        self.dst = dst

    def target(self, output: str) -> Path:
        out = self.dst / output
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def state(self, output: str) -> dict[str, Any] | None:
        """What says the output is still as written (None: it is gone)."""
        out = self.dst / output
        if not out.exists():
            return None
        size, mtime = _stat((out,))
        return {"out_size": size, "out_mtime_ns": mtime}

    def ready(self) -> None:
        """Folders are made as outputs are written."""

    def journal(self) -> dict[str, dict[str, Any]]:
        return _read_journals(self.dst)

    def record(self, part: tuple[int, int] | None, entry: dict[str, Any]) -> None:
        _append(_journal_path(self.dst, part), entry)


class _BucketOutputs:
    """DST_DIR in a bucket: outputs are objects, the journal an object per output (S3
    cannot append). Holds only the URL, so it travels to worker processes."""

    def __init__(self, dst: RemotePath) -> None:
        self.url = str(dst)

    def _store(self) -> Any:
        from ...remote import location
        from ...remote.upload import S3Store

        return S3Store(location(self.url))  # type: ignore[arg-type]

    def target(self, output: str) -> str:
        return self.url + output

    def state(self, output: str) -> dict[str, Any] | None:
        head = self._store().head(output)
        return None if head is None else {"out_size": head[0], "out_etag": head[1]}

    def ready(self) -> None:
        """The bucket is there and in reach, before any file is converted."""
        self._store().check_bucket()

    def journal(self) -> dict[str, dict[str, Any]]:
        store = self._store()
        entries: dict[str, dict[str, Any]] = {}
        for name in sorted(store.below(f"{JOURNAL_DIR}/")):
            try:
                entry = json.loads(store.get(name))
            except (ValueError, RecursionError):
                continue
            if isinstance(entry, dict) and isinstance(entry.get("output"), str):
                entries[entry["output"]] = entry
        return entries

    def record(self, part: tuple[int, int] | None, entry: dict[str, Any]) -> None:
        folder = _journal_path(Path(), part).name.removesuffix(".jsonl")
        name = hashlib.sha256(entry["output"].encode()).hexdigest()[:32]
        self._store().put(f"{JOURNAL_DIR}/{folder}/{name}.json",
                          json.dumps(entry, sort_keys=True).encode())


_Outputs = _LocalOutputs | _BucketOutputs


def _outputs(dst: Path | RemotePath) -> _Outputs:
    return _BucketOutputs(dst) if isinstance(dst, RemotePath) else _LocalOutputs(dst)


def _stat(paths: tuple[Path, ...]) -> tuple[int, int]:
    """Total size and latest mtime of files (a folder output: the files in it)."""
    size, mtime = 0, 0
    for path in paths:
        for file in ([path] if path.is_file() else sorted(p for p in path.rglob("*")
                                                          if p.is_file())):
            st = file.stat()
            size, mtime = size + st.st_size, max(mtime, st.st_mtime_ns)
    return size, mtime


def _done_before(task: _Task, outputs: _Outputs, entry: dict[str, Any] | None,
                 key: str) -> bool:
    if entry is None or entry.get("options") != key or entry.get("source") != task.source:
        return False
    state = outputs.state(task.output)
    if state is None or any(entry.get(k) != v for k, v in state.items()):
        return False
    if list(_stat(task.found.files)) == [entry.get("size"), entry.get("mtime_ns")]:
        return True
    return sha256_files(task.found.files) == entry.get("sha256")  # touched, same bytes


# -- the work -------------------------------------------------------------------------


def _convert(task: _Task, src: Path, outputs: _Outputs, settings: FolderOptions
             ) -> dict[str, Any]:
    """One file, in a worker process: the outcome and the journal entry (if converted)."""
    from .file import normalize_file

    start = time.monotonic()
    before = _stat(task.found.files)
    try:
        out = outputs.target(task.output)
        report = normalize_file(task.found.path, out, settings.options, to=settings.to,
                                anchor=settings.anchor, overwrite=True, verify=settings.verify,
                                jobs=1, hash_source=True, metadata=settings.metadata,
                                max_expansion=settings.max_expansion)
    except CkptportError as exc:
        return {"outcome": FileOutcome(task.source, task.output, Status.FAILED,
                                       " ".join(exc.message.split()), task.size)}
    except OSError as exc:
        return {"outcome": FileOutcome(task.source, task.output, Status.FAILED,
                                       f"cannot write: {exc.strerror or exc}", task.size)}
    except Exception as exc:  # a bug: reported for this file; the others go on
        return {"outcome": FileOutcome(task.source, task.output, Status.FAILED,
                                       f"internal error: {type(exc).__name__}: {exc}",
                                       task.size)}
    state = outputs.state(task.output) or {}
    entry = {"source": task.source, "output": task.output, "options": settings.key(),
             "sha256": report.source_sha256, "size": before[0], "mtime_ns": before[1],
             **state}
    outcome = FileOutcome(task.source, task.output, Status.CONVERTED, "", task.size,
                          state.get("out_size", 0), time.monotonic() - start)
    return {"outcome": outcome, "entry": entry}


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds normalize_file: its temp files are removed


def _quiet_worker() -> None:
    """Workers leave Ctrl-C to the parent, which lets running files finish; killed, they
    remove what they were writing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop)


def normalize_folder(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                     settings: FolderOptions | None = None, *,
                     progress: Progress = no_progress) -> FolderReport:
    """Normalize every checkpoint under ``src`` into ``dst`` (folder mode).

    Args:
        src: a folder of checkpoints (``readers.discover`` finds them by their bytes).
        dst: the output folder; each checkpoint is written to its relative path there.
        settings: ``FolderOptions``: normalize options, format, workers, ``part``, ``dry_run``.
        progress: a ``Progress`` callback (files and bytes).

    Returns:
        A ``FolderReport``: every file's outcome (``Status``), its exit code (1 if any
        failed; the others are done).

    Raises:
        InputError: ``src`` is no folder of checkpoints.
        OutputError, OptionError: ``dst`` is unusable (inside ``src``, names a file).
    """
    settings = settings or FolderOptions()
    src_dir, dst_dir = Path(src), _folder(dst)
    start = time.monotonic()
    tasks, outcomes, others = plan_folder(src_dir, dst_dir, settings)
    if settings.dry_run:
        outcomes += [FileOutcome(t.source, t.output, Status.PLANNED, "", t.size) for t in tasks]
        return _report(src_dir, dst_dir, outcomes, others, start, settings)
    outputs = _outputs(dst_dir)
    outputs.ready()
    journal = {} if settings.overwrite else outputs.journal()
    key = settings.key()
    todo = []
    for task in tasks:
        if _done_before(task, outputs, journal.get(task.output), key):
            outcomes.append(FileOutcome(task.source, task.output, Status.SKIPPED,
                                        "converted before from the same bytes and options",
                                        task.size))
        else:
            todo.append(task)
    files_bar = progress("files", len(todo))
    bytes_bar = progress("bytes", sum(t.size for t in todo))
    try:
        for result in _run(todo, src_dir, outputs, settings):
            outcome = result["outcome"]
            outcomes.append(outcome)
            if "entry" in result:
                outputs.record(settings.part, result["entry"])
            files_bar(1)
            bytes_bar(outcome.bytes_in)
    except KeyboardInterrupt:
        finished = sum(1 for o in outcomes if o.status is Status.CONVERTED)
        raise KeyboardInterrupt(f"interrupted; {finished} files converted and kept "
                                "(journalled); nothing else was written; run again to "
                                "resume") from None
    return _report(src_dir, dst_dir, outcomes, others, start, settings)


def _run(todo: list[_Task], src: Path, dst: _Outputs, settings: FolderOptions
         ) -> Iterator[dict[str, Any]]:
    """Outcomes as they finish; biggest files first, so a big one does not end alone."""
    order = sorted(todo, key=lambda t: -t.size)
    count = min(workers(settings.jobs), len(order))
    if count <= 1:
        for task in order:
            yield _convert(task, src, dst, settings)
        return
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # not at start-up

    with ProcessPoolExecutor(max_workers=count, initializer=_quiet_worker) as pool:
        pending: set[Future[dict[str, Any]]] = set()
        queue = iter(order)
        try:
            for task in queue:  # keep every worker busy, no more queued than that
                pending.add(pool.submit(_convert, task, src, dst, settings))
                if len(pending) >= count:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    yield from (future.result() for future in done)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                yield from (future.result() for future in done)
        except GeneratorExit:
            raise
        except BaseException:  # Ctrl-C, SIGTERM: no new file; running ones finish, journalled
            running = {future for future in pending if not future.cancel()}
            for future in running:
                try:
                    result = future.result()
                except BaseException:  # noqa: S112 - a worker stopped mid-file: nothing kept
                    continue
                yield result
            raise


def _append(log: Path, entry: dict[str, Any]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _report(src: Path, dst: Path | RemotePath, outcomes: list[FileOutcome],
            others: list[tuple[str, str]], start: float,
            settings: FolderOptions) -> FolderReport:
    return FolderReport(src, dst, tuple(sorted(outcomes, key=lambda o: o.source)),
                        tuple(others), time.monotonic() - start, settings.part)

