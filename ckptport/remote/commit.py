"""``hf://`` destinations: every output file in one commit (or pull request), made only once
every file is uploaded, then read back at that commit.

The hub has no staging area, but it has the next best thing: LFS objects
are uploaded before the commit that names them (huggingface_hub's
``preupload_lfs_files``; the LFS batch API's ``verify`` step has the hub
check each object's sha256 and size), and are not part of the repository
until a commit names them. So each file (one shard at a time, written and
verified locally first) is uploaded as soon as it is verified and its local
copy deleted; when all are uploaded, one ``create_commit`` adds them all
(and deletes a replaced set's stale shards), with ``parent_commit`` set to
the branch's commit when the command started, so a branch that moved is a
refusal, not a merge. Nothing is committed before that step, and nothing at
all when a file fails. After the commit, every file is read back from the
hub at the new commit and its sha256 compared with the local bytes'; the
hub cannot undo a commit, so a read-back that differs is an error naming
the commit (with ``--create-pr`` it is an unmerged pull request).

Why a local spool of one shard: an LFS upload names its object by sha256,
so a file's bytes are hashed before they are sent (huggingface_hub uploads
by Xet when ``hf_xet`` is installed, else by LFS; ``HF_HUB_DISABLE_XET=1``
forces LFS).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CkptportError, OutputError, VerificationError
from .urls import RemotePath, RemoteURL

if TYPE_CHECKING:
    from huggingface_hub import CommitOperationAdd

    from .upload import LateBytes

__all__ = ["HubStore", "Uploaded", "INLINE", "DEFERRED"]

INLINE = 10 << 20  # files at most this large go in the commit itself (the hub's own limit)
# in a destination's pins, a list: its files are uploaded and collected there, and the one
# commit of them all is made by whoever set it (folder mode, once every file is done)
DEFERRED = "hub commit deferred"


@dataclass(frozen=True)
class Uploaded:
    name: str
    operation: CommitOperationAdd  # uploaded (LFS) or inline, for the commit that names it
    sha256: str
    size: int


_bars_lock = threading.Lock()
_bars_held = [0, False]  # calls under way (a folder's jobs run in threads), bars shown before


@contextlib.contextmanager
def _no_bars(hub: Any) -> Iterator[None]:  # Any: the huggingface_hub module (hub._hub)
    """huggingface_hub's own progress bars (hf_xet's upload and hashing reports among them)
    off while it works for ckptport: stderr carries ckptport's progress and its one line.
    Turned off by the first call under way, back on (if they were on) after the last."""
    utils = hub.utils
    with _bars_lock:
        if _bars_held[0] == 0:
            _bars_held[1] = not utils.are_progress_bars_disabled()
            with warnings.catch_warnings():  # HF_HUB_DISABLE_PROGRESS_BARS=0 keeps them
                warnings.simplefilter("ignore")
                utils.disable_progress_bars()
        _bars_held[0] += 1
    try:
        yield
    finally:
        with _bars_lock:
            _bars_held[0] -= 1
            if _bars_held[0] == 0 and _bars_held[1]:
                utils.enable_progress_bars()


class HubStore:
    """An ``hf://ORG/REPO[@BRANCH][/PATH]`` destination being written."""

    def __init__(self, path: RemotePath, folder: bool, create_pr: bool = False) -> None:
        from .hub import _endpoint, _hub

        self.path, self.url = path, path.url
        self.hub = _hub()
        self.api = self.hub.HfApi(endpoint=_endpoint(), token=self.hub.get_token() or False)
        self.repo, self.revision = self.url.host, self.url.revision or "main"
        key = self.url.key
        self.folder = (key.rstrip("/") + "/" if key else "") if folder else \
            (key.rsplit("/", 1)[0] + "/" if "/" in key else "")
        self.create_pr = create_pr
        self.parent: str | None = None
        self.files: tuple[str, ...] = ()
        self.commit_url: str | None = None
        self.pr_url: str | None = None

    def _refusal(self, exc: Exception) -> OutputError:
        name = type(exc).__name__
        status = getattr(getattr(exc, "response", None), "status_code", None)
        first = (str(exc).strip().splitlines() or [name])[0]
        if name == "RepositoryNotFoundError" or status == 404 and "Repo" in first:
            return OutputError(f"no such repository {self.repo!r} (or the token cannot see it: "
                               "set HF_TOKEN)", self.path)
        if name == "RevisionNotFoundError":
            return OutputError(f"no such branch {self.revision!r}", self.path)
        if status in (401, 403):
            return OutputError(f"access denied (HTTP {status}): the token needs write access "
                               "to the repository (HF_TOKEN)", self.path)
        if status == 412:
            return OutputError(f"the branch {self.revision} moved while the output was written "
                               "(a commit was made since); nothing was committed, run again",
                               self.path)
        from .urls import redact

        return OutputError(f"the hub refused: {redact(first)}", self.path)

    # Any: an HfApi method's own answer (RepoInfo, CommitInfo, None), read by the caller
    def _call(self, operation: str, **params: object) -> Any:
        try:
            with _no_bars(self.hub):
                return getattr(self.api, operation)(**params)
        except CkptportError:
            raise
        except Exception as exc:  # the library's errors, one line each
            raise self._refusal(exc) from None

    # -- what is there

    def check_bucket(self) -> None:
        """The repository and branch exist and are readable; the commit to build on."""
        info = self._call("repo_info", repo_id=self.repo, revision=self.revision,
                          repo_type=self.url.repo_type)
        self.parent = info.sha
        self.files = tuple(s.rfilename for s in (info.siblings or ()))

    def exists(self, name: str) -> bool:
        return self.folder + name in self.files

    def names(self) -> list[str]:
        """The files directly in the folder."""
        return [f[len(self.folder):] for f in self.files if f.startswith(self.folder)
                and "/" not in f[len(self.folder):]]

    # -- uploading

    def stage(self, local: Path, name: str, verify: bool = True,
              late: LateBytes | None = None) -> Uploaded:
        """Upload ``local`` (LFS, before any commit names it); small files are kept to go
        in the commit itself. An LFS upload is named by the file's sha256, so bytes still
        to be computed (``late``) are waited for and written in first."""
        if late is not None:
            value = late.value()
            with open(local, "r+b") as file:
                os.pwrite(file.fileno(), value, late.offset)
        add = self.hub.CommitOperationAdd
        size = local.stat().st_size
        operation = add(self.folder + name, local.read_bytes() if size <= INLINE else str(local))
        self._call("preupload_lfs_files", repo_id=self.repo, additions=[operation],
                   repo_type=self.url.repo_type, revision=self.revision,
                   create_pr=self.create_pr, free_memory=True)
        if operation._upload_mode != "lfs" and size > INLINE:
            raise OutputError(f"the hub would store {name} ({size} bytes) in git, not LFS; "
                              "add its extension to the repository's .gitattributes", self.path)
        return Uploaded(name, operation, operation.upload_info.sha256.hex(), size)

    def commit(self, uploaded: list[Uploaded], stale: list[str], overwrite: bool,
               message: str, description: str) -> RemotePath:
        """One commit (or pull request) with every file, then each read back at it
        (``overwrite`` was checked against the files before anything was written)."""
        deferred = self.path.pins.get(DEFERRED)
        if deferred is not None:
            deferred += uploaded
            return self.path
        delete = self.hub.CommitOperationDelete
        operations = [u.operation for u in uploaded] + \
            [delete(self.folder + name) for name in stale]
        info = self._call("create_commit", repo_id=self.repo, operations=operations,
                          commit_message=message, commit_description=description,
                          repo_type=self.url.repo_type, revision=self.revision,
                          create_pr=self.create_pr, parent_commit=self.parent)
        self.commit_url, self.pr_url = info.commit_url, info.pr_url
        for item in uploaded:
            self._read_back(item, info.oid)
        return RemotePath(RemoteURL("hf", self.repo, self.folder.rstrip("/"),
                                    repo_type=self.url.repo_type, revision=info.oid),
                          transfers=self.path.transfers)

    def _read_back(self, item: Uploaded, commit: str) -> None:
        from .objects import open_remote, opened

        where = RemotePath(RemoteURL("hf", self.repo, item.operation.path_in_repo,
                                     repo_type=self.url.repo_type, revision=commit),
                           opener=open_remote, transfers=self.path.transfers)
        digest = hashlib.sha256()
        try:
            file = opened(where)
            try:
                stream = file.stream()
                while chunk := stream.read(1 << 22):
                    digest.update(chunk)
            finally:
                file.close()
        except CkptportError as exc:
            raise VerificationError(f"reading back commit {commit}: {exc.message}",
                                    self.path) from None
        if digest.hexdigest() != item.sha256 or file.size != item.size:
            raise VerificationError(f"commit {commit} holds {item.name} with other bytes than "
                                    "were uploaded (revert that commit)", self.path)

    def discard(self) -> list[str]:
        """Nothing to remove: uploaded LFS objects no commit names are not in the repository."""
        return []

    def __enter__(self) -> HubStore:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
