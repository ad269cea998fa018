"""Output bounded by the input: what a file's tensors may stand for, relative to its size.

A 2.3 KB zip with six stride-0 views over a 32-byte record once meant 6 GiB
written by ``normalize`` (until the disk was full) and 3 GB of memory for
``manifest`` and ``check --finite``; ``check`` passed it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ckptport
from ckptport.readers import open_checkpoint
from fixtures.hostile import PROTO2, STOP, in_dict, storage, tensor, text, write_zip

GIB_FLOATS = 1 << 28  # float32 elements in 1 GiB


@pytest.fixture(scope="module")
def stride_zero(tmp_path_factory) -> Path:
    views = b"".join(text(f"v{i}") + tensor(storage("0", 8), 0, (GIB_FLOATS,), (0,))
                     for i in range(6))
    return write_zip(tmp_path_factory.mktemp("budget") / "stride0.pt",
                     PROTO2 + in_dict(views) + STOP, (("0", 8),))


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory) -> Path:
    """4096 views of one 1 MiB storage, each 3/4 of it: 3 GiB of tensors."""
    numel = 1 << 18
    views = b"".join(text(f"v{i}") + tensor(storage("0", numel), i * 16, (3 * numel // 4,), (1,))
                     for i in range(4096))
    return write_zip(tmp_path_factory.mktemp("budget") / "overlap.pt",
                     PROTO2 + in_dict(views) + STOP, (("0", numel),))


@pytest.mark.parametrize("name", ["stride_zero", "overlapping"])
def test_normalize_and_manifest_refuse_naming_the_tensors(request, run, tmp_path, name):
    path = request.getfixturevalue(name)
    start = time.monotonic()
    for command in (("normalize", path, tmp_path / "out.pth"),
                    ("manifest", path, "-o", tmp_path / "m.json")):
        result = run(*command)
        assert result.exit_code == 2, result.output
        line = result.stderr.strip()
        assert len(line.splitlines()) == 1 and "more than the budget" in line
        assert "biggest: v0 (1.0 GiB)" in line or "biggest: v" in line
        assert "--max-expansion" in line
    assert not list(tmp_path.iterdir())
    assert time.monotonic() - start < 10


def test_check_reports_the_file_over_budget_without_reading_it(stride_zero, run):
    start = time.monotonic()
    result = run("check", stride_zero, "--finite-all", "--format", "json")
    assert time.monotonic() - start < 10
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and not report["files"][0]["unreadable"]
    codes = [f["code"] for f in report["files"][0]["findings"]]
    assert "CKP014" in codes and "CKP006" not in codes


def test_the_budget_can_be_raised_for_a_file_one_knows(stride_zero, monkeypatch):
    with pytest.raises(ckptport.InputError, match="6.0 GiB from a"):
        open_checkpoint(stride_zero)
    assert open_checkpoint(stride_zero, max_expansion=1e9).source.materialized == 6 << 30
    monkeypatch.setenv("CKPTPORT_MAX_EXPANSION", "1e9")
    assert open_checkpoint(stride_zero).source.materialized == 6 << 30
    monkeypatch.setenv("CKPTPORT_MAX_EXPANSION", "lots")
    with pytest.raises(ckptport.OptionError, match="CKPTPORT_MAX_EXPANSION"):
        open_checkpoint(stride_zero)


def test_ordinary_files_are_far_within_it(fx):
    for name in ("ddp_cuda3", "views", "slice", "tied", "dtypes"):
        facts = open_checkpoint(fx[name]).source
        assert 0 < facts.materialized <= 2 * facts.size + (64 << 20), name


def test_an_empty_array_of_many_rows_is_refused_fast(tmp_path, run):
    """numpy ``S4`` of shape (30000000, 0) holds no bytes; tolist() made 30 M lists."""
    path = tmp_path / "empty_rows.pt"
    torch.save({"state_dict": {"w": torch.ones(2)},
                "rows": np.zeros((30_000_000, 0), dtype="S4")}, path)
    start = time.monotonic()
    result = run("normalize", path, tmp_path / "o.pth", "--select", "all")
    assert time.monotonic() - start < 10
    assert result.exit_code == 2 and "rows holds a numpy.ndarray" in result.stderr
    assert "would become more than" in result.stderr
    assert run("normalize", path, tmp_path / "w.pth").exit_code == 0  # the weights alone


def test_loading_takes_the_budget_as_every_command_does(tmp_path):
    """``load_state_dict``/``load_into`` refuse what normalize refuses, and take the same
    ``max_expansion`` for a file one knows (a 128 MiB stride-0 view of 8 floats)."""
    path = write_zip(tmp_path / "s0.pt", PROTO2 + in_dict(
        text("w") + tensor(storage("0", 8), 0, (1 << 25,), (0,))) + STOP, (("0", 8),))
    with pytest.raises(ckptport.InputError, match="more than the budget"):
        ckptport.load_state_dict(path)
    state = ckptport.load_state_dict(path, max_expansion=1e9)
    assert state["w"].shape == (1 << 25,) and bool((state["w"] == state["w"][0]).all())
