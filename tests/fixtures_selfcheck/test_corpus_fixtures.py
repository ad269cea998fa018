"""The hostile corpus (``fixtures/corpus.py``) checked, not ckptport: these hold whatever
the engine does."""

from __future__ import annotations

import os
import stat

from fixtures.corpus import CASE_NAMES, KINDS, VERDICTS
from tests.test_corpus import MAX_CASE_BYTES


def test_corpus_covers_the_techniques_asked_for(corpus):
    assert set(corpus) == set(CASE_NAMES)
    pickle_level = [c for c in corpus.values() if c.kind == "pickle"]
    assert len(pickle_level) >= 45
    assert {c.verdict for c in corpus.values()} == set(VERDICTS)
    assert {c.kind for c in corpus.values()} == set(KINDS)
    assert all(c.source for c in corpus.values())


def test_cases_are_small_and_harmless(corpus, sentinel):
    for case in corpus.values():
        assert os.path.lexists(case.path), case.name
        files = [case.path] if not case.path.is_dir() else [
            p for p in case.path.rglob("*") if p.is_file() and not p.is_symlink()]
        for path in files:
            if stat.S_ISREG(os.lstat(path).st_mode):
                assert path.stat().st_size <= MAX_CASE_BYTES, (case.name, path)
    assert not sentinel.exists()


def test_code_cases_name_the_first_global_they_resolve_to(corpus):
    """``raw`` is only set where Python's unpickler renames (compat names)."""
    for case in corpus.values():
        if case.verdict in ("code", "extract"):
            assert case.resolved and case.raw != case.resolved
        else:
            assert case.resolved is None and case.raw is None
