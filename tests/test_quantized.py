"""Low-precision dtypes read and written bit for bit; quantized weights never cast as numbers,
and dequantized exactly as the schemes' reference libraries do (transformers' integrations)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptport.dtypes import DTYPES
from tests.helpers import load_output, same_bits

# every dtype torch 2.13 can save, as torch lays it out
TORCH_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
                "complex128", "complex64", "int64", "int32", "int16", "int8", "uint64",
                "uint32", "uint16", "uint8", "bool", "bits8", "bits16", "bits1x8", "bits2x4",
                "bits4x2")


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=torch.Generator().manual_seed(seed)).bool()
    size = torch.empty(0, dtype=dtype).element_size() * torch.Size(shape).numel()
    raw = torch.randint(0, 256, (size,), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(seed))
    return raw.view(dtype).reshape(shape)


def _raw_safetensors(path: Path, entries: dict[str, tuple[str, list[int], bytes]]) -> Path:
    """A safetensors file as the format specifies it (for dtypes torch cannot make: FP6)."""
    header, data = {}, b""
    for name, (code, shape, raw) in entries.items():
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [len(data),
                                                                        len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("dtypes")
    tensors = {name: _random(getattr(torch, name), (3, 4), seed)
               for seed, name in enumerate(TORCH_DTYPES)}
    torch.save(tensors, folder / "all.pth")
    stored = {k: v for k, v in tensors.items() if DTYPES[k].safetensors}
    save_file(stored, folder / "all.safetensors")
    fp6 = bytes(range(24))
    _raw_safetensors(folder / "fp6.safetensors", {"a": ("F6_E2M3", [2, 8], fp6[:12]),
                                                  "b": ("F6_E3M2", [1, 16], fp6[12:])})
    return {"pth": folder / "all.pth", "safetensors": folder / "all.safetensors",
            "fp6": folder / "fp6.safetensors"}


@pytest.mark.parametrize("source", ["pth", "safetensors"])
@pytest.mark.parametrize("to", ["pth", "safetensors"])
def test_every_dtype_round_trips_bit_for_bit(every_dtype, run, tmp_path, source, to):
    truth = load_output(every_dtype[source])
    if to == "safetensors":
        truth = {k: v for k, v in truth.items() if DTYPES[str(v.dtype)[6:]].safetensors}
        pick = [a for k in truth for a in ("--keep", k)] if source == "pth" else []
    else:
        pick = []
    out = tmp_path / f"out.{to}"
    result = run("normalize", every_dtype[source], out, *pick)
    assert result.exit_code == 0, result.output
    written = load_output(out)
    assert sorted(written) == sorted(truth)
    for name, tensor in truth.items():
        assert same_bits(written[name], tensor), name
    assert run("diff", every_dtype[source], out, *pick).exit_code == 0


def test_f4_header_counts_values_and_torch_counts_bytes(every_dtype, tmp_path, run):
    """safetensors records F4's logical shape (two values a byte); torch's float4_e2m1fn_x2
    packs pairs along the last dimension: both meanings survive a round trip."""
    out = tmp_path / "f4.safetensors"
    assert run("normalize", every_dtype["pth"], out, "--keep", "float4_e2m1fn_x2").exit_code == 0
    (length,) = struct.unpack("<Q", out.read_bytes()[:8])
    header = json.loads(out.read_bytes()[8:8 + length])
    assert header["float4_e2m1fn_x2"]["dtype"] == "F4"
    assert header["float4_e2m1fn_x2"]["shape"] == [3, 8]
    assert load_file(out)["float4_e2m1fn_x2"].shape == (3, 4)


def test_manifest_digest_is_one_across_containers(every_dtype, run):
    digests = []
    for side in ("pth", "safetensors"):
        result = run("manifest", every_dtype[side], "--keep", "float*", "--keep", "int*",
                     "--keep", "uint*", "--keep", "bool", "--keep", "complex64")
        assert result.exit_code == 0, result.output
        digests.append(json.loads(result.stdout)["digest"])
    assert digests[0] == digests[1]


def test_fp6_is_safetensors_only(every_dtype, run, tmp_path):
    out = tmp_path / "fp6.safetensors"
    result = run("normalize", every_dtype["fp6"], out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[-24:] == bytes(range(24))
    inspected = run("inspect", every_dtype["fp6"], "--format", "json")
    assert "float6_e2m3fn_x4" in inspected.stdout
    refused = run("normalize", every_dtype["fp6"], tmp_path / "fp6.pth")
    assert refused.exit_code == 2
    assert "torch 2.13 has no float6" in refused.stderr
    assert not (tmp_path / "fp6.pth").exists()
    assert run("diff", every_dtype["fp6"], out).exit_code == 0
    changed = tmp_path / "changed.safetensors"
    changed.write_bytes(out.read_bytes()[:-1] + b"\x00")
    assert run("diff", every_dtype["fp6"], changed).exit_code == 1


@pytest.mark.parametrize(("code", "shape", "size", "why"), [
    ("F4", [2, 3], 3, "they do not divide"),        # valid bytes, but not torch's pairs
    ("F6_E2M3", [2, 2], 3, "they do not divide"),
    ("F4", [3], 2, "byte"),                         # 12 bits: not whole bytes
])
def test_packed_shapes_torch_cannot_mean_are_refused(tmp_path, run, code, shape, size, why):
    path = _raw_safetensors(tmp_path / "odd.safetensors", {"x": (code, shape, bytes(size))})
    result = run("inspect", path)
    assert result.exit_code == 2
    assert "odd.safetensors" in result.stderr and "'x'" in result.stderr


# -- FP8 block-scaled: transformers writes it (Fp8Quantize) and dequantizes it (oracle) ----


def _fp8_quantize(key: str, weight: torch.Tensor, scale_fmt: str | None = None
                  ) -> dict[str, torch.Tensor]:
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    config = SimpleNamespace(weight_block_size=[128, 128], scale_fmt=scale_fmt)
    return Fp8Quantize(SimpleNamespace(quantization_config=config))._quantize_one(key, weight)


def _fp8_reference(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    return Fp8Dequantize(None)._dequantize_one(codes, scale, output_dtype=dtype)


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = torch.Generator().manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    state.update(_fp8_quantize("model.layers.0.mlp.up_proj.weight",
                               torch.randn(256, 384, generator=g).bfloat16()))
    state.update(_fp8_quantize("model.layers.0.mlp.down_proj.weight",
                               torch.randn(384, 256, generator=g).bfloat16(), "ue8m0"))
    state.update(_fp8_quantize("model.layers.0.mlp.experts.gate_up_proj",
                               torch.randn(2, 256, 128, generator=g).bfloat16()))
    state["model.layers.0.input_layernorm.weight"] = torch.randn(384, generator=g).bfloat16()
    state["model.embed_tokens.weight"] = torch.randn(10, 384, generator=g).bfloat16()
    folder = tmp_path_factory.mktemp("fp8")
    save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}}))
    return folder / "model.safetensors"


QUANTIZED = ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
             "model.layers.0.mlp.experts.gate_up_proj")


def test_dtype_refuses_to_cast_fp8_codes_and_scales(fp8, run, tmp_path):
    """Issue 26.4: the cast that used to give weights thousands of times off, exit 0."""
    out = tmp_path / "out.safetensors"
    result = run("normalize", fp8, out, "--dtype", "bfloat16")
    assert result.exit_code == 2
    assert "fp8-block" in result.stderr and "--dequantize" in result.stderr
    assert "model.safetensors" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_fp8_dequantized_as_transformers_does(fp8, run, tmp_path, dtype):
    out = tmp_path / "out.safetensors"
    result = run("normalize", fp8, out, "--dequantize", dtype, "--format", "json")
    assert result.exit_code == 0, result.output
    source, written = load_file(fp8), load_file(out)
    assert sorted(written) == sorted(k for k in source if not k.endswith("_scale_inv"))
    for name in QUANTIZED:
        expected = _fp8_reference(source[name], source[name + "_scale_inv"],
                                  getattr(torch, dtype))
        assert same_bits(written[name], expected), name
    for name in ("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"):
        assert same_bits(written[name], source[name])
    report = json.loads(result.stdout)
    assert "fp8-block" in json.dumps(report)


def test_unquantized_tensors_still_cast_once_dequantized(fp8, run, tmp_path):
    out = tmp_path / "out.safetensors"
    result = run("normalize", fp8, out, "--dequantize", "--dtype", "float32")
    assert result.exit_code == 0, result.output
    source, written = load_file(fp8), load_file(out)
    name = "model.layers.0.mlp.up_proj.weight"
    assert same_bits(written[name], _fp8_reference(source[name], source[name + "_scale_inv"],
                                                   torch.bfloat16).float())
    norm = "model.layers.0.input_layernorm.weight"
    assert same_bits(written[norm], source[norm].float())


def test_fp8_partial_blocks_scaled_as_deepseek_does(tmp_path, run):
    """A weight the 128x128 block does not divide (DeepSeek-V3's kv_a_proj_with_mqa is 576
    rows): the edge blocks are cut short, as DeepSeek's weight_dequant and compressed-tensors'
    FP8BlockDequantizer do (transformers' refuses such shapes)."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randn(200, 300, generator=g).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 3, generator=g) + 0.5
    path = tmp_path / "partial.safetensors"
    save_file({"w.weight": codes, "w.weight_scale_inv": scale}, path)
    out = tmp_path / "out.safetensors"
    assert run("normalize", path, out, "--dequantize").exit_code == 0
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import (
        FP8BlockDequantizer,
    )

    expected = FP8BlockDequantizer(dtype=torch.bfloat16)._create_dequantized_weight(codes, scale)
    assert same_bits(load_file(out)["w.weight"], expected)


@pytest.mark.parametrize(("tensors", "why"), [
    ({"w.weight_scale_inv": torch.ones(1, 1)}, "without its weight"),
    ({"w.weight": torch.zeros(256, 256, dtype=torch.float8_e4m3fn),
      "w.weight_scale_inv": torch.ones(3, 2)}, "does not tile"),
    ({"w.weight": torch.zeros(256, 256, dtype=torch.float8_e4m3fn),
      "w.weight_scale_inv": torch.ones(2, 2, dtype=torch.int32)}, "dtype torch.int32"),
    ({"w.weight": torch.zeros(256, 256, dtype=torch.bfloat16),
      "w.weight_scale_inv": torch.ones(2, 2)}, "not an FP8 dtype"),
])
def test_fp8_that_cannot_be_dequantized_is_refused(tmp_path, run, tensors, why):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, path)
    out = tmp_path / "out.safetensors"
    result = run("normalize", path, out, "--dequantize")
    assert result.exit_code == 2
    assert why in result.stderr and "bad.safetensors" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_plain_fp8_without_scales_still_casts(tmp_path, run):
    path = tmp_path / "plain.safetensors"
    codes = torch.randn(4, 4).to(torch.float8_e5m2)
    save_file({"w": codes}, path)
    out = tmp_path / "out.safetensors"
    assert run("normalize", path, out, "--dtype", "float32").exit_code == 0
    assert same_bits(load_file(out)["w"], codes.float())


# -- MXFP4 (gpt-oss): built as transformers' layout specifies; its dequantizer is the oracle --


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    g = torch.Generator().manual_seed(2)
    experts, rows, groups = 2, 6, 3
    state = {
        "model.layers.0.mlp.experts.gate_up_proj_blocks":
            torch.randint(0, 256, (experts, rows, groups, 16), dtype=torch.uint8, generator=g),
        "model.layers.0.mlp.experts.gate_up_proj_scales":
            torch.randint(118, 136, (experts, rows, groups), dtype=torch.uint8, generator=g),
        "model.layers.0.mlp.experts.gate_up_proj_bias": torch.randn(experts, rows).bfloat16(),
        "model.layers.0.mlp.experts.down_proj_blocks":
            torch.randint(0, 256, (experts, 4, 1, 16), dtype=torch.uint8, generator=g),
        "model.layers.0.mlp.experts.down_proj_scales":
            torch.randint(120, 130, (experts, 4, 1), dtype=torch.uint8,
                          generator=g).view(torch.float8_e8m0fnu),
    }
    path = tmp_path_factory.mktemp("mxfp4") / "model.safetensors"
    save_file(state, path)
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_mxfp4_dequantized_as_transformers_does(mxfp4, run, tmp_path, dtype):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out = tmp_path / "out.safetensors"
    result = run("normalize", mxfp4, out, "--dequantize", dtype)
    assert result.exit_code == 0, result.output
    source, written = load_file(mxfp4), load_file(out)
    prefix = "model.layers.0.mlp.experts."
    assert sorted(written) == [f"{prefix}down_proj", f"{prefix}gate_up_proj",
                               f"{prefix}gate_up_proj_bias"]
    for proj in ("gate_up_proj", "down_proj"):
        expected = convert_moe_packed_tensors(source[f"{prefix}{proj}_blocks"],
                                              source[f"{prefix}{proj}_scales"].view(torch.uint8),
                                              dtype=getattr(torch, dtype))
        assert same_bits(written[prefix + proj], expected), proj


def test_mxfp4_scales_are_never_cast(mxfp4, run, tmp_path):
    result = run("normalize", mxfp4, tmp_path / "out.safetensors", "--dtype", "float32")
    assert result.exit_code == 2
    assert "mxfp4" in result.stderr and "--dequantize" in result.stderr


# -- every command speaks of schemes -------------------------------------------------------


def test_inspect_shows_the_scheme_and_its_tensors(fp8, run):
    text = run("inspect", fp8)
    assert text.exit_code == 0
    assert "quantization: fp8-block (3 weights)" in text.stdout
    assert "model.layers.0.mlp.up_proj.weight_scale_inv" in text.stdout
    doc = json.loads(run("inspect", fp8, "--format", "json").stdout)["quantization"]
    assert doc["schemes"] == {"fp8-block": 3}
    weight = next(w for w in doc["weights"] if w["weight"] == QUANTIZED[0])
    assert weight["params"]["block_size"] == [128, 128]
    assert weight["tensors"] == {"codes": QUANTIZED[0], "scale": QUANTIZED[0] + "_scale_inv"}


def test_manifest_records_the_scheme_and_dequantized_digest(fp8, run, tmp_path):
    doc = json.loads(run("manifest", fp8).stdout)
    assert doc["quantization"]["schemes"] == {"fp8-block": 3}
    out = tmp_path / "plain.safetensors"
    assert run("normalize", fp8, out, "--dequantize").exit_code == 0
    dequantized = json.loads(run("manifest", fp8, "--dequantize").stdout)
    assert dequantized["digest"] == json.loads(run("manifest", out).stdout)["digest"]
    assert dequantized["options"]["dequantize"] == "bfloat16"


def test_diff_compares_in_dequantized_space(fp8, run, tmp_path):
    out = tmp_path / "plain.safetensors"
    assert run("normalize", fp8, out, "--dequantize").exit_code == 0
    assert run("diff", fp8, out, "--dequantize").exit_code == 0
    assert run("diff", fp8, out).exit_code == 1


def test_load_into_dequantizes_or_refuses_the_cast(fp8):
    import ckptport

    model = torch.nn.Module()
    model.up = torch.nn.Linear(384, 256, bias=False, dtype=torch.bfloat16)
    rename = [(r"^model\.layers\.0\.mlp\.up_proj\.", "up.")]
    with pytest.raises(ckptport.CkptportError, match="dequantize="):
        ckptport.load_into(model, fp8, strict=False, rename=rename)
    ckptport.load_into(model, fp8, strict=False, rename=rename, dequantize="bfloat16")
    source = load_file(fp8)
    expected = _fp8_reference(source[QUANTIZED[0]], source[QUANTIZED[0] + "_scale_inv"],
                              torch.bfloat16)
    assert same_bits(model.up.weight.detach(), expected)
    state = ckptport.load_state_dict(fp8, dequantize="float32")
    assert state[QUANTIZED[0]].dtype == torch.float32
    assert not any(k.endswith("_scale_inv") for k in state)


# -- compressed-tensors: folders the library wrote (fixtures/quantized.py), its oracles ----

QUANTIZED_FIXTURES = Path(__file__).with_name("quantized")
ORACLES = json.loads((QUANTIZED_FIXTURES / "oracles.json").read_text())


def _digests(path: Path) -> dict[str, str]:
    from fixtures.quantized import digest

    return {name: digest(tensor) for name, tensor in sorted(load_file(path).items())}


@pytest.mark.parametrize("folder", sorted(ORACLES["folders"]))
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_compressed_tensors_dequantized_as_the_library_does(folder, dtype, run, tmp_path):
    out = tmp_path / "out.safetensors"
    result = run("normalize", QUANTIZED_FIXTURES / folder / "model.safetensors", out,
                 "--dequantize", dtype)
    assert result.exit_code == 0, result.output
    assert "compressed-tensors" in result.stdout
    assert _digests(out) == ORACLES["folders"][folder][dtype]


def test_recorded_oracles_are_the_installed_librarys():
    """The digests above are what compressed-tensors computes today, not a stale copy."""
    from fixtures.quantized import compressed_tensors_oracle

    for folder in ("ct-w4a16_asym", "ct-nvfp4a16", "ct-fp8_block", "ct-mxfp4a16"):
        assert compressed_tensors_oracle(QUANTIZED_FIXTURES / folder, "bfloat16") == \
            ORACLES["folders"][folder]["bfloat16"], folder


def test_compressed_tensors_without_config_decided_by_the_tensors(tmp_path, run):
    source = QUANTIZED_FIXTURES / "ct-w4a16_asym" / "model.safetensors"
    alone = tmp_path / "alone" / "model.safetensors"
    alone.parent.mkdir()
    alone.write_bytes(source.read_bytes())
    out = tmp_path / "out.safetensors"
    assert run("normalize", alone, out, "--dequantize").exit_code == 0
    assert _digests(out) == ORACLES["folders"]["ct-w4a16_asym"]["bfloat16"]


def test_a_config_that_contradicts_the_tensors_is_refused(tmp_path, run):
    folder = tmp_path / "lying"
    folder.mkdir()
    source = QUANTIZED_FIXTURES / "ct-w4a16"
    (folder / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out.safetensors"
    result = run("normalize", folder / "model.safetensors", out, "--dequantize")
    assert result.exit_code == 2
    assert "group_size 64" in result.stderr and "up_proj" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("folder", ["ct-fp8", "ct-w4a16", "ct-nvfp4a16"])
def test_compressed_tensors_scales_are_never_cast(folder, run, tmp_path):
    result = run("normalize", QUANTIZED_FIXTURES / folder / "model.safetensors",
                 tmp_path / "out.safetensors", "--dtype", "float32")
    assert result.exit_code == 2
    assert "compressed-tensors" in result.stderr and "--dequantize" in result.stderr


def test_a_scheme_ckptport_does_not_know_is_not_cast_either(tmp_path, run):
    """HQQ's layout (W_q codes beside scale and zero): no dequantizer here, and no silent
    cast."""
    path = tmp_path / "hqq.safetensors"
    save_file({"m.W_q": torch.zeros(4, 8, dtype=torch.uint8),
               "m.scale": torch.ones(4, 1).half(), "m.zero": torch.ones(4, 1).half(),
               "norm.weight": torch.ones(4)}, path)
    result = run("normalize", path, tmp_path / "out.safetensors", "--dtype", "bfloat16")
    assert result.exit_code == 2
    assert "does not dequantize" in result.stderr
    refused = run("normalize", path, tmp_path / "plain.safetensors", "--dequantize")
    assert refused.exit_code == 2 and "does not dequantize" in refused.stderr
    kept = run("normalize", path, tmp_path / "kept.safetensors")
    assert kept.exit_code == 0


# -- ModelOpt NVFP4: a folder ModelOpt itself exported; compressed-tensors' converter and
# NVFP4 decompressor are the oracle --------------------------------------------------------

MODELOPT = QUANTIZED_FIXTURES / "modelopt-nvfp4"


def _modelopt_oracle(tmp_path: Path, state: dict[str, torch.Tensor], dtype: torch.dtype
                     ) -> dict[str, torch.Tensor]:
    """What compressed-tensors gives: ModelOptNvfp4Converter, then its dequantizer over the
    config the converter writes (its input_global_scale is left behind: ckptport consumes
    ModelOpt's input_scale, which a plain model has no place for)."""
    from compressed_tensors.entrypoints.convert.converters import (
        CompressedTensorsDequantizer,
        ModelOptNvfp4Converter,
    )

    ignore = json.loads((MODELOPT / "hf_quant_config.json").read_text())["quantization"][
        "exclude_modules"]
    converter = ModelOptNvfp4Converter(targets=["Linear"], ignore=ignore)
    folder = tmp_path / "ct-config"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {"quantization_config": converter.update_config(None).model_dump(mode="json")}))
    made = CompressedTensorsDequantizer(folder, dtype=dtype).process(converter.process(state))
    return {k: v for k, v in made.items() if not k.endswith(".input_global_scale")}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_modelopt_nvfp4_dequantized_as_compressed_tensors_converts_it(run, tmp_path, dtype):
    out = tmp_path / "out.safetensors"
    result = run("normalize", MODELOPT / "model.safetensors", out, "--dequantize", dtype)
    assert result.exit_code == 0, result.output
    assert "7 modelopt-nvfp4 weights" in result.stdout
    written = load_file(out)
    expected = _modelopt_oracle(tmp_path, load_file(MODELOPT / "model.safetensors"),
                                getattr(torch, dtype))
    assert sorted(written) == sorted(expected)
    for name, tensor in expected.items():
        assert same_bits(written[name], tensor), name


def test_modelopt_nvfp4_recognized_by_either_config(run, tmp_path):
    doc = json.loads(run("inspect", MODELOPT / "model.safetensors", "--format",
                         "json").stdout)["quantization"]
    assert doc["schemes"] == {"modelopt-nvfp4": 7}
    weight = doc["weights"][0]
    assert weight["params"]["group_size"] == 16
    assert weight["tensors"]["weight_scale_2"].endswith(".weight_scale_2")
    assert "CKP016" not in _codes_of(run, MODELOPT / "model.safetensors")
    cast = run("normalize", MODELOPT / "model.safetensors", tmp_path / "cast.safetensors",
               "--dtype", "float32")
    assert cast.exit_code == 2 and "modelopt-nvfp4" in cast.stderr
    assert "--dequantize" in cast.stderr
    # an older export: hf_quant_config.json alone says NVFP4, and it is held to the tensors
    folder = tmp_path / "older"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((MODELOPT / "model.safetensors").read_bytes())
    config = json.loads((MODELOPT / "config.json").read_text())
    del config["quantization_config"]
    (folder / "config.json").write_text(json.dumps(config))
    hf_quant = json.loads((MODELOPT / "hf_quant_config.json").read_text())
    hf_quant["quantization"]["group_size"] = 32
    (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    out = tmp_path / "out.safetensors"
    result = run("normalize", folder / "model.safetensors", out, "--dequantize")
    assert result.exit_code == 2 and "group_size 32" in result.stderr
    assert "older/model.safetensors" in result.stderr and not out.exists()


@pytest.mark.parametrize(("change", "key", "why"), [
    ("no_scale_2", "m.weight", "without m.weight_scale_2"),
    ("scale_2_bf16", "m.weight_scale_2", "expected one float32"),
    ("scale_shape", "m.weight_scale", "expected float8_e4m3fn [4, 2]"),
    ("pre_quant_scale", "m.pre_quant_scale", "NVFP4_AWQ"),
    ("orphan_scale_2", "m.weight_scale_2", "without its m.weight"),
    ("odd_codes", "m.weight", "expected 2-D torch.uint8"),
    ("config", "m", "quant_algo 'FP8'"),
])
def test_modelopt_nvfp4_that_cannot_be_dequantized_is_refused(tmp_path, run, change, key, why):
    g = torch.Generator().manual_seed(7)
    state = {"m.weight": torch.randint(0, 256, (4, 16), dtype=torch.uint8, generator=g),
             "m.weight_scale": (torch.rand(4, 2, generator=g) + 0.5).to(torch.float8_e4m3fn),
             "m.weight_scale_2": torch.tensor(0.01), "m.input_scale": torch.tensor(0.1),
             "norm.weight": torch.ones(4)}
    if change == "no_scale_2":
        del state["m.weight_scale_2"]
    elif change == "scale_2_bf16":
        state["m.weight_scale_2"] = state["m.weight_scale_2"].bfloat16()
    elif change == "scale_shape":
        state["m.weight_scale"] = state["m.weight_scale"][:, :1].contiguous()
    elif change == "pre_quant_scale":
        state["m.pre_quant_scale"] = torch.ones(32)
    elif change == "orphan_scale_2":
        del state["m.weight"], state["m.weight_scale"]
    elif change == "odd_codes":
        state["m.weight"] = state["m.weight"].to(torch.int16)
    folder = tmp_path / "bad"
    folder.mkdir()
    save_file(state, folder / "model.safetensors")
    if change == "config":
        (folder / "config.json").write_text(json.dumps({"quantization_config": {
            "quant_method": "modelopt", "quant_algo": "FP8"}}))
    out = tmp_path / "out.safetensors"
    result = run("normalize", folder / "model.safetensors", out, "--dequantize")
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "bad/model.safetensors" in result.stderr and why in result.stderr, result.stderr
    assert key in result.stderr and not out.exists()
    assert any(h.startswith(f"{key}: ") and why in h
               for h in _codes_of(run, folder / "model.safetensors").get("CKP016", []))


# -- check: CKP016 --------------------------------------------------------------------------


def _codes_of(run, path) -> dict[str, list[str]]:
    doc = json.loads(run("check", path, "--format", "json").stdout)
    found: dict[str, list[str]] = {}
    for finding in doc["files"][0]["findings"]:
        found.setdefault(finding["code"], []).append(f"{finding['key']}: {finding['message']}")
    return found


def test_check_passes_quantized_checkpoints_that_dequantize(fp8, mxfp4, run):
    for path in (fp8, mxfp4, QUANTIZED_FIXTURES / "ct-nvfp4a16" / "model.safetensors"):
        assert "CKP016" not in _codes_of(run, path), path


@pytest.mark.parametrize(("tensors", "key", "why"), [
    ({"w.weight_scale_inv": torch.ones(1, 1)}, "w.weight_scale_inv", "without its weight"),
    ({"w.weight": torch.zeros(256, 256, dtype=torch.float8_e4m3fn),
      "w.weight_scale_inv": torch.ones(3, 2)}, "w.weight", "does not tile"),
    ({"w.weight": torch.zeros(256, 256, dtype=torch.float8_e4m3fn),
      "w.weight_scale_inv": torch.tensor([[1.0, 0.0], [float("nan"), 1.0]])},
     "w.weight_scale_inv", "NaN or infinite, 1 zero"),
    ({"w.weight": torch.zeros(256, 256, dtype=torch.float8_e4m3fn),
      "w.weight_scale_inv": torch.ones(2, 2),
      "v.weight": torch.zeros(256, 256, dtype=torch.float8_e4m3fn)}, "v.weight",
     "without a scale"),
    ({"m.weight_packed": torch.zeros(4, 5, dtype=torch.int32),
      "m.weight_scale": torch.ones(4, 1), "m.weight_shape": torch.tensor([4, 64])},
     "m.weight_packed", "cannot hold"),
])
def test_check_finds_what_cannot_be_dequantized(tmp_path, run, tensors, key, why):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, path)
    hits = _codes_of(run, path).get("CKP016", [])
    assert any(h.startswith(f"{key}: ") and why in h for h in hits), hits
    assert run("check", path, "--codes", "CKP016").exit_code == 1


# -- bitsandbytes: its CPU backend quantizes and dequantizes (the oracle) -------------------


@pytest.fixture(scope="module")
def bnb_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """Linear4bit (NF4 nested, FP4) and Linear8bitLt quantized on the CPU by bitsandbytes, the
    state dict it saves, and what its own dequantizers give for each weight."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import dequantize_4bit, int8_vectorwise_dequant

    g = torch.Generator().manual_seed(3)
    model = torch.nn.Module()
    model.nf4 = bnb.nn.Linear4bit(256, 64, bias=False, quant_type="nf4",
                                  compress_statistics=True)
    model.nf4.weight = bnb.nn.Params4bit(torch.randn(64, 256, generator=g).bfloat16(),
                                         requires_grad=False, quant_type="nf4",
                                         compress_statistics=True)
    model.fp4 = bnb.nn.Linear4bit(128, 32, bias=False, quant_type="fp4",
                                  compress_statistics=False)
    model.fp4.weight = bnb.nn.Params4bit(torch.randn(32, 128, generator=g), requires_grad=False,
                                         quant_type="fp4", compress_statistics=False)
    model.int8 = bnb.nn.Linear8bitLt(128, 16, bias=False, has_fp16_weights=False)
    model.int8.weight = bnb.nn.Int8Params(torch.randn(16, 128, generator=g).half(),
                                          requires_grad=False, has_fp16_weights=False)
    model.norm = torch.nn.LayerNorm(16)
    model = model.to("cpu")  # bitsandbytes quantizes as the weights move to the device
    path = tmp_path_factory.mktemp("bnb") / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    oracle = {"nf4.weight": dequantize_4bit(model.nf4.weight.data, model.nf4.weight.quant_state),
              "fp4.weight": dequantize_4bit(model.fp4.weight.data, model.fp4.weight.quant_state),
              "int8.weight": int8_vectorwise_dequant(model.int8.weight.data,
                                                     model.int8.weight.SCB)}
    return path, oracle


def _fp4_negative_zero(packed: torch.Tensor, written: torch.Tensor,
                       expected: torch.Tensor) -> torch.Tensor:
    """FP4's code 8, the encoding's negative zero: bitsandbytes gives it as -0.0 on CUDA and
    in its scalar CPU kernel, as +0.0 in its AVX-512 CPU kernel and pure-torch table. ckptport
    writes CUDA's -0.0 on every machine; the library's answer, whichever this CPU gives, is
    taken there once ckptport's is checked to be -0.0, every other element compared as is."""
    flat = packed.reshape(-1)
    code8 = torch.stack([flat >> 4, flat & 15], 1).reshape(-1)[:expected.numel()] == 8
    mine = written.reshape(-1)[code8]
    assert code8.any() and (mine == 0).all() and torch.signbit(mine).all()
    return torch.where(code8, written.reshape(-1), expected.reshape(-1)).reshape(expected.shape)


def test_bitsandbytes_dequantized_as_the_library_does(bnb_model, run, tmp_path):
    path, oracle = bnb_model
    for name, expected in oracle.items():  # each in the dtype the library gives it
        out = tmp_path / f"{name}.safetensors"
        dtype = str(expected.dtype).removeprefix("torch.")
        result = run("normalize", path, out, "--dequantize", dtype)
        assert result.exit_code == 0, result.output
        written = load_file(out)
        if name == "fp4.weight":
            expected = _fp4_negative_zero(load_file(path)[name], written[name], expected)
        assert same_bits(written[name], expected), name
        assert not any(".absmax" in k or k.endswith(".SCB") or "quant_state" in k
                       for k in written)
    assert "bitsandbytes" in run("inspect", path).stdout
    assert run("normalize", path, tmp_path / "cast.safetensors", "--dtype",
               "float16").exit_code == 2


def test_bitsandbytes_quant_state_that_lies_is_refused(bnb_model, run, tmp_path):
    path, _ = bnb_model
    state = load_file(path)
    key = "nf4.weight.quant_state.bitsandbytes__nf4"
    doc = json.loads(bytes(state[key].tolist()))
    doc["shape"] = [64, 512]
    state[key] = torch.tensor(list(json.dumps(doc).encode()), dtype=torch.uint8)
    lying = tmp_path / "lying.safetensors"
    save_file(state, lying)
    result = run("normalize", lying, tmp_path / "out.safetensors", "--dequantize")
    assert result.exit_code == 2
    assert "nf4.weight" in result.stderr and "lying.safetensors" in result.stderr


# -- AutoAWQ GEMM: built as AutoAWQ lays it out; compressed-tensors' converter is the oracle --


def test_awq_dequantized_as_compressed_tensors_converts_it(tmp_path, run):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter
    from compressed_tensors.quantization import preset_name_to_scheme

    g = torch.Generator().manual_seed(4)
    inputs, outputs, size = 256, 64, 128
    state = {"m.qweight": torch.randint(-2**31, 2**31 - 1, (inputs, outputs // 8),
                                        dtype=torch.int32, generator=g),
             "m.qzeros": torch.randint(-2**31, 2**31 - 1, (inputs // size, outputs // 8),
                                       dtype=torch.int32, generator=g),
             "m.scales": (torch.rand(inputs // size, outputs, generator=g) / 10).half(),
             "norm.weight": torch.ones(outputs).half()}
    path = tmp_path / "awq.safetensors"
    save_file(state, path)
    converted = AutoAWQConverter(bits=4, group_size=size).process(dict(state))
    scheme = preset_name_to_scheme("W4A16_ASYM", ["Linear"])
    local = {k.removeprefix("m."): v for k, v in converted.items() if k.startswith("m.")}
    expected = BaseCompressor.get_value_from_registry("pack-quantized").decompress(
        local, scheme)["weight"]
    _dequantizes_to(run, path, tmp_path, expected, ("float16", "bfloat16"))


def _dequantizes_to(run, path, tmp_path, expected, dtypes) -> None:
    """``m.weight`` dequantized to each dtype is ``expected`` cast to it, ``norm.weight`` kept;
    a plain ``--dtype`` cast of the codes is refused."""
    for dtype in dtypes:
        out = tmp_path / f"{dtype}.safetensors"
        result = run("normalize", path, out, "--dequantize", dtype)
        assert result.exit_code == 0, result.output
        written = load_file(out)
        assert sorted(written) == ["m.weight", "norm.weight"]
        assert same_bits(written["m.weight"], expected.to(getattr(torch, dtype)))
    assert run("normalize", path, tmp_path / "cast.safetensors", "--dtype",
               "float32").exit_code == 2


@pytest.mark.parametrize("command", ["inspect", "check"])
def test_schemes_are_recognized_without_torch(command):
    """A quantized file's scheme, parameters and scale values are read without torch (the
    packed shape and bitsandbytes' JSON state by position, scales by their bits)."""
    import subprocess
    import sys

    from tests.test_inspect import _NO_TORCH

    path = QUANTIZED_FIXTURES / "ct-w4a16_asym" / "model.safetensors"
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, command, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch was imported" not in done.stderr
    assert command == "check" or "compressed-tensors" in done.stdout


# -- GPTQ: built as AutoGPTQ / GPTQModel lay it out; an independent oracle from their formula --
# (packed with Python integers, dequantized in float64, rounded once; GPTQModel's own
# dequantizers are the oracle further below.)


def _gptq_pack(values: list[list[int]], bits: int) -> torch.Tensor:
    """Each row's codes as one little-endian bit stream of int32 words (GPTQ's packing)."""
    rows = []
    for row in values:
        stream = sum(v << (bits * i) for i, v in enumerate(row))
        words = [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(len(row) * bits // 32)]
        rows.append([w - (1 << 32) if w >= 1 << 31 else w for w in words])
    return torch.tensor(rows, dtype=torch.int32)


def _gptq(bits: int, desc_act: bool, seed: int, inputs: int = 128, outputs: int = 32,
          size: int = 32) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """GPTQ tensors of one linear, its codes (N, K) and its stored zero points (G, N)."""
    g = torch.Generator().manual_seed(seed)
    groups = inputs // size
    codes = torch.randint(0, 1 << bits, (outputs, inputs), generator=g)
    stored = torch.randint(0, 1 << bits, (groups, outputs), generator=g)
    order = torch.randperm(inputs, generator=g) if desc_act else torch.arange(inputs)
    g_idx = (order // size).to(torch.int32)
    state = {"m.qweight": _gptq_pack(codes.tolist(), bits).T.contiguous(),
             "m.qzeros": _gptq_pack(stored.tolist(), bits),
             "m.scales": (torch.rand(groups, outputs, generator=g) / 10).half(),
             "m.g_idx": g_idx, "norm.weight": torch.ones(outputs).half()}
    return state, codes, stored


def _gptq_oracle(state, codes, stored, checkpoint_format: str) -> torch.Tensor:
    zeros = stored + (1 if checkpoint_format == "gptq" else 0)       # v1: stored minus one
    group = state["m.g_idx"].long()
    out = torch.empty(codes.shape, dtype=torch.float64)
    for k in range(codes.shape[1]):
        out[:, k] = state["m.scales"][group[k]].double() * (codes[:, k] - zeros[group[k]])
    return out.half()


def _gptq_folder(folder: Path, state, **config) -> Path:
    folder.mkdir()
    save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", **config}}))
    return folder / "model.safetensors"


@pytest.mark.parametrize("bits, desc_act, checkpoint_format",
                         [(4, True, "gptq"), (4, False, "gptq_v2"), (8, True, "gptq_v2"),
                          (8, False, "gptq"), (3, True, "gptq"), (2, False, "gptq_v2")])
def test_gptq_dequantized_as_its_formula_says(tmp_path, run, bits, desc_act, checkpoint_format):
    state, codes, stored = _gptq(bits, desc_act, seed=bits)
    path = _gptq_folder(tmp_path / "q", state, bits=bits, group_size=32, desc_act=desc_act,
                        sym=False, checkpoint_format=checkpoint_format)
    expected = _gptq_oracle(state, codes, stored, checkpoint_format)
    _dequantizes_to(run, path, tmp_path, expected, ("float16", "float32"))
    assert "gptq" in run("inspect", path).stdout
    assert "CKP016" not in _codes_of(run, path)


def test_gptq_without_config_is_v1_and_without_g_idx_in_order(tmp_path, run):
    state, codes, stored = _gptq(4, False, seed=9)
    expected = _gptq_oracle(state, codes, stored, "gptq")
    del state["m.g_idx"]
    path = tmp_path / "plain.safetensors"
    save_file(state, path)
    result = run("normalize", path, tmp_path / "out.safetensors", "--dequantize", "float16")
    assert result.exit_code == 0, result.output
    assert same_bits(load_file(tmp_path / "out.safetensors")["m.weight"], expected)


def test_gptq_symmetric_zero_points_held_to_their_format(tmp_path, run):
    state, codes, _ = _gptq(4, True, seed=5)
    state["m.qzeros"] = _gptq_pack([[8] * 32] * 4, 4)                  # v2's symmetric midpoint
    good = _gptq_folder(tmp_path / "v2", state, bits=4, group_size=32, desc_act=True, sym=True,
                        checkpoint_format="gptq_v2")
    assert run("normalize", good, tmp_path / "out.safetensors", "--dequantize").exit_code == 0
    bad = _gptq_folder(tmp_path / "v1", state, bits=4, group_size=32, desc_act=True, sym=True,
                       checkpoint_format="gptq")
    result = run("normalize", bad, tmp_path / "bad.safetensors", "--dequantize")
    assert result.exit_code == 2
    assert "m.qzeros" in result.stderr and "convention" in result.stderr
    assert not (tmp_path / "bad.safetensors").exists()


@pytest.mark.parametrize("change, config, key, why", [
    ("g_idx", {}, "m.g_idx", "outside the 4 groups"),
    ("qzeros", {}, "m.qzeros", "do not pack"),
    (None, {"bits": 8}, "m", "says bits 8"),
    (None, {"group_size": 64}, "m", "says group_size 64"),
    (None, {"group_size": None}, "m", "says group_size -1"),  # absent: one group per row
    ("no_g_idx", {"desc_act": True}, "m", "desc_act"),
])
def test_gptq_that_lies_is_refused(tmp_path, run, change, config, key, why):
    state, _, _ = _gptq(4, True, seed=6)
    if change == "g_idx":
        state["m.g_idx"][3] = 4
    elif change == "qzeros":
        state["m.qzeros"] = state["m.qzeros"][:3].contiguous()  # 3 rows for 4 groups
    elif change == "no_g_idx":
        del state["m.g_idx"]
    settings = {k: v for k, v in {"bits": 4, "group_size": 32, **config}.items() if v is not None}
    path = _gptq_folder(tmp_path / "bad", state, **settings)
    out = tmp_path / "out.safetensors"
    result = run("normalize", path, out, "--dequantize")
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "model.safetensors" in result.stderr and f"{key}" in result.stderr
    assert why in result.stderr, result.stderr
    assert not out.exists()
    assert any(h.startswith(f"{key}: ") and why in h
               for h in _codes_of(run, path).get("CKP016", [])), _codes_of(run, path)


# -- GPTQ dequantized by the library: GPTQModel's pure-torch TorchLinear and its file tool ----
# (tests/gptq_library.py, in its own process. The packs are built as GPTQModel lays them out:
# it cannot quantize on the CPU. v1 packs keep their stored zero points below 2**bits - 1:
# GPTQModel reads an all-ones one as zero 0 where ckptport reads 2**bits, pinned below.)

GPTQ_CASES = [(4, True, "gptq"), (4, False, "gptq"), (4, True, "gptq_v2"), (4, False, "gptq_v2"),
              (2, True, "gptq"), (2, False, "gptq_v2"), (3, True, "gptq_v2"), (3, False, "gptq"),
              (8, True, "gptq"), (8, False, "gptq_v2")]


def _gptq_library_folder(root: Path, name: str, bits: int, desc_act: bool,
                         checkpoint_format: str, stored: torch.Tensor | None = None) -> Path:
    """One linear's GPTQ folder; v1's stored zero points kept off all-ones unless given."""
    state, _, drawn = _gptq(bits, desc_act, seed=20 + bits)
    if stored is None and checkpoint_format == "gptq":
        stored = drawn % ((1 << bits) - 1)
    if stored is not None:
        state["m.qzeros"] = _gptq_pack(stored.tolist(), bits)
    return _gptq_folder(root / name, state, bits=bits, group_size=32, desc_act=desc_act,
                        sym=False, checkpoint_format=checkpoint_format).parent


def _gptq_all_ones() -> tuple[torch.Tensor, torch.Tensor]:
    """The codes and v1 stored zero points of the ``v1-all-ones`` case: group 1's all 15."""
    _, codes, drawn = _gptq(4, True, seed=24)
    stored = drawn % 15
    stored[1] = 15
    return codes, stored


@pytest.fixture(scope="module")
def gptq_library(tmp_path_factory: pytest.TempPathFactory,
                 gptq_oracle: subprocess.Popen[str] | None) -> dict[str, Path]:
    """The folders of ``GPTQ_CASES`` (and ``v1-all-ones``), each with ``library.safetensors``
    written by the oracle process the session started (``tests/conftest.py``)."""
    if gptq_oracle is None:
        pytest.skip("gptqmodel is not installed (make test installs it: see the Makefile)")
    root = tmp_path_factory.mktemp("gptq_library")
    folders = {f"{b}-{d}-{f}": _gptq_library_folder(root, f"{b}-{d}-{f}", b, d, f)
               for b, d, f in GPTQ_CASES}
    folders["v1-all-ones"] = _gptq_library_folder(root, "v1-all-ones", 4, True, "gptq",
                                                  _gptq_all_ones()[1])
    _, errors = gptq_oracle.communicate("".join(f"{f}\n" for f in folders.values()),
                                        timeout=300)
    assert gptq_oracle.returncode == 0, errors[-3000:]
    return folders


@pytest.mark.parametrize("bits, desc_act, checkpoint_format", GPTQ_CASES)
def test_gptq_dequantized_as_gptqmodel_does(gptq_library, run, tmp_path, bits, desc_act,
                                            checkpoint_format):
    folder = gptq_library[f"{bits}-{desc_act}-{checkpoint_format}"]
    library = load_file(folder / "library.safetensors")
    assert library["module"].dtype == torch.float16
    assert same_bits(library["file"], library["module"])
    _dequantizes_to(run, folder / "model.safetensors", tmp_path, library["module"],
                    ("float16", "float32"))


def test_gptq_v1_all_ones_zero_point_is_read_as_autogptq_kernels_do(gptq_library, run, tmp_path):
    """A v1 stored zero of all ones: ckptport adds the one back in integers (2**bits), as
    AutoGPTQ's CUDA kernels and its act-order torch path (qlinear_cuda) do; GPTQModel 7.6's
    file tool wraps it to 0 (``(zeros + 1) & mask``), as AutoGPTQ's qlinear_cuda_old does."""
    folder = gptq_library["v1-all-ones"]
    out = tmp_path / "out.safetensors"
    assert run("normalize", folder / "model.safetensors", out, "--dequantize",
               "float16").exit_code == 0
    state, (codes, stored) = load_file(folder / "model.safetensors"), _gptq_all_ones()
    assert same_bits(load_file(out)["m.weight"], _gptq_oracle(state, codes, stored, "gptq"))
    wrapped = _gptq_oracle(state, codes, (stored + 1) % 16, "gptq_v2")       # group 1: zero 0
    assert same_bits(load_file(folder / "library.safetensors")["file"], wrapped)


# -- a dequantized model folder loads as a plain model, with the library's own logits ------


@pytest.fixture(scope="module")
def quantized_llamas(tmp_path_factory: pytest.TempPathFactory
                     ) -> dict[str, tuple[Path, torch.nn.Module]]:
    """A tiny Llama quantized three ways (FP8 blocks by transformers' Fp8Quantize, W4A16 by
    compressed-tensors' compressor, NVFP4 exported by ModelOpt), each folder with the model
    its library dequantizes: transformers' own FP8 load (CPU: dequantized), its
    compressed-tensors load with dequantize=True, and compressed-tensors' ModelOpt oracle."""
    from transformers import (
        AutoModelForCausalLM,
        CompressedTensorsConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    from fixtures.quantized import TINY_LLAMA, ct_compress, ct_scheme

    torch.manual_seed(0)
    config = LlamaConfig(**{**TINY_LLAMA, "hidden_size": 128, "intermediate_size": 256})
    state = LlamaForCausalLM(config).to(torch.bfloat16).state_dict()
    linear = [k for k in state if k.endswith("proj.weight")]
    root = tmp_path_factory.mktemp("llamas")
    scheme = ct_scheme("W4A16")
    fp8: dict[str, torch.Tensor] = {}
    packed: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        fp8.update(_fp8_quantize(name, tensor) if name in linear else {name: tensor})
        packed.update({f"{module}.{k}": v for k, v in ct_compress(tensor, scheme).items()}
                      if name in linear else {name: tensor})
    from compressed_tensors.quantization import QuantizationConfig

    configs = {"fp8": {"quant_method": "fp8", "weight_block_size": [128, 128],
                       "activation_scheme": "dynamic"},
               "w4a16": QuantizationConfig(config_groups={"group_0": scheme},
                                           format=scheme.format, ignore=["lm_head"],
                                           quantization_status="compressed"
                                           ).model_dump(mode="json")}
    for name, tensors in (("fp8", fp8), ("w4a16", packed)):
        config.quantization_config = configs[name]
        config.save_pretrained(root / name)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  root / name / "model.safetensors", metadata={"format": "pt"})
    made = {"fp8": (root / "fp8", AutoModelForCausalLM.from_pretrained(root / "fp8")),
            "w4a16": (root / "w4a16", AutoModelForCausalLM.from_pretrained(
                root / "w4a16", quantization_config=CompressedTensorsConfig(dequantize=True)))}
    oracle = root / "modelopt-oracle"  # the oracle's weights, under ModelOpt's model config
    oracle.mkdir()
    plain = json.loads((MODELOPT / "config.json").read_text())
    del plain["quantization_config"]
    (oracle / "config.json").write_text(json.dumps(plain))
    save_file(_modelopt_oracle(root, load_file(MODELOPT / "model.safetensors"), torch.bfloat16),
              oracle / "model.safetensors", metadata={"format": "pt"})
    made["modelopt"] = (MODELOPT, AutoModelForCausalLM.from_pretrained(oracle))
    return made


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
@pytest.mark.parametrize("scheme", ["fp8", "w4a16", "modelopt"])
def test_a_dequantized_model_folder_loads_as_a_plain_model(quantized_llamas, run, tmp_path,
                                                           scheme):
    """normalize FOLDER/ OUT/ --dequantize: OUT's config.json has no quantization_config
    (ModelOpt's hf_quant_config.json is not carried), and from_pretrained(OUT) gives the
    logits of the library's own dequantized model, exactly."""
    from transformers import AutoModelForCausalLM

    folder, library = quantized_llamas[scheme]
    out = tmp_path / "out"
    result = run("normalize", folder, f"{out}/", "--dequantize", "bfloat16")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    source_config = json.loads((folder / "config.json").read_text())
    assert config == {k: v for k, v in source_config.items() if k != "quantization_config"}
    plain = AutoModelForCausalLM.from_pretrained(out)
    tokens = torch.arange(24).reshape(2, 12) % 128
    with torch.no_grad():
        assert torch.equal(plain(tokens).logits, library(tokens).logits)
    weight = "model.layers.0.mlp.up_proj.weight"
    assert same_bits(plain.state_dict()[weight], library.state_dict()[weight])


def test_folder_mode_writes_the_plain_config_beside_each_output(run, tmp_path):
    tree = tmp_path / "tree" / "nvfp4"
    tree.mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "hf_quant_config.json"):
        (tree / name).write_bytes((MODELOPT / name).read_bytes())
    out = tmp_path / "out"
    result = run("normalize", tmp_path / "tree", out, "--dequantize", "--to", "safetensors")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (out / "nvfp4").iterdir()) == ["config.json",
                                                                  "model.safetensors"]
    assert "quantization_config" not in json.loads((out / "nvfp4" / "config.json").read_text())
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "config.json").write_text("{}")
    refused = run("normalize", tree, f"{taken}/", "--dequantize")
    assert refused.exit_code == 2 and "taken/config.json" in refused.stderr
    assert "--overwrite" in refused.stderr
    assert sorted(p.name for p in taken.iterdir()) == ["config.json"]
    (tree / "config.json").write_text("{not json")
    broken = run("normalize", tree, f"{tmp_path / 'broken'}/", "--dequantize")
    assert broken.exit_code == 2
    assert len(broken.stderr.strip().splitlines()) == 1
    assert "nvfp4/config.json" in broken.stderr and "JSON" in broken.stderr
    assert not (tmp_path / "broken").exists()


# -- diff --dequantize in quantization steps; check --finite on dequantized values ----------


@pytest.mark.parametrize(("folder", "seed", "block"), [("ct-w4a16", 3, None),
                                                       ("ct-fp8_block", 2, (128, 128))])
def test_diff_reports_the_error_in_quantization_steps(run, tmp_path, folder, seed, block):
    """diff QUANTIZED ORIGINAL --dequantize: per weight, max |a - b| / the scale of its
    element's group or block (computed here from the file's scales), in text and JSON."""
    from fixtures.quantized import CT_PRESETS, MODULE

    quantized = QUANTIZED_FIXTURES / folder / "model.safetensors"
    preset = next(p for p in CT_PRESETS if f"ct-{p.lower()}" == folder)
    original = torch.randn(*CT_PRESETS[preset],
                           generator=torch.Generator().manual_seed(seed)).bfloat16()
    source = load_file(quantized)
    reference = tmp_path / "original.safetensors"
    save_file({f"{MODULE}.weight": original, "model.norm.weight": source["model.norm.weight"]},
              reference)
    plain = tmp_path / "plain.safetensors"
    assert run("normalize", quantized, plain, "--dequantize").exit_code == 0
    scale = source[f"{MODULE}.weight_scale"].double()
    if block is None:
        scale = scale.repeat_interleave(original.shape[1] // scale.shape[1], dim=1)
    else:
        scale = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    error = (load_file(plain)[f"{MODULE}.weight"].double() - original.double()).abs()
    expected = float((error / scale).max())
    result = run("diff", quantized, reference, "--dequantize", "--format", "json")
    assert result.exit_code == 1, result.output
    (delta,) = json.loads(result.stdout)["value_mismatches"]
    assert delta["key"] == f"{MODULE}.weight"
    assert delta["max_steps"] == pytest.approx(expected, rel=1e-12)
    # half a step from rounding (int4's clipped edge and the bfloat16 output add a little;
    # an E4M3 code's own step is up to 32 of its scale, at 256..448)
    assert 0 < expected < (1 if block is None else 32)
    text = run("diff", quantized, reference, "--dequantize")
    assert f"({expected:.3g} steps)" in text.stdout
    assert "steps" not in run("diff", plain, reference).stdout  # nothing dequantized


def test_check_finite_reads_the_dequantized_weights(tmp_path, run):
    """Finite codes times a finite scale can overflow: --finite names the weight."""
    path = tmp_path / "overflow.safetensors"
    codes = torch.full((128, 128), 448.0).to(torch.float8_e4m3fn)
    save_file({"w.weight": codes, "w.weight_scale_inv": torch.full((1, 1), 3e38),
               "v.weight": codes.clone(), "v.weight_scale_inv": torch.ones(1, 1)}, path)
    doc = json.loads(run("check", path, "--finite", "--format", "json").stdout)
    found = [(f["code"], f["key"], f["message"]) for f in doc["files"][0]["findings"]]
    assert [(c, k) for c, k, _ in found] == [("CKP006", "w.weight")], found
    assert "16384 of 16384 values are NaN or infinite once dequantized" in found[0][2]
    assert run("check", path).exit_code == 0  # without --finite: no value is read


def _grid(weight) -> torch.Tensor | None:
    """The values a weight's codes stand for, in units of its step (None: every integer)."""
    from ckptport.quant.bnb import TABLES

    params = weight.params
    if params.get("quant_type") in TABLES:
        return torch.tensor([float.fromhex(v) for v in TABLES[params["quant_type"]]],
                            dtype=torch.float64)
    if params.get("num_bits") == 4 and params.get("type", "float") == "float" or \
            weight.scheme.name == "mxfp4":
        magnitudes = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
        return torch.cat((magnitudes, -magnitudes))
    if str(params.get("format")).startswith("float8") or params.get("type") == "float":
        every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
        return every[every.isfinite()]
    return None


@pytest.mark.parametrize("case", ["fp8", "mxfp4", "bnb", "gptq", "modelopt", "ct-nvfp4a16",
                                  "ct-mxfp4a16", "ct-mxfp8a16", "ct-w8a8", "ct-w3a16"])
def test_each_schemes_step_is_what_its_codes_are_multiplied_by(case, fp8, mxfp4, bnb_model,
                                                                tmp_path):
    """Every scheme's step (what diff divides by): the float32 dequantized weight over it
    lies on the scheme's code grid (integers, E2M1, E4M3, the NF4/FP4 tables), up to the
    rounding of the scheme's own arithmetic."""
    from ckptport.quant import config_of, recognize

    if case == "gptq":
        path = _gptq_folder(tmp_path / "g", _gptq(4, True, seed=8)[0], bits=4, group_size=32,
                            desc_act=True, checkpoint_format="gptq")
    else:
        path = {"fp8": fp8, "mxfp4": mxfp4, "bnb": bnb_model[0],
                "modelopt": MODELOPT / "model.safetensors"}.get(
            case, QUANTIZED_FIXTURES / case / "model.safetensors")
    state = load_file(path)
    weights = recognize(state, config_of(path)).weights
    assert weights
    for weight in weights:
        parts = tuple(state[n] for n in weight.parts.values())
        ratio = (weight.scheme.dequantize(weight, parts, torch.float32).double()
                 / weight.scheme.step(weight, parts))
        grid = _grid(weight)
        if grid is None:
            nearest = ratio.round()
        else:  # the grid value nearest each ratio: one of the two around it
            grid = grid.unique()
            above = torch.searchsorted(grid, ratio).clamp(1, len(grid) - 1)
            low, high = grid[above - 1], grid[above]
            nearest = torch.where((ratio - low).abs() <= (high - ratio).abs(), low, high)
        assert torch.allclose(ratio, nearest, rtol=2 ** -7, atol=1e-6), (case, weight.name)


# -- verification of dequantized weights: the bytes read back against the CRC-32 written --


def test_each_weight_is_computed_once_and_its_written_bytes_verified(fp8, run, tmp_path,
                                                                     monkeypatch):
    """Verification reads the file back and compares each dequantized weight's bytes with
    the CRC-32 of what was computed and written (no second computation); a byte changed
    in the file after it was written fails the write, which publishes nothing."""
    from ckptport.quant.fp8_block import Fp8Block
    from ckptport.writers import safetensors as writer

    calls: list[str] = []
    original = Fp8Block.dequantize

    def counted(self, weight, parts, dtype):
        calls.append(weight.name)
        return original(self, weight, parts, dtype)

    monkeypatch.setattr(Fp8Block, "dequantize", counted)
    out = tmp_path / "out.safetensors"
    assert run("normalize", fp8, out, "--dequantize").exit_code == 0
    assert sorted(calls) == sorted(QUANTIZED)  # once each: written, not computed again
    expected = {n: _fp8_reference(load_file(fp8)[n], load_file(fp8)[n + "_scale_inv"],
                                  torch.bfloat16) for n in QUANTIZED}
    assert all(same_bits(load_file(out)[n], t) for n, t in expected.items())

    write = writer.write_safetensors

    def flip_one_byte(plan, file, advance, tap=None, defer=None):
        write(plan, file, advance, tap, defer)
        entry = plan.entries[QUANTIZED[1]]
        at = len(plan.header) + entry.start + 7
        file.flush()
        (byte,) = os.pread(file.fileno(), 1, at)
        os.pwrite(file.fileno(), bytes([byte ^ 1]), at)

    monkeypatch.setattr(writer, "write_safetensors", flip_one_byte)
    bad = tmp_path / "bad.safetensors"
    result = run("normalize", fp8, bad, "--dequantize")
    assert result.exit_code != 0
    assert QUANTIZED[1] in result.stderr and "CRC-32" in result.stderr
    assert not bad.exists()
