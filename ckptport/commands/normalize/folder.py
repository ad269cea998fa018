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
- **Remote folders**: SRC_DIR may be a bucket folder (``s3://BUCKET/PREFIX/``)
  or a hub repository (``hf://ORG/REPO[@REVISION]``), walked from its listing
  (``readers.discover``) with every object's version pinned when it is first
  opened: a file that changes after that is refused by name (the others go
  on), never converted from two versions. DST_DIR may be a bucket folder or a
  hub repository too (``outputs``: the journal in the bucket; one commit into
  the hub).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ...errors import EXIT_FINDINGS, EXIT_OK, CkptportError
from ...parallel import workers
from ...progress import Progress, no_progress
from ...readers.discover import Where
from ...remote.urls import RemotePath
from ...sources import sha256_files
from .outputs import JOURNAL_DIR, Entry, HubOutputs, Outputs, outputs_for, stat_files
from .plan import FileOutcome, FolderOptions, Status, Task, location_of, plan_folder

if TYPE_CHECKING:
    from concurrent.futures import Future

# the plan's names handed on: a caller of folder mode imports them from here
__all__ = ["FolderOptions", "FileOutcome", "FolderReport", "normalize_folder", "JOURNAL_DIR"]


@dataclass(frozen=True)
class FolderReport:
    src: Where
    dst: Where
    files: tuple[FileOutcome, ...]
    not_checkpoints: tuple[tuple[str, str], ...]  # files no loader opens, with the reason
    seconds: float
    part: tuple[int, int] | None = None
    notes: tuple[str, ...] = ()  # a hub DST_DIR: the commit or pull request made
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


def _done_before(task: Task, outputs: Outputs, entry: Entry | None, key: str) -> bool:
    if entry is None or entry.get("options") != key or entry.get("source") != task.source:
        return False
    state = outputs.state(task.output)
    if state is None or any(entry.get(k) != v for k, v in state.items()):
        return False
    if list(stat_files(task.found.files)) == [entry.get("size"), entry.get("mtime_ns")]:
        return True  # the same size and mtime (a remote object: the same version)
    local = tuple(p for p in task.found.files if isinstance(p, Path))
    if len(local) < len(task.found.files):
        return False  # another version of a remote object: hashing it would fetch it whole
    return sha256_files(local) == entry.get("sha256")  # touched, same bytes


# -- the work -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Done:
    """What a worker hands back: the file's outcome and, if converted, its journal entry."""

    outcome: FileOutcome
    entry: Entry | None = None


def _convert(task: Task, outputs: Outputs, settings: FolderOptions) -> _Done:
    """One file, in a worker process: the outcome and the journal entry (if converted)."""
    from .file import normalize_file

    start = time.monotonic()
    before = stat_files(task.found.files)
    path = task.found.path
    try:
        out = outputs.target(task.output)
        # a remote file read afresh (its own spool), at the version the walk pinned
        report = normalize_file(path.reopened() if isinstance(path, RemotePath) else path,
                                out, settings.options, to=settings.to,
                                anchor=settings.anchor, overwrite=True, verify=settings.verify,
                                jobs=1, hash_source=True, config_beside=True,
                                metadata=settings.metadata, max_expansion=settings.max_expansion,
                                create_pr=settings.create_pr)
    except CkptportError as exc:
        reason = " ".join(exc.message.split())
    except OSError as exc:
        reason = f"cannot write: {exc.strerror or exc}"
    except Exception as exc:  # a bug: reported for this file; the others go on
        reason = f"internal error: {type(exc).__name__}: {exc}"
    else:
        state = outputs.written(out, task.output)
        entry: Entry = {"source": task.source, "output": task.output,
                        "options": settings.key(), "sha256": report.source_sha256,
                        "size": before[0], "mtime_ns": before[1], **state}
        size = state.get("out_size", 0)
        return _Done(FileOutcome(task.source, task.output, Status.CONVERTED, "", task.size,
                                 size if isinstance(size, int) else 0,
                                 time.monotonic() - start), entry)
    return _Done(FileOutcome(task.source, task.output, Status.FAILED, reason, task.size))


def _stop(signum: int, frame: FrameType | None) -> None:
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
    src_dir, dst_dir = location_of(src, dst=False), location_of(dst, dst=True)
    start = time.monotonic()
    tasks, outcomes, others = plan_folder(src_dir, dst_dir, settings)
    outputs = outputs_for(dst_dir, settings.create_pr)
    if settings.dry_run:
        outcomes += [FileOutcome(t.source, t.output, Status.PLANNED, "", t.size) for t in tasks]
        return _report(src_dir, dst_dir, outcomes, others, start, settings)
    outputs.ready(settings.part)
    todo, skipped = _not_done_before(tasks, outputs, settings)
    outcomes += skipped
    outcomes += _convert_all(todo, outputs, settings, progress)
    outcomes, notes = _finish(outcomes, outputs, src_dir, settings)
    return _report(src_dir, dst_dir, outcomes, others, start, settings, notes)


def _not_done_before(tasks: list[Task], outputs: Outputs, settings: FolderOptions
                     ) -> tuple[list[Task], list[FileOutcome]]:
    """The tasks to run, and those the journal says are done (``overwrite``: none)."""
    journal = {} if settings.overwrite else outputs.journal()
    key = settings.key()
    todo, skipped = [], []
    for task in tasks:
        if _done_before(task, outputs, journal.get(task.output), key):
            skipped.append(FileOutcome(task.source, task.output, Status.SKIPPED,
                                       "converted before from the same bytes and options",
                                       task.size))
        else:
            todo.append(task)
    return todo, skipped


def _convert_all(todo: list[Task], outputs: Outputs, settings: FolderOptions,
                 progress: Progress) -> list[FileOutcome]:
    """Every task's outcome, each converted file journalled as it finishes; Ctrl-C says
    what was kept."""
    outcomes: list[FileOutcome] = []
    files_bar = progress("files", len(todo))
    bytes_bar = progress("bytes", sum(t.size for t in todo))
    try:
        for done in _run(todo, outputs, settings):
            outcomes.append(done.outcome)
            if done.entry is not None:
                outputs.record(settings.part, done.entry)
            files_bar(1)
            bytes_bar(done.outcome.bytes_in)
    except KeyboardInterrupt:
        finished = sum(1 for o in outcomes if o.status is Status.CONVERTED)
        kept = "nothing was committed" if isinstance(outputs, HubOutputs) \
            else f"{finished} files converted and kept (journalled)"
        raise KeyboardInterrupt(f"interrupted; {kept}; nothing else was written; run again "
                                "to resume") from None
    return outcomes


def _finish(outcomes: list[FileOutcome], outputs: Outputs, src: Where,
            settings: FolderOptions) -> tuple[list[FileOutcome], tuple[str, ...]]:
    """The outputs finished (a hub DST_DIR: its one commit, made only if no file failed)
    and the outcomes as they stand then, with the notes the finish made."""
    failed = any(o.status is Status.FAILED for o in outcomes)
    notes = outputs.finish(not failed, f"Convert the checkpoints of {src} with ckptport",
                           _description(outcomes, settings))
    if failed and isinstance(outputs, HubOutputs):  # the one commit was not made
        outcomes = [o if o.status is not Status.CONVERTED else replace(
            o, status=Status.FAILED, reason="converted and uploaded, not committed: another "
            "file failed, and one commit holds them all; nothing was committed")
            for o in outcomes]
    return outcomes, notes


def _description(outcomes: list[FileOutcome], settings: FolderOptions) -> str:
    """A hub commit's words for a folder: each file from its source, and how."""
    from ..._version import __version__

    lines = [f"- {o.source} -> {o.output}" for o in sorted(outcomes, key=lambda o: o.source)
             if o.status is Status.CONVERTED]
    return "\n".join([*lines, f"Options: {settings.key()}",
                      f"Written and verified bit for bit by ckptport {__version__}."])


def _run(todo: list[Task], dst: Outputs, settings: FolderOptions) -> Iterator[_Done]:
    """Outcomes as they finish; biggest files first, so a big one does not end alone."""
    order = sorted(todo, key=lambda t: -t.size)
    count = min(workers(settings.jobs), len(order))
    if count <= 1:
        for task in order:
            yield _convert(task, dst, settings)
        return
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait  # not at start-up

    with ProcessPoolExecutor(max_workers=count, initializer=_quiet_worker) as pool:
        pending: set[Future[_Done]] = set()
        queue = iter(order)
        try:
            for task in queue:  # keep every worker busy, no more queued than that
                pending.add(pool.submit(_convert, task, dst, settings))
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


def _report(src: Where, dst: Where, outcomes: list[FileOutcome],
            others: list[tuple[str, str]], start: float,
            settings: FolderOptions, notes: tuple[str, ...] = ()) -> FolderReport:
    return FolderReport(src, dst, tuple(sorted(outcomes, key=lambda o: o.source)),
                        tuple(others), time.monotonic() - start, settings.part, notes)
