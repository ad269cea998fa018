"""Names are judged by what they reach (issue 26), tested by class.

Every module of ckptport's allow-list is walked: each attribute a file can
name as a global (``torch.os``), and each attribute of each class reached
that a ``builtins.getattr`` can take (``Linear.forward``), is judged as the
unpickler would meet it, and checked against what the object really is:
every module and every standard-library object beyond the data table is
code-running, every function torch could run for the file is code-running
when called, and those whose bytecode imports, opens, evaluates or loads
are code-running even named. Then the enumerated hostile files of
``fixtures/reached.py``: each payload is proven to run under
``torch.load(weights_only=False)``, and no ckptport command runs it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import ckptport
from ckptport.errors import UnsafeCheckpointError
from ckptport.unpickle import names, stdlib
from ckptport.unpickle.allowed import allowed_names
from ckptport.unpickle.names import Kind
from ckptport.unpickle.reach import RESOLVED_PACKAGES, SCALAR_HOMES, Reach, describe
from ckptport.unpickle.snapshots import TORCH_NN_CLASSES, TORCH_NN_FUNCTIONS
from fixtures.hostile import PROTO2, STOP, call, global_, in_dict, text, write_zip
from fixtures.reached import build_reached

ALLOWED = allowed_names()
MODULES = sorted({name.rpartition(".")[0] for name in ALLOWED})
# what a function's own bytecode names when it imports, evaluates, opens, loads, saves or
# writes what its arguments say: such a function is code-running even held as a value
PRIMITIVES = frozenset({
    "__import__", "import_module", "exec", "eval", "compile", "open", "system", "Popen",
    "popen", "load", "loads", "save", "from_file", "_import_dotted_name", "setattr",
    "modules", "_load_from_bytes",
})


def _resolved(module: str) -> bool:
    """Modules whose names ckptport judges fully: torch by reach, the rest by closed tables."""
    return module.split(".", 1)[0] in {*RESOLVED_PACKAGES, "numpy"} or stdlib.is_stdlib(module)


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _primitives(value: object) -> set[str]:
    code = getattr(inspect.unwrap(value), "__code__", None) if callable(value) else None
    return set().union(*(set(c.co_names) & PRIMITIVES for c in _codes(code))) if code else set()


def _expect(path: str, value: object, verdict: names.Verdict, named: bool) -> str | None:
    """Why ``verdict`` is wrong for ``value`` reached by ``path``; None when it holds."""
    if path in ALLOWED:
        return None  # ckptport's own wrapper answers it, never the real object
    if type(value) in (staticmethod, classmethod):  # type(): a proxy's __class__ runs code
        value = value.__func__
    home = describe(value, path).home
    if stdlib.is_stdlib(path):  # the closed table answers by the name itself
        return None if (verdict.kind is Kind.CODE) != stdlib.is_data(path) else "the table"
    if issubclass(type(value), types.ModuleType):
        return None if verdict.kind is Kind.CODE else "a module not judged code-running"
    if stdlib.is_stdlib(home) and not stdlib.is_data(home) and home not in SCALAR_HOMES:
        return None if verdict.kind is Kind.CODE else f"{home} is standard-library code"
    if named and type(value) is types.FunctionType and _primitives(value) and \
            value.__module__ == path.rpartition(".")[0]:
        return None if verdict.kind is Kind.CODE else (
            f"its bytecode uses {sorted(_primitives(value))}")
    if callable(value) and not issubclass(type(value), type):
        return None if verdict.kind is Kind.CODE or verdict.called else (
            "a function whose call is not code-running")
    return None if verdict.kind is not Kind.ALLOWED or path in ALLOWED else "allowed by reach"


def _walk() -> tuple[dict[str, str], int, list[tuple[str, type]]]:
    """Every global of every allowed module, judged: (wrong verdicts, count, inert classes)."""
    wrong: dict[str, str] = {}
    count = 0
    classes: list[tuple[str, type]] = []
    for module in MODULES:
        if not _resolved(module):
            continue
        for attribute, value in vars(importlib.import_module(module)).items():
            path = f"{module}.{attribute}"
            verdict = names.judge(path, False, ALLOWED)
            count += 1
            why = _expect(path, value, verdict, named=True)
            if why:
                wrong[path] = why
            if issubclass(type(value), type) and verdict.kind is not Kind.CODE:
                classes.append((path, value))  # inert, or allowed (ShardedTensor's record)
    return wrong, count, classes


@pytest.fixture(scope="module")
def walked() -> tuple[dict[str, str], int, list[tuple[str, type]]]:
    return _walk()


def test_every_global_of_an_allowed_module_is_judged_by_what_it_reaches(walked):
    wrong, count, _ = walked
    assert count > 3000  # torch's namespace alone holds thousands
    assert not wrong, '\n'.join(f'{k}: {v}' for k, v in sorted(wrong.items()))


def test_every_attribute_a_getattr_takes_from_a_class_reached_is_judged(walked):
    _, _, classes = walked
    wrong: dict[str, str] = {}
    count = 0
    for path, cls in classes:
        for attribute in dir(cls):
            if attribute.startswith("_"):
                continue  # refused by getattr whatever it reaches
            try:
                value = inspect.getattr_static(cls, attribute)
            except AttributeError:
                continue
            count += 1
            why = _expect(f"{path}.{attribute}", value,
                          names.judge_attribute(path, attribute), named=False)
            if why:
                wrong[f"{path}.{attribute}"] = why
    assert count > 1000
    assert not wrong, wrong


def test_every_global_of_every_torch_module_is_judged_by_what_it_reaches():
    """Beyond the allow-list: every attribute of every module ``import torch`` loads."""
    wrong: dict[str, str] = {}
    count = 0
    for module, loaded in sorted(sys.modules.items()):
        if loaded is None or not (module == "torch" or module.startswith("torch.")):
            continue
        for attribute, value in list(vars(loaded).items()):
            path = f"{module}.{attribute}"
            count += 1
            why = _expect(path, value, names.judge(path, False, ALLOWED), named=False)
            if why:
                wrong[path] = why
    assert count > 20_000
    assert not wrong, "\n".join(f"{k}: {v}" for k, v in sorted(wrong.items()))


@pytest.mark.parametrize("path", ["torch.os", "torch.sys", "torch.builtins", "torch.importlib",
                                  "torch.serialization", "torch._utils.os", "torch.nn"])
def test_a_module_reached_through_torch_is_code(path):
    verdict = names.judge(path, False, ALLOWED)
    assert verdict.kind is Kind.CODE and "it reaches the module" in verdict.reaches(path)


@pytest.mark.parametrize(("owner", "attribute", "home"), [
    ("torch.os", "system", "posix.system"), ("torch.builtins", "exec", "builtins.exec"),
    ("torch.nn.modules.module.OrderedDict", "fromkeys", "collections.OrderedDict.fromkeys"),
])
def test_an_attribute_is_judged_by_its_home(owner, attribute, home):
    verdict = names.judge_attribute(owner, attribute)
    assert verdict.kind is Kind.CODE and home in verdict.reaches(f"{owner}.{attribute}")


def test_what_cannot_be_followed_without_running_code_is_code():
    """torch's lazy attributes (module ``__getattr__``) and missing names: unknown, so code."""
    for path in ("torch.nn.Lineer", "torch.utils.nothing_here.Thing"):
        verdict = names.judge(path, False, ALLOWED)
        assert verdict.kind is Kind.CODE and "cannot resolve" in verdict.reaches(path)


def test_a_package_ckptport_does_not_import_is_unresolved_never_allowed():
    for path in ("deepspeed.runtime.zero.config.os", "pyannote.audio.core.task.Problem"):
        verdict = names.judge(path, False, ALLOWED)
        assert verdict.kind is Kind.INERT and verdict.reached is None
        assert path.split(".")[0] not in sys.modules or path.startswith("deepspeed")


def test_a_packages_own_members_keep_its_tier():
    """FSDP's enum members and ShardedTensor's nested class: data, as the class is."""
    for owner, attribute in (("torch.distributed.fsdp.api.ShardingStrategy", "FULL_SHARD"),
                             ("torch.distributed._shard.sharded_tensor.api.ShardedTensor",
                              "ProcessGroupState")):
        assert names.judge_attribute(owner, attribute).kind is Kind.INERT


def _nn_loaded_by_import_torch() -> list[str]:
    """The torch.nn modules a fresh ``import torch`` loads (this process has loaded more:
    whatever earlier tests imported)."""
    probe = ("import json, sys, torch\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('torch.nn.'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def _nn_defined() -> tuple[set[str], set[str]]:
    """torch.nn's classes and functions defined where their names say, not allowed, not code."""
    classes, functions = set(), set()
    for module in _nn_loaded_by_import_torch():
        loaded = sys.modules.get(module) or importlib.import_module(module)
        for attribute, value in vars(loaded).items():
            path = f"{module}.{attribute}"
            reached = describe(value, path)
            if path in ALLOWED or names.is_code(path) or reached.home != path:
                continue
            if reached.kind is Reach.CLASS:
                classes.add(path)
            elif reached.kind is Reach.FUNCTION:
                functions.add(path)
    return classes, functions


def test_the_torch_nn_snapshot_matches_the_installed_torch():
    """What reach knows without importing torch is what importing it would show."""
    classes, functions = _nn_defined()
    assert set(TORCH_NN_CLASSES) == classes, (set(TORCH_NN_CLASSES) ^ classes)
    assert set(TORCH_NN_FUNCTIONS) == functions, (set(TORCH_NN_FUNCTIONS) ^ functions)


def test_inspect_and_check_of_a_pickled_model_import_no_torch(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(_Blocks(), path)
    probe = ("import sys\nfrom ckptport.cli import main\nsys.argv = ['ckptport', *sys.argv[1:]]\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "assert 'torch' not in sys.modules, 'torch was imported'\n")
    for command in ("inspect", "check"):
        done = subprocess.run([sys.executable, "-c", probe, command, str(path)],
                              capture_output=True, text=True, timeout=120)
        assert "torch was imported" not in done.stderr and done.stdout, done.stderr


# -- the hostile files ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def proven(tmp_path_factory) -> dict[str, Path]:
    """The payloads, each shown to create its sentinel under full unpickling."""
    root = tmp_path_factory.mktemp("reached-proof")
    (root / "ran").mkdir()
    files = build_reached(root / "files", root / "ran")
    script = ("import sys, warnings, torch\nwarnings.simplefilter('ignore')\n"
              "for p in sys.argv[1:]:\n    try: torch.load(p, weights_only=False)\n"
              "    except Exception: pass\n")
    subprocess.run([sys.executable, "-c", script, *map(str, files.values())], check=True,
                   capture_output=True, timeout=120)
    ran = {p.name for p in (root / "ran").iterdir()}
    assert ran == set(files), set(files) - ran
    return files


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, proven) -> tuple[dict[str, Path], Path]:
    root = tmp_path_factory.mktemp("reached")
    (root / "ran").mkdir()
    return build_reached(root / "files", root / "ran"), root / "ran"


def test_the_attacks_are_enumerated(proven):
    assert {"torch.os", "torch.builtins", "torch._utils.importlib", "torch._utils.sys",
            "torch._utils.pickle", "torch.serialization.save",
            "torch._utils._import_dotted_name"} <= set(proven)


def test_check_reports_code_even_with_the_warnings_ignored(hostile, run):
    files, ran = hostile
    result = run("check", *files.values(), "--ignore", "CKP002,CKP012", "--format", "json")
    assert result.exit_code == 1, result.stdout
    for report in json.loads(result.stdout)["files"]:
        assert "CKP003" in {f["code"] for f in report["findings"]}, report
    assert run("check", files["torch.os"], "--ignore", "CKP003").exit_code == 2
    assert not any(ran.iterdir())


def test_normalize_read_and_inspect_refuse_or_name_them(hostile, run, tmp_path):
    files, ran = hostile
    for name, path in files.items():
        out = tmp_path / f"{name}.pth"
        result = run("normalize", path, out, "--select", "all")
        assert result.exit_code == 2 and "which can run code" in result.stderr, (name,
                                                                                 result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
        with pytest.raises(UnsafeCheckpointError):
            ckptport.read(path)
        shown = json.loads(run("inspect", path, "--format", "json").stdout)
        assert shown["dangerous_globals"], name
    assert not any(ran.iterdir())


def _getattr(target: bytes, name: str) -> bytes:
    return call(global_("builtins", "getattr"), target, text(name))


@pytest.mark.parametrize("reached", [
    call(global_("torch.nn.functional", "relu"), text("x")),  # a torch function, called
    call(_getattr(global_("torch.nn.modules.linear", "Linear"), "forward"), text("x")),
    _getattr(global_("torch.nn.modules.module", "OrderedDict"), "fromkeys"),
])
def test_a_resolved_function_the_file_calls_is_code(tmp_path, run, reached):
    path = write_zip(tmp_path / "f.pt", PROTO2 + in_dict(text("x"), reached) + STOP, ())
    with pytest.raises(UnsafeCheckpointError):
        ckptport.read(path)
    result = run("check", path, "--ignore", "CKP002,CKP012", "--format", "json")
    assert result.exit_code == 1
    assert "CKP003" in {f["code"] for f in json.loads(result.stdout)["files"][0]["findings"]}


# -- the valid files that must still pass --------------------------------------------------


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16)  # F.relu, a value
        self.norm = nn.LayerNorm(8)
        self.conv = nn.Sequential(nn.Conv1d(2, 2, 3), nn.BatchNorm1d(2), nn.ReLU())


def test_a_pickled_model_holding_torch_functions_as_values_passes(tmp_path, run):
    path = tmp_path / "model.pt"
    torch.save(_Blocks(), path)
    shown = json.loads(run("check", path, "--format", "json").stdout)
    codes = {f["code"] for f in shown["files"][0]["findings"]}
    assert "CKP003" not in codes and "CKP008" not in codes, shown
    assert run("normalize", path, tmp_path / "all.pth", "--select", "all").exit_code == 0
    assert "torch.nn.functional.relu" in run("inspect", path, "--format", "json").stdout
