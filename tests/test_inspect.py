"""``ckptport inspect``: what is in a file, without running or reading it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path

import pytest

from ckptport.render import formats_for, formatter

GOLDEN = Path(__file__).with_name("golden") / "inspect_dp_in_ddp.json"
TEXT_GOLDEN = GOLDEN.with_name("inspect_ddp_cuda3.txt")
JSON_GOLDEN = GOLDEN.with_name("inspect_ddp_cuda3.json")


def _portable(doc: dict) -> dict:
    """The report without what depends on the machine: the temp path and the version."""
    return {**doc, "path": Path(doc["path"]).name, "ckptport": "<version>"}


def test_inspect_json_golden(fx, run):
    result = run("inspect", fx["dp_in_ddp"], "--format", "json", "--depth", "1")
    assert result.exit_code == 0, result.stderr
    doc = _portable(json.loads(result.stdout))
    if os.environ.get("CKPTPORT_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(doc, indent=2) + "\n")
    assert doc == json.loads(GOLDEN.read_text())


def test_inspect_text_names_every_fact(fx, run):
    result = run("inspect", fx["ddp_cuda3"])
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for fact in ("torch-zip", "tensors: 15", "parameters: 854 in state_dict",
                 "float32 6.6 KiB", "cuda:3 (15 storages)", "module. (9 keys)",
                 "globals beyond weights-only: argparse.Namespace",
                 "args: argparse.Namespace", "module.conv.weight: float32[4, 3, 3, 3] 432 B"):
        assert fact in out, fact


def test_depth_limits_the_layout(fx, run):
    out = run("inspect", fx["ddp_cuda3"], "--depth", "0").stdout
    assert "… 7 entries below --depth" in out and "module.conv.weight" not in out


def test_hash_is_the_file_sha256(fx, run):
    doc = json.loads(run("inspect", fx["plain"], "--hash", "--format", "json").stdout)
    assert doc["sha256"] == hashlib.sha256(fx["plain"].read_bytes()).hexdigest()
    assert json.loads(run("inspect", fx["plain"], "--format", "json").stdout)["sha256"] is None


def test_inspect_names_dangerous_globals_without_running_them(fx, run, sentinel):
    result = run("inspect", fx["os_system_zip"], "--format", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["dangerous_globals"] == ["os.system"]
    assert doc["blocking_objects"] == [{"key": "<root>", "global_name": "os.system",
                                        "dangerous": True, "count": 1}]
    assert not sentinel.exists()


def test_inspect_lists_unimportable_objects_by_key(fx, run):
    doc = json.loads(run("inspect", fx["lightning_unimportable"], "--format", "json").stdout)
    found = {(o["key"], o["global_name"]) for o in doc["blocking_objects"]}
    module = "ckptport_fixture_private_config"
    assert (("hyper_parameters.config", f"{module}.TrainConfig") in found
            and ("hyper_parameters.tree", f"{module}.ConfigNode") in found)


def test_shared_storages_and_bloat(fx, run):
    doc = json.loads(run("inspect", fx["slice"], "--format", "json").stdout)
    assert doc["shared_storages"] == [["small", "strided"]]
    assert doc["storage_bloat"] == [{"key": "small", "storage_bytes": 1_000_000,
                                     "used_bytes": 76}]


@pytest.mark.parametrize("name", ["truncated", "random", "lying_frame_zip", "memo_bomb_legacy"])
def test_unreadable_is_one_line_exit_2(fx, run, name):
    result = run("inspect", fx[name])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and str(fx[name]) in result.stderr


def test_every_format_renders_inspect_exactly(fx):
    """Each format's rendering of one report, against its golden file (path and size
    replaced: they depend on the machine and the torch that wrote the fixture)."""
    from ckptport.commands.inspection import inspect

    report = inspect(fx["ddp_cuda3"])
    assert report.size == fx["ddp_cuda3"].stat().st_size
    portable = dataclasses.replace(report, path=Path("ddp_cuda3.pth"), size=0)
    assert formats_for("inspect") == ["text", "json"]  # the inspect command's choices
    text = formatter("text").inspect(portable)
    doc = {**json.loads(formatter("json").inspect(portable)), "ckptport": "<version>"}
    if os.environ.get("CKPTPORT_UPDATE_GOLDEN"):
        TEXT_GOLDEN.write_text(text + "\n")
        JSON_GOLDEN.write_text(json.dumps(doc, indent=2) + "\n")
    assert text == TEXT_GOLDEN.read_text().removesuffix("\n")
    assert doc == json.loads(JSON_GOLDEN.read_text())


# -- the torch-free describe reader ----------------------------------------------


@pytest.fixture(scope="module")
def converted(fx, tmp_path_factory) -> dict[str, Path]:
    """A safetensors file (plain and --select all) and shard sets of both kinds."""
    from ckptport.commands.normalize import normalize_file as convert
    from ckptport.rules import NormalizeOptions

    out = tmp_path_factory.mktemp("converted")
    convert(fx["ddp_cuda3"], out / "w.safetensors")
    convert(fx["tied"], out / "tied.safetensors")
    convert(fx["ddp_cuda3"], out / "all.safetensors", NormalizeOptions(select="all"))
    convert(fx["ddp_cuda3"], out / "st_set", max_shard_size=1024, to="safetensors")
    convert(fx["ddp_cuda3"], out / "pth_set", max_shard_size=1024, to="pth")
    return {"safetensors": out / "w.safetensors", "tied_safetensors": out / "tied.safetensors",
            "all_safetensors": out / "all.safetensors",
            "st_index": out / "st_set" / "model.safetensors.index.json",
            "pth_index": out / "pth_set" / "pytorch_model.bin.index.json",
            "st_folder": out / "st_set"}


def _same_report_both_ways(path: Path) -> None:
    """The report from described tensors equals the one from torch tensors (ckptport.read)."""
    from ckptport.commands.inspection import inspect
    from ckptport.errors import CkptportError
    from ckptport.readers import materialize, open_checkpoint

    try:
        described = open_checkpoint(path, lenient=True)
    except CkptportError as exc:  # every reader refuses it alike
        with pytest.raises(CkptportError) as refused:
            open_checkpoint(path)
        assert refused.value.message == exc.message or exc.dangerous
        return
    assert inspect(described) == inspect(materialize(described))


def test_described_reports_equal_the_reports_of_torch_tensors(fx, converted):
    for path in [*fx.values(), *converted.values()]:
        _same_report_both_ways(path)


def test_zips_safetensors_shards_and_legacy_files_are_described_without_torch(fx, converted):
    from ckptport.checkpoint import TensorInfo, iter_tensors
    from ckptport.readers import describe

    for path in (fx["ddp_cuda3"], fx["ddp_cuda3_legacy"], fx["protocol4"], fx["slice"],
                 *converted.values()):
        tensors = [t for _, t in iter_tensors(describe(path).tree)]
        assert tensors and all(type(t) is TensorInfo for t in tensors), path


def test_snapshots_match_the_installed_torch():
    import torch
    from torch import _weights_only_unpickler

    from ckptport import dtypes
    from ckptport.unpickle.snapshots import TENSOR_ATTRIBUTES, TORCH_DEFAULT_NAMES

    assert frozenset(_weights_only_unpickler._get_allowed_globals()) == TORCH_DEFAULT_NAMES
    attributes = frozenset(dir(torch.Tensor)) | frozenset(dir(torch.nn.Parameter))
    assert attributes - {"__slotnames__"} == TENSOR_ATTRIBUTES - {"__slotnames__"}
    for name, dtype in dtypes.all_names():
        value = getattr(torch, name)
        assert isinstance(value, torch.dtype) and repr(dtype) == repr(value), name
        assert dtype.itemsize == value.itemsize, name
        assert dtype.is_floating_point == value.is_floating_point, name
        assert dtype.is_complex == value.is_complex, name
    torch_names = {n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    assert torch_names == {n for n, _ in dtypes.all_names()}
    with warnings.catch_warnings():  # TypedStorage classes warn that they are deprecated
        warnings.simplefilter("ignore", UserWarning)
        for storage, dtype in dtypes.STORAGE_CLASSES.items():
            if storage != "Storage":  # torch.Storage names the legacy base class
                assert repr(getattr(torch, storage).dtype) == repr(dtype), storage


_NO_TORCH = """
import sys
from ckptport.cli import main
sys.argv = ["ckptport", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
assert "torch" not in sys.modules, "torch was imported"
sys.exit(code)
"""


@pytest.mark.parametrize("command", ["inspect", "check"])
@pytest.mark.parametrize("name", ["ddp_cuda3", "protocol4", "os_system_zip", "safetensors",
                                  "all_safetensors", "st_index", "pth_index", "st_folder"])
def test_inspect_and_check_import_no_torch(fx, converted, command, name):
    import subprocess
    import sys

    path = fx[name] if name in fx else converted[name]
    done = subprocess.run([sys.executable, "-c", _NO_TORCH, command, str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    assert "torch was imported" not in done.stderr and done.stdout
