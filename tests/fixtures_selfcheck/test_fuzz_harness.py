"""The fuzzing harness (``fixtures/fuzz.py``) checked, not ckptport: a reader that raises
or hangs must be reported as such, or the fuzz tests could not fail."""

from __future__ import annotations

from fixtures.fuzz import run_case


def test_harness_catches_what_it_must(tmp_path):
    def raises(path):
        raise ValueError("boom")

    def hangs(path):
        import signal

        signal.alarm(1)
        while True:
            pass

    assert run_case(tmp_path, raises)[0] == "exception"
    assert run_case(tmp_path, hangs)[0] == "timeout"


