"""Shard sets in and out: Hugging Face layout, hostile indexes, atomic publication."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import ckptport
from ckptport.writers import shards as shard_writer
from ckptport.writers.plan import parse_size
from ckptport.writers.shards import split_shards
from fixtures.models import TiedLM, TinyNet
from tests.helpers import load_output, sha256


@pytest.mark.parametrize(("to", "index"), [("safetensors", "model.safetensors.index.json"),
                                           ("pth", "pytorch_model.bin.index.json")])
def test_shard_set_round_trip_is_byte_identical_to_single_file(fx, run, tmp_path, to, index):
    folder = tmp_path / "set"
    result = run("normalize", fx["ddp_cuda3"], folder, "--max-shard-size", "1KB", "--to", to)
    assert result.exit_code == 0, result.stderr
    doc = json.loads((folder / index).read_text())
    shards = sorted(set(doc["weight_map"].values()))
    stem, ext = ("model", ".safetensors") if to == "safetensors" else ("pytorch_model", ".bin")
    assert shards == [f"{stem}-0000{i}-of-00003{ext}" for i in (1, 2, 3)]
    assert doc["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in TinyNet().state_dict().values())
    for shard in shards:
        state = load_output(folder / shard)  # each shard loads on its own, public APIs
        assert state and all(doc["weight_map"][k] == shard for k in state)

    single, merged = tmp_path / "single.pth", tmp_path / "merged.pth"
    run("normalize", fx["ddp_cuda3"], single)
    for source in (folder, folder / index):  # the folder or its index
        assert run("normalize", source, merged, "--overwrite").exit_code == 0
        assert sha256(merged) == sha256(single)
    TinyNet().load_state_dict(ckptport.read(folder).tree, strict=True)


def test_safetensors_shards_carry_format_pt(fx, run, tmp_path):
    run("normalize", fx["ddp_cuda3"], tmp_path / "s", "--max-shard-size", "1KB")
    for shard in (tmp_path / "s").glob("*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            assert f.metadata()["format"] == "pt"


def test_one_shard_is_written_without_index(fx, run, tmp_path):
    folder = tmp_path / "one"
    folder.mkdir()
    assert run("normalize", fx["ddp_cuda3"], folder).exit_code == 0
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors"]


@pytest.mark.parametrize("to", ["pth", "safetensors"])
def test_tied_tensors_land_in_one_shard(run, tmp_path, to):
    model = TiedLM()
    state = model.state_dict()
    src = tmp_path / "tied.pth"
    torch.save({"embed.weight": state["embed.weight"], "middle": torch.ones(3),
                "out.weight": state["out.weight"]}, src)
    folder = tmp_path / "tied"
    result = run("normalize", src, folder, "--max-shard-size", "10B", "--to", to)
    assert result.exit_code == 0, result.stderr
    index = next(folder.glob("*.index.json"))
    weight_map = json.loads(index.read_text())["weight_map"]
    tree = ckptport.read(folder).tree
    if to == "pth":  # a .bin shard's pickle holds both names over one storage
        assert weight_map["embed.weight"] == weight_map["out.weight"] != weight_map["middle"]
        assert tree["embed.weight"].untyped_storage().data_ptr() == \
            tree["out.weight"].untyped_storage().data_ptr()
        assert torch.equal(tree["out.weight"], model.out.weight)
    else:  # the hub's convention: a tied name is left out, never mapped to a shard lacking it
        assert "out.weight" not in weight_map
        assert weight_map["embed.weight"] != weight_map["middle"]
        assert "left 1 tied names out" in result.stdout
        # ckptport records it in the index's metadata and reads the set back whole, tied
        metadata = json.loads(index.read_text())["metadata"]
        assert metadata["ckptport.aliases"] == {"out.weight": "embed.weight"}
        assert tree["out.weight"] is tree["embed.weight"]
        from safetensors.torch import load_file
        hub_view = {k: v for shard in folder.glob("*.safetensors") for k, v in
                    load_file(shard).items()}
        assert "out.weight" not in hub_view  # what the hub's loaders see: the model re-ties it
    assert torch.equal(tree["embed.weight"], model.embed.weight)
    assert ckptport.diff(src, folder).equal  # a tied name on one side only is not a difference


def test_split_keeps_order_and_puts_big_tensors_alone():
    state = {"a": torch.zeros(10), "b": torch.zeros(100), "c": torch.zeros(1), "d": torch.zeros(1)}
    assert split_shards(state, 100) == [["a"], ["b"], ["c", "d"]]


@pytest.mark.parametrize(("text", "size"), [("5GB", 5 * 10**9), ("500MB", 5 * 10**8),
                                            ("2GiB", 2 * 2**30), ("1.5gb", 15 * 10**8),
                                            ("123B", 123), ("1024", 1024), (7, 7)])
def test_parse_size(text, size):
    """A bare number of text is bytes from a KiB up; an int from Python is bytes."""
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "5XB", "0"])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(ValueError):
        parse_size(text)


def _set(tmp_path, fx, run):
    folder = tmp_path / "set"
    run("normalize", fx["ddp_cuda3"], folder, "--max-shard-size", "1KB")
    return folder, folder / "model.safetensors.index.json"


def _rewrite(index, edit):
    doc = json.loads(index.read_text())
    edit(doc["weight_map"])
    index.write_text(json.dumps(doc))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m.update({"conv.weight": "/etc/passwd.safetensors"}), "plain file names"),
    (lambda m: m.update({"conv.weight": "../model-00001-of-00003.safetensors"}),
     "plain file names"),
    (lambda m: m.update({"conv.weight": "model.bin"}), "not a .safetensors file"),
    (lambda m: m.update({"conv.weight": "model-00009-of-00009.safetensors"}), "is missing"),
    (lambda m: m.update({"ghost.weight": "model-00001-of-00003.safetensors"}),
     "keys no shard holds"),
    (lambda m: m.update({"conv.weight": "model-00002-of-00003.safetensors"}),
     "but the index puts it in"),
])
def test_hostile_or_broken_index(fx, run, tmp_path, edit, message):
    folder, index = _set(tmp_path, fx, run)
    _rewrite(index, edit)
    result = run("normalize", folder, tmp_path / "o.pth")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert str(index) in result.stderr and not (tmp_path / "o.pth").exists()


def test_key_in_two_shards(fx, run, tmp_path):
    folder = tmp_path / "dup"
    folder.mkdir()
    from safetensors.torch import save_file

    save_file({"w": torch.ones(1)}, folder / "model-00001-of-00002.safetensors")
    save_file({"v": torch.ones(1), "w": torch.ones(1)},
              folder / "model-00002-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "model-00001-of-00002.safetensors",
                        "v": "model-00002-of-00002.safetensors"}}))
    result = run("normalize", folder, tmp_path / "o.pth")
    assert result.exit_code == 2 and "is in two shards" in result.stderr


def test_interrupted_set_leaves_the_old_set_intact(fx, run, tmp_path, monkeypatch):
    folder, index = _set(tmp_path, fx, run)
    before = {p.name: sha256(p) for p in folder.iterdir()}
    calls = []
    real_emit = shard_writer.emit

    def emit_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_emit(*args, **kwargs)

    monkeypatch.setattr(shard_writer, "emit", emit_then_interrupt)
    result = run("normalize", fx["ddp_cuda3"], folder, "--max-shard-size", "2KB", "--overwrite")
    assert result.exit_code == 130
    assert {p.name: sha256(p) for p in folder.iterdir()} == before  # no temp folder left


def test_existing_set_needs_overwrite_and_stale_shards_go(fx, run, tmp_path):
    folder, _ = _set(tmp_path, fx, run)
    (folder / "config.json").write_text("{}")
    result = run("normalize", fx["ddp_cuda3"], folder, "--max-shard-size", "100MB")
    assert result.exit_code == 2 and "pass --overwrite" in result.stderr
    result = run("normalize", fx["ddp_cuda3"], folder, "--max-shard-size", "100MB",
                 "--overwrite")
    assert result.exit_code == 0
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


def test_select_all_cannot_be_sharded(fx, run, tmp_path):
    result = run("normalize", fx["ddp_cuda3"], tmp_path / "s", "--max-shard-size", "1KB",
                 "--select", "all")
    assert result.exit_code == 2 and "flat state dict" in result.stderr


def test_safetensors_writer_golden_bytes(tmp_path):
    """The streaming writer's bytes for a tiny file, and the official reader accepts them."""
    from ckptport.checkpoint import Checkpoint, Format, SourceFacts

    src = SourceFacts(path=tmp_path / "none", format=Format.SAFETENSORS, size=0)
    tree = {"b": torch.tensor([1, 2], dtype=torch.int16), "a": torch.tensor([1.5])}
    out = tmp_path / "tiny.safetensors"
    ckptport.write(Checkpoint(tree, src), out)
    raw = out.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    header = raw[8:8 + length]
    tree_json = ('{"__dict__":[["b",{"__tensor__":"b"}],["a",{"__tensor__":"a"}]]}')
    expected = (
        '{"__metadata__":{"ckptport.tree":' + json.dumps(tree_json)
        + ',"ckptport.version":"' + ckptport.__version__ + '","format":"pt"},'
        '"a":{"data_offsets":[0,4],"dtype":"F32","shape":[1]},'
        '"b":{"data_offsets":[4,8],"dtype":"I16","shape":[2]}}'
    )
    assert header.decode().rstrip(" ") == expected
    assert raw[8 + length:] == struct.pack("<f", 1.5) + struct.pack("<hh", 1, 2)
    with safe_open(str(out), framework="pt") as f:
        assert torch.equal(f.get_tensor("b"), tree["b"])


@pytest.mark.parametrize("size", ["2", "1023", " 5 "])
def test_a_small_size_without_a_unit_is_refused(fx, run, tmp_path, size):
    """``--max-shard-size 2`` meant 2GB; as bytes it wrote one shard per tensor."""
    result = run("normalize", fx["plain"], tmp_path / "out", "--max-shard-size", size)
    assert result.exit_code == 2 and "without a unit is" in result.stderr
    assert "name the unit" in result.stderr and not (tmp_path / "out").exists()



def _hub_set(folder: Path) -> Path:
    """A shard set as the hub writes it (``huggingface_hub.save_torch_state_dict``)."""
    from huggingface_hub import save_torch_state_dict

    torch.manual_seed(0)
    state = {"layer0.weight": torch.randn(16, 16), "layer1.weight": torch.randn(8, 16),
             "layer2.weight": torch.randn(8, 16), "layer3.weight": torch.randn(16, 16)}
    folder.mkdir()
    save_torch_state_dict(state, folder, max_shard_size=1100)
    assert len(list(folder.glob("model-*-of-00003.safetensors"))) == 3
    return folder / "model.safetensors.index.json"


def _cut(doc: dict) -> None:  # shard 2's keys gone from the index: a cut index
    doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if "00002" not in v}


def _doubled(doc: dict, folder: Path) -> None:  # shard 2 (layer1, layer2) named twice
    shutil.copy(folder / "model-00002-of-00003.safetensors",
                folder / "model-2-of-00003.safetensors")
    doc["weight_map"]["layer2.weight"] = "model-2-of-00003.safetensors"


def _foreign(doc: dict, folder: Path) -> None:  # a shard of another save's set
    (folder / "model-00002-of-00003.safetensors").rename(
        folder / "model-00002-of-00004.safetensors")
    doc["weight_map"].update({"layer1.weight": "model-00002-of-00004.safetensors",
                              "layer2.weight": "model-00002-of-00004.safetensors"})


@pytest.mark.parametrize(("edit", "message"), [
    (lambda doc, folder: _cut(doc), "shard 2 is named by no key"),
    (_doubled, "names one shard as 2 files (model-00002-of-00003.safetensors, "
               "model-2-of-00003.safetensors)"),
    (_foreign, "shards of 2 different sets"),
])
def test_a_numbered_shard_set_is_whole_or_refused(run, tmp_path, edit, message):
    """The hub numbers its shards (-00002-of-00003): an index that names no key of a shard
    left that shard's tensors out silently; one shard under two names, or shards of two
    sets, are files of two saves."""
    index = _hub_set(tmp_path / "set")
    whole = run("normalize", index.parent, tmp_path / "whole.safetensors")
    assert whole.exit_code == 0, whole.stderr
    doc = json.loads(index.read_text())
    edit(doc, index.parent)
    index.write_text(json.dumps(doc))
    result = run("normalize", index.parent, tmp_path / "o.pth")
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "o.pth").exists()
    checked = run("check", index.parent)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout and message in checked.stdout
