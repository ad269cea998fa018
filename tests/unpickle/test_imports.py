"""A package ckptport never imports is judged by what its source imports (issue 26).

A fake installed package whose import would create a sentinel binds the
standard library, torch and its own submodules under innocent names; each
such name is code-running, read from the source without importing it, and
what the package defines itself stays in the tier its text gives it. Then
the allow-list's own third-party modules (DeepSpeed's), judged from source
first, are compared with what importing them shows.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import ckptport
from ckptport.errors import UnsafeCheckpointError
from ckptport.unpickle import imports, names, reach
from ckptport.unpickle.allowed import allowed_names
from ckptport.unpickle.names import Kind
from fixtures.hostile import PROTO2, STOP, call, global_, in_dict, text, write_zip

ALLOWED = allowed_names()


@pytest.fixture
def package(tmp_path, monkeypatch) -> tuple[str, Path]:
    """``fakepkg``, on sys.path, whose import creates ``imported``."""
    imported = tmp_path / "imported"
    root = tmp_path / "site" / "fakepkg"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text(
        f"open({str(imported)!r}, 'w').close()\n"
        "import os\nfrom subprocess import run as go\nfrom .inner import helper_alias\n"
        "from torch import save\nfrom collections import OrderedDict\n"
        "from torch.nn.functional import relu as act\n"
        "try:\n    import json as fast\nexcept ImportError:\n    fast = None\n"
        "class Config:\n    pass\n\ndef helper(x):\n    return x\n")
    (root / "inner.py").write_text("import sys as helper_alias\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for cached in (reach.reach, imports.bindings, imports._source):
        cached.cache_clear()
    yield "fakepkg", imported
    for cached in (reach.reach, imports.bindings, imports._source):
        cached.cache_clear()


@pytest.mark.parametrize(("name", "reaches"), [
    ("os", "the module os"), ("go", "subprocess.run"), ("helper_alias", "fakepkg.inner"),
    ("save", "torch.save"), ("fast", "the module json"), ("inner", "the module fakepkg.inner"),
])
def test_what_its_source_imports_is_code(package, name, reaches):
    verdict = names.judge(f"fakepkg.{name}", False, ALLOWED)
    assert verdict.kind is Kind.CODE and reaches in verdict.reaches(f"fakepkg.{name}")
    assert "fakepkg" not in sys.modules and not package[1].exists()


def test_what_it_defines_keeps_its_texts_tier(package):
    for name in ("Config", "helper", "nothing_here"):
        assert names.judge(f"fakepkg.{name}", False, ALLOWED).kind is Kind.INERT
    assert names.judge("fakepkg.OrderedDict", False, ALLOWED).kind is Kind.INERT
    act = names.judge("fakepkg.act", False, ALLOWED)  # torch's function: a value, not a call
    assert act.kind is Kind.INERT and act.called
    assert names.judge_attribute("fakepkg.OrderedDict", "fromkeys").kind is Kind.CODE
    assert names.judge_attribute("fakepkg.Config", "anything").kind is Kind.INERT
    assert "fakepkg" not in sys.modules and not package[1].exists()


def test_a_payload_through_its_imports_is_refused(package, tmp_path, run):
    ran = tmp_path / "ran"
    body = call(call(global_("builtins", "getattr"), global_("fakepkg", "os"), text("system")),
                text(f"touch {ran}"))
    path = write_zip(tmp_path / "f.pt", PROTO2 + body + b"0" + in_dict() + STOP, ())
    script = "import sys, torch; torch.load(sys.argv[1], weights_only=False)"
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, capture_output=True,
                   timeout=120, env={"PYTHONPATH": str(tmp_path / "site")})
    assert ran.exists()  # full unpickling runs it (and imports fakepkg)
    ran.unlink()
    package[1].unlink()
    result = run("check", path, "--ignore", "CKP002,CKP012", "--format", "json")
    assert result.exit_code == 1
    assert "CKP003" in {f["code"] for f in json.loads(result.stdout)["files"][0]["findings"]}
    with pytest.raises(UnsafeCheckpointError, match="fakepkg.os"):
        ckptport.read(path)
    assert not ran.exists() and not package[1].exists()


def test_every_module_an_allowed_third_party_module_holds_is_code():
    """DeepSpeed's allowed modules, imported here only to know the truth: every module
    among their attributes is code-running, judged from source (reach never imports)."""
    pytest.importorskip("deepspeed")
    modules = sorted({n.rpartition(".")[0] for n in ALLOWED if n.startswith("deepspeed")})
    count = 0
    for module in modules:
        for attribute, value in vars(importlib.import_module(module)).items():
            count += 1
            if type(value) is types.ModuleType:
                path = f"{module}.{attribute}"
                assert names.judge(path, False, ALLOWED).kind is Kind.CODE, path
    assert count > 50
