"""What a hub commit of a conversion says: the source at its version, the options, what the
rules changed (``normalize --create-pr`` opens a pull request with these words, as the hub's
conversion bot does); what the rules changed is also what an output records of them."""

from __future__ import annotations

import json

from ...readers import Source
from ...remote.urls import RemotePath
from ...rules import NormalizeOptions, RuleResult
from ...writers.remote import Message, RemoteDestination

__all__ = ["applied", "commit_message"]


def applied(results: tuple[RuleResult, ...]) -> dict[str, str]:
    """What this run's rules changed, rule by rule (a rule may run more than once)."""
    changes: dict[str, str] = {}
    for r in (r for r in results if r.changed):
        changes[r.rule] = f"{changes[r.rule]}; {r.summary}" if r.rule in changes else r.summary
    return changes


def _version(path: RemotePath) -> str:
    if path.url.scheme == "hf":
        from ...remote.hub import commit_of

        return f"commit {commit_of(path)}"
    return f"version {path.opened().version}"


def commit_message(source: Source, remote: RemoteDestination,
                   options: NormalizeOptions | None, results: tuple[RuleResult, ...]) -> Message:
    """A hub commit's words: what was converted (at which version) and how."""
    from ..._version import __version__
    from ...analysis.manifests import options_of

    files = source.files
    versions = [f"{f} ({_version(f)})" if isinstance(f, RemotePath) else str(f) for f in files]
    changed = applied(results)
    lines = [f"Source: {', '.join(versions[:3])}" + (f" and {len(files) - 3} more"
                                                     if len(files) > 3 else ""),
             f"Options: {json.dumps(options_of(options or NormalizeOptions()), sort_keys=True)}",
             *(f"- {rule}: {summary}" for rule, summary in changed.items()),
             f"Written and verified bit for bit by ckptport {__version__}."]
    name = files[0].name if files else "checkpoint"
    return Message(f"Convert {name} to {remote.local.format.name} with ckptport",
                   "\n".join(lines))
