"""Checkpoints as people really have them (issue 13), against ground truth.

The fixtures come from ``fixtures/real_world.py``, built once per module; each
case carries the ground truth computed from the live objects at generation
time (whole pickled models, omegaconf/Lightning, YOLO-like model + EMA, fx,
list roots, hub tied weights, TorchScript, .pth.tar, TransformerEngine).
ckptport passes when what it writes loads with the public loaders
(``torch.load(weights_only=True)``, ``safetensors``), equals that truth bit
for bit and loads with ``load_state_dict(strict=True)`` into the real model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result
from safetensors import safe_open
from safetensors.torch import load_file

import ckptport
from fixtures.real_world import (
    CASE_NAMES,
    OMEGACONF_CASES,
    RealCase,
)
from tests.helpers import same_bits

Run = Callable[..., Result]

# What each case asks of normalize; test_case_table_matches_the_generator keeps it honest.
REFUSED = ("whole_model_state_dict_hook", "sparse_quantized", "torch_package")
TRUSTED = ("torchscript_cuda1",)
NO_STATE_DICT = ("hf_training_args", "pth_tar_folder")
CONVERTED = tuple(n for n in CASE_NAMES if n not in (*REFUSED, *TRUSTED, *NO_STATE_DICT))
WITH_ALL = (*OMEGACONF_CASES, "refused_objects", "hf_training_args", "lightning_fsdp")
WITH_EMA = ("yolo_like",)
RECORDED = ("torchscript_cuda1", "pth_tar_cuda7", "pth_tar_cuda3", "upper_case_PT",
            "legacy_pt_tar")
FORMATS = ("pth", "safetensors")


def case_of(real: dict[str, RealCase], name: str) -> RealCase:
    if name not in real:
        assert name in OMEGACONF_CASES, f"the generator did not build {name}"
        pytest.skip("omegaconf is not installed; it is needed to generate this case")
    return real[name]


# --------------------------------------------------------------------------
# comparing outputs with the truth


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality, including sparse (COO, CSR) and quantized layouts."""
    if a.layout != b.layout or a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.layout == torch.sparse_coo:
        return same_tensor(a._indices(), b._indices()) and same_tensor(a._values(), b._values())
    if a.layout == torch.sparse_csr:
        return all(same_tensor(x, y) for x, y in (
            (a.crow_indices(), b.crow_indices()), (a.col_indices(), b.col_indices()),
            (a.values(), b.values())))
    if a.is_quantized:
        return (a.qscheme() == b.qscheme() and a.q_scale() == b.q_scale()
                and a.q_zero_point() == b.q_zero_point()
                and same_tensor(a.int_repr(), b.int_repr()))
    return same_bits(a, b)


def tree_differences(want: Any, got: Any, path: str = "") -> list[str]:
    """Where ``got`` differs from ``want``: mappings by keys, sequences by exact type."""
    where = path or "<root>"
    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and same_tensor(want, got)
        return [] if ok else [f"{where}: tensor differs ({_describe(got)})"]
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return [f"{where}: want a mapping, got {_describe(got)}"]
        out = [f"{where}: missing {k!r}" for k in want if k not in got]
        out += [f"{where}: unexpected {k!r}" for k in got if k not in want]
        for key in want:
            if key in got:
                out += tree_differences(want[key], got[key], f"{path}.{key}" if path else str(key))
        return out
    if type(want) in (list, tuple):
        if type(got) is not type(want) or len(got) != len(want):
            return [f"{where}: want {type(want).__name__} of {len(want)}, got {_describe(got)}"]
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True))
                for d in tree_differences(w, g, f"{path}.{i}" if path else str(i))]
    if isinstance(want, float) and isinstance(got, float) and math.isnan(want) and \
            math.isnan(got):
        return []
    if type(got) is not type(want) or got != want:
        return [f"{where}: want {want!r}, got {got!r}"]
    return []


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {value.dtype} {tuple(value.shape)} {value.layout}"
    return f"{type(value).__name__} {value!r}"[:120]


def load_safetensors(path: Path) -> dict[str, Any]:
    """``load_file`` plus ckptport's alias names (tied tensors stored once)."""
    state: dict[str, Any] = dict(load_file(path))
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata() or {}
    for stored, names in json.loads(metadata.get("ckptport.aliases", "{}")).items():
        for name in names:
            state[name] = state[stored]
    return state


def load_written(path: Path, expected: Mapping[str, Any]) -> dict[str, Any]:
    """What a user gets from DST; non-tensor values of a .safetensors come from its tree."""
    if path.suffix != ".safetensors":
        return torch.load(path, weights_only=True)
    state = load_safetensors(path)
    plain_keys = [k for k, v in expected.items() if not isinstance(v, torch.Tensor)]
    if plain_keys:
        tree = ckptport.read(path).tree
        state.update((k, tree[k]) for k in plain_keys if k in tree)
    return state


def ties(state: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Pairs of names that are one tensor (same storage, offset, shape, stride)."""
    seen: dict[tuple[Any, ...], str] = {}
    pairs = []
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and value.layout == torch.strided and \
                not value.is_quantized:
            ident = (value.untyped_storage().data_ptr(), value.storage_offset(),
                     tuple(value.shape), value.stride())
            if ident in seen:
                pairs.append((seen[ident], key))
            else:
                seen[ident] = key
    return pairs


def assert_state(case: RealCase, expected: Mapping[str, Any], out: Path) -> dict[str, Any]:
    got = load_written(out, expected)
    problems = tree_differences(dict(expected), dict(got))
    assert problems == [], f"{case.name} -> {out.name}: {problems[:8]}"
    if out.suffix != ".safetensors":
        for first, second in ties(expected):
            assert got[first].untyped_storage().data_ptr() == \
                got[second].untyped_storage().data_ptr(), f"tie {first}/{second} lost"
        if case.expected_metadata is not None:
            versions = getattr(got, "_metadata", None)
            assert versions is not None, "state dict _metadata (module versions) missing"
            assert {k: dict(v) for k, v in versions.items()} == case.expected_metadata
    return got


# --------------------------------------------------------------------------
# normalize with default options


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", CONVERTED)
def test_normalize_gives_the_true_state_dict(real: dict[str, RealCase], run: Run,
                                             tmp_path: Path, name: str, fmt: str) -> None:
    case = case_of(real, name)
    assert case.expected is not None
    out = tmp_path / f"out.{fmt}"
    result = run("normalize", case.path, out)
    assert result.exit_code == 0, result.stderr
    assert_state(case, case.expected, out)
    if case.model is not None:  # as users load it: strict, the model's own ties filled
        model = case.model()
        ckptport.load_into(model, out)
        loaded = {k: v for k, v in model.state_dict().items() if k in case.expected}
        assert tree_differences(dict(case.expected), loaded) == []


@pytest.mark.parametrize("name", CONVERTED)
def test_diff_source_and_output_are_equal(real: dict[str, RealCase], run: Run,
                                          tmp_path: Path, name: str) -> None:
    case = case_of(real, name)
    out = tmp_path / "out.pth"
    normalized = run("normalize", case.path, out)
    assert normalized.exit_code == 0, normalized.stderr
    result = run("diff", case.path, out)
    assert result.exit_code == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", WITH_EMA)
def test_ema_picks_the_ema_module(real: dict[str, RealCase], run: Run, tmp_path: Path,
                                  name: str) -> None:
    case = case_of(real, name)
    assert case.expected_ema is not None
    out = tmp_path / "ema.pth"
    result = run("normalize", case.path, out, "--ema")
    assert result.exit_code == 0, result.stderr
    assert_state(case, case.expected_ema, out)
    assert "DetectionModel" in result.stdout  # the report names each module's class


def test_select_walks_lists(real: dict[str, RealCase], run: Run, tmp_path: Path) -> None:
    case = case_of(real, "list_root")
    out = tmp_path / "chemnet.pth"
    result = run("normalize", case.path, out, "--select", "2.1.0")
    assert result.exit_code == 0, result.stderr
    assert_state(case, case.expected or {}, out)


# --------------------------------------------------------------------------
# refusals and TorchScript


@pytest.mark.parametrize("name", REFUSED + TRUSTED)
def test_refusal_names_what_it_is(real: dict[str, RealCase], run: Run, tmp_path: Path,
                                  name: str) -> None:
    case = case_of(real, name)
    out = tmp_path / "out.pth"
    result = run("normalize", case.path, out)
    assert result.exit_code == 2, result.stdout
    assert any(word in result.stderr for word in case.refusal), result.stderr
    assert "corrupt" not in result.stderr and "a ObjectRecord" not in result.stderr
    assert not out.exists()


def test_torchscript_with_trust(real: dict[str, RealCase], run: Run, tmp_path: Path) -> None:
    case = case_of(real, "torchscript_cuda1")
    assert case.expected is not None
    out = tmp_path / "ts.safetensors"
    result = run("normalize", case.path, out, "--trust")
    assert result.exit_code == 0, result.stderr
    assert_state(case, case.expected, out)
    assert run("diff", "--trust", case.path, out).exit_code == 0
    checked = run("check", case.path)
    assert checked.exit_code == 1, checked.stderr  # CKP011: an error finding, not unreadable
    assert "TorchScript" in checked.stdout and "CKP008" not in checked.stdout


@pytest.mark.parametrize("name", RECORDED)
def test_inspect_reports_the_recorded_device(real: dict[str, RealCase], run: Run,
                                             name: str) -> None:
    case = case_of(real, name)
    result = run("inspect", case.path)
    assert result.exit_code == 0, result.stderr
    for device in case.recorded:
        assert device in result.stdout
    assert "all storages on cpu" not in result.stdout


def test_check_finds_pth_tar_files_in_folders(real: dict[str, RealCase], run: Run) -> None:
    case = case_of(real, "pth_tar_folder")
    result = run("check", case.path, "--format", "json")
    assert result.exit_code == 1, result.stderr  # warnings on every file, none unreadable
    assert result.stderr == ""
    doc = json.loads(result.stdout)
    files = {Path(f["path"]): f for f in doc["files"]}
    assert set(files) == set(case.members)
    assert doc["skipped"] == [] and doc["findings"] == 2 * len(case.members)
    for member, report in files.items():  # each read: saved on a GPU, wrapped in DDP
        assert report["unreadable"] is False, member
        assert sorted(f["code"] for f in report["findings"]) == ["CKP001", "CKP004"], member


# --------------------------------------------------------------------------
# --select all: plain data only


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", WITH_ALL)
def test_select_all_is_plain_data(real: dict[str, RealCase], run: Run, tmp_path: Path,
                                  name: str, fmt: str) -> None:
    case = case_of(real, name)
    out = tmp_path / f"all.{fmt}"
    result = run("normalize", case.path, out, "--select", "all")
    assert result.exit_code == 0, result.stderr
    tree = torch.load(out, weights_only=True) if fmt == "pth" else ckptport.read(out).tree
    problems = tree_differences(case.expected_all, tree)
    assert problems == [], problems[:10]


def test_extra_state_that_cannot_be_seen_is_said(real: dict[str, RealCase], run: Run,
                                                 tmp_path: Path) -> None:
    """A custom class's get_extra_state leaves no trace in the file: the report says so."""
    case = case_of(real, "whole_model_extra_state")
    result = run("normalize", case.path, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    assert "FP8Linear" in result.stdout and "get_extra_state" in result.stdout
