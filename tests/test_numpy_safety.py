"""Forged numpy objects are refused before numpy sees them; genuine ones still read.

Each forgery would crash the process (memory corruption) if it reached
numpy, so every command runs in a forked child (``fixtures.fuzz.run_case``):
a signal there is a finding, not a dead test session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import ckptport
from ckptport.cli import cli
from fixtures.fuzz import run_case
from fixtures.numpy_forgery import build_numpy_forgeries, genuine_numpy

FORGERIES = ("numpy_scalar_zip", "numpy_scalar_legacy", "numpy_array_zip",
             "numpy_array_legacy", "numpy_shared_dtype_zip", "numpy_shared_dtype_legacy",
             "numpy_scalar_dcp")


@pytest.fixture(scope="module")
def forged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_numpy_forgeries(tmp_path_factory.mktemp("numpy"))


def _refused_everywhere(path: Path, out: Path) -> None:
    """Every command on ``path``: exit 2 naming numpy, nothing written; raises if not."""
    runner = CliRunner()
    commands = {
        "normalize": ["normalize", str(path), str(out / "o.pth"), "--select", "all"],
        "diff": ["diff", str(path), str(path)],
        "inspect": ["inspect", str(path)],
        "check": ["check", str(path)],
    }
    for name, args in commands.items():
        result = runner.invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 2, (name, result.exit_code, result.output)
        assert "numpy" in result.output, (name, result.output)
    assert not list(out.iterdir())
    try:
        ckptport.read(path)
    except ckptport.CkptportError as exc:
        assert "numpy" in exc.line()
    else:
        raise AssertionError("ckptport.read accepted a forged numpy dtype")


@pytest.mark.parametrize("name", FORGERIES)
def test_forged_numpy_dtype_is_refused_without_crashing(forged, tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    assert run_case(forged[name], lambda p: _refused_everywhere(p, out)) is None


def test_genuine_numpy_values_still_convert(forged, tmp_path):
    dst = tmp_path / "o.pth"
    ckptport.normalize_file(forged["numpy_genuine"], dst, ckptport.NormalizeOptions(select="all"))
    loaded = torch.load(dst, weights_only=True)
    for key, value in genuine_numpy().items():
        if isinstance(value, np.ndarray):
            expected = torch.from_numpy(value.astype(value.dtype.newbyteorder("=")))
            assert torch.equal(loaded[key], expected), key
        elif isinstance(value, np.generic):
            assert loaded[key] == value.item() and type(loaded[key]) is type(value.item()), key
        else:
            assert torch.equal(loaded[key], value)
