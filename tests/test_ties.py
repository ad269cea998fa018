"""One weights digest per set of weights, however a container keeps a tie.

A Hugging Face model with tied embeddings saved as ``pytorch_model.bin`` holds
``lm_head.weight`` and the embedding as one storage; ``save_pretrained``'s
safetensors leaves ``lm_head.weight`` out; a tool that clones before saving
stores it twice. The digest must be the same for all (``analysis/ties.py``),
and manifests of schema version 1 (every name in the digest) still check.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

import ckptport
from ckptport.analysis.manifests import load_manifest, write_manifest
from ckptport.commands.manifest import manifest
from ckptport.errors import InputError


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny tied Llama saved every way: by transformers itself, by torch, cloned."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("hub")
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder / "safetensors")  # 11 names: lm_head.weight left out
    state = model.state_dict()
    (folder / "bin").mkdir()
    torch.save(state, folder / "bin" / "pytorch_model.bin")  # what save_pretrained used to write
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    copies = OrderedDict((k, v.clone()) for k, v in state.items())
    torch.save(copies, folder / "copies.pth")
    untied = folder / "untied"  # the same numbers, but the model says they are two tensors
    untied.mkdir()
    torch.save(copies, untied / "pytorch_model.bin")
    (untied / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    declared = folder / "declared"
    declared.mkdir()
    torch.save(copies, declared / "pytorch_model.bin")
    (declared / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    ckptport.normalize_file(folder / "bin", folder / "out.safetensors")
    ckptport.normalize_file(folder / "bin", folder / "shards", max_shard_size=512)
    return {"safetensors": folder / "safetensors", "bin": folder / "bin",
            "bin-file": folder / "bin" / "pytorch_model.bin", "copies": folder / "copies.pth",
            "declared": declared, "untied": untied, "out": folder / "out.safetensors",
            "shards": folder / "shards"}


def test_stored_tied_or_omitted_is_one_digest(hub):
    names = {key: {t.name for t in manifest(path).tensors} for key, path in hub.items()}
    assert "lm_head.weight" not in names["safetensors"] and "lm_head.weight" in names["bin"]
    digests = {key: manifest(path).digest for key, path in hub.items() if key != "untied"}
    assert len(set(digests.values())) == 1, digests


def test_how_each_tie_is_known(hub):
    def tie(key: str) -> tuple[str | None, str | None]:
        entry = manifest(hub[key]).by_name()["lm_head.weight"]
        return entry.alias_of, entry.tie_by

    assert tie("bin") == ("model.embed_tokens.weight", "storage")
    assert tie("declared") == ("model.embed_tokens.weight", "config")
    assert tie("copies") == ("model.embed_tokens.weight", "convention")
    assert tie("untied") == (None, None)  # config.json says two tensors: two lines
    assert manifest(hub["untied"]).digest != manifest(hub["bin"]).digest


def test_a_guessed_tie_is_said(hub, run):
    result = run("manifest", hub["copies"])
    assert result.exit_code == 0
    assert "lm_head.weight is taken as a tie of model.embed_tokens.weight" in result.stderr
    assert "note:" not in run("manifest", hub["bin"]).stderr


def test_ordinary_names_of_one_tensor_both_stand(tmp_path):
    w = torch.arange(6.0).reshape(2, 3)
    torch.save(OrderedDict([("b", w), ("a", w)]), tmp_path / "tied.pth")
    torch.save(OrderedDict([("a", w)]), tmp_path / "one.pth")
    made = manifest(tmp_path / "tied.pth")
    assert all(t.alias_of is None for t in made.tensors)  # no hub convention says which
    assert made.digest != manifest(tmp_path / "one.pth").digest


def test_a_version_1_manifest_still_checks(hub, tmp_path, run):
    made = json.loads(manifest(hub["bin"]).to_json())
    for entry in made["tensors"]:
        entry.pop("alias_of", None)
        entry.pop("tie_by", None)
    lines = sorted(json.dumps([t["name"], t["dtype"], t["shape"], t["nbytes"], t["sha256"]],
                              separators=(",", ":")) for t in made["tensors"])
    made.update(version=1, digest=hashlib.sha256("\n".join(lines).encode()).hexdigest())
    old = tmp_path / "round3.manifest.json"
    old.write_text(json.dumps(made))
    assert load_manifest(old).digest == made["digest"]  # the old digest, readable
    assert run("check", hub["out"], "--against-manifest", old).exit_code == 0
    assert run("check", hub["safetensors"], "--against-manifest", old).exit_code == 0


def test_an_alias_cannot_hide_a_tensor(hub, tmp_path):
    good = tmp_path / "good.json"
    write_manifest(manifest(hub["bin"]), good)
    doc = json.loads(good.read_text())
    lying = next(t for t in doc["tensors"] if t["name"] == "model.norm.weight")
    lying["alias_of"] = "model.embed_tokens.weight"  # other content: would leave the digest
    kept = [t for t in doc["tensors"] if t.get("alias_of") is None]
    lines = sorted(json.dumps([t["name"], t["dtype"], t["shape"], t["nbytes"], t["sha256"]],
                              separators=(",", ":")) for t in kept)
    doc["digest"] = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="alias_of.*model.norm.weight"):
        load_manifest(bad)
