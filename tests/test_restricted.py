"""The restricted unpickler: real checkpoints read without running anything; attacks refused."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

import numpy as np
import pytest
import torch

import ckptport
from ckptport.errors import InputError, UnsafeCheckpointError
from ckptport.readers import open_checkpoint
from ckptport.tree import ObjectRecord
from fixtures.hostile import ALL_ATTACKS, PROTO2, STOP, call, global_, text, write_zip
from fixtures.make_fixtures import UNIMPORTABLE_MODULE

HOSTILE = sorted(f"{name}_{kind}" for name in ALL_ATTACKS for kind in ("zip", "legacy"))


@pytest.mark.parametrize("name", HOSTILE)
def test_restricted_reader_refuses_attack(fx, sentinel, name):
    start = time.monotonic()
    with pytest.raises(InputError) as caught:
        open_checkpoint(fx[name])
    assert re.search(ALL_ATTACKS[name.rsplit("_", 1)[0]].message, caught.value.line()), \
        caught.value.line()
    assert time.monotonic() - start < 5
    assert not sentinel.exists()


@pytest.mark.parametrize("name", HOSTILE)
def test_normalize_refuses_attack(fx, sentinel, run, tmp_path, name):
    out = tmp_path / "out.safetensors"
    result = run("normalize", fx[name], out, "--select", "all")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ckptport: error: {fx[name]}: "), lines
    assert "Traceback" not in result.output
    assert not out.exists() and not list(tmp_path.iterdir())
    assert not sentinel.exists()


@pytest.mark.parametrize(("name", "global_name"), [
    ("call_os_system_zip", "os.system"),
    ("dotted_name_legacy", "posixpath.os.system"),
    ("call_functools_partial_zip", "functools.partial"),
    ("call_mailbox_Maildir_zip", "mailbox.Maildir"),
])
def test_refusal_names_the_global(fx, run, tmp_path, name, global_name):
    result = run("normalize", fx[name], tmp_path / "o.pth")
    assert result.exit_code == 2
    assert f"{global_name}," in result.stderr and "nothing was run" in result.stderr
    with pytest.raises(UnsafeCheckpointError) as caught:
        ckptport.read(fx[name])
    assert caught.value.globals == (global_name,)
    assert "mypkg" not in sys.modules


def _training_objects() -> dict:
    return {"sd": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)[1:3]},
            "args": argparse.Namespace(lr=0.1, size=torch.Size([3])),
            "best": np.float64(2.5), "counts": np.arange(4, dtype=np.int32),
            "param": torch.nn.Parameter(torch.ones(2)), "device": torch.device("cuda:1"),
            "dtype": torch.bfloat16, "tags": {1, 2}, "raw": b"xy"}


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("zip_format", [True, False])
def test_reads_every_protocol_and_container(tmp_path, protocol, zip_format):
    """torch 2.13's weights-only reader rejects protocol >= 4; ckptport reads them."""
    objects = _training_objects()
    path = tmp_path / "ckpt.pt"
    with open(path, "wb") as f:
        torch.save(objects, f, pickle_protocol=protocol,
                   _use_new_zipfile_serialization=zip_format)
    tree = ckptport.read(path).tree
    assert torch.equal(tree["sd"]["w"], objects["sd"]["w"])
    assert torch.equal(tree["sd"]["b"], objects["sd"]["b"])
    assert tree["args"] == objects["args"] and tree["best"] == 2.5
    assert (tree["counts"] == objects["counts"]).all() and tree["dtype"] is torch.bfloat16
    assert tree["tags"] == {1, 2} and tree["raw"] == b"xy"
    assert type(tree["param"]) is torch.nn.Parameter and tree["device"] == torch.device("cuda:1")


def test_protocol4_keeps_recorded_locations_and_is_lazy(fx):
    checkpoint = ckptport.read(fx["protocol4"])
    assert checkpoint.source.storage_locations == {"cuda:3": 15}
    weight = checkpoint.tree["state_dict"]["module.conv.weight"]
    assert weight.device.type == "cpu"
    assert not weight.untyped_storage().resizable()  # a slice of the file's private map


def test_lightning_unimportable_normalizes_to_plain_data(fx, run, tmp_path):
    out = tmp_path / "clean.pth"
    result = run("normalize", fx["lightning_unimportable"], out, "--select", "all",
                 "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert UNIMPORTABLE_MODULE not in sys.modules
    loaded = torch.load(out, weights_only=True)
    hyper = loaded["hyper_parameters"]
    assert hyper["config"] == {"__class__": f"{UNIMPORTABLE_MODULE}.TrainConfig", "lr": 0.1,
                               "layers": [4, 5], "name": "tiny"}
    optim = hyper["tree"]["_content"]["optim"]
    assert optim["_parent"] == {"__backref__": "hyper_parameters.tree"}
    assert optim["_content"] == {"lr": 0.1, "betas": (0.9, 0.999)}
    converted = next(r for r in json.loads(result.stdout)["rules"]
                     if r["rule"] == "convert-objects")["changes"]
    assert {"key": "hyper_parameters.config", "action": "converted",
            "detail": f"{UNIMPORTABLE_MODULE}.TrainConfig -> dict"} in converted


def test_unknown_classes_are_records(fx):
    tree = ckptport.read(fx["lightning_unimportable"]).tree
    config = tree["hyper_parameters"]["config"]
    assert isinstance(config, ObjectRecord)
    assert config.name == f"{UNIMPORTABLE_MODULE}.TrainConfig"
    assert config.state == {"lr": 0.1, "layers": [4, 5], "name": "tiny"}


@pytest.mark.parametrize(("body", "message"), [
    (call(global_("builtins", "bytearray"), b"J" + (10**9).to_bytes(4, "little")),
     "bytearray takes bytes"),
    (call(global_("numpy._core.multiarray", "_reconstruct"), global_("numpy", "ndarray"),
          b"(J" + (10**9).to_bytes(4, "little") + b"t", text("b")),
     r"_reconstruct takes \(ndarray, \(0,\), code\)"),
    (call(global_("collections", "OrderedDict"), text("x")), "OrderedDict takes a list"),
])
def test_allowed_callables_check_their_arguments(tmp_path, body, message):
    """The allow-list's callables are wrappers: no gigabyte allocations from a pickle."""
    path = write_zip(tmp_path / "f.pt", PROTO2 + body + STOP, ())
    with pytest.raises(InputError, match=message):
        open_checkpoint(path)
    with pytest.raises(InputError):  # the fast path refuses or hands over; nothing allocates
        ckptport.read(path)


def test_trust_still_unpickles_fully(fx, run, tmp_path):
    result = run("normalize", fx["plain"], tmp_path / "o.pth", "--trust")
    assert result.exit_code == 0 and "--trust" in result.stderr


# -- values handed to the pickle are read-only: BUILD cannot rewrite them -------------

_MARK, _BUILD, _SETITEMS, _EMPTY_DICT, _TUPLE2, _NONE = b"(", b"b", b"u", b"}", b"\x86", b"N"


def _slotstate(**attrs: bytes) -> bytes:
    """A BUILD argument ``(None, {name: value})``: sets attributes, as for __slots__."""
    pairs = b"".join(text(k) + v for k, v in attrs.items())
    return _NONE + _EMPTY_DICT + _MARK + pairs + _SETITEMS + _TUPLE2


@pytest.mark.parametrize(("module", "name", "attrs"), [
    ("torch", "float32", {"itemsize": b"K\x08"}),  # the shared dtype table
    ("collections", "OrderedDict", {"call": global_("builtins", "int")}),  # an allowed wrapper
    ("argparse", "Namespace", {"__eq__": global_("builtins", "int")}),  # a real class
    ("mypkg.tools", "make", {"record_name": text("collections.UserDict")}),  # a stand-in class
])
def test_build_on_a_global_is_refused_and_changes_nothing(tmp_path, module, name, attrs):
    pkl = PROTO2 + global_(module, name) + _slotstate(**attrs) + _BUILD + STOP
    path = write_zip(tmp_path / "build.pt", pkl, ())
    with pytest.raises(InputError, match="BUILD|sets the attribute|__setstate__"):
        open_checkpoint(path)
    with pytest.raises(InputError):
        open_checkpoint(path, lenient=True)
    assert torch.finfo(torch.float32).bits == 32
    from ckptport.dtypes import by_name

    assert by_name("float32").itemsize == 4
    assert argparse.Namespace.__eq__ is not int
    namespace = PROTO2 + call(global_("argparse", "Namespace")) + STOP
    value = open_checkpoint(write_zip(tmp_path / "ns.pt", namespace, ())).tree
    assert type(value) is argparse.Namespace


def test_build_on_a_described_tensor_is_refused(tmp_path):
    from fixtures.hostile import storage, tensor

    state = _MARK + storage("0", 64) + b"K\x00" + b"K\x08K\x08\x86" + b"K\x08K\x01\x86" + b"t"
    pkl = PROTO2 + tensor(storage("1", 4), 0, (4,), (1,)) + state + _BUILD + STOP
    path = write_zip(tmp_path / "swap.pt", pkl, (("0", 64), ("1", 4)))
    with pytest.raises(InputError, match="BUILD"):
        open_checkpoint(path)
