"""DeepSpeed pipeline-parallel checkpoints, as a ``PipelineModule`` saves them.

Written by DeepSpeed 0.19 itself (gloo, bf16, one stage per rank at world sizes 1
and 2; ``fixtures/distributed.py``); the truth is each stage's own
``module.state_dict()``, the names and values DeepSpeed's module holds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import hostile_member, refused, same_bits


def _truth(dist: Path, world: int) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for rank in range(world):
        merged.update(torch.load(dist / "truth" / f"ws{world}" / f"pipe_rank{rank}.pt",
                                 weights_only=True))
    return merged


def _tag(folder: Path) -> Path:
    return folder / (folder / "latest").read_text().strip()


@pytest.mark.parametrize("world", [1, 2])
def test_a_pipeline_save_is_the_pipeline_modules_state_dict(dist, run, tmp_path, world):
    folder = dist / "ds" / f"ws{world}" / "pipe"
    want = _truth(dist, world)
    result = run("normalize", folder, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert sorted(got) == sorted(want) == ["0.bias", "0.weight", "2.bias", "2.weight",
                                           "3.bias", "3.weight"]
    assert all(got[k].dtype == torch.bfloat16 and same_bits(got[k], v) for k, v in want.items())
    shown = json.loads(run("inspect", folder, "--format", "json").stdout)
    assert shown["format"] == "deepspeed-pipeline"
    done = run("normalize", folder.parent, tmp_path / "all", "--format", "json")  # folder mode
    states = {f["source"]: f["status"] for f in json.loads(done.stdout)["files"]
              if f["source"].startswith("pipe/")}
    assert states.pop(f"pipe/{_tag(folder).name}") == "converted"
    assert set(states.values()) == {"no weights"}  # the engine's and optimizer's state


def test_a_missing_layer(dist, run, tmp_path):
    folder = Path(shutil.copytree(dist / "ds" / "ws2" / "pipe", tmp_path / "pipe"))
    (_tag(folder) / "layer_02-model_states.pt").unlink()
    refused(run, folder, tmp_path / "out.pth", "layer 2 of layers 0..3 has no file")
    checked = run("check", folder)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout


def test_a_layer_under_two_spellings_or_of_another_model_parallel_rank(dist, run, tmp_path):
    folder = Path(shutil.copytree(dist / "ds" / "ws1" / "pipe", tmp_path / "pipe"))
    tag = _tag(folder)
    shutil.copy(tag / "layer_00-model_states.pt", tag / "layer_0-model_states.pt")
    refused(run, folder, tmp_path / "out.pth", "layer 0 is claimed by 2 files")
    (tag / "layer_0-model_states.pt").rename(tag / "layer_00-model_01-model_states.pt")
    refused(run, folder, tmp_path / "out.pth", "model-parallel rank 1",
            "layer_00-model_01-model_states.pt")


def test_a_truncated_or_hostile_layer(dist, run, tmp_path, sentinel):
    folder = Path(shutil.copytree(dist / "ds" / "ws1" / "pipe", tmp_path / "pipe"))
    path = _tag(folder) / "layer_03-model_states.pt"
    data = path.read_bytes()
    path.write_bytes(data[:-300])
    refused(run, folder, tmp_path / "out.pth", str(path))
    checked = run("check", folder)
    assert checked.exit_code == 2 and f"{path}: CKP008" in checked.stdout
    hostile_member(run, folder, path, sentinel, tmp_path / "out.pth", str(path))
