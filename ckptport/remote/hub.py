"""``hf://`` sources: the revision resolved to a commit once, files read by range at it.

huggingface_hub does what it does for every client: it finds the token
(``HF_TOKEN``, ``huggingface-cli login``'s file, ``HF_TOKEN_PATH``) and
resolves the revision (``/api/{type}s/{repo}/revision/{rev}``) to a commit
sha. Files are then read by range from ``/{repo}/resolve/{sha}/{path}``
(``hf_hub_url``), so a branch that moves while a shard set is read cannot
mix two commits: every file of one command is read at the commit its
first file resolved to, and every answer must carry that commit
(``X-Repo-Commit``). The token goes to the hub's host only, never to the
CDN it redirects to. ``HF_ENDPOINT`` (read when a source is opened) points
everything at a mirror or a local server. The revision lookup is
huggingface_hub's own request: it is waited for within the request deadline
(``deadline.bounded``), its sockets bounded by ``Timeout.read``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import DeadlineError, InputError
from .deadline import bounded
from .fetching import NotFound, missing_extra
from .http import HttpObject
from .urls import RemotePath, redact

if TYPE_CHECKING:
    from huggingface_hub.hf_api import DatasetInfo, ModelInfo, SpaceInfo

__all__ = ["commit_of", "open_hub", "repo_files"]

_DEFAULT_ENDPOINT = "https://huggingface.co"


def _hub() -> Any:  # Any: the huggingface_hub module, imported when a URL is opened
    try:
        import huggingface_hub
    except ImportError:
        raise missing_extra("hf") from None
    return huggingface_hub


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", _DEFAULT_ENDPOINT).rstrip("/")


def _revision(path: RemotePath) -> ModelInfo | DatasetInfo | SpaceInfo:
    """The repository at the URL's revision (default branch if none), resolved once."""
    url = path.url
    pin = ("hf", _endpoint(), url.repo_type, url.host, url.revision)
    if pin not in path.pins:
        hub = _hub()
        api = hub.HfApi(endpoint=_endpoint(), token=hub.get_token() or False)
        transfers = path.transfers
        try:
            info = bounded(lambda: api.repo_info(url.host, revision=url.revision,
                                                 repo_type=url.repo_type,
                                                 timeout=transfers.timeout.read),
                           transfers, transfers.request_ends(), path)
        except DeadlineError:
            raise
        except Exception as exc:  # the library's errors name the cause; keep its first line
            raise _refusal(exc, path) from None
        if not isinstance(getattr(info, "sha", None), str):
            raise InputError("the hub did not resolve the revision to a commit", path)
        path.pins[pin] = info
    found: ModelInfo | DatasetInfo | SpaceInfo = path.pins[pin]
    return found


def _refusal(exc: Exception, path: RemotePath) -> InputError:
    name = type(exc).__name__
    text = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else name)
    if name in ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError"):
        return NotFound(f"{text} ({name})", path)
    if name == "GatedRepoError":
        return InputError(f"the repository is gated: accept its terms on the hub and set "
                          f"HF_TOKEN ({text})", path)
    return InputError(f"cannot resolve the revision at {_endpoint()}: {text}", path)


def commit_of(path: RemotePath) -> str:
    """The commit ``path``'s revision resolved to (what a read of it reads)."""
    return str(_revision(path).sha)


def repo_files(path: RemotePath) -> tuple[str, ...]:
    """The files of the repository at the pinned commit (from the revision's answer)."""
    return tuple(s.rfilename for s in (_revision(path).siblings or ()))


def open_hub(path: RemotePath) -> HttpObject:
    url = path.url
    commit = commit_of(path)
    hub = _hub()
    token = hub.get_token()
    target = hub.hf_hub_url(url.host, url.key, repo_type=url.repo_type, revision=commit,
                            endpoint=_endpoint())
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return HttpObject(path, target, headers, path.transfers, expect={"X-Repo-Commit": commit})
