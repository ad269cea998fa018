"""RL trainers' FSDP checkpoints as verl's checkpoint manager lays them out.

The model files are real FSDP1 ``SHARDED_STATE_DICT`` saves of every rank (torch 2.13,
gloo, world sizes 1 and 2; ``fixtures/distributed.py``) under verl's names, beside the
optimizer and extra state; the truth is FSDP's own full state dict of the same model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fixtures.hostile import PROTO2, STOP, system, write_zip
from tests.helpers import hostile_member, refused, same_bits


def _copy(dist: Path, world: int, tmp_path: Path) -> Path:
    return Path(shutil.copytree(dist / "verl" / f"ws{world}", tmp_path / "actor"))


@pytest.mark.parametrize("world", [1, 2])
def test_verl_model_files_are_the_full_state_dict(dist, run, tmp_path, world):
    folder = dist / "verl" / f"ws{world}"
    want = torch.load(dist / "truth" / f"ws{world}" / "fsdp1.pt", weights_only=True)
    result = run("normalize", folder, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert list(got) == list(want) and all(same_bits(got[k], v) for k, v in want.items())
    shown = json.loads(run("inspect", folder, "--format", "json").stdout)
    assert shown["format"] == "verl-fsdp"
    done = run("normalize", folder.parent, tmp_path / "all", "--format", "json")  # folder mode
    assert done.exit_code == 0, done.output
    states = {f["source"]: f["status"] for f in json.loads(done.stdout)["files"]
              if f["source"].split("/")[0] == f"ws{world}"}
    assert states.pop(f"ws{world}") == "converted"
    assert set(states.values()) == {"no weights"} and len(states) == 2 * world


def test_plain_tensors_at_world_size_one(run, tmp_path):
    """At world size 1 the model file may hold plain tensors: it is the state dict."""
    folder = tmp_path / "actor"
    folder.mkdir()
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    torch.save(state, folder / "model_world_size_1_rank_0.pt")
    torch.save({"state": {}}, folder / "optim_world_size_1_rank_0.pt")
    result = run("normalize", folder, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert all(same_bits(got[k], v) for k, v in state.items())


def test_a_missing_rank(dist, run, tmp_path):
    folder = _copy(dist, 2, tmp_path)
    (folder / "model_world_size_2_rank_1.pt").unlink()
    refused(run, folder, tmp_path / "out.pth", "model_world_size_2_rank_1.pt is missing")
    checked = run("check", folder)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout


def test_a_rank_under_two_spellings(dist, run, tmp_path):
    folder = _copy(dist, 2, tmp_path)
    shutil.copy(folder / "model_world_size_2_rank_1.pt", folder / "model_world_size_2_rank_01.pt")
    refused(run, folder, tmp_path / "out.pth", "rank 1 is claimed by 2 files")


def test_files_of_two_runs(dist, run, tmp_path):
    folder = _copy(dist, 2, tmp_path)
    shutil.copy(dist / "verl" / "ws1" / "model_world_size_1_rank_0.pt", folder)
    refused(run, folder, tmp_path / "out.pth", "world sizes 1, 2")


def test_names_that_lie_about_the_world_size(dist, run, tmp_path):
    folder = _copy(dist, 2, tmp_path)
    for rank in (0, 1):
        (folder / f"model_world_size_2_rank_{rank}.pt").rename(
            folder / f"model_world_size_3_rank_{rank}.pt")
    refused(run, folder, tmp_path / "out.pth", "model_world_size_3_rank_2.pt is missing")


def test_a_truncated_rank_file(dist, run, tmp_path):
    folder = _copy(dist, 2, tmp_path)
    path = folder / "model_world_size_2_rank_1.pt"
    path.write_bytes(path.read_bytes()[:-500])
    refused(run, folder, tmp_path / "out.pth", path.name)
    checked = run("check", folder)
    assert checked.exit_code == 2 and f"{path}: CKP008" in checked.stdout


def test_a_hostile_rank_file(dist, run, tmp_path, sentinel):
    folder = _copy(dist, 2, tmp_path)
    victim = folder / "model_world_size_2_rank_1.pt"
    hostile_member(run, folder, victim, sentinel, tmp_path / "out.pth", victim.name)
    hidden = _copy(dist, 2, tmp_path / "second")  # in the optimizer state, still gated
    write_zip(hidden / "optim_world_size_2_rank_0.pt", PROTO2 + system(sentinel) + STOP, ())
    checked = run("check", hidden)
    assert checked.exit_code == 1 and "optim_world_size_2_rank_0.pt: CKP003" in checked.stdout
    assert not sentinel.exists()
