"""Names: a closed world for the standard library, an honest tier for third-party calls.

Capitalisation never decides: ``wave.Wave_write(path)`` creates a file under
full unpickling and is refused; pyannote's ``Problem(2)`` is a package's enum
member, reported in a tier of its own (CKP012) and kept as data; a
``getattr`` on an inert class record is an inert reference.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

import ckptport
from ckptport.errors import UnsafeCheckpointError
from ckptport.unpickle import names, stdlib
from fixtures.hostile import PROTO2, STOP, call, global_, in_dict, storage, tensor, text, write_zip


def test_the_table_covers_the_standard_library():
    assert set(sys.stdlib_module_names) <= stdlib.MODULES
    assert set(stdlib.DATA_NAMES) <= stdlib.MODULES


def test_every_data_name_exists_and_is_not_a_function():
    for module, members in stdlib.DATA_NAMES.items():
        loaded = importlib.import_module(module)
        for name in members:
            value = getattr(loaded, name, None)
            assert value is not None, f"{module}.{name} does not exist"
            assert not callable(value) or isinstance(value, type) or name in {
                "_array_reconstructor"} or module == "typing", f"{module}.{name}"


@pytest.mark.parametrize("name", [
    "wave.Wave_write", "aifc.Aifc_write", "sunau.Au_write", "sqlite3.Connection",
    "mailbox.Maildir", "mailbox.MH", "shelve.open", "zoneinfo.ZoneInfo", "logging.FileHandler",
    "tempfile.TemporaryDirectory", "os.system", "builtins.open", "re.compile",
])
def test_standard_library_names_beyond_the_data_table_run_code(name):
    assert names.is_code(name)


@pytest.mark.parametrize("name", [
    "collections.OrderedDict", "datetime.datetime", "builtins.ValueError", "uuid.UUID",
    "pathlib.PosixPath", "typing.List", "argparse.Namespace",
])
def test_data_names_are_classes_that_run_nothing(name):
    assert not names.is_code(name) and names.known_class(name)


@pytest.mark.parametrize("name", [
    "pyannote.audio.core.task.Problem", "openff.nagl.nn.ActivationFunction",
    "mypkg.factory.make_model", "MyPkg.Thing", "mypkg.thing",
])
def test_third_party_names_are_inert_and_unproven_whatever_their_case(name):
    assert not names.is_code(name) and not names.known_class(name)


def _state_dict_and(extra_key: str, extra: bytes) -> bytes:
    pid = storage("0", 2)
    weights = in_dict(text("w"), tensor(pid, 0, (2,), (1,)))
    return PROTO2 + in_dict(text("state_dict"), weights, text(extra_key), extra) + STOP


@pytest.fixture(scope="module")
def enums(tmp_path_factory) -> Path:
    """whisperx's pytorch_model.bin in small: pyannote's Problem/Resolution enum members
    (a REDUCE of the class on an int) in the hyper-parameters beside the weights."""
    problem = call(global_("pyannote.audio.core.task", "Problem"), b"K\x02")
    resolution = call(global_("pyannote.audio.core.task", "Resolution"), b"K\x01")
    body = _state_dict_and("hyper_parameters",
                           in_dict(text("problem"), problem, text("resolution"), resolution))
    return write_zip(tmp_path_factory.mktemp("enums") / "pytorch_model.bin", body, (("0", 2),))


def test_a_packages_enums_are_their_own_tier_not_code(enums, run):
    shown = run("check", enums, "--format", "json")
    assert shown.exit_code == 1, shown.stdout
    findings = json.loads(shown.stdout)["files"][0]["findings"]
    assert {f["code"] for f in findings} == {"CKP012"}
    calls = sorted(f["message"] for f in findings if f["code"] == "CKP012")
    assert "calls pyannote.audio.core.task.Problem(…)" in calls[0]
    accepted = run("check", enums, "--ignore", "CKP012")
    assert accepted.exit_code == 0, accepted.stdout


def test_normalize_keeps_the_enum_members_as_data(enums, run, tmp_path):
    out = tmp_path / "all.pth"
    assert run("normalize", enums, out, "--select", "all").exit_code == 0
    written = torch.load(out, weights_only=True)
    assert written["hyper_parameters"]["problem"] == {
        "__class__": "pyannote.audio.core.task.Problem", "__args__": [2]}
    assert torch.equal(written["state_dict"]["w"], torch.zeros(2))


def test_a_third_party_call_handed_tensors_is_refused(tmp_path, run):
    """torch would build the value by running the call; ckptport cannot know what it holds."""
    pid = storage("0", 2)
    made = call(global_("mypkg.factory", "build"), tensor(pid, 0, (2,), (1,)))
    path = write_zip(tmp_path / "handed.pt", PROTO2 + in_dict(text("model"), made) + STOP,
                     (("0", 2),))
    with pytest.raises(UnsafeCheckpointError, match="mypkg.factory.build"):
        ckptport.read(path)
    assert run("normalize", path, tmp_path / "o.pth", "--select", "all").exit_code == 2
    codes = {f["code"] for f in json.loads(run("check", path, "--format", "json").stdout)[
        "files"][0]["findings"]}
    assert "CKP012" in codes and "CKP003" not in codes


def test_getattr_on_an_inert_class_is_an_inert_reference(tmp_path, run):
    """ultralytics' yolo11n-seg.pt pickles builtins.getattr(Detect, "forward")."""
    forward = call(global_("builtins", "getattr"),
                   global_("ultralytics.nn.modules.head", "Detect"), text("forward"))
    path = write_zip(tmp_path / "yolo.pt", _state_dict_and("forward", forward), (("0", 2),))
    tree = ckptport.read(path).tree
    assert tree["forward"].name == "ultralytics.nn.modules.head.Detect.forward"
    findings = json.loads(run("check", path, "--format", "json").stdout)["files"][0]["findings"]
    assert "CKP003" not in {f["code"] for f in findings}
    assert run("normalize", path, tmp_path / "y.pth").exit_code == 0


def _getattr(target: bytes, name: str) -> bytes:
    return call(global_("builtins", "getattr"), target, text(name))


@pytest.mark.parametrize("target", [
    text("os"), global_("os", "system"), global_("builtins", "object"),
    # from a harmless data class to os.system by attributes: on Python 3.12+
    # PurePath._flavour is os.path, whose .os is the os module
    _getattr(_getattr(global_("pathlib", "PurePath"), "_flavour"), "os"),
    _getattr(global_("pathlib", "PurePath"), "os"),  # a stdlib attribute beyond data
    _getattr(global_("ultralytics.nn.modules.head", "Detect"), "forward"),  # a chain
    global_("pathlib", "PurePath"),  # PurePath.system: a stdlib attribute beyond data
])
def test_getattr_on_anything_else_is_refused(tmp_path, sentinel, target):
    reached = _getattr(target, "system")
    path = write_zip(tmp_path / "g.pt", PROTO2 + call(reached, text(f"touch {sentinel}"))
                     + STOP, ())
    with pytest.raises(ckptport.CkptportError):
        ckptport.read(path)
    assert not sentinel.exists()
