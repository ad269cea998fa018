"""A URL source: what ``resolve`` does for a local path, for an object over the network.

A URL naming an object is asked of the readers' layouts as a local file
is (a ``*.index.json`` is a shard set); a hub folder (``hf://org/repo/``)
as a local folder is, from the repository's names. The object is opened as
a ``RemoteFile`` (a ``SourceFile`` reading by range) and goes through the
same sniff, the same name check and the same shard-index parse as a local
file: a remote source is untrusted exactly like a local one. A ``Source`` and
its ``SourceFacts`` hold its ``RemotePath`` (their paths are ``Where``): it is
path-like and prints its redacted URL.
"""

from __future__ import annotations

from ..remote import RemotePath, folder_names
from .base import Source, local
from .folders import not_one_checkpoint

__all__ = ["resolve_url"]


def resolve_url(path: RemotePath) -> Source:
    from . import layout_of, source_of

    names = folder_names(path)
    if names is None:  # an object
        layout = layout_of(path.parent, None, path.name)
    else:
        layout = layout_of(path, names)
        if layout is None:
            raise not_one_checkpoint(path, names)
    if names is not None and layout is not None and layout.reader is not None and \
            layout.main == path:  # the folder itself: DCP, DeepSpeed, rank files
        local(path, layout.format)  # refused: read from local files
    return source_of(path, layout)
