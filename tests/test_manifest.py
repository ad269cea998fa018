"""Manifests: one weights digest for the same weights in every container; CKP010; diff.

The digest must not depend on the container (.pth zip and legacy,
.safetensors, a shard set, DCP, a Hugging Face folder), the sharding, the
key order or ties; it must change with any element and with a cast.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import ckptport
from ckptport.analysis.manifests import SCHEMA, load_manifest, write_manifest
from ckptport.commands.manifest import manifest
from ckptport.errors import InputError
from tests.test_properties import PROPERTY_SETTINGS, state_dicts


def _every_container(state: OrderedDict[str, torch.Tensor], folder: Path) -> dict[str, Path]:
    """The same weights written every way a user meets them."""
    src = folder / "src.pth"
    torch.save(state, src)
    legacy = folder / "legacy.pth"
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    made = {"pth": src, "legacy": legacy}
    for name, kwargs in {"safetensors": {}, "shards": {"max_shard_size": 64},
                         "dcp": {"to": "dcp"}}.items():
        target = folder / ("out.safetensors" if name == "safetensors" else name)
        ckptport.normalize_file(src, target, **kwargs)
        made[name] = target
    hf = folder / "hf"
    hf.mkdir()
    ckptport.normalize_file(src, hf / "model.safetensors")
    made["hf-folder"] = hf
    return made


@settings(PROPERTY_SETTINGS, max_examples=10)
@given(state_dicts())
def test_the_digest_is_the_same_in_every_container(state):
    with tempfile.TemporaryDirectory() as tmp:
        made = _every_container(state, Path(tmp))
        digests = {name: manifest(path).digest for name, path in made.items()}
        assert len(set(digests.values())) == 1, digests


@settings(PROPERTY_SETTINGS, max_examples=10)
@given(state_dicts(), st.data())
def test_the_digest_changes_with_one_element(state, data):
    candidates = [k for k, v in state.items() if v.numel()]
    assume(candidates)  # a state dict of empty tensors has no element to change
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        torch.save(state, folder / "a.pth")
        changed = OrderedDict((k, v.contiguous().clone()) for k, v in state.items())
        flat = changed[data.draw(st.sampled_from(candidates))].reshape(-1)
        flat.view(torch.uint8)[data.draw(st.integers(0, flat.numel() - 1))
                               * flat.element_size()] ^= 1
        torch.save(changed, folder / "b.pth")
        assert manifest(folder / "a.pth").digest != manifest(folder / "b.pth").digest


def test_a_cast_changes_the_digest_and_options_are_recorded(fx):
    kept = manifest(fx["ddp_cuda3"])
    cast = manifest(fx["ddp_cuda3"], ckptport.NormalizeOptions(dtype="bfloat16"))
    assert kept.digest != cast.digest
    assert cast.options["dtype"] == "bfloat16" and kept.options["dtype"] == "keep"


def test_key_order_and_ties_do_not_enter_the_digest(tmp_path):
    w = torch.arange(6.0)
    tied = OrderedDict([("b", w), ("a", w)])
    apart = OrderedDict([("a", w.clone()), ("b", w.clone())])
    torch.save(tied, tmp_path / "tied.pth")
    torch.save(apart, tmp_path / "apart.pth")
    one, two = manifest(tmp_path / "tied.pth"), manifest(tmp_path / "apart.pth")
    assert one.digest == two.digest
    assert one.by_name()["a"].tied == ("b",) and two.by_name()["a"].tied == ()


def test_normalize_writes_the_manifest_of_what_it_wrote(fx, tmp_path, run):
    for ext in ("pth", "safetensors"):
        out, listed = tmp_path / f"out.{ext}", tmp_path / f"{ext}.manifest.json"
        result = run("normalize", fx["tied"], out, "--manifest", listed)
        assert result.exit_code == 0, result.stderr
        written = load_manifest(listed)
        assert written == manifest(out) and written.digest == manifest(fx["tied"]).digest
    shards = tmp_path / "shards"
    result = run("normalize", fx["tied"], shards, "--max-shard-size", "100B",
                 "--manifest", tmp_path / "set.json")
    assert result.exit_code == 0, result.stderr
    assert load_manifest(tmp_path / "set.json").digest == manifest(shards).digest


def test_the_manifest_command_and_its_file(fx, tmp_path, run):
    printed = run("manifest", fx["ddp_cuda3"])
    assert printed.exit_code == 0
    doc = json.loads(printed.stdout)
    assert doc["schema"] == SCHEMA and doc["version"] == 2 and doc["tensor_count"] == 9
    assert [t["name"] for t in doc["tensors"]] == sorted(t["name"] for t in doc["tensors"])
    out = tmp_path / "m.json"
    result = run("manifest", fx["ddp_cuda3"], "-o", out)
    assert result.exit_code == 0 and doc["digest"] in result.stdout
    assert json.loads(out.read_text()) == doc
    assert run("manifest", fx["ddp_cuda3"], "-o", out).exit_code == 2  # exists
    assert manifest(fx["ddp_cuda3"], jobs=1) == manifest(fx["ddp_cuda3"], jobs=2)


def test_check_against_manifest_names_each_tensor(fx, tmp_path, run):
    listed = tmp_path / "release.json"
    write_manifest(manifest(fx["ddp_cuda3"]), listed)
    state = ckptport.load_state_dict(fx["ddp_cuda3"])
    state["conv.weight"] = state["conv.weight"].clone()
    state["conv.weight"].view(-1)[0] += 1  # content changed
    state["bn.bias"] = state["bn.bias"].double()  # dtype changed
    del state["head.1.bias"]  # missing
    state["extra"] = torch.zeros(2)  # unexpected
    artifact = tmp_path / "artifact.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(artifact))
    result = run("check", artifact, "--against-manifest", listed, "--format", "json")
    assert result.exit_code == 1
    found = {(f["key"], f["message"].split(" ")[0]) for entry in json.loads(result.stdout)["files"]
             for f in entry["findings"] if f["code"] == "CKP010"}
    assert found == {("bn.bias", "float64[4],"), ("conv.weight", "content"),
                     ("extra", "unexpected"), ("head.1.bias", "missing")}
    same = tmp_path / "same.pth"
    ckptport.normalize_file(fx["ddp_cuda3"], same)
    assert run("check", same, "--against-manifest", listed).exit_code == 0


def test_diff_takes_a_manifest_on_either_side(fx, tmp_path, run):
    listed = tmp_path / "m.json"
    write_manifest(manifest(fx["ddp_cuda3"]), listed)
    assert run("diff", listed, fx["ddp_cuda3_legacy"]).exit_code == 0
    assert run("diff", fx["ddp_cuda3"], listed).exit_code == 0
    assert run("diff", listed, listed).exit_code == 0
    other = tmp_path / "other.pth"
    state = ckptport.load_state_dict(fx["ddp_cuda3"])
    state["conv.bias"] = state["conv.bias"] + 1
    torch.save(state, other)
    result = run("diff", listed, other)
    assert result.exit_code == 1 and "content differs (sha256)" in result.stdout
    assert "conv.bias" in result.stdout


@pytest.mark.parametrize(("text", "field"), [
    ("{not json", "not JSON"),
    ('{"hello": 1}', "schema"),
    ('{"schema": "ckptport.manifest", "version": 99, "tensors": []}', "version 99"),
    ('{"schema": "ckptport.manifest", "version": 1, "options": {}, "tensors": "x"}',
     "tensors"),
    ('{"schema": "ckptport.manifest", "version": 1, "options": {}, "tensors": '
     '[{"name": "a", "dtype": "float32", "shape": [-1], "nbytes": 4, "sha256": "00"}]}',
     "tensors[0].shape"),
])
def test_a_bad_manifest_is_exit_2_naming_the_file_and_field(fx, tmp_path, run, text, field):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(InputError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_manifest(bad)
    result = run("check", fx["ddp_cuda3"], "--against-manifest", bad)
    assert result.exit_code == 2 and str(bad) in result.stderr
    assert "Traceback" not in result.stderr


def test_an_edited_manifest_is_refused(fx, tmp_path):
    listed = tmp_path / "m.json"
    write_manifest(manifest(fx["ddp_cuda3"]), listed)
    doc = json.loads(listed.read_text())
    doc["tensors"][0]["sha256"] = "0" * 64
    listed.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="digest"):
        load_manifest(listed)


def test_manifest_of_a_zip_checkpoint_imports_no_torch(fx):
    code = ("import sys; from ckptport.commands.manifest import manifest; "
            f"manifest({str(fx['ddp_cuda3'])!r}); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


def test_a_manifest_never_replaces_the_source_or_dst(fx, tmp_path, run):
    src = tmp_path / "src.pth"
    src.write_bytes(fx["ddp_cuda3"].read_bytes())
    before = src.read_bytes()
    result = run("normalize", src, tmp_path / "out.pth", "--manifest", src)
    assert result.exit_code == 2 and "manifest elsewhere" in result.stderr
    assert src.read_bytes() == before and not (tmp_path / "out.pth").exists()


def test_normalize_manifest_gates_its_own_output_whatever_the_options(fx, run, tmp_path):
    """The manifest normalize writes describes DST, which is already selected, stripped and
    cast: check DST --against-manifest applies none of those steps again."""
    out, made = tmp_path / "o.safetensors", tmp_path / "m.json"
    result = run("normalize", fx["ema_timm"], out, "--ema", "--dtype", "float16",
                 "--strip-prefix", "auto", "--manifest", made)
    assert result.exit_code == 0, result.stderr
    gated = run("check", out, "--against-manifest", made)
    assert gated.exit_code == 0, gated.stdout
