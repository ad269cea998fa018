"""``ckptport diff`` end to end: exit codes, what each report says, the Python API."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ckptport
import ckptport.analysis.diffing
from ckptport.render import FORMATTERS, formatter

DIFF_MODULE = importlib.import_module("ckptport.compare")  # the window engine
GOLDEN = Path(__file__).with_name("golden") / "diff_small.json"


def _st(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def clean(fx, tmp_path_factory) -> Path:
    """fx["ddp_cuda3"] normalized to .safetensors with ckptport.convert."""
    out = tmp_path_factory.mktemp("diff") / "clean.safetensors"
    ckptport.normalize_file(fx["ddp_cuda3"], out)
    return out


@pytest.fixture
def weights(clean) -> dict[str, torch.Tensor]:
    """Writable copies of the clean weights, to perturb."""
    return {k: v.clone() for k, v in ckptport.read(clean).tree.items()}


def test_identical_files_are_equal(fx, run):
    result = run("diff", fx["plain"], fx["plain"])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    count = len(ckptport.read(fx["plain"]).tree)
    assert first == f"{count} tensors compared: {count} equal, 0 differ"


@pytest.mark.parametrize("name", ["ddp_cuda3", "ddp_cuda3_legacy"])
def test_same_weights_across_formats_and_wrappers(fx, run, clean, name):
    result = run("diff", fx[name], clean)
    assert result.exit_code == 0, result.output
    assert "map-to-cpu: 15 storages cuda:3 -> cpu" in result.stdout
    assert "strip-prefixes: renamed" in result.stdout


def test_raw_compares_as_stored(fx, run, clean):
    result = run("diff", "--raw", fx["ddp_cuda3"], clean)
    assert result.exit_code == 1
    assert "only in A" in result.stdout
    assert "state_dict.module.conv.weight" in result.stdout
    assert "--raw: compared as stored" in result.stdout


def test_raw_refuses_normalize_options(fx, run, clean):
    result = run("diff", "--raw", "--select", "all", "--dtype", "float16", fx["ddp_cuda3"],
                 clean)
    assert (result.exit_code, result.stderr) == (
        2, "ckptport: error: --raw compares as stored; it cannot be combined with --select, "
           "--dtype\n")


def test_one_perturbed_element_is_found_and_tolerance_passes_it(fx, run, clean, weights,
                                                                tmp_path):
    key = "conv.weight"
    weights[key][1, 2, 0, 1] += 1e-3
    other = _st(tmp_path / "perturbed.safetensors", weights)
    result = run("diff", fx["ddp_cuda3"], other)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].endswith(
        f"1 differ (largest |Δ| 1.0e-03 at {key})")
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith(key))
    assert f"1 of {weights[key].numel()}" in row and "[1, 2, 0, 1]" in row

    tolerant = run("diff", fx["ddp_cuda3"], other, "--atol", "1e-2")
    assert tolerant.exit_code == 0, tolerant.output
    assert "within tolerance" in tolerant.stdout.splitlines()[0]
    assert run("diff", fx["ddp_cuda3"], other, "--rtol", "1e-6").exit_code == 1


def test_largest_difference_is_located_across_chunks(monkeypatch, tmp_path):
    monkeypatch.setattr(DIFF_MODULE, "CHUNK_ELEMENTS", 7)
    a = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    b = a.clone()
    b[1, 3] += 0.5
    b[5, 8] -= 2.0
    report = ckptport.diff(_st(tmp_path / "a.safetensors", {"w": a}),
                           _st(tmp_path / "b.safetensors", {"w": b}))
    (delta,) = report.value_mismatches
    assert (delta.differing, delta.max_abs, delta.index, delta.a, delta.b) == (
        2, 2.0, (5, 8), 58.0, 56.0)
    assert delta.max_rel == pytest.approx(0.5 / 13)


def test_shape_change(run, weights, clean, tmp_path):
    weights["head.1.bias"] = torch.zeros(7)
    result = run("diff", clean, _st(tmp_path / "b.safetensors", weights))
    assert result.exit_code == 1
    assert "shapes differ (1):" in result.stdout
    assert "float32[5]" in result.stdout and "float32[7]" in result.stdout


def test_dtype_change_fails_unless_cast(run, weights, clean, tmp_path):
    weights["head.1.weight"] = weights["head.1.weight"].double()
    other = _st(tmp_path / "b.safetensors", weights)
    strict = run("diff", clean, other)
    assert strict.exit_code == 1
    assert "dtypes differ (values not compared; --cast compares them by value) (1):" in (
        strict.stdout)
    cast = run("diff", clean, other, "--cast")
    assert cast.exit_code == 0, cast.output
    assert "dtypes differ (compared by value, --cast) (1):" in cast.stdout


def test_cast_compares_values_at_common_precision(tmp_path):
    a = torch.tensor([1.0, 0.1, 3.0])
    report = ckptport.diff(_st(tmp_path / "a.safetensors", {"w": a}),
                           _st(tmp_path / "b.safetensors", {"w": a.half()}), cast=True)
    (delta,) = report.value_mismatches
    assert (delta.dtype_a, delta.dtype_b, delta.differing, delta.index) == (
        "float32", "float16", 1, (1,))


def test_keys_missing_on_either_side(run, weights, clean, tmp_path):
    del weights["conv.bias"]
    weights["extra.weight"] = torch.ones(2)
    result = run("diff", clean, _st(tmp_path / "b.safetensors", weights))
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].endswith("; 1 only in A; 1 only in B")
    assert lines[lines.index("only in A (1):") + 2].strip() == "conv.bias"
    assert lines[lines.index("only in B (1):") + 2].strip() == "extra.weight"


def test_nan_equals_nan_and_negative_zero_equals_zero(tmp_path):
    nan = float("nan")
    a = _st(tmp_path / "a.safetensors", {"w": torch.tensor([nan, -0.0, 1.0])})
    b = _st(tmp_path / "b.safetensors", {"w": torch.tensor([nan, 0.0, 1.0])})
    assert ckptport.diff(a, b).equal
    c = _st(tmp_path / "c.safetensors", {"w": torch.tensor([1.0, 0.0, 1.0])})
    (delta,) = ckptport.diff(a, c, atol=1e9).value_mismatches
    assert (delta.differing, delta.max_abs, delta.index) == (1, float("inf"), (0,))


def test_non_tensor_difference_with_select_all(fx, run, tmp_path):
    normalized = ckptport.normalize(ckptport.read(fx["ddp_cuda3"]),
                                    ckptport.NormalizeOptions(select="all")).checkpoint
    tree = dict(normalized.tree)
    tree["epoch"] = 4
    tree["args"] = {**tree["args"], "lr": 0.05}
    other = tmp_path / "epoch4.pth"
    ckptport.write(normalized.with_tree(tree), other)
    same = run("diff", "--select", "all", fx["ddp_cuda3"], fx["ddp_cuda3_legacy"])
    assert same.exit_code == 0, same.output
    result = run("diff", "--select", "all", fx["ddp_cuda3"], other)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].endswith("; 2 non-tensor values differ")
    rows = [line.split() for line in result.stdout.splitlines()[-2:]]
    assert rows == [["epoch", "3", "4"], ["args.lr", "0.1", "0.05"]]


@pytest.mark.parametrize("bad", ["truncated", "random", "empty", "directory"])
@pytest.mark.parametrize("side", [0, 1])
def test_unreadable_input_exits_2_naming_the_file(fx, run, clean, bad, side):
    paths = [clean, clean]
    paths[side] = fx[bad]
    result = run("diff", *paths)
    assert result.exit_code == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("ckptport: error: ") and str(fx[bad]) in line


def test_missing_file_exits_2(run, clean, tmp_path):
    result = run("diff", clean, tmp_path / "nope.pth")
    assert result.exit_code == 2
    assert "nope.pth" in result.stderr


def _small_pair(tmp_path: Path) -> tuple[Path, Path]:
    a = {"same": torch.arange(4.0), "gone": torch.ones(1), "grow": torch.zeros(2),
         "wider": torch.ones(2), "moved": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    b = {"same": torch.arange(4.0), "grow": torch.zeros(3), "wider": torch.ones(2).double(),
         "moved": torch.tensor([[1.0, 2.0], [3.0, 4.5]]), "new": torch.ones(1)}
    return _st(tmp_path / "a.safetensors", a), _st(tmp_path / "b.safetensors", b)


def test_golden_json_report(run, tmp_path):
    a, b = _small_pair(tmp_path)
    result = run("diff", a, b, "--format", "json")
    assert result.exit_code == 1
    text = result.stdout.replace(str(tmp_path), "<tmp>").replace(ckptport.__version__, "<v>")
    if os.environ.get("CKPTPORT_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_every_report_format_renders_a_diff(tmp_path):
    report = ckptport.diff(*_small_pair(tmp_path))
    for fmt in FORMATTERS:
        out = fmt.diff(report)
        shown = json.loads(out)["summary"] if fmt.name == "json" else out
        shown = shown.replace("\\|", "|")  # markdown escapes table pipes
        assert report.summary() in shown
    markdown = formatter("markdown").diff(report)
    assert markdown.startswith("### ckptport diff: different")
    assert "| `moved` | float32 | 1 of 4 | 5.0e-01 | 1.2e-01 | [1, 1] | 4 | 4.5 |" in markdown


def test_normalize_still_offers_only_text_and_json(run, fx, tmp_path):
    result = run("normalize", fx["plain"], tmp_path / "x.pth", "--format", "markdown")
    assert result.exit_code == 2


def test_limit_hides_rows_in_text(run, tmp_path):
    a = _st(tmp_path / "a.safetensors", {f"k{i}": torch.ones(1) for i in range(5)})
    b = _st(tmp_path / "b.safetensors", {"other": torch.ones(1)})
    result = run("diff", a, b, "--limit", "2")
    assert "  … and 3 more (--limit, or --format json lists all)" in result.stdout
    full = json.loads(run("diff", a, b, "--limit", "2", "--format", "json").stdout)
    assert full["only_in_a"] == [f"k{i}" for i in range(5)]


def test_python_api_takes_checkpoints_and_leaves_their_tensors_alone(clean, weights):
    weights["head.1.bias"][0] = 7.0
    mine = ckptport.read(clean)
    mine = mine.with_tree({k: v.clone() for k, v in mine.tree.items()} | weights)
    seen: list[int] = []

    def progress(description: str, total: int):
        seen.append(total)
        return seen.append

    report = ckptport.diff(clean, mine, progress=progress)
    assert isinstance(report, ckptport.analysis.diffing.DiffReport)
    assert [d.key for d in report.value_mismatches] == ["head.1.bias"]
    assert seen[0] == sum(seen[1:]) > 0
    assert float(mine.tree["head.1.bias"][0]) == 7.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.equal = True  # type: ignore[misc]
    with pytest.raises(ckptport.OptionError, match="raw=True"):
        ckptport.diff(clean, mine, raw=True, options=ckptport.NormalizeOptions())
