"""``ckptport inspect``: what is in a file, without running or reading it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from ckptport.render import ReportFormat, formatter

GOLDEN = Path(__file__).with_name("golden") / "inspect_dp_in_ddp.json"


def _portable(doc: dict) -> dict:
    """The report without what depends on the machine: the temp path and the version."""
    return {**doc, "path": Path(doc["path"]).name, "ckptport": "<version>"}


def test_inspect_json_golden(fx, run):
    result = run("inspect", fx["dp_in_ddp"], "--format", "json", "--depth", "1")
    assert result.exit_code == 0, result.stderr
    doc = _portable(json.loads(result.stdout))
    if os.environ.get("CKPTPORT_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(doc, indent=2) + "\n")
    assert doc == json.loads(GOLDEN.read_text())


def test_inspect_text_names_every_fact(fx, run):
    result = run("inspect", fx["ddp_cuda3"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for fact in ("torch-zip", "tensors: 15", "parameters: 854 in state_dict",
                 "float32 6.6 KiB", "cuda:3 (15 storages)", "module. (9 keys)",
                 "globals beyond weights-only: argparse.Namespace",
                 "args: argparse.Namespace", "module.conv.weight: float32[4, 3, 3, 3] 432 B"):
        assert fact in out, fact


def test_depth_limits_the_layout(fx, run):
    out = run("inspect", fx["ddp_cuda3"], "--depth", "0").stdout
    assert "… 7 entries below --depth" in out and "module.conv.weight" not in out


def test_hash_is_the_file_sha256(fx, run):
    doc = json.loads(run("inspect", fx["plain"], "--hash", "--format", "json").stdout)
    assert doc["sha256"] == hashlib.sha256(fx["plain"].read_bytes()).hexdigest()
    assert json.loads(run("inspect", fx["plain"], "--format", "json").stdout)["sha256"] is None


def test_inspect_names_dangerous_globals_without_running_them(fx, run, sentinel):
    result = run("inspect", fx["os_system_zip"], "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["dangerous_globals"] == ["os.system"]
    assert doc["blocking_objects"] == [{"key": "<root>", "global_name": "os.system",
                                        "dangerous": True}]
    assert not sentinel.exists()


def test_inspect_lists_unimportable_objects_by_key(fx, run):
    doc = json.loads(run("inspect", fx["lightning_unimportable"], "--format", "json").stdout)
    found = {(o["key"], o["global_name"]) for o in doc["blocking_objects"]}
    module = "ckptport_fixture_private_config"
    assert (("hyper_parameters.config", f"{module}.TrainConfig") in found
            and ("hyper_parameters.tree", f"{module}.ConfigNode") in found)


def test_shared_storages_and_bloat(fx, run):
    doc = json.loads(run("inspect", fx["slice"], "--format", "json").stdout)
    assert doc["shared_storages"] == [["small", "strided"]]
    assert doc["storage_bloat"] == [{"key": "small", "storage_bytes": 1_000_000,
                                     "used_bytes": 76}]


@pytest.mark.parametrize("name", ["truncated", "random", "lying_frame_zip", "memo_bomb_legacy"])
def test_unreadable_is_one_line_exit_2(fx, run, name):
    result = run("inspect", fx[name])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and str(fx[name]) in result.stderr


def test_every_format_renders_inspect(fx):
    from ckptport.inspect import inspect

    report = inspect(fx["ddp_cuda3"])
    for fmt in ReportFormat:
        if fmt is not ReportFormat.MARKDOWN:  # not offered by the inspect command
            assert formatter(fmt).inspect(report)
