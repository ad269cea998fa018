"""Megatron-core ``dist_checkpointing`` saves (``torch_dist``), and NeMo 2's ``weights/``.

The folders are megatron-core's own ``dist_checkpointing.save`` of a sharded state dict
(gloo on CPU, world sizes 1 and 2; ``fixtures/megatron.py``); the truth is megatron's own
``dist_checkpointing.load`` of the whole tensors. ckptport reads them without megatron.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from fixtures.hostile import PROTO2, STOP, system, write_zip
from tests.helpers import hostile_member, refused, same_bits

CASES = ["ws1", "ws2", "nemo1", "nemo2"]


def _copy(mcore: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(mcore / name, tmp_path / name))


@pytest.mark.parametrize("name", CASES)
def test_every_command_reads_what_megatron_loads(mcore, run, tmp_path, name):
    world = name[-1]
    want = torch.load(mcore / f"truth{world}.pt", weights_only=True)
    folder = mcore / name
    result = run("normalize", folder, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert list(got) == list(want) and all(same_bits(got[k], v) for k, v in want.items())
    whole = run("normalize", folder, tmp_path / "all.pth", "--select", "all")
    assert whole.exit_code == 0, whole.stderr
    common = torch.load(mcore / f"common{world}.pt", weights_only=True)
    everything = torch.load(tmp_path / "all.pth", weights_only=True)
    assert everything["iteration"] == common["iteration"] == 2
    assert same_bits(everything["rng_state"]["random_rng_state"],
                     common["rng_state"]["random_rng_state"])
    shown = json.loads(run("inspect", folder, "--format", "json").stdout)
    assert shown["format"] == "megatron-dist"
    assert run("check", folder).exit_code == 0
    assert run("diff", folder, mcore / f"ws{world}").exit_code == 0
    assert run("manifest", folder, "-o", tmp_path / "m.json").exit_code == 0


def test_megatrons_enums_in_common_are_data(mcore, run, tmp_path):
    """Megatron-LM's args (AttnBackend, ModelType) in common.pt: plain data, not code."""
    folder = mcore / "args1"
    checked = run("check", folder)
    assert "CKP012" not in checked.stdout and "CKP003" not in checked.stdout, checked.stdout
    assert "args.attention_backend: needs megatron.core.transformer.enums.AttnBackend" in \
        checked.stdout  # torch.load(weights_only=True) refuses it: a warning, said so
    result = run("normalize", folder, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    want = torch.load(mcore / "truth1.pt", weights_only=True)
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert list(got) == list(want) and all(same_bits(got[k], v) for k, v in want.items())
    whole = run("normalize", folder, tmp_path / "all.pth", "--select", "all")
    assert whole.exit_code == 0, whole.stderr
    args = torch.load(tmp_path / "all.pth", weights_only=True)["args"]
    assert args["num_layers"] == 1


def test_read_without_megatron(mcore, tmp_path):
    """Every command in a fresh interpreter: megatron is never imported."""
    code = ("import sys; from click.testing import CliRunner; from ckptport.cli import cli\n"
            f"folder, out = {str(mcore / 'nemo2')!r}, {str(tmp_path)!r}\n"
            f"assert CliRunner().invoke(cli, ['check', {str(mcore / 'args1')!r}]).exit_code == 1\n"
            "for args in (['inspect', folder], ['check', folder], ['normalize', folder,\n"
            "              out + '/o.safetensors'], ['diff', folder, folder],\n"
            "             ['manifest', folder, '-o', out + '/m.json']):\n"
            "    r = CliRunner().invoke(cli, args)\n"
            "    assert r.exit_code == 0, (args, r.output)\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'megatron'], 'imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]


def test_megatrons_plan_classes_are_inert_records(mcore, run, tmp_path, monkeypatch):
    """Older megatron pickles its own MCoreSavePlan (and MCoreMetadata) into .metadata:
    read as inert records, megatron never imported nor its classes constructed."""
    folder = _copy(mcore, "ws2", tmp_path)
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    name = "megatron.core.dist_checkpointing.strategies.torch"
    fake = types.ModuleType(name)  # only while pickling: pickle looks the classes up
    for short in ("MCoreSavePlan", "MCoreMetadata"):
        setattr(fake, short, type(short, (), {"__module__": name}))
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
        patch.setitem(sys.modules, name, fake)
        plan = fake.MCoreSavePlan()
        plan.__dict__.update(items=[], planner_data=None, mcore_data={"k": {"shape": (14, 7)}})
        metadata.all_local_plans = [plan, plan]
        metadata.mcore_data = fake.MCoreMetadata()
        data = pickle.dumps(metadata)
    assert b"MCoreSavePlan" in data and b"MCoreMetadata" in data
    (folder / ".metadata").write_bytes(data)
    result = run("normalize", folder, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    want = torch.load(mcore / "truth2.pt", weights_only=True)
    got = torch.load(tmp_path / "out.pth", weights_only=True)
    assert all(same_bits(got[k], v) for k, v in want.items())
    (folder / ".metadata").write_bytes(data.replace(b"MCoreMetadata", b"MCoreMetadatX"))
    refused(run, folder, tmp_path / "other.pth", "MCoreMetadatX", "not DCP metadata")


def test_a_missing_data_file(mcore, run, tmp_path):
    folder = _copy(mcore, "ws2", tmp_path)
    (folder / "__1_0.distcp").unlink()
    refused(run, folder, tmp_path / "out.pth", "__1_0.distcp is missing")
    assert run("check", folder).exit_code == 2


def test_a_truncated_data_file(mcore, run, tmp_path):
    folder = _copy(mcore, "nemo2", tmp_path)
    path = folder / "weights" / "__1_0.distcp"
    path.write_bytes(path.read_bytes()[:-40])
    refused(run, folder, tmp_path / "out.pth", "__1_0.distcp", "truncated")


def test_common_missing_is_partial(mcore, run, tmp_path):
    folder = _copy(mcore, "ws2", tmp_path)
    (folder / "common.pt").unlink()
    refused(run, folder, tmp_path / "out.pth", "common.pt is missing")
    checked = run("check", folder)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout


def test_another_backend(mcore, run, tmp_path):
    folder = _copy(mcore, "ws1", tmp_path)
    (folder / "metadata.json").write_text('{"sharded_backend": "zarr", '
                                          '"sharded_backend_version": 1}')
    refused(run, folder, tmp_path / "out.pth", "metadata.json", "'zarr' backend")


def test_lying_metadata(mcore, run, tmp_path):
    """Chunks that do not tile the tensor they claim to: refused naming it, CKP013."""
    folder = _copy(mcore, "ws2", tmp_path)
    path = folder / ".metadata"
    metadata = pickle.loads(path.read_bytes())
    item = metadata.state_dict_metadata["decoder.layers.0.mlp.linear_fc1.weight"]
    item.size = torch.Size([15, 7])
    path.write_bytes(pickle.dumps(metadata))
    refused(run, folder, tmp_path / "out.pth", "linear_fc1.weight")
    checked = run("check", folder)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout


def test_a_payload_in_common(mcore, run, tmp_path, sentinel):
    folder = _copy(mcore, "nemo2", tmp_path)
    hostile_member(run, folder, folder / "weights" / "common.pt", sentinel,
                   tmp_path / "out.pth", "common.pt")
    proof = tmp_path / "RAN"  # the same payload under full unpickling runs
    write_zip(tmp_path / "proof.pt", PROTO2 + system(proof) + STOP, ())
    subprocess.run([sys.executable, "-c", "import sys, torch; torch.load(sys.argv[1], "
                    "weights_only=False)", str(tmp_path / "proof.pt")], check=False)
    assert proof.exists() and not sentinel.exists()
