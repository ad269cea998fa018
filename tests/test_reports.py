"""Reports name what a user has or gets, never ckptport's own classes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

INTERNAL = re.compile(r"\bckptport\.[a-z_.]+\.[A-Z]\w*")  # a module path, then a class


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> object:
    path = tmp_path_factory.mktemp("objects") / "objects.pth"
    torch.save({"state_dict": {"w": torch.ones(2)}, "class_weights": np.ones(3, "float32"),
                "mean": np.float64(0.5), "shape": torch.Size([2, 3])}, path)
    return path


@pytest.mark.parametrize("fmt", ["text", "json", "markdown"])
def test_no_internal_class_name_reaches_a_report(objects, fx, run, tmp_path, fmt):
    for src in (objects, fx["ddp_cuda3"], fx["nested"]):
        for args in (("normalize", src, tmp_path / f"{src.stem}-{fmt}.pth", "--select", "all"),
                     ("inspect", src), ("diff", src, src, "--select", "all")):
            if fmt == "markdown" and args[0] != "diff":
                continue
            result = run(*args, "--format", fmt)
            assert result.exit_code == 0, result.output
            assert not INTERNAL.findall(result.stdout), (args, INTERNAL.findall(result.stdout))
    converted = run("normalize", objects, tmp_path / "again.pth", "--select", "all").stdout
    assert "class_weights: numpy.ndarray -> torch.Tensor" in converted
