"""Where folder mode's outputs go, and how a later run knows which are done (the journal).

Three kinds of DST_DIR, one interface (``Outputs``), so the planning and the
workers (``folder``) never ask which:

- **a local folder**: each output is a file; each part's journal is one file
  (``.ckptport-journal/*.jsonl``, one JSON line per output, fsynced), and an
  output counts as still as written while its size and mtime are those
  recorded;
- **a bucket folder** (``s3://BUCKET/PREFIX/``): each output is uploaded and
  verified as ``normalize_file`` does for a URL; the journal is one small
  object per output under ``PREFIX/.ckptport-journal/PART/`` (S3 objects
  cannot be appended to), and an output counts as still as written while its
  size and ETag are those recorded;
- **a hub repository** (``hf://ORG/REPO[@BRANCH][/PATH]``): each output is
  written, verified and uploaded (LFS) by its worker, and its commit deferred
  (``remote.commit.DEFERRED``); once every file is done, one commit (or pull
  request) adds them all, built on the branch's commit when the run started,
  then every file is read back at it. One failed file and nothing is
  committed. The commit is the unit: there is no journal (a run that failed
  committed nothing; run it again), and no ``--part`` (N commits of one
  folder would race for the branch).

Every kind holds only strings, so it travels to the worker processes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import OptionError, OutputError
from ...remote.urls import RemotePath
from ...writers.remote import OFF_THE_HUB

if TYPE_CHECKING:
    from ...remote.commit import HubStore, Uploaded
    from ...remote.upload import S3Store

__all__ = ["JOURNAL_DIR", "Entry", "Outputs", "outputs_for", "stat_files"]

JOURNAL_DIR = ".ckptport-journal"

Entry = dict[str, object]  # a journal line: JSON's scalars, by name


def stat_files(paths: tuple[Path | RemotePath, ...]) -> tuple[int, int]:
    """Total size and latest mtime of files (a folder output: the files in it; a remote
    object: its size and its pinned version's digest)."""
    size, mtime = 0, 0
    for path in paths:
        files: list[Path | RemotePath] = [path] if isinstance(path, RemotePath) or \
            path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            st = file.stat()
            size, mtime = size + st.st_size, max(mtime, st.st_mtime_ns)
    return size, mtime


def _journal_name(part: tuple[int, int] | None) -> str:
    return "all" if part is None else f"part-{part[0]}-of-{part[1]}"


def _entries(texts: list[str]) -> dict[str, Entry]:
    """Every recorded output, by its relative path; the last record wins, a line cut by a
    crash is skipped (that output is redone)."""
    entries: dict[str, Entry] = {}
    for text in texts:
        try:
            entry = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(entry, dict) and isinstance(entry.get("output"), str):
            entries[entry["output"]] = entry
    return entries


class LocalOutputs:
    """DST_DIR on this machine: outputs are files, each part's journal one file."""

    def __init__(self, dst: Path) -> None:
        self.dst = dst

    def target(self, output: str) -> str | os.PathLike[str]:
        out = self.dst / output
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def state(self, output: str) -> Entry | None:
        """What says the output is still as written (None: it is gone)."""
        out = self.dst / output
        if not out.exists():
            return None
        size, mtime = stat_files((out,))
        return {"out_size": size, "out_mtime_ns": mtime}

    def written(self, target: str | os.PathLike[str], output: str) -> Entry:
        return self.state(output) or {}

    def ready(self, part: tuple[int, int] | None) -> None:
        """Folders are made as outputs are written."""

    def journal(self) -> dict[str, Entry]:
        folder = self.dst / JOURNAL_DIR
        texts: list[str] = []
        for journal in sorted(folder.glob("*.jsonl")) if folder.is_dir() else ():
            try:
                texts += journal.read_text("utf-8", errors="replace").splitlines()
            except OSError:  # noqa: PERF203 - an unreadable journal: its outputs are redone
                continue
        return _entries(texts)

    def record(self, part: tuple[int, int] | None, entry: Entry) -> None:
        log = self.dst / JOURNAL_DIR / f"{_journal_name(part)}.jsonl"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finish(self, complete: bool, summary: str, description: str) -> tuple[str, ...]:
        """Every output is in place as it is written: nothing left to do."""
        return ()


class BucketOutputs(LocalOutputs):
    """DST_DIR in a bucket: outputs are objects, the journal an object per output (S3
    cannot append)."""

    def __init__(self, dst: RemotePath) -> None:  # noqa: D107 - the URL, not the object
        self.url = str(dst)

    def _store(self) -> S3Store:
        from ...remote import location
        from ...remote.upload import S3Store

        return S3Store(location(self.url))  # type: ignore[arg-type]

    def target(self, output: str) -> str | os.PathLike[str]:
        return self.url + output

    def state(self, output: str) -> Entry | None:
        head = self._store().head(output)
        return None if head is None else {"out_size": head[0], "out_etag": head[1]}

    def ready(self, part: tuple[int, int] | None) -> None:
        """The bucket is there and in reach, before any file is converted."""
        self._store().check_bucket()

    def journal(self) -> dict[str, Entry]:
        store = self._store()
        return _entries([store.get(name).decode("utf-8", errors="replace")
                         for name in sorted(store.below(f"{JOURNAL_DIR}/"))])

    def record(self, part: tuple[int, int] | None, entry: Entry) -> None:
        name = hashlib.sha256(str(entry["output"]).encode()).hexdigest()[:32]
        self._store().put(f"{JOURNAL_DIR}/{_journal_name(part)}/{name}.json",
                          json.dumps(entry, sort_keys=True).encode())


class HubOutputs(LocalOutputs):
    """DST_DIR in a hub repository: every output uploaded by its worker, then one commit."""

    def __init__(self, dst: RemotePath, create_pr: bool) -> None:  # noqa: D107
        self.url, self.create_pr = str(dst).rstrip("/"), create_pr
        self.uploaded: list[Uploaded] = []  # in this process: what the workers uploaded
        self.store: HubStore | None = None  # in this process: the branch's commit, pinned

    def __getstate__(self) -> dict[str, object]:
        return {"url": self.url, "create_pr": self.create_pr, "uploaded": [], "store": None}

    def target(self, output: str) -> str | os.PathLike[str]:
        from ...remote import location
        from ...remote.commit import DEFERRED

        where = location(f"{self.url}/{output}")
        assert isinstance(where, RemotePath)
        where.pins[DEFERRED] = []  # normalize_file uploads; the commit is made here
        return where

    def state(self, output: str) -> Entry | None:
        return None  # no journal: each run is one commit (or none)

    def written(self, target: str | os.PathLike[str], output: str) -> Entry:
        from ...remote.commit import DEFERRED

        assert isinstance(target, RemotePath)
        uploaded: list[Uploaded] = target.pins[DEFERRED]
        return {"out_size": sum(u.size for u in uploaded), "uploaded": uploaded}

    def ready(self, part: tuple[int, int] | None) -> None:
        """The repository and branch are there and writable; their commit is pinned."""
        from ...remote import location
        from ...remote.commit import HubStore

        where = location(self.url)
        assert isinstance(where, RemotePath)
        if part is not None:
            raise OptionError(f"--part {part[0]}/{part[1]}: a hub repository DST is one "
                              "commit of the whole folder; split it into folders instead")
        self.store = HubStore(where, True, self.create_pr)
        self.store.check_bucket()

    def journal(self) -> dict[str, Entry]:
        return {}

    def record(self, part: tuple[int, int] | None, entry: Entry) -> None:
        uploaded = entry.pop("uploaded")
        assert isinstance(uploaded, list)
        self.uploaded += uploaded

    def finish(self, complete: bool, summary: str, description: str) -> tuple[str, ...]:
        """One commit (or pull request) with every output, read back at it; none at all
        unless every file was converted."""
        if not complete or not self.uploaded or self.store is None:
            return ()
        self.store.commit(self.uploaded, [], True, summary, description)
        return tuple(f"{what}: {url}" for what, url in (
            ("commit", self.store.commit_url), ("pull request", self.store.pr_url)) if url)


Outputs = LocalOutputs | BucketOutputs | HubOutputs


def outputs_for(dst: Path | RemotePath, create_pr: bool = False) -> Outputs:
    """Where folder mode writes; ``create_pr`` is the hub's, refused for any other DST."""
    if create_pr and (isinstance(dst, Path) or dst.url.scheme != "hf"):
        raise OutputError(OFF_THE_HUB, str(dst))
    if isinstance(dst, Path):
        return LocalOutputs(dst)
    if dst.url.scheme == "hf":
        return HubOutputs(dst, create_pr)
    return BucketOutputs(dst)
