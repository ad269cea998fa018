"""``ckptport check``: the CI gate on exported checkpoints.

Each code has a stable name, a severity, and a one-line message naming the
file and the key it concerns; ``CODES`` documents what each finds, why it
matters and how to fix it (the README's table is made from it). Files are
read for a report: a file with a code-running global is a finding that
names it, and nothing in it runs. No tensor byte is read unless ``finite``
or ``against`` needs values, and torch is not imported for zip, legacy and
safetensors files or shard sets.

A folder is searched for every regular file any loader could open:
checkpoint files whatever their extension (``.PT``, ``.pth.tar``), shard
sets, DCP and Hugging Face folders, and any other file whose bytes
``torch.load`` would unpickle. A file that no loader can open is listed as
skipped with the reason, never silently passed over.
"""

from __future__ import annotations

from .codes import CODES
from .file import FINITE_SCOPES, CheckCode, CheckSettings, FileUnderCheck, Severity
from .run import CheckReport, FileResult, Finding, Skipped, check

__all__ = ["CheckCode", "CheckSettings", "FileUnderCheck", "CODES", "Finding", "Severity",
           "FileResult", "Skipped", "CheckReport", "check", "FINITE_SCOPES"]
