"""``ckptport normalize`` end to end: outputs loaded back with public APIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import ckptport
from ckptport.tree import KEY_ALIASES as ALIASES_KEY
from fixtures.models import TiedLM, TinyNet
from tests.helpers import load_output, load_trusted, same_bits, sha256

FORMATS = ["pth", "safetensors"]


def _plain_keys() -> list[str]:
    return list(TinyNet().state_dict())


@pytest.mark.parametrize("ext", FORMATS)
def test_ddp_cuda3_checkpoint_loads_on_cpu_into_unwrapped_model(fx, run, tmp_path, ext):
    out = tmp_path / f"model.{ext}"
    result = run("normalize", fx["ddp_cuda3"], out)
    assert result.exit_code == 0, result.stderr
    assert "15 storages cuda:3 -> cpu" in result.stdout
    assert "picked state_dict" in result.stdout

    state = load_output(out)
    assert list(state) == _plain_keys() if ext == "pth" else sorted(state) == sorted(_plain_keys())
    TinyNet().load_state_dict(state, strict=True)
    truth = load_trusted(fx["ddp_cuda3"])["state_dict"]
    for key, tensor in truth.items():
        got = state[key.removeprefix("module.")]
        assert got.device.type == "cpu" and same_bits(got, tensor), key


def test_raw_gpu_file_really_fails_plain_torch_load(fx):
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
        torch.load(fx["ddp_cuda3"], weights_only=True)


@pytest.mark.parametrize("name", ["dp_in_ddp", "compile_plain", "compile_ddp", "fsdp_style"])
@pytest.mark.parametrize("ext", FORMATS)
def test_wrapper_prefixes_are_stripped(fx, run, tmp_path, name, ext):
    out = tmp_path / f"model.{ext}"
    assert run("normalize", fx[name], out).exit_code == 0
    state = load_output(out)
    TinyNet().load_state_dict(state, strict=True)
    truth = load_trusted(fx["plain"])
    assert all(same_bits(state[k], truth[k]) for k in truth)


def test_legacy_and_zip_sources_give_identical_bytes(fx, run, tmp_path):
    a, b = tmp_path / "zip.pth", tmp_path / "legacy.pth"
    assert run("normalize", fx["ddp_cuda3"], a).exit_code == 0
    result = run("normalize", fx["ddp_cuda3_legacy"], b)
    assert result.exit_code == 0, result.stderr
    assert "torch-legacy" in result.stdout
    assert sha256(a) == sha256(b)


def test_batchnorm_metadata_is_renamed_with_the_keys(fx, run, tmp_path):
    out = tmp_path / "m.pth"
    run("normalize", fx["ddp_cuda3"], out)
    state = torch.load(out, weights_only=True)
    assert state._metadata[""] == {"version": 1}
    assert state._metadata["bn"]["version"] == 2
    assert not any(k.startswith("module") for k in state._metadata)
    assert state["bn.num_batches_tracked"].dtype == torch.int64
    assert int(state["bn.num_batches_tracked"]) == 2  # trained twice in the fixture


def test_safetensors_keeps_module_versions_for_our_reader(fx, run, tmp_path):
    out = tmp_path / "m.safetensors"
    run("normalize", fx["ddp_cuda3"], out)
    tree = ckptport.read(out).tree
    assert tree._metadata["bn"]["version"] == 2
    assert list(tree) == _plain_keys()


def test_slice_of_big_tensor_is_written_small(fx, run, tmp_path):
    for ext in FORMATS:
        out = tmp_path / f"s.{ext}"
        result = run("normalize", fx["slice"], out)
        assert result.exit_code == 0
        assert "compacted 2 tensors" in result.stdout
        assert out.stat().st_size < 3000, out.stat().st_size  # source is ~1 MB
        state = load_output(out)
        assert torch.equal(state["small"], torch.arange(10, 14, dtype=torch.float32))
        assert torch.equal(state["strided"], torch.arange(0, 20, 2, dtype=torch.float32))
    loaded = torch.load(tmp_path / "s.pth", weights_only=True)
    assert loaded["small"].untyped_storage().nbytes() == 16


def test_views_of_one_buffer_become_separate_tensors(fx, run, tmp_path):
    out = tmp_path / "v.pth"
    run("normalize", fx["views"], out)
    state = torch.load(out, weights_only=True)
    assert state["a"].untyped_storage().data_ptr() != state["b"].untyped_storage().data_ptr()
    assert torch.equal(state["b"], torch.arange(4, 8, dtype=torch.float32))


def test_non_contiguous_tensor_becomes_contiguous(fx, run, tmp_path):
    for ext in FORMATS:
        out = tmp_path / f"n.{ext}"
        run("normalize", fx["noncontig"], out)
        t = load_output(out)["t"]
        assert t.is_contiguous() and torch.equal(t, torch.arange(12.0).reshape(3, 4).t())


def test_tied_weights_stay_tied(fx, run, tmp_path):
    pth, st = tmp_path / "t.pth", tmp_path / "t.safetensors"
    run("normalize", fx["tied"], pth)
    run("normalize", fx["tied"], st)
    state = torch.load(pth, weights_only=True)
    assert state["embed.weight"].untyped_storage().data_ptr() == \
        state["out.weight"].untyped_storage().data_ptr()
    with safe_open(str(st), framework="pt") as f:
        assert sorted(f.keys()) == ["embed.weight"]  # stored once
        assert json.loads(f.metadata()[ALIASES_KEY]) == {"embed.weight": ["out.weight"]}
    tree = ckptport.read(st).tree
    assert tree["out.weight"] is tree["embed.weight"]
    model = TiedLM()
    model.load_state_dict(tree, strict=True)
    assert torch.equal(model.out.weight, state["out.weight"])


@pytest.mark.parametrize("ext", FORMATS)
def test_every_dtype_roundtrips_bit_exact(fx, run, tmp_path, ext):
    out = tmp_path / f"d.{ext}"
    result = run("normalize", fx["dtypes"], out)
    assert result.exit_code == 0, result.stderr
    state = load_output(out)
    truth = load_trusted(fx["dtypes"])
    assert set(state) == set(truth)
    for key, tensor in truth.items():
        assert same_bits(state[key], tensor), key
    assert state["scalar"].dim() == 0 and state["empty"].shape == (0, 3)
    assert torch.signbit(state["nan_and_negzero"][1]) and state["nan_and_negzero"][0].isnan()


@pytest.mark.parametrize("ext", FORMATS)
def test_output_is_deterministic_across_processes(fx, run, tmp_path, ext):
    a, b = tmp_path / f"a.{ext}", tmp_path / f"b.{ext}"
    assert run("normalize", fx["ddp_cuda3"], a, "--select", "all").exit_code == 0
    subprocess.run([sys.executable, "-m", "ckptport", "normalize", str(fx["ddp_cuda3"]), str(b),
                    "--select", "all", "-q"], check=True, capture_output=True)
    assert sha256(a) == sha256(b)


def test_select_all_pth_holds_plain_data_only(fx, run, tmp_path):
    out = tmp_path / "all.pth"
    result = run("normalize", fx["ddp_cuda3"], out, "--select", "all")
    assert result.exit_code == 0, result.stderr
    tree = torch.load(out, weights_only=True)  # no allow-list: only plain types remain
    truth = load_trusted(fx["ddp_cuda3"])
    assert tree["args"] == {"lr": 0.1, "arch": "tinynet", "input_size": (3, 8, 8)}
    assert type(tree["args"]["input_size"]) is tuple
    assert tree["best_acc"] == 0.8125 and type(tree["best_acc"]) is float
    assert tree["step"] == 1200 and type(tree["step"]) is int
    assert torch.equal(tree["class_weights"], torch.from_numpy(truth["class_weights"]))
    assert tree["epoch"] == 3
    momentum = tree["optimizer"]["state"][0]["momentum_buffer"]
    assert same_bits(momentum, truth["optimizer"]["state"][0]["momentum_buffer"])
    assert tree["optimizer"]["param_groups"][0]["lr"] == 0.1
    TinyNet().load_state_dict(tree["state_dict"], strict=True)
    assert "converted" in result.stdout and "argparse.Namespace -> dict" in result.stdout


def test_select_all_safetensors_rebuilds_the_tree(fx, run, tmp_path):
    pth, st = tmp_path / "all.pth", tmp_path / "all.safetensors"
    run("normalize", fx["ddp_cuda3"], pth, "--select", "all")
    run("normalize", fx["ddp_cuda3"], st, "--select", "all")
    from ckptport.compare import tree_mismatches

    assert tree_mismatches(torch.load(pth, weights_only=True), ckptport.read(st).tree) == []
    with safe_open(str(st), framework="pt") as f:
        assert "optimizer.state.0.momentum_buffer" in f.keys()
        assert f.metadata()["format"] == "pt"
        assert f.metadata()["ckptport.source_sha256"] == sha256(fx["ddp_cuda3"])


def test_select_named_key_and_missing_key(fx, run, tmp_path):
    out = tmp_path / "o.pth"
    assert run("normalize", fx["ddp_cuda3"], out, "--select", "state_dict").exit_code == 0
    result = run("normalize", fx["ddp_cuda3"], tmp_path / "x.pth", "--select", "weights")
    assert result.exit_code == 2
    assert "no key 'weights'" in result.stderr and "state_dict" in result.stderr


def test_auto_never_guesses_between_dicts_of_tensors(fx, run, tmp_path):
    """Two candidates and no known name: an error listing both, never a pick by size."""
    out = tmp_path / "n.pth"
    result = run("normalize", fx["nested"], out)
    assert result.exit_code == 2 and not out.exists()
    assert "cannot tell which dict of tensors holds the weights: stuff.weights" in result.stderr
    assert "stuff.tiny (1 entries" in result.stderr and "--select KEY" in result.stderr
    result = run("normalize", fx["nested"], out, "--select", "stuff.weights")
    assert result.exit_code == 0
    TinyNet().load_state_dict(torch.load(out, weights_only=True), strict=True)


def test_auto_never_picks_optimizer_state(tmp_path, run):
    """facial_emotion_recognition's model.pkl: {"network": ..., "optimizer": ...}, legacy;
    the Adam moments of one layer once won by size (exit 0, 2 tensors instead of 32)."""
    torch.manual_seed(0)
    network = TinyNet()
    optimizer = torch.optim.Adam(network.parameters())
    network(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    src = tmp_path / "model.pkl"
    torch.save({"network": network.state_dict(), "optimizer": optimizer.state_dict()}, src,
               _use_new_zipfile_serialization=False)
    out = tmp_path / "out.pth"
    result = run("normalize", src, out)
    assert result.exit_code == 0, result.stderr
    assert "picked network: the only dict of tensors outside optimizer state" in result.stdout
    loaded = torch.load(out, weights_only=True)
    assert list(loaded) == list(network.state_dict())
    TinyNet().load_state_dict(loaded, strict=True)


def test_ema_timm_and_mmengine(fx, run, tmp_path):
    plain = load_trusted(fx["ema_timm"])
    out = tmp_path / "e.pth"
    result = run("normalize", fx["ema_timm"], out, "--ema")
    assert "state_dict_ema" in result.stdout
    got = torch.load(out, weights_only=True)
    assert all(torch.equal(got[k], plain["state_dict_ema"][k]) for k in got)
    result = run("normalize", fx["ema_timm"], tmp_path / "n.pth")
    assert "EMA weights are also present" in result.stdout
    result = run("normalize", fx["ema_mmengine"], tmp_path / "m.pth", "--ema")
    assert "mmengine convention" in result.stdout and "picked state_dict" in result.stdout


def test_strip_prefix_and_keep_prefixes(fx, run, tmp_path):
    kept = tmp_path / "k.pth"
    run("normalize", fx["dp_in_ddp"], kept, "--keep-prefixes")
    assert all(k.startswith("module.module.") for k in torch.load(kept, weights_only=True))
    extra = tmp_path / "x.pth"
    run("normalize", fx["dp_in_ddp"], extra, "--keep-prefixes", "--strip-prefix", "module.")
    assert list(torch.load(extra, weights_only=True)) == _plain_keys()


def test_prefix_collision_names_both_keys(fx, run, tmp_path):
    out = tmp_path / "c.pth"
    result = run("normalize", fx["collide"], out)
    assert result.exit_code == 2
    assert "'module.w' and 'w'" in result.stderr and not out.exists()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dtype_casts_floating_tensors_only(fx, run, tmp_path, dtype):
    out = tmp_path / "c.safetensors"
    assert run("normalize", fx["ddp_cuda3"], out, "--dtype", dtype).exit_code == 0
    state = load_output(out)
    truth = load_trusted(fx["ddp_cuda3"])["state_dict"]
    assert state["conv.weight"].dtype == getattr(torch, dtype)
    assert torch.equal(state["conv.weight"], truth["module.conv.weight"].to(getattr(torch, dtype)))
    assert state["bn.num_batches_tracked"].dtype == torch.int64


def test_anchor_records_cuda_without_a_gpu(fx, run, tmp_path):
    out = tmp_path / "a.pth"
    assert run("normalize", fx["plain"], out, "--anchor", "cuda:1").exit_code == 0
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(out, weights_only=True)
    assert ckptport.read(out).source.storage_locations == {"cuda:1": 9}
    assert run("normalize", fx["plain"], tmp_path / "b.pth", "--anchor", "gpu").exit_code == 2


def test_json_report_lists_every_rule(fx, run, tmp_path):
    result = run("normalize", fx["ddp_cuda3"], tmp_path / "j.pth", "--format", "json")
    doc = json.loads(result.stdout)
    assert [r["rule"] for r in doc["rules"]] == [
        "select", "map-to-cpu", "convert-objects", "strip-prefixes", "cast-dtype",
        "compact-tensors"]
    assert doc["selection"]["picked"] == "state_dict"
    assert "optimizer" in doc["selection"]["others"]
    strip = doc["rules"][3]
    assert len(strip["changes"]) == 9 and strip["details"]["prefixes_removed"] == ["module."]
    assert doc["source"]["storage_locations"] == {"cuda:3": 15}
    assert doc["output"]["verified"] is True and doc["output"]["tensors"] == 9


def test_python_api_matches_cli(fx, tmp_path):
    report = ckptport.normalize_file(fx["ddp_cuda3"], tmp_path / "p.safetensors",
                              ckptport.NormalizeOptions(dtype="float16"))
    assert report.output.verified and report.output.tensors == 9
    normalized = ckptport.normalize(ckptport.read(fx["ddp_cuda3"]))
    assert [r.rule for r in normalized.results][0] == "select"
    assert list(normalized.checkpoint.tree) == _plain_keys()


def test_progress_callback_sees_every_byte(fx, tmp_path):
    seen: dict[str, list[int]] = {}

    def progress(description: str, total: int):
        seen[description] = [total, 0]
        return lambda n: seen[description].__setitem__(1, seen[description][1] + n)

    ckptport.normalize_file(fx["ddp_cuda3"], tmp_path / "p.safetensors", progress=progress)
    writing, verifying = seen["writing p.safetensors"], seen["verifying p.safetensors"]
    assert verifying[0] == verifying[1] > 0
    assert writing[1] == writing[0] == verifying[0]


def test_trust_warns(fx, run, tmp_path):
    result = run("normalize", fx["plain"], tmp_path / "t.pth", "--trust")
    assert result.exit_code == 0 and "warning: --trust" in result.stderr


def test_help_does_not_import_torch():
    code = "import sys; from ckptport.cli import main; sys.argv=['ckptport','--help']\n" \
           "try: main()\nexcept SystemExit: pass\nassert 'torch' not in sys.modules, 'torch!'"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_debug_env_shows_traceback(fx, tmp_path):
    env = {**os.environ, "CKPTPORT_DEBUG": "1"}
    proc = subprocess.run([sys.executable, "-m", "ckptport", "normalize", str(fx["random"]),
                           str(tmp_path / "x.pth")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def _dir_listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


@pytest.mark.parametrize("ext", FORMATS)
def test_deferred_casts_are_made_one_at_a_time(tmp_path, ext, monkeypatch):
    """The streaming pipeline never holds two computed tensors at once (``Pending`` leaves)."""
    import weakref

    import ckptport.tensors.data
    from ckptport.checkpoint import Checkpoint, Format, SourceFacts
    from ckptport.dtypes import by_name
    from ckptport.tensors import Pending

    alive, peak, made = [0], [0], [0]
    real = ckptport.tensors.data.to_torch

    def counting(leaf, storages=None):
        tensor = real(leaf, storages)
        if isinstance(leaf, Pending):
            made[0] += 1
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
            weakref.finalize(tensor, lambda: alive.__setitem__(0, alive[0] - 1))
        return tensor

    monkeypatch.setattr(ckptport.tensors.data, "to_torch", counting)
    tree = {f"t{i}": Pending(torch.full((256,), float(i)), by_name("float16"))
            for i in range(6)}
    tree["tied"] = tree["t0"]
    src = SourceFacts(path=tmp_path / "none", format=Format.TORCH_ZIP, size=0)
    out = tmp_path / f"out.{ext}"
    ckptport.write(Checkpoint(tree, src), out)
    assert made[0] >= 6 and peak[0] == 1
    state = load_output(out)
    assert all(torch.equal(state[f"t{i}"], torch.full((256,), float(i), dtype=torch.float16))
               for i in range(6))
    if ext == "pth":
        tied, first = state["tied"], state["t0"]
        assert tied.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()


def test_streaming_convert_casts_lazily_but_reports_the_same(fx, tmp_path):
    from ckptport.tensors import Pending

    eager = ckptport.normalize(ckptport.read(fx["ddp_cuda3"]),
                               ckptport.NormalizeOptions(dtype="bfloat16"))
    lazy = ckptport.normalize(ckptport.read(fx["ddp_cuda3"]),
                              ckptport.NormalizeOptions(dtype="bfloat16"), lazy=True)
    assert eager.results == lazy.results
    assert isinstance(lazy.checkpoint.tree["conv.weight"], Pending)
    assert isinstance(eager.checkpoint.tree["conv.weight"], torch.Tensor)
    assert eager.checkpoint.tree["conv.weight"].dtype == torch.bfloat16


def test_a_failing_read_back_publishes_nothing(fx, tmp_path, monkeypatch):
    from ckptport.errors import VerificationError

    def refuse(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no such global")

    monkeypatch.setattr(torch, "load", refuse)
    dst = tmp_path / "model.pth"
    with pytest.raises(VerificationError, match="does not load with weights_only=True: no such"):
        ckptport.normalize_file(fx["ddp_cuda3"], dst)
    assert list(tmp_path.iterdir()) == []
