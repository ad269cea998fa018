"""The hostile corpus through every command: one verdict per file, reached by all of them.

``fixtures/corpus.py`` writes each case and says what ckptport must do with
it (issues 11 and 12): refuse a code-running global by its resolved name
(``normalize``/``diff``/``read`` exit 2, ``check`` CKP003, ``inspect``
lists it), name a code-running constructor whose arguments are data and
extract the weights without calling it (a pickled fx ``GraphModule``),
refuse a malformed or ambiguous file everywhere (exit 2, CKP008), or read
an odd but legitimate file exactly as torch and the safetensors library do.
Every command must leave nothing behind and never run the payload: its only
effect would be the session's sentinel file.

The corpus is built once per module; every case stays small, so the whole
module runs in seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result

import ckptport
from ckptport.errors import CkptportError
from fixtures.corpus import CASE_NAMES, Case
from tests.helpers import same_bits

MAX_CASE_BYTES = 512 * 1024  # "a few hundred KB"; sizes that matter are declared, not written
CASE_SECONDS = 10  # every command on one case together; issue 12 counts a 10 s hang as a finding


@contextlib.contextmanager
def _fifo_released(path: Path) -> Iterator[None]:
    """Keep a FIFO from hanging the suite when a command (wrongly) opens it.

    A writer thread opens and closes the FIFO in a loop, so a reader gets
    end-of-file instead of blocking forever; the case still fails on its
    reason. Nothing to do for regular files and folders.
    """
    if not stat.S_ISFIFO(os.lstat(path).st_mode):
        yield
        return
    done = threading.Event()

    def writer() -> None:
        while not done.is_set():
            os.close(os.open(path, os.O_WRONLY))  # blocks until someone reads

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # frees a writer stuck in open()
        thread.join(timeout=5)
        os.close(reader)


def _refusal(result: Result, case: Case) -> str:
    """The refusal's message: one stderr line naming the source, never a crash.

    Returned without its ``ckptport: error: PATH:`` prefix, so a reason
    regex cannot match the case's own file name.
    """
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptport: error: "), lines
    assert "internal error" not in lines[0], lines[0]
    message = lines[0].removeprefix("ckptport: error: ")
    return re.sub(re.escape(str(case.path)) + r"\S*", "", message)


def _findings(result: Result) -> list[dict[str, Any]]:
    """``check --format json``'s findings; its stdout must be the JSON report, even on exit 2."""
    try:
        report = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"check printed no JSON report: {result.stdout!r} {result.stderr!r}")
    return [f for entry in report["files"] for f in entry["findings"]]


def _tensors(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a loaded tree, by dotted key path."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    if isinstance(tree, dict):
        items: Any = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return {}
    found: dict[str, torch.Tensor] = {}
    for key, value in items:
        found.update(_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    return found


def _assert_code(case: Case, run: Any, tmp_path: Path) -> None:
    assert case.resolved is not None
    out = tmp_path / "out.pth"
    result = run("normalize", case.path, out, "--select", "all")
    assert result.exit_code == 2, result.stdout + result.stderr
    assert case.resolved in _refusal(result, case)
    diff = run("diff", case.path, case.path)
    assert diff.exit_code == 2 and case.resolved in _refusal(diff, case)
    with pytest.raises(CkptportError, match=re.escape(case.resolved)):
        ckptport.read(case.path)
    _assert_reported(case, run)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _assert_reported(case: Case, run: Any) -> None:
    """``check`` fails the gate naming the global (as spelled too); ``inspect`` lists it.

    A global that is code-running by its module is a dangerous global; an
    unknown one the file calls with no proof it is a class is listed apart,
    with the same CKP003 severity.
    """
    check = run("check", case.path, "--format", "json")
    assert check.exit_code == 1, check.stdout
    assert any(f["code"] == "CKP003" and case.resolved in f["message"]
               for f in _findings(check)), check.stdout
    if case.raw:  # the spelling in the file is reported next to what it resolves to
        assert case.raw in check.stdout
    inspect = run("inspect", case.path, "--format", "json")
    assert inspect.exit_code == 0, inspect.stderr
    report = json.loads(inspect.stdout)
    assert case.resolved in report["dangerous_globals"] + report["unproven_callables"]


def _assert_extract(case: Case, run: Any, tmp_path: Path) -> None:
    """Reports name the constructor; normalize takes the weights without calling it."""
    _assert_reported(case, run)
    out = tmp_path / "out.pth"
    result = run("normalize", case.path, out, "--select", "all")
    assert result.exit_code == 0, result.stderr
    torch.load(out, weights_only=True)
    assert run("diff", case.path, out, "--select", "all").exit_code == 0


def _assert_refused(case: Case, run: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.pth"
    result = run("normalize", case.path, out, "--select", "all")
    assert result.exit_code == 2, result.stdout + result.stderr
    message = _refusal(result, case)
    if case.reason:
        assert re.search(case.reason, message, re.IGNORECASE), message
    for args in (("diff", case.path, case.path), ("inspect", case.path, "--format", "json")):
        other = run(*args)
        assert other.exit_code == 2, (args[0], other.stdout, other.stderr)
        _refusal(other, case)
    with pytest.raises(CkptportError):
        ckptport.read(case.path)
    check = run("check", case.path, "--format", "json")
    assert check.exit_code == 2, check.stdout
    assert any(f["code"] == "CKP008" for f in _findings(check)), check.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _assert_read(case: Case, run: Any, tmp_path: Path) -> None:
    assert case.expected is not None
    out = tmp_path / "out.pth"
    result = run("normalize", case.path, out, "--keep-prefixes")
    assert result.exit_code == 0, result.stderr
    got = _tensors(torch.load(out, weights_only=True))
    assert sorted(got) == sorted(case.expected)
    for key, want in case.expected.items():
        assert same_bits(got[key], want), (key, got[key], want)
    assert run("inspect", case.path, "--format", "json").exit_code == 0  # the torch-free path
    if case.absent:  # a claim ckptport never checked: reports may quote it, outputs never vouch
        st = tmp_path / "out.safetensors"
        again = run("normalize", case.path, st, "--keep-prefixes")
        assert again.exit_code == 0, again.stderr
        for written in (out, st):
            assert case.absent.encode() not in written.read_bytes(), written


_CHECKS = {"code": _assert_code, "extract": _assert_extract, "refused": _assert_refused,
           "read": _assert_read}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_command_reaches_the_verdict(corpus, run, tmp_path, sentinel, name):
    case = corpus[name]
    start = time.monotonic()
    with _fifo_released(case.path):
        _CHECKS[case.verdict](case, run, tmp_path)
    assert time.monotonic() - start < CASE_SECONDS
    assert not sentinel.exists()
