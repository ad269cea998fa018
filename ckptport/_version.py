"""The version: written once here (setuptools reads it into the package metadata)."""

from __future__ import annotations

__version__ = "0.1.0"


def installed_version() -> str:
    """The version pip installed, from the package metadata (what ``pip show`` says);
    this file's, where ckptport runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ckptport")
    except PackageNotFoundError:
        return __version__
