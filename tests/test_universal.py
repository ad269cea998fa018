"""DeepSpeed universal checkpoints, as DeepSpeed's own ``ds_to_universal`` writes them.

The truth is DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint`` on the save
that was converted: the universal folder holds the same fp32 masters, one file per
parameter. Read as a tag folder (its ``mp_rank_00`` copy) it would give the
half-precision module of a bf16 run.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import warnings
from pathlib import Path

import torch

from tests.helpers import hostile_member, refused


def _zero_to_fp32(folder: Path) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return get_fp32_state_dict_from_zero_checkpoint(str(folder))


def _copy(dist: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(dist / "ds" / "universal" / name, tmp_path / name))


def test_universal_gives_the_fp32_masters(dist, run, tmp_path):
    folder = dist / "ds" / "universal" / "s2_bf16"
    want = _zero_to_fp32(dist / "ds" / "ws2" / "s2_bf16")
    out = tmp_path / "out.pth"
    result = run("normalize", folder, out)
    assert result.exit_code == 0, result.stderr
    got = torch.load(out, weights_only=True)
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():  # frozen layers: the bf16 copy, held as fp32
        assert got[key].dtype == torch.float32 and torch.equal(got[key], tensor.float()), key
    assert torch.equal(got["head.weight"], want["emb.weight"])  # the tie, restored
    module = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert not torch.equal(got["fc1.weight"], module["fc1.weight"].float())  # not the copy
    shown = json.loads(run("inspect", folder, "--format", "json").stdout)
    assert shown["format"] == "deepspeed-universal"
    checked = run("check", folder.parent, "--format", "json")  # the folder walk
    report = json.loads(checked.stdout)
    assert str(folder) in [f["path"] for f in report["files"]]
    assert not any(f["path"].endswith("fp32.pt") for f in report["files"])


def test_a_zero3_universal_save_without_its_frozen_layers_isrefused(dist, run, tmp_path):
    """ds_to_universal leaves ZeRO-3's frozen parameters out: refused, never filled from the
    half-precision module."""
    refused(run, dist / "ds" / "universal" / "s3_bf16", tmp_path / "out.pth",
             "frozen.weight", "ZeRO-3")


def test_a_missing_parameter_file(dist, run, tmp_path):
    folder = _copy(dist, "s2_bf16", tmp_path)
    shutil.rmtree(folder / "zero" / "fc2.bias")
    refused(run, folder, tmp_path / "out.pth", "zero/fc2.bias/fp32.pt", "partly copied")
    checked = run("check", folder)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout


def test_a_truncated_parameter_file(dist, run, tmp_path):
    folder = _copy(dist, "s2_bf16", tmp_path)
    path = folder / "zero" / "fc1.weight" / "fp32.pt"
    path.write_bytes(path.read_bytes()[:-300])
    refused(run, folder, tmp_path / "out.pth", str(path))
    checked = run("check", folder)
    assert checked.exit_code == 2 and f"{path}: CKP008" in checked.stdout


def test_a_parameter_file_of_another_shape(dist, run, tmp_path):
    folder = _copy(dist, "s2_bf16", tmp_path)
    torch.save({"param": torch.zeros(2, 2), "cat_dim": 0}, folder / "zero" / "fc1.bias" /
               "fp32.pt")
    refused(run, folder, tmp_path / "out.pth", "fc1.bias", "[2, 2]", "[13]")


def test_a_hostile_parameter_file(dist, run, tmp_path, sentinel):
    folder = _copy(dist, "s2_bf16", tmp_path)
    victim = folder / "zero" / "emb.weight" / "fp32.pt"
    hostile_member(run, folder, victim, sentinel, tmp_path / "out.pth", str(victim))
