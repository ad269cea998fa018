"""The real-world fixture generator (``fixtures/real_world.py``) checked, not ckptport.

These hold whatever ckptport does: the cases are what the test table in
``tests/test_real_world.py`` says, small, repeatable, and their ground truth
is what full unpickling (our own files, classes importable) gives.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import pytest

from fixtures.real_world import THROWAWAY_MODULES, RealCase, build_real_world, importable, plain
from tests.helpers import load_trusted
from tests.test_real_world import (
    NO_STATE_DICT,
    RECORDED,
    REFUSED,
    TRUSTED,
    WITH_ALL,
    WITH_EMA,
    case_of,
    tree_differences,
)


def test_case_table_matches_the_generator(real: dict[str, RealCase]) -> None:
    for name, case in real.items():
        assert (case.expected is None) == (name in (*REFUSED, *NO_STATE_DICT)), name
        assert bool(case.refusal) == (name in (*REFUSED, *TRUSTED)), name
        assert case.needs_trust == (name in TRUSTED), name
        assert (case.expected_all is not None) == (name in WITH_ALL), name
        assert (case.expected_ema is not None) == (name in WITH_EMA), name
        if name != "pth_tar_folder":
            assert bool(case.recorded) == (name in RECORDED), name


def test_files_are_small(real: dict[str, RealCase]) -> None:
    files = {p for case in real.values()
             for p in ([case.path] if case.path.is_file() else case.path.rglob("*"))
             if p.is_file()}
    assert all(p.stat().st_size < 1_000_000 for p in files)
    assert sum(p.stat().st_size for p in files) < 10_000_000


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_generation_repeats_its_bytes(real: dict[str, RealCase], real_root: Path,
                                      tmp_path: Path) -> None:
    build_real_world(tmp_path / "again")
    assert _digests(tmp_path / "again") == _digests(real_root)


def test_classes_are_unimportable_outside_generation() -> None:
    for module in THROWAWAY_MODULES:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(module)


@pytest.mark.parametrize("name", ["whole_model", "yolo_like", "fx_graph_module"])
def test_ground_truth_is_what_full_unpickling_gives(real: dict[str, RealCase], name: str) -> None:
    """Our own fixture, fully unpickled with its classes importable: the same state dict."""
    case = case_of(real, name)
    with importable():
        loaded = load_trusted(case.path)
    module = loaded["model"] if name == "yolo_like" else loaded
    state = module.state_dict()
    assert tree_differences(dict(case.expected or {}), dict(state)) == []
    assert {k: dict(v) for k, v in state._metadata.items()} == case.expected_metadata
    if name == "yolo_like":
        assert tree_differences(dict(case.expected_ema or {}),
                                dict(loaded["ema"].state_dict())) == []


@pytest.mark.parametrize("name", ["refused_objects", "hf_training_args"])
def test_expected_all_is_plain_of_the_unpickled_tree(real: dict[str, RealCase],
                                                      name: str) -> None:
    case = case_of(real, name)
    with importable():
        loaded = load_trusted(case.path)
    assert tree_differences(case.expected_all, plain(loaded)) == []


@pytest.mark.parametrize("name", ["whole_model_state_dict_hook", "whole_model_extra_state"])
def test_code_changes_the_true_state_dict(real: dict[str, RealCase], name: str) -> None:
    """Why one is refused and the other noted: state_dict() has a key only code produces."""
    case = case_of(real, name)
    with importable():
        state = load_trusted(case.path).state_dict()
    assert any(k.endswith(("format_version", "_extra_state")) for k in state)


