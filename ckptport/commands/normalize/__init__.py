"""``ckptport normalize``: one checkpoint (``file``), or a folder of them (``folder``).

Folder mode is the same command given a folder of checkpoints: it runs the
single-file conversion on each, in worker processes, resumably.
"""

from __future__ import annotations

from .file import NormalizeReport, normalize_file
from .folder import FileOutcome, FolderOptions, FolderReport, normalize_folder

__all__ = ["NormalizeReport", "normalize_file", "FolderOptions", "FolderReport", "FileOutcome",
           "normalize_folder"]
