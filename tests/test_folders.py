"""What a folder path names: one home (``readers.folders``), the same answer for every command.

Tried as a new user would: a diffusers ``unet/`` was a folder-mode run that
made a directory named like DST; an accelerate ``save_state`` folder read as
its model alone, its optimizer and RNG files silently left out; a peft
adapter folder was not recognised.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import ckptport
from ckptport.readers import layout_of
from ckptport.readers.folders import listing
from tests.helpers import same_bits

WEIGHTS = {"conv.weight": torch.arange(6.0).reshape(2, 3), "conv.bias": torch.ones(2)}


@pytest.mark.parametrize("name", ["diffusion_pytorch_model.safetensors",
                                  "adapter_model.safetensors", "model.safetensors"])
def test_a_librarys_model_folder_is_one_checkpoint(tmp_path, run, name):
    folder = tmp_path / "unet"
    folder.mkdir()
    save_file(WEIGHTS, folder / name)
    (folder / "config.json").write_text("{}")
    layout = layout_of(folder, listing(folder))
    assert layout is not None and layout.files == (folder / name,)
    assert layout.quiet == (folder / "config.json",)
    out = tmp_path / "out" / "diffusion_pytorch_model.safetensors"
    out.parent.mkdir()
    result = run("normalize", folder, out)
    assert result.exit_code == 0, result.stderr
    assert out.is_file()
    loaded = ckptport.load_state_dict(out)
    assert all(same_bits(loaded[k], v) for k, v in WEIGHTS.items())
    assert run("inspect", folder, "--format", "json").exit_code == 0


def test_a_pytorch_bin_adapter_folder_is_one_checkpoint(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    torch.save(WEIGHTS, folder / "adapter_model.bin")
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    assert list(ckptport.load_state_dict(folder)) == list(WEIGHTS)


@pytest.fixture
def accelerate_state(tmp_path):
    """What accelerate's save_state writes: the model beside the training state."""
    folder = tmp_path / "checkpoint_3"
    folder.mkdir()
    save_file(WEIGHTS, folder / "model.safetensors")
    torch.save({"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
               folder / "optimizer.bin")
    torch.save({"step": 3}, folder / "scheduler.bin")
    torch.save({"torch_manual_seed": torch.ones(4, dtype=torch.uint8)},
               folder / "random_states_0.pkl")
    return folder


def test_an_accelerate_state_folder_is_a_folder_of_checkpoints(accelerate_state, run, tmp_path):
    layout = layout_of(accelerate_state, listing(accelerate_state))
    assert layout is not None and layout.many is not None
    shown = run("inspect", accelerate_state)
    assert shown.exit_code == 2 and "accelerate save_state folder" in shown.stderr
    assert "optimizer.bin" in shown.stderr
    to_file = run("normalize", accelerate_state, tmp_path / "model.pth")
    assert to_file.exit_code == 2 and not (tmp_path / "model.pth").exists()
    out = tmp_path / "converted"
    done = run("normalize", accelerate_state, out, "--select", "all", "--format", "json")
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in out.glob("*.pth")) == [
        "model.pth", "optimizer.pth", "random_states_0.pth", "scheduler.pth"]


@pytest.fixture(scope="session")
def accelerate_saved(tmp_path_factory):
    """accelerate's own save_state after a step of training (model, AdamW, a scheduler, a
    dataloader), and the unwrapped model's state dict it saved."""
    accelerate = pytest.importorskip("accelerate", reason="the test extra's accelerate")
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)),
                                       batch_size=4)
    model, optimizer, scheduler, data = accelerator.prepare(model, optimizer, scheduler, data)
    for (batch,) in data:
        accelerator.backward(model(batch).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    folder = tmp_path_factory.mktemp("accelerate") / "checkpoint_1"
    accelerator.save_state(str(folder))
    return folder, {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def test_folder_mode_skips_training_state_of_a_save_state_folder(accelerate_saved, run,
                                                                 tmp_path):
    """The optimizer, scheduler and RNG files hold no model weights: reported as such and not
    converted (exit 0); the model is, bit for bit; ``--select all`` converts them all."""
    folder, weights = accelerate_saved
    assert sorted(p.name for p in folder.iterdir()) == [
        "model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin"]
    result = run("normalize", folder, tmp_path / "out", "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    states = {f["source"]: f["status"] for f in report["files"]}
    assert states == {"model.safetensors": "converted", "optimizer.bin": "no weights",
                      "random_states_0.pkl": "no weights", "scheduler.bin": "no weights"}
    assert sorted(p.name for p in (tmp_path / "out").glob("*.pth")) == ["model.pth"]
    got = torch.load(tmp_path / "out" / "model.pth", weights_only=True)
    assert sorted(got) == sorted(weights) and all(same_bits(got[k], v) for k, v in weights.items())
    text = run("normalize", folder, tmp_path / "again")
    assert text.exit_code == 0 and "3 training state without model weights" in text.stdout
    every = run("normalize", folder, tmp_path / "all", "--select", "all")
    assert every.exit_code == 0 and len(list((tmp_path / "all").glob("*.pth"))) == 4
    assert run("check", folder).exit_code == 1  # still gated: its RNG state needs numpy


def test_the_cli_keeps_a_dst_folder_slash(fx, run, tmp_path):
    """``normalize ckpt.pth shards/`` writes a shard set, as the Python call does."""
    result = run("normalize", fx["plain"], f"{tmp_path / 'shards'}/")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "shards" / "model.safetensors").is_file()


def test_one_list_of_files_per_layout(fx, tmp_path):
    """resolve, the reader, a folder search and provenance see the same files of a DCP
    folder (its ``.metadata``, every ``*.distcp``, Lightning's ``meta.pt``)."""
    from ckptport.readers import open_checkpoint, resolve
    from ckptport.readers.discover import discover

    root = tmp_path / "runs"
    folder = root / "dcp"
    root.mkdir()
    ckptport.normalize_file(fx["plain"], folder, to="dcp")
    torch.save({"epoch": 3}, folder / "meta.pt")
    (root / "README.md").write_text("runs")
    expected = (folder / ".metadata", *sorted(folder.glob("*.distcp")), folder / "meta.pt")
    source = resolve(folder)
    assert source.files == expected
    assert open_checkpoint(source).source.files == expected
    found = discover(root)
    assert [(f.path, f.files) for f in found.checkpoints] == [(folder, expected)]
    from safetensors import safe_open

    from ckptport.sources import sha256_files

    out = tmp_path / "out.safetensors"
    ckptport.normalize_file(folder, out)
    with safe_open(out, "pt") as written:  # provenance: the hash of the layout's files
        assert written.metadata()["ckptport.source_sha256"] == sha256_files(expected)


def test_a_folder_holding_no_checkpoint_fails_the_gate(tmp_path, run):
    """A CI export that wrote only its config and README fails ``check`` (exit 2, its own
    finding), as an empty folder does."""
    export = tmp_path / "export"
    export.mkdir()
    checked = run("check", export)
    assert checked.exit_code == 2 and "holds no checkpoint: it is empty" in checked.stdout
    (export / "config.json").write_text("{}")
    (export / "README.md").write_text("# model")
    checked = run("check", export, "--format", "json")
    assert checked.exit_code == 2
    report = json.loads(checked.stdout)
    [finding] = report["files"][0]["findings"]
    assert finding["code"] == "CKP008" and "none of its 2 files is one" in finding["message"]


def test_a_model_folders_companions_are_not_unchecked_noise(tmp_path, run):
    """configs, tokenizers and cards beside the weights are the layout's own: not listed as
    files no loader opens; a pickle under a config's name is still checked."""
    folder = tmp_path / "model"
    folder.mkdir()
    save_file(WEIGHTS, folder / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "README.md", "merges.txt"):
        (folder / name).write_text("{}")
    checked = run("check", folder.parent, "--format", "json")
    assert checked.exit_code == 0, checked.stdout
    report = json.loads(checked.stdout)
    assert [f["path"] for f in report["files"]] == [str(folder / "model.safetensors")]
    assert report["skipped"] == []
    torch.save({"w": torch.ones(1)}, folder / "generation_config.json")
    report = json.loads(run("check", folder.parent, "--format", "json").stdout)
    assert str(folder / "generation_config.json") in [f["path"] for f in report["files"]]
