"""Where checkpoints come from: DCP folders, Hugging Face folders, Lightning; load_into."""

from __future__ import annotations

import os
import pickle
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

import ckptport
import ckptport.commands.load
from ckptport.compare import tree_mismatches
from fixtures.models import TinyNet
from tests.helpers import load_output, load_trusted, same_bits


@pytest.fixture
def dcp_folder(tmp_path):
    """A real DCP checkpoint written by torch.distributed.checkpoint.save, no process group."""
    torch.manual_seed(1)
    state = {"model": {f"module.{k}": v for k, v in TinyNet().state_dict().items()},
             "step": 7, "name": "run-1", "sched": {"lr": 0.1}}
    folder = tmp_path / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    return folder, state


def test_dcp_folder_reads_as_the_saved_tree(dcp_folder, run, tmp_path):
    folder, state = dcp_folder
    tree = ckptport.read(folder).tree
    assert tree_mismatches(state, tree) == []
    out = tmp_path / "m.safetensors"
    result = run("normalize", folder, out)
    assert result.exit_code == 0, result.stderr
    assert "picked model" in result.stdout and "dcp" in result.stdout
    TinyNet().load_state_dict(load_output(out), strict=True)


def test_dcp_round_trip_and_diff(fx, run, tmp_path):
    out = tmp_path / "out_dcp"
    result = run("normalize", fx["ddp_cuda3"], out, "--to", "dcp")
    assert result.exit_code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp"]
    # torch's own loader, as a training job would use it
    target = {k: torch.empty_like(v) for k, v in TinyNet().state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, checkpoint_id=out, no_dist=True)
    truth = load_trusted(fx["ddp_cuda3"])["state_dict"]
    assert all(same_bits(target[k], truth["module." + k]) for k in target)
    assert ckptport.diff(out, fx["ddp_cuda3"]).equal


def test_dcp_output_keeps_lists_and_optimizer_state_as_torch_save_to_dcp_does(fx, run,
                                                                               tmp_path):
    result = run("normalize", fx["ddp_cuda3"], tmp_path / "d", "--to", "dcp", "--select", "all")
    assert result.exit_code == 0, result.stderr
    assert "DCP keeps dict keys as strings" in result.stdout
    tree = ckptport.read(tmp_path / "d").tree
    truth = load_trusted(fx["ddp_cuda3"])
    assert same_bits(tree["optimizer"]["state"]["0"]["momentum_buffer"],
                     truth["optimizer"]["state"][0]["momentum_buffer"])
    assert tree["optimizer"]["param_groups"][0]["params"] == \
        truth["optimizer"]["param_groups"][0]["params"]


def test_malicious_dcp_metadata_is_refused(dcp_folder, run, tmp_path, sentinel):
    folder, _ = dcp_folder

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {sentinel}",))

    (folder / ".metadata").write_bytes(pickle.dumps(Payload()))
    result = run("normalize", folder, tmp_path / "o.pth")
    assert result.exit_code == 2
    assert "refers to posix.system, which is not DCP metadata" in result.stderr
    assert not sentinel.exists() and not (tmp_path / "o.pth").exists()


def test_dcp_data_file_outside_the_folder_is_refused(dcp_folder, run, tmp_path):
    folder, _ = dcp_folder
    metadata = ckptport.readers.dcp.read_dcp_metadata(folder)
    for info in metadata.storage_data.values():
        info.relative_path = "../../etc/passwd.distcp"
    with (folder / ".metadata").open("wb") as f:
        pickle.dump(metadata, f)
    result = run("normalize", folder, tmp_path / "o.pth")
    assert result.exit_code == 2 and "only plain *.distcp names" in result.stderr


def test_hugging_face_model_folder_as_source(fx, run, tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert run("normalize", fx["ddp_cuda3"], folder / "model.safetensors").exit_code == 0
    out = tmp_path / "o.pth"
    assert run("normalize", folder, out).exit_code == 0
    TinyNet().load_state_dict(torch.load(out, weights_only=True), strict=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("normalize", empty, tmp_path / "x.pth")
    assert result.exit_code == 2 and "no checkpoint in it" in result.stderr


def test_lightning_checkpoint_is_recognized_and_hinted(run, tmp_path):
    net = TinyNet()
    ckpt = {"epoch": 2, "global_step": 40, "pytorch-lightning_version": "2.4.0",
            "state_dict": {f"model.{k}": v for k, v in net.state_dict().items()},
            "hyper_parameters": {"lr": 0.01, "layers": [1, 2]}, "loops": {}, "callbacks": {}}
    src = tmp_path / "epoch=2.ckpt"
    torch.save(ckpt, src)
    result = run("normalize", src, tmp_path / "a.pth")
    assert "a Lightning checkpoint (version 2.4.0)" in result.stdout
    assert "add --strip-prefix model." in result.stdout
    out = tmp_path / "b.pth"
    assert run("normalize", src, out, "--strip-prefix", "model.").exit_code == 0
    TinyNet().load_state_dict(torch.load(out, weights_only=True), strict=True)
    everything = tmp_path / "all.pth"
    run("normalize", src, everything, "--select", "all", "--strip-prefix", "model.")
    assert torch.load(everything, weights_only=True)["hyper_parameters"] == \
        {"lr": 0.01, "layers": [1, 2]}


WRAPS = {
    "plain": lambda m: m,
    "dataparallel": nn.DataParallel,
    "compiled": torch.compile,
    "compiled-dataparallel": lambda m: torch.compile(nn.DataParallel(m)),
}


@pytest.mark.parametrize("model_wrap", list(WRAPS))
@pytest.mark.parametrize("source", ["ddp_cuda3", "plain", "compile_ddp", "fsdp_style"])
def test_load_into_matches_wrapped_and_unwrapped(fx, model_wrap, source):
    model = WRAPS[model_wrap](TinyNet())
    result = ckptport.load_into(model, fx[source])
    assert result == ckptport.commands.load.LoadResult((), (), (), len(model.state_dict()))
    truth = ckptport.load_state_dict(fx[source])
    inner = model._orig_mod if hasattr(model, "_orig_mod") else model
    inner = inner.module if isinstance(inner, nn.DataParallel) else inner
    assert all(torch.equal(v, truth[k]) for k, v in inner.state_dict().items())


def test_load_into_mismatch_explains_and_suggests(fx):
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = TinyNet()

    with pytest.raises(ckptport.StateDictMismatchError) as err:
        ckptport.load_into(Wrapper(), fx["plain"])
    text = str(err.value)
    assert "9 model keys missing" in text and "backbone.conv.weight (closest: conv.weight)" in text
    assert "load into model.backbone instead" in text
    lightning_like = {f"net.{k}": v for k, v in TinyNet().state_dict().items()}
    path = fx["plain"].parent / "net_prefixed.pth"
    torch.save(lightning_like, path)
    with pytest.raises(ckptport.StateDictMismatchError, match="--strip-prefix net."):
        ckptport.load_into(TinyNet(), path)
    with pytest.raises(ckptport.StateDictMismatchError, match="filled no tensor"):
        ckptport.load_into(TinyNet(), path, strict=False)  # a load that loads nothing


def test_load_state_dict_maps_to_the_device_asked(fx):
    state = ckptport.load_state_dict(fx["ddp_cuda3"], device="meta")
    assert {t.device.type for t in state.values()} == {"meta"}
    assert list(state) == list(TinyNet().state_dict())
    assert state._metadata["bn"]["version"] == 2


def test_renamed_copy_reads_the_same(fx, tmp_path):
    """A renamed copy (.bin) reads the same: the container comes from the bytes."""
    copy = tmp_path / "weights.bin"
    shutil.copy(fx["plain"], copy)
    assert ckptport.diff(copy, fx["plain"]).equal


def test_drift_plot_is_a_png_of_the_right_series(fx, run, tmp_path):
    from ckptport.render.plot import drift_series

    state = ckptport.load_state_dict(fx["plain"])
    moved = {k: v.clone() for k, v in state.items()}
    moved["conv.weight"] = moved["conv.weight"] * (1 + 1e-3)
    moved["head.1.bias"] = moved["head.1.bias"].to(torch.bfloat16).to(torch.float32)
    other = tmp_path / "moved.pth"
    torch.save(moved, other)
    png = tmp_path / "drift.png"
    result = run("diff", fx["plain"], other, "--rtol", "1e-2", "--plot", png)
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib import image

    height, width, _ = image.imread(png).shape
    assert width >= 600 and height == 400

    series = drift_series(ckptport.diff(fx["plain"], other, rtol=1e-2))
    assert series.keys == tuple(state)  # model order
    by_key = dict(zip(series.keys, series.max_rel, strict=True))
    assert by_key["conv.weight"] == pytest.approx(1e-3, rel=1e-3)
    assert 0 < by_key["head.1.bias"] < 4e-3  # bfloat16 rounding
    assert all(v == 0 for k, v in by_key.items() if k not in ("conv.weight", "head.1.bias"))
    assert series.tolerance == 1e-2


def test_torchscript_is_refused_unless_trusted(run, tmp_path, sentinel):
    model = TinyNet().eval()
    scripted = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(model), scripted)
    out = tmp_path / "state.safetensors"
    result = run("normalize", scripted, out)
    assert result.exit_code == 2 and "a TorchScript archive (torch.jit.save)" in result.stderr
    assert "with --trust its parameters and buffers are extracted" in result.stderr
    assert not out.exists()
    result = run("normalize", scripted, out, "--trust")
    assert result.exit_code == 0, result.stderr
    assert "warning: --trust" in result.stderr and "torchscript" in result.stdout
    state = load_output(out)
    TinyNet().load_state_dict(state, strict=True)
    assert all(same_bits(state[k], v) for k, v in model.state_dict().items())
    assert not sentinel.exists()


def test_dcp_metadata_with_a_lying_length_is_refused_before_allocating(dcp_folder, run,
                                                                      tmp_path):
    """Found by the fuzzer: BYTEARRAY8 claiming 2**40 bytes made the C unpickler allocate."""
    import struct

    folder, _ = dcp_folder
    (folder / ".metadata").write_bytes(b"\x80\x05\x96" + struct.pack("<Q", 2**40) + b"x" * 8)
    result = run("normalize", folder, tmp_path / "o.pth")
    assert result.exit_code == 2
    assert "declares 1099511627776 bytes, past the end of the data" in result.stderr


def test_inspect_reports_the_dcp_planner_metadata(dcp_folder, run):
    import json

    folder, state = dcp_folder
    result = run("inspect", folder, "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["format"] == "dcp" and doc["metadata"]["dcp.data_files"] == "__0_0.distcp"
    planner = json.loads(doc["metadata"]["dcp.planner_data"])
    assert planner["model.module.conv.weight"] == ["model", "module.conv.weight"]
    assert int(doc["metadata"]["dcp.items"]) == len(TinyNet().state_dict()) + 3
    assert "dcp.planner_data" in run("inspect", folder).stdout


def test_safetensors_headers_of_every_length_are_safetensors(tmp_path):
    """A header length whose first byte is a pickle opcode (0x70 'p' = PUT, 0x63 'c' =
    GLOBAL, …) is not a polyglot: the unpickler stops at the opcode's argument."""
    import struct

    from ckptport.checkpoint import Format
    from ckptport.containers.sniff import sniff
    from ckptport.sources import open_source

    data = struct.pack("<2f", 1.0, 2.0)
    base = '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    for length in range(len(base), 300):
        path = tmp_path / f"h{length}.safetensors"
        header = base.ljust(length).encode()
        path.write_bytes(struct.pack("<Q", length) + header + data)
        source = open_source(path)
        try:
            assert sniff(source) is Format.SAFETENSORS, length
        finally:
            source.close()
