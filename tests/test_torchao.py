"""torchao tensor subclasses: quantized by torchao on the CPU, dequantized by torchao (the oracle).

A tiny model is quantized once per session with each torchao config that runs on a CPU,
saved as ``torch.save(model.state_dict())`` writes it (the subclasses pickled, in the zip and
the legacy format) and as
torchao's safetensors support flattens it; ckptport reads both without importing torchao
and dequantizes each weight bit for bit as the subclass's own ``dequantize()`` does.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.helpers import same_bits

pytest.importorskip("torchao", reason="the test extra's torchao is not installed")

DTYPES = ("bfloat16", "float16", "float32")


@pytest.fixture(scope="session")
def torchao_model(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Two Linear layers per config, each quantized by ``quantize_``; Float8 with dynamic
    activations, and Float8 in blocks, built by ``Float8Tensor.from_hp`` as ``Float8Dynamic
    ActivationFloat8WeightConfig`` builds them (the config itself asserts a CUDA GPU of
    compute capability 8.9; ``Float8WeightOnlyConfig`` takes no ``PerBlock``)."""
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict
    from torchao.quantization import (
        Float8Tensor,
        Float8WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8DynamicActivationIntxWeightConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
        PerGroup,
        PerTensor,
        quantize_,
    )
    from torchao.quantization.granularity import PerBlock
    from torchao.quantization.quantize_.workflows import QuantizeTensorToFloat8Kwargs

    torch.manual_seed(0)
    configs = {"int8": (Int8WeightOnlyConfig(), torch.bfloat16),
               "int8_g32": (Int8WeightOnlyConfig(granularity=PerGroup(32)), torch.float32),
               "w8a8": (Int8DynamicActivationInt8WeightConfig(), torch.float32),
               "fp8": (Float8WeightOnlyConfig(), torch.bfloat16),
               "fp8_tensor": (Float8WeightOnlyConfig(granularity=PerTensor()), torch.float32),
               "int4": (IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                             granularity=PerGroup(32)), torch.bfloat16),
               "a8w4": (Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4),
                        torch.float32)}
    model = torch.nn.Module()
    for name, (config, dtype) in configs.items():
        layers = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16)).to(dtype)
        quantize_(layers, config)
        setattr(model, name, layers)
    dynamic = torch.nn.Linear(64, 32)
    dynamic.weight = torch.nn.Parameter(Float8Tensor.from_hp(
        dynamic.weight.detach(), granularity=PerTensor(),
        act_quant_kwargs=QuantizeTensorToFloat8Kwargs(granularity=PerTensor())),
        requires_grad=False)
    model.fp8_dynamic = dynamic
    blocks = torch.nn.Linear(64, 64).to(torch.bfloat16)  # 32x32 blocks, as DeepSeek's are
    blocks.weight = torch.nn.Parameter(Float8Tensor.from_hp(
        blocks.weight.detach(), granularity=PerBlock([32, 32])), requires_grad=False)
    model.fp8_blocks = blocks
    model.norm = torch.nn.LayerNorm(16)
    state = model.state_dict()
    folder = tmp_path_factory.mktemp("torchao")
    torch.save(state, folder / "model.pth")
    torch.save(state, folder / "legacy.pth", _use_new_zipfile_serialization=False)
    tensors, metadata = flatten_tensor_state_dict(state)
    save_file(tensors, folder / "model.safetensors", metadata=metadata)
    subclasses = {k: v for k, v in state.items() if type(v) is not torch.Tensor}
    oracle = {dtype: {k: _dequantized(v, getattr(torch, dtype)) for k, v in subclasses.items()}
              for dtype in DTYPES}
    return SimpleNamespace(folder=folder, pth=folder / "model.pth", legacy=folder / "legacy.pth",
                           safetensors=folder / "model.safetensors", state=state,
                           tensors=tensors, metadata=metadata, oracle=oracle)


def _dequantized(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torchao's own: ``dequantize(output_dtype)`` where the class takes one; else (Intx)
    ``dequantize()`` in the weight's own dtype, cast."""
    if type(weight).__name__ == "IntxUnpackedToInt8Tensor":
        return weight.dequantize().to(dtype)
    return weight.dequantize(output_dtype=dtype)


@pytest.mark.parametrize("container", ["pth", "legacy", "safetensors"])
def test_torchao_dequantized_as_the_library_does(torchao_model, run, tmp_path, container):
    source = getattr(torchao_model, container)
    plain = {k: v for k, v in torchao_model.state.items() if type(v) is torch.Tensor}
    for dtype in DTYPES:
        out = tmp_path / f"{dtype}.safetensors"
        result = run("normalize", source, out, "--dequantize", dtype)
        assert result.exit_code == 0, result.output
        assert "dequantized 16 torchao weights" in result.stdout
        written = load_file(out)
        assert sorted(written) == sorted(torchao_model.state)
        for name, expected in torchao_model.oracle[dtype].items():
            assert same_bits(written[name], expected), (name, dtype)
        assert all(same_bits(written[k], v) for k, v in plain.items())


def test_torchao_inspect_shows_each_class_and_its_tensors(torchao_model, run):
    doc = json.loads(run("inspect", torchao_model.pth, "--format", "json").stdout)
    weights = {w["weight"]: w for w in doc["quantization"]["weights"]}
    assert doc["quantization"]["schemes"] == {"torchao": 16}
    int4 = weights["int4.0.weight"]
    assert int4["params"]["class"] == "IntxUnpackedToInt8Tensor"
    assert int4["params"]["block_size"] == [1, 32] and int4["params"]["dtype"] == "bfloat16"
    assert int4["tensors"] == {"qdata": "int4.0._weight_qdata", "scale": "int4.0._weight_scale",
                               "zero_point": "int4.0._weight_zero_point"}
    dynamic = weights["fp8_dynamic.weight"]["params"]
    assert dynamic["class"] == "Float8Tensor" and dynamic["block_size"] == [32, 64]
    assert dynamic["activation"] == "QuantizeTensorToFloat8Kwargs"
    assert weights["w8a8.1.weight"]["params"]["activation"] == "QuantizeTensorToInt8Kwargs"
    assert weights["fp8_blocks.weight"]["params"]["block_size"] == [32, 32]
    assert weights["fp8_tensor.0.weight"]["params"]["block_size"] == [32, 64]
    from_file = json.loads(run("inspect", torchao_model.safetensors, "--format", "json").stdout)
    assert {w["weight"]: w for w in from_file["quantization"]["weights"]} == weights


def test_torchao_codes_are_never_cast_and_kept_as_torchao_lays_them_out(torchao_model, run,
                                                                     tmp_path):
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    cast = run("normalize", torchao_model.pth, tmp_path / "cast.safetensors", "--dtype",
               "float16")
    assert cast.exit_code == 2 and "--dequantize" in cast.stderr
    assert not (tmp_path / "cast.safetensors").exists()
    kept = tmp_path / "kept.safetensors"
    assert run("normalize", torchao_model.pth, kept).exit_code == 0
    written = load_file(kept)  # the inner tensors, under the names torchao's safetensors uses
    assert sorted(written) == sorted(torchao_model.tensors)
    assert all(same_bits(written[k], v) for k, v in torchao_model.tensors.items())
    with safe_open(kept, "pt") as handle:  # and the metadata: torchao's loader reads it back
        metadata = handle.metadata()
    back, left = unflatten_tensor_state_dict(written, metadata)
    assert not left and sorted(back) == sorted(torchao_model.state)
    for name, original in torchao_model.state.items():
        assert type(back[name]) is type(original), name
        expected = original.dequantize() if type(original) is not torch.Tensor else original
        got = back[name].dequantize() if type(original) is not torch.Tensor else back[name]
        assert same_bits(got, expected), name
    again = tmp_path / "again.safetensors"  # ckptport reads its own output as torchao's
    assert run("normalize", kept, again, "--dequantize", "float32").exit_code == 0
    assert all(same_bits(load_file(again)[k], v)
               for k, v in torchao_model.oracle["float32"].items())
    with safe_open(again, "pt") as handle:  # dequantized: no torchao entry left behind
        assert "tensor_names" not in handle.metadata()


def _forged_safetensors(model: SimpleNamespace, path: Path, tensors: dict[str, torch.Tensor],
                        metadata: dict[str, object]) -> Path:
    """The flattened file with tensors replaced (None: left out) and weights' metadata
    rewritten."""
    docs = dict(model.metadata)
    for name, change in metadata.items():
        doc = json.loads(docs[name])
        doc["_data"].update(change)  # type: ignore[call-overload]
        docs[name] = json.dumps(doc)
    kept = {k: v for k, v in {**model.tensors, **tensors}.items() if v is not None}
    save_file(kept, path, metadata=docs)
    return path


@pytest.mark.parametrize(("tensors", "metadata", "weight", "why"), [
    ({"int8.0._weight_scale": torch.ones(32, 3)}, {}, "int8.0.weight", "does not tile"),
    ({"int8.0._weight_scale": torch.ones(32, 1, dtype=torch.int32)}, {},
     "int8.0._weight_scale", "not float32"),
    ({"fp8.0._weight_qdata": torch.zeros(32, 64, dtype=torch.int8)}, {},
     "fp8.0._weight_qdata", "not an FP8 dtype"),
    ({}, {"fp8.1.weight": {"block_size": [1, 16]}}, "fp8.1.weight", "block_size [1, 16]"),
    ({"int4.0._weight_zero_point": torch.zeros(32, 1, dtype=torch.int8)}, {},
     "int4.0._weight_zero_point", "does not match its scale"),
    ({"int8.0._weight_qdata": None}, {}, "int8.0._weight_scale", "without its codes"),
])
def test_forged_inner_tensors_are_refused(torchao_model, run, tmp_path, tensors, metadata,
                                          weight, why):
    path = _forged_safetensors(torchao_model, tmp_path / "forged.safetensors", tensors,
                               metadata)
    result = run("normalize", path, tmp_path / "out.safetensors", "--dequantize")
    line = result.stderr.strip()
    assert result.exit_code == 2 and "\n" not in line, result.output
    assert "forged.safetensors" in line and weight in line and why in line, line
    assert not (tmp_path / "out.safetensors").exists()
    doc = json.loads(run("check", path, "--format", "json").stdout)
    hits = [f"{f['key']}: {f['message']}" for f in doc["files"][0]["findings"]
            if f["code"] == "CKP016"]
    assert any(h.startswith(weight) and why in h for h in hits), hits


def test_forged_subclass_in_a_pth_is_refused(run, tmp_path):
    """torchao's constructors check nothing: a scale that does not tile its codes saves."""
    from torchao.quantization import Int8Tensor

    forged = Int8Tensor(torch.zeros(32, 64, dtype=torch.int8), torch.ones(3, 1), [1, 64],
                        torch.float32)
    path = tmp_path / "forged.pth"
    torch.save({"m.weight": forged}, path)
    result = run("normalize", path, tmp_path / "out.pth", "--dequantize")
    assert result.exit_code == 2
    assert "forged.pth" in result.stderr and "m.weight" in result.stderr
    assert "does not tile" in result.stderr
    assert run("check", path, "--codes", "CKP016").exit_code == 1
    hollow = tmp_path / "hollow.pth"  # a subclass whose qdata is not a tensor
    hollowed = Int8Tensor(torch.zeros(32, 64, dtype=torch.int8), torch.ones(32, 1), [1, 64],
                          torch.float32)
    hollowed.qdata = None
    torch.save({"m.weight": hollowed}, hollow)
    hollowed_out = run("normalize", hollow, tmp_path / "hollow.safetensors")
    assert hollowed_out.exit_code == 2
    assert "hollow.pth: m.weight: a torchao Int8Tensor without its qdata" in hollowed_out.stderr
    clash = tmp_path / "clash.pth"  # an inner tensor's flattened name taken: never overwritten
    torch.save({"m.weight": forged, "m._weight_scale": torch.ones(3)}, clash)
    shown = run("inspect", clash)
    assert shown.exit_code == 2
    assert "clash.pth: m._weight_scale: both a tensor and the scale" in shown.stderr


class _Payload:
    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.sentinel}",))


class _Int8TensorWithPayload:
    """Pickles as torchao's Int8Tensor does, with a payload where its ``qdata`` goes."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        from torchao.quantization import Int8Tensor

        wrapper = (Int8Tensor, torch.float32, (2, 2), (2, 1), 0, torch.strided,
                   torch.device("cpu"), False)
        return (torch._tensor._rebuild_from_type_v2,
                (torch._utils._rebuild_wrapper_subclass, Int8Tensor, wrapper,
                 {"qdata": _Payload(self.sentinel), "block_size": [1, 2]}))


def _with_pickle(path: Path, data: bytes) -> Path:
    """A torch zip whose data.pkl is ``data`` (written by torch's own zip writer)."""
    torch.save({}, path)
    with zipfile.ZipFile(path) as archive:
        records = {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}
    writer = torch._C.PyTorchFileWriter(str(path))
    for name, record in {**records, "data.pkl": data}.items():
        writer.write_record(name, record, len(record))
    writer.write_end_of_file()
    return path


def test_hostile_torchao_pickles_are_refused(run, tmp_path, sentinel):
    inside = tmp_path / "inside.pth"
    torch.save({"0.weight": _Int8TensorWithPayload(sentinel)}, inside)
    # a torchao name that reaches code: pickle resolves "torchao" + "os.system" to os.system
    import torchao

    assert torchao.os.system is os.system  # type: ignore[attr-defined]
    command = f"touch {sentinel}".encode()
    data = (b"\x80\x04}\x94(\x8c\x080.weight\x94\x8c\x07torchao\x94\x8c\x09os.system\x94\x93"
            + b"\x8c" + bytes([len(command)]) + command + b"\x85Ru.")
    named = _with_pickle(tmp_path / "named.pth", data)
    for path in (inside, named):
        refused = run("normalize", path, tmp_path / "o.pth", "--dequantize")
        assert refused.exit_code == 2, refused.output
        assert "system" in refused.stderr and str(path) in refused.stderr, refused.stderr
        shown = run("inspect", path)  # a report reads it leniently and names the danger
        assert "DANGEROUS" in shown.stdout and "system" in shown.stdout, shown.output
    assert not sentinel.exists()
    assert not (tmp_path / "o.pth").exists()



@pytest.fixture(scope="session")
def torchao_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A tiny Llama quantized by transformers' torchao integration (int4 weights in groups
    of 32, bfloat16) and saved by ``save_pretrained`` as it ships them: a shard set of
    torchao's flattened safetensors, the metadata in every shard; and the quantized model."""
    from torchao.quantization import IntxWeightOnlyConfig, PerGroup
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, TorchAoConfig

    from fixtures.quantized import TINY_LLAMA

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("torchao-llama")
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(torch.bfloat16).save_pretrained(root / "plain")
    config = TorchAoConfig(quant_type=IntxWeightOnlyConfig(weight_dtype=torch.int4,
                                                           granularity=PerGroup(32)))
    model = AutoModelForCausalLM.from_pretrained(root / "plain", quantization_config=config,
                                                 dtype=torch.bfloat16)
    model.save_pretrained(root / "quantized", max_shard_size="60KB")
    assert len(list((root / "quantized").glob("model-*.safetensors"))) == 2
    return root / "quantized", model


def test_torchao_model_folder_dequantized_loads_with_the_librarys_logits(torchao_llama, run,
                                                                        tmp_path):
    """normalize FOLDER/ OUT/ --dequantize: from_pretrained(OUT) gives the logits of the
    model with the quantized one's weights, each its own dequantize(); in float32 each weight
    is that bfloat16 result cast (the shards' metadata says the class and its dtype)."""
    from transformers import AutoModelForCausalLM

    folder, quantized = torchao_llama
    library = {name: _dequantized(p, torch.float32) for name, p in
               quantized.state_dict().items() if type(p) is not torch.Tensor}
    wide = tmp_path / "wide.safetensors"
    assert run("normalize", folder, wide, "--dequantize", "float32").exit_code == 0
    written = load_file(wide)
    assert library and all(same_bits(written[k], v) for k, v in library.items())
    out = tmp_path / "out"
    result = run("normalize", folder, f"{out}/", "--dequantize", "bfloat16")
    assert result.exit_code == 0, result.output
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    plain = AutoModelForCausalLM.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(folder.parent / "plain")
    reference.load_state_dict({k: v.dequantize() if type(v) is not torch.Tensor else v
                               for k, v in quantized.state_dict().items()})
    tokens = torch.arange(24).reshape(2, 12) % 128
    with torch.no_grad():
        assert torch.equal(plain(tokens).logits, reference(tokens).logits)


def test_torchao_bin_shard_set_read_as_one_layout(torchao_model, run, tmp_path):
    """A ``.bin`` shard set of pickled subclasses: its index names the weights, each shard
    holds them whole; ckptport reads it as one checkpoint and dequantizes each weight."""
    state, folder = torchao_model.state, tmp_path / "set"
    folder.mkdir()
    names = list(state)
    halves = {"pytorch_model-00001-of-00002.bin": names[:len(names) // 2],
              "pytorch_model-00002-of-00002.bin": names[len(names) // 2:]}
    for shard, keys in halves.items():
        torch.save({k: state[k] for k in keys}, folder / shard)
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in halves.items()
                                        for k in keys}}))
    out = tmp_path / "out.safetensors"
    result = run("normalize", folder, out, "--dequantize", "float16")
    assert result.exit_code == 0, result.output
    written = load_file(out)
    assert sorted(written) == sorted(state)
    assert all(same_bits(written[k], v) for k, v in torchao_model.oracle["float16"].items())


def test_torchao_weights_found_under_a_checkpoints_own_keys(torchao_model, run, tmp_path):
    """A training checkpoint ({"model": DDP's "module."-prefixed state, "step": ...}): the
    rules pick the model and strip the prefix, and each weight keeps its class and dtype
    (an IntxUnpackedToInt8Tensor in bfloat16, dequantized to float32, is that result cast)."""
    path = tmp_path / "train.pth"
    torch.save({"model": {f"module.{k}": v for k, v in torchao_model.state.items()},
                "step": 3}, path)
    out = tmp_path / "out.safetensors"
    result = run("normalize", path, out, "--dequantize", "float32")
    assert result.exit_code == 0, result.output
    written = load_file(out)
    assert all(same_bits(written[k], v) for k, v in torchao_model.oracle["float32"].items())


def test_a_flattened_file_without_torchao_metadata_is_dequantized_as_a_stated_guess(
        torchao_model, run, tmp_path):
    """No metadata: the class is read from the codes' dtype, and the report says so per weight
    (a guess is never silent); with the metadata, nothing is guessed."""
    bare = tmp_path / "bare.safetensors"
    save_file(dict(torchao_model.tensors), bare)
    out = tmp_path / "out.safetensors"
    result = run("normalize", bare, out, "--dequantize", "float32", "--format", "json")
    assert result.exit_code == 0, result.output
    rule = next(r for r in json.loads(result.stdout)["rules"] if r["rule"] == "dequantize")
    guessed = rule["details"]["guessed"]
    assert guessed and all(c["key"] in guessed and "guessed: no torchao metadata" in c["detail"]
                           for c in rule["changes"])
    assert f"{len(guessed)} of them guessed" in rule["summary"]
    text = run("normalize", bare, out, "--dequantize", "float32", "--overwrite")
    assert text.exit_code == 0 and "guessed" in text.output
    plain = run("normalize", torchao_model.pth, out, "--dequantize", "float32", "--overwrite",
                "--format", "json")
    rule = next(r for r in json.loads(plain.stdout)["rules"] if r["rule"] == "dequantize")
    assert "guessed" not in rule["details"] and "guessed" not in rule["summary"]


def test_check_finds_zero_torchao_scales(torchao_model, run, tmp_path):
    scale = torchao_model.tensors["w8a8.0._weight_scale"].clone()
    scale[3] = 0.0
    path = _forged_safetensors(torchao_model, tmp_path / "zero.safetensors",
                               {"w8a8.0._weight_scale": scale}, {})
    doc = json.loads(run("check", path, "--format", "json").stdout)
    hits = [f"{f['key']}: {f['message']}" for f in doc["files"][0]["findings"]
            if f["code"] == "CKP016"]
    assert hits == ["w8a8.0._weight_scale: torchao scale of w8a8.0.weight holds 1 zero values: "
                    "the codes of those blocks dequantize to NaN or 0"], hits
    clean = json.loads(run("check", torchao_model.pth, "--format", "json").stdout)
    assert not [f for f in clean["files"][0]["findings"] if f["code"] == "CKP016"]


def test_torchao_recognized_without_torch(torchao_model):
    """The subclasses are data: inspecting the .pth imports neither torchao nor torch."""
    import subprocess
    import sys

    from tests.test_inspect import _NO_TORCH

    done = subprocess.run([sys.executable, "-c", _NO_TORCH, "inspect", str(torchao_model.pth)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch was imported" not in done.stderr
    assert "quantization: torchao (16 weights)" in done.stdout
