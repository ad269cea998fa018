"""One error family: file problems are input errors naming the file, never usage errors or
escaped exceptions; options never swallow a path; what torch runs is what check sees."""

from __future__ import annotations

import errno
import importlib
import json
import math
import pickle
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from numpy._core.multiarray import _reconstruct, scalar

import ckptport
from ckptport import errors
from ckptport.analysis.manifests import load_manifest
from ckptport.errors import InputError, OptionError, UnsafeCheckpointError
from fixtures.hostile import LEGACY_MAGIC, call, global_, text


class _Reduce:
    """Pickles as ``reduce``: a value numpy's own pickling would write, with other parts."""

    def __init__(self, reduce: tuple[Any, ...]) -> None:
        self.reduce = reduce

    def __reduce__(self) -> tuple[Any, ...]:
        return self.reduce


def _array(dtype: str, shape: tuple[int, ...], data: bytes) -> _Reduce:
    return _Reduce((_reconstruct, (np.ndarray, (0,), b"b"),
                    (1, shape, np.dtype(dtype), False, data)))


NUMPY_REJECTS = {
    "s0_array": _array("S0", (3,), b""),
    "v0_scalar": _Reduce((scalar, (np.dtype("V0"), b""))),
    "dims_65": _array("f4", (1,) * 65, b"\0\0\0\0"),
    "generic_datetime": _array("M8", (2,), struct.pack("<2q", 1, 2)),
}


@pytest.fixture(scope="module")
def rejected(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("numpy")
    made = {}
    for name, value in NUMPY_REJECTS.items():
        made[name] = out / f"{name}.pt"
        torch.save({"state_dict": {"w": torch.ones(2)}, "value": value}, made[name])
    return made


@pytest.mark.parametrize("name", sorted(NUMPY_REJECTS))
def test_numpy_values_numpy_rejects_are_input_errors(rejected, run, tmp_path, name):
    path = rejected[name]
    for args in (("inspect", path), ("normalize", path, tmp_path / "o.pth", "--select", "all")):
        result = run(*args)
        if result.exit_code == 0:  # read as data numpy accepts; conversion must still work
            continue
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"ckptport: error: {path}: ")
        assert "internal error" not in result.stderr and "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.pth").exists() or name == "generic_datetime"


def test_check_keeps_the_good_files_report(rejected, fx, run):
    result = run("check", fx["plain"], rejected["s0_array"], "--format", "json")
    report = json.loads(result.stdout)
    assert result.exit_code == 2
    by_path = {Path(f["path"]).name: f for f in report["files"]}
    assert by_path["plain.pth"]["unreadable"] is False
    assert by_path["s0_array.pt"]["unreadable"] is True


def test_the_library_raises_the_family(rejected):
    with pytest.raises(ckptport.CkptportError, match="numpy itself rejects"):
        ckptport.read(rejected["s0_array"])


@pytest.mark.parametrize(("options", "field"), [
    ({"strip_prefixes": 5}, "strip_prefixes"), ({"ema": {}}, "ema"),
    ({"keep_prefixes": "yes"}, "keep_prefixes"), ({"dtype": "int4"}, "dtype"),
    ({"select": 3}, "select"), ({"colour": "red"}, "colour"),
])
def test_a_manifests_options_are_checked(fx, run, tmp_path, options, field):
    made = tmp_path / "m.json"
    assert run("manifest", fx["plain"], "-o", made).exit_code == 0
    doc = json.loads(made.read_text())
    doc["options"].update(options)
    made.write_text(json.dumps(doc))
    with pytest.raises(ckptport.InputError, match=f'"options".*{field}'):
        load_manifest(made)
    result = run("check", fx["plain"], "--against-manifest", made)
    assert result.exit_code == 2 and "internal error" not in result.stderr


@pytest.mark.parametrize("flag", ["--finite", "--finite-all"])
def test_no_option_swallows_a_path(fx, run, flag):
    result = run("check", flag, fx["dtypes"], "--format", "json")
    assert result.exit_code == 1, result.output  # dtypes holds a NaN
    assert [Path(f["path"]).name for f in json.loads(result.stdout)["files"]] == ["dtypes.pth"]


def test_ema_flags_never_swallow_a_path(fx, run, tmp_path):
    out = tmp_path / "e.pth"
    assert run("normalize", "--ema", fx["ema_timm"], out).exit_code == 0
    assert run("normalize", "--prefer-ema", fx["plain"], tmp_path / "p.pth").exit_code == 0


def test_a_dcp_folder_without_metadata_is_one_broken_checkpoint(run, tmp_path):
    folder = tmp_path / "broken_dcp"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"\0" * 64)
    out = tmp_path / "out.pth"
    result = run("normalize", folder, out)
    assert result.exit_code == 2 and not out.exists()
    assert "holds DCP data files (*.distcp) but no .metadata" in result.stderr


def test_a_folder_of_checkpoints_to_a_file_dst_is_a_usage_error(fx, run, tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.pth").write_bytes(fx["plain"].read_bytes())
    out = tmp_path / "out.pth"
    result = run("normalize", folder, out)
    assert result.exit_code == 2 and not out.exists()
    assert f"{folder}: is a folder of checkpoints" in result.stderr and "out.pth" in result.stderr


def test_complex_nan_and_negative_zero_verify(tmp_path, run):
    src = tmp_path / "z.pt"
    torch.save({"state_dict": {"w": torch.ones(1)}, "z": complex(math.nan, 1.0), "n": -0.0},
               src)
    for out in (tmp_path / "z.pth", tmp_path / "z.safetensors"):
        result = run("normalize", src, out, "--select", "all")
        assert result.exit_code == 0, result.stderr
    loaded = torch.load(tmp_path / "z.pth", weights_only=True)
    assert math.isnan(loaded["z"].real) and math.copysign(1, loaded["n"]) == -1


def test_no_numpy_warning_reaches_stderr(tmp_path, run):
    src = tmp_path / "ld.pt"
    torch.save({"state_dict": {"w": torch.ones(1)}, "huge": np.longdouble("1e4000")}, src)
    result = run("normalize", src, tmp_path / "o.pth", "--select", "all")
    assert result.exit_code == 0 and result.stderr == ""


def _legacy_with_magic_payload(sentinel: Path) -> bytes:
    """The magic-number pickle (the first a legacy file holds) calls os.system, then pushes
    the magic number: torch.load runs it before anything else."""
    magic = (b"\x80\x02" + call(global_("os", "system"), text(f"touch {sentinel}")) + b"0"
             + pickle.dumps(LEGACY_MAGIC, protocol=2)[2:])
    sys_info = {"protocol_version": 1001, "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 4}}
    return (magic + pickle.dumps(1001, protocol=2) + pickle.dumps(sys_info, protocol=2)
            + pickle.dumps({"w": 1}, protocol=2) + pickle.dumps([], protocol=2))


def test_a_payload_in_the_magic_pickle_is_named_by_every_command(tmp_path, run, sentinel):
    path = tmp_path / "magic.pt"
    path.write_bytes(_legacy_with_magic_payload(sentinel))
    check = run("check", path, "--format", "json")
    codes = {f["code"] for f in json.loads(check.stdout)["files"][0]["findings"]}
    assert check.exit_code == 1 and "CKP003" in codes
    assert "os.system" in run("inspect", path).stdout
    assert run("normalize", path, tmp_path / "o.pth").exit_code == 2
    assert not sentinel.exists()


def test_the_pickle_is_followed_past_the_first_mib(tmp_path, run, sentinel):
    """A pickle that skips 2 MiB (a string torch never looks inside) before its payload:
    the verdict of whether torch.load would run it reads as far as the pickle goes."""
    from ckptport.containers.sniff import torch_would_unpickle
    from ckptport.sources import open_source

    skipped = 2 << 20
    payload = call(global_("os", "system"), text(f"touch {sentinel}")) + b"."
    path = tmp_path / "x.pt"
    path.write_bytes(b"B" + struct.pack("<I", skipped) + b"{" * skipped + b"0" + payload)
    assert torch_would_unpickle(open_source(path))
    result = run("check", path, "--format", "json")
    codes = {f["code"] for f in json.loads(result.stdout)["files"][0]["findings"]}
    assert "CKP003" in codes and not sentinel.exists()


def test_the_cli_prints_before_importing_torch_or_the_commands():
    probe = ("import sys, ckptport.cli; "
             "print(sorted(m for m in sys.modules if m == 'torch' "
             "or m.startswith('ckptport.commands')))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("error", [
    UnsafeCheckpointError(None, ("os.system",), "runs code"),
    InputError("cut short"),
    OptionError("no such option value"),
])
def test_every_error_can_name_a_file_and_globals_later(error):
    """``at``/``naming`` copy the error whatever its constructor takes; it stays as raised."""
    named = error.at("/data/x.pth")
    assert type(named) is type(error) and named.path == "/data/x.pth"
    assert named.line().startswith("/data/x.pth: ") and error.path is None
    more = error.naming(("subprocess.Popen",), {})
    assert "subprocess.Popen" in more.dangerous and "subprocess.Popen" not in error.dangerous


def test_a_negative_tolerance_is_an_option_error(fx):
    from ckptport.errors import OptionError

    with pytest.raises(OptionError, match="atol and rtol"):
        ckptport.diff(fx["ddp_cuda3"], fx["ddp_cuda3"], atol=-1)
    with pytest.raises(OptionError, match="atol and rtol"):
        ckptport.check(fx["ddp_cuda3"], against=fx["ddp_cuda3"], rtol=float("nan"))


# Errors that also speak Python: each ckptport error is also the standard exception it is.
STANDARD = {
    errors.InputNotFoundError: FileNotFoundError,
    errors.InputIsADirectoryError: IsADirectoryError,
    errors.InputPermissionError: PermissionError,
    errors.InputOSError: OSError,
    errors.UnsafeCheckpointError: pickle.UnpicklingError,
    errors.DeadlineError: TimeoutError,
    errors.OptionError: ValueError,
    errors.SelectionError: KeyError,
    errors.RuleError: ValueError,
    errors.StateDictMismatchError: RuntimeError,
    errors.OutputExistsError: FileExistsError,
    errors.OutputNotFoundError: FileNotFoundError,
    errors.OutputIsADirectoryError: IsADirectoryError,
    errors.OutputPermissionError: PermissionError,
    errors.OutputOSError: OSError,
    errors.SignatureError: ValueError,
}
FAMILY = [getattr(errors, name) for name in errors.__all__ if name.endswith("Error")]


def test_the_tree_in_the_docstring_is_the_class_tree():
    """Every class is drawn under its parent, with the standard exception it also is."""
    drawn = {}
    for line in errors.__doc__.splitlines():
        found = re.match(r"^\s*[│ ]*(?:├── |└── )?(\w+Error)\b(?:\s+\+ ([\w.]+))?", line)
        if found and hasattr(errors, found[1]):
            depth = line.index(found[1])
            drawn[found[1]] = (depth, found[2])
    assert sorted(drawn) == sorted(cls.__name__ for cls in FAMILY)
    for cls in FAMILY:
        ours = [b for b in cls.__bases__ if issubclass(b, errors.CkptportError)]
        theirs = [b for b in cls.__bases__ if not issubclass(b, errors.CkptportError)]
        if cls is not errors.CkptportError:
            assert len(ours) == 1 and drawn[ours[0].__name__][0] < drawn[cls.__name__][0]
        spelled = drawn[cls.__name__][1]
        if spelled:
            module, _, name = spelled.rpartition(".")
            standard = getattr(importlib.import_module(module or "builtins"), name)
        assert [b for b in theirs if b is not Exception] == ([standard] if spelled else []), cls
        assert STANDARD.get(cls) is (standard if spelled else None)


@pytest.mark.parametrize("cls", FAMILY, ids=lambda c: c.__name__)
def test_every_error_keeps_its_line_copied_and_pickled(cls):
    made = (cls("p.pth", ("os.system",), "runs code") if cls is errors.UnsafeCheckpointError
            else cls("a cause", "p.pth"))
    for again in (pickle.loads(pickle.dumps(made)), made.at("q.pth"), made.naming(("x.y",), {})):
        assert type(again) is cls and str(again) == str(made) == "p.pth: " + made.message
    if isinstance(made, OSError):
        assert (made.filename, made.strerror) == ("p.pth", made.message)


def test_python_callers_catch_the_standard_exceptions(fx, tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        ckptport.read(tmp_path / "nope.pth")
    assert (caught.value.errno, caught.value.filename) == (errno.ENOENT, str(tmp_path / "nope.pth"))
    with pytest.raises(FileExistsError, match="exists; pass --overwrite"):
        ckptport.normalize_file(fx["plain"], fx["plain"].parent / "ddp_cuda3.pth")
    with pytest.raises(FileNotFoundError) as caught:
        ckptport.normalize_file(fx["plain"], tmp_path / "no" / "such" / "out.pth")
    assert str(caught.value) == f"{tmp_path / 'no'}: folder does not exist"
    with pytest.raises(pickle.UnpicklingError):
        ckptport.read(fx["malicious_zip"])
    model = torch.nn.Linear(3, 1)
    with pytest.raises(RuntimeError, match="missing|unexpected|mismatch"):
        ckptport.load_into(model, fx["plain"])
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_folder_that_takes_no_files_says_so_not_that_it_is_missing(fx, run, tmp_path):
    result = run("normalize", fx["plain"], "/proc/out.pth")
    assert result.exit_code == 2
    assert result.stderr == ("ckptport: error: /proc: cannot create a file in this folder "
                             "(No such file or directory); write somewhere else\n")
    (tmp_path / "file").write_text("")
    result = run("normalize", fx["plain"], tmp_path / "file" / "out.pth")
    assert result.stderr == f"ckptport: error: {tmp_path / 'file'}: is a file, not a folder\n"


# One error shape for every command and mode: one line on stderr; under --format json
# also a JSON error object on stdout.
FAILING = {
    "normalize": lambda fx, tmp: ("normalize", tmp / "nope.pth", tmp / "o.pth"),
    "manifest": lambda fx, tmp: ("manifest", tmp / "nope.pth"),
    "diff": lambda fx, tmp: ("diff", tmp / "nope.pth", fx["plain"]),
    "inspect": lambda fx, tmp: ("inspect", tmp / "nope.pth"),
    "check": lambda fx, tmp: ("check", fx["plain"], "--codes", "CKP999"),
}


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("command", sorted(FAILING))
def test_every_command_fails_in_one_shape(fx, run, tmp_path, command, fmt):
    for args, kind in ((FAILING[command](fx, tmp_path), None),
                       ((command, "--nosuch-option", fx["plain"]), "UsageError"),
                       ((command,), "UsageError")):  # a missing argument
        result = run(*args, "--format", fmt)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("ckptport: error: ") and "Usage:" not in result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        if fmt == "text":
            assert result.stdout == ""
            continue
        doc = json.loads(result.stdout)
        assert (doc["command"], doc["exit_code"]) == (command, 2)
        assert result.stderr == f"ckptport: error: {doc['error']['message']}\n"
        assert doc["error"]["kind"] == kind or kind is None and doc["error"]["kind"].endswith(
            "Error")
    assert not list(tmp_path.iterdir())


def test_an_existing_manifest_file_is_refused_in_one_line_before_reading(fx, run, tmp_path):
    out = tmp_path / "m.json"
    out.write_text("mine")
    result = run("manifest", tmp_path / "nope.pth", "-o", out)  # not read: refused first
    assert (result.exit_code, result.stderr) == (
        2, f"ckptport: error: {out}: exists; pass --overwrite to replace it\n")
    assert out.read_text() == "mine"
    assert run("manifest", fx["plain"], "-o", out, "--overwrite").exit_code == 0
    assert json.loads(out.read_text())["tensors"]


def test_a_closed_stdout_ends_the_command_quietly(fx):
    """``ckptport inspect x | head -1``: the reader left; no traceback, no error line."""
    proc = subprocess.Popen([sys.executable, "-m", "ckptport", "inspect", str(fx["ddp_cuda3"])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read()
    assert (proc.wait(), err) == (141, b"")


@pytest.mark.parametrize(("args", "message"), [
    (("--select", "nosuchkey"), "--select nosuchkey: no key 'nosuchkey'"),
    (("--keep", "zzz*"), "--keep zzz*: matches no key"),
    (("--drop", "zzz*"), "--drop zzz*: matches no key"),
    (("--strip-prefix", "nope"), "--strip-prefix nope.: no key starts with it"),
    (("--rename", "^zzz", "y"), "--rename '^zzz': matches no key"),
    (("--subtree", "nope"), "--subtree nope"),
    (("--select", "CKP001"), "--select CKP001 names a check code: --codes CKP001 runs only it"),
])
def test_check_refuses_options_that_select_nothing_as_normalize_does(fx, run, tmp_path, args,
                                                                     message):
    """Where check runs the options (--against; --select under --finite too), an option
    that matches nothing is a typo, not a pass."""
    extras = [("--against", fx["plain"])] + [("--finite",)] * (args[0] == "--select")
    for extra in extras:
        result = run("check", fx["plain"], *args, *extra)
        assert result.exit_code == 2, result.output
        assert message in result.stderr and len(result.stderr.splitlines()) == 1
    assert run("normalize", fx["plain"], tmp_path / "o.pth", *args).exit_code == 2


def test_check_keeps_accepting_options_that_select_something(fx, run):
    plain = run("check", fx["plain"], "--against", fx["plain"])
    for args in (("--keep", "*"), ("--rename", "^", ""), ("--select", "auto")):
        result = run("check", fx["plain"], "--against", fx["plain"], *args)
        assert (result.exit_code, result.stdout) == (plain.exit_code, plain.stdout), args
    wrapped = run("check", fx["ddp_cuda3"], "--select", "state_dict", "--finite")
    assert wrapped.exit_code == 1 and "CKP001" in wrapped.stdout  # its findings, as before


@pytest.mark.parametrize(("args", "message"), [
    (("--keep", "*"), "--keep acts only with --against REF"),
    (("--finite", "--dtype", "float16"), "--dtype acts only with --against REF"),
    (("--select", "model"), "--select acts only with --against REF or --finite"),
    (("--finite-all", "--prefer-ema"), "--prefer-ema acts only with --against REF or --finite"),
    (("--atol", "0.1", "--rtol", "0.1"), "--atol and --rtol act only with --against REF"),
])
def test_check_refuses_options_that_would_change_nothing(fx, run, args, message):
    """An option check would not apply (no --against to compare normalized weights) is
    an error, not a run that looks as if it had applied."""
    result = run("check", fx["ddp_cuda3"], *args, "--format", "json")
    assert (result.exit_code, result.stderr) == (2, f"ckptport: error: {message}\n")
    assert json.loads(result.stdout)["error"]["message"] == message


BY_VALUE = ("only with two checkpoints, not a manifest (it is compared by sha256, "
            "normalized as it records)")
ONE_SRC = "acts only with one SRC, not a folder of checkpoints"


@pytest.mark.parametrize(("args", "message"), [
    (("diff", "MANIFEST", "PLAIN", "--atol", "0.1", "--cast"), f"--atol and --cast act {BY_VALUE}"),
    (("diff", "PLAIN", "MANIFEST", "--raw"), f"--raw acts {BY_VALUE}"),
    (("diff", "PLAIN", "MANIFEST", "--dtype", "float16"),
     f"--dtype acts {BY_VALUE}"),
    (("diff", "MANIFEST", "PLAIN", "--plot", "OUT/p.png"),
     f"--plot acts {BY_VALUE}"),
    (("manifest", "PLAIN", "--overwrite"),
     "--overwrite acts only with -o FILE (without it the manifest itself, JSON, goes to stdout)"),
    (("manifest", "PLAIN", "--format", "text"),
     "--format text acts only with -o FILE (without it the manifest itself, JSON, goes to "
     "stdout)"),
    (("normalize", "PLAIN", "OUT/o.safetensors", "--anchor", "cuda:0"),
     "--anchor acts only with a pth output, not safetensors"),
    (("normalize", "PLAIN", "OUT/o.pth", "--dcp-key", "model"),
     "--dcp-key acts only with a dcp output, not pth"),
    (("normalize", "PLAIN", "OUT/o.pth", "--metadata", "drop"),
     "--metadata acts only with a safetensors output, not pth"),
    (("normalize", "PLAIN", "OUT/o.pth", "--dry-run"),
     "--dry-run acts only with a folder of checkpoints as SRC"),
    (("normalize", "PLAIN", "OUT/o.pth", "--sign-chain", "c.pem"),
     "--sign-chain acts only with --sign PEM"),
    (("normalize", "FOLDER", "OUT/o", "--trust"), f"--trust {ONE_SRC}"),
    (("normalize", "FOLDER", "OUT/o", "--sign-certificate", "c.pem"),
     f"--sign-certificate {ONE_SRC}"),
    (("normalize", "FOLDER", "OUT/o", "--dry-run", "--to", "safetensors", "--anchor", "cuda:1"),
     "--anchor acts only with a pth output, not safetensors"),
    (("normalize", "FOLDER", "OUT/o", "--create-pr", "--dry-run"),
     "OUT/o: --create-pr opens a pull request on the hub: DST must be hf://…"),
    (("verify", "PLAIN", "--public-key", "k.pem", "--output-signature", "x.sig"),
     "--output-signature acts only with --chain SOURCE"),
    (("diff", "PLAIN", "PLAIN", "--raw", "--keep", "*", "--map-b", "k.toml"),
     "--raw compares as stored; it cannot be combined with --keep, --map-b"),
    (("sign", "PLAIN", "--key", "k.pem", "--identity-token", "t"),
     "--identity-token acts only with --sigstore"),
    (("sign", "PLAIN", "--sigstore", "--certificate", "c.pem"),
     "--certificate acts only with --key PEM"),
    (("sign", "PLAIN", "--key", "k.pem", "--weights-only", "--file-hash", "blake3"),
     "--file-hash blake3 acts only with an OMS signature over the files (not --weights-only, "
     "not a URL)"),
])
def test_an_option_that_would_change_nothing_is_an_error(fx, run, tmp_path, args, message):
    """Every command: an option its mode would not apply is one error line (exit 2) and
    nothing written, not a run that looks as if it had applied."""
    out = tmp_path / "out"
    out.mkdir()
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.pth").write_bytes(fx["plain"].read_bytes())
    listed = tmp_path / "m.json"
    if "MANIFEST" in args:
        assert run("manifest", fx["plain"], "-o", listed).exit_code == 0
    named = {"PLAIN": str(fx["plain"]), "MANIFEST": str(listed), "FOLDER": str(folder)}
    argv = [named.get(a, a.replace("OUT", str(out))) for a in args]
    message = message.replace("OUT", str(out))
    result = run(*argv)
    assert (result.exit_code, result.stderr) == (2, f"ckptport: error: {message}\n")
    assert list(out.iterdir()) == []
    if args[0] in ("diff", "normalize"):  # their JSON error, too
        doc = json.loads(run(*argv, "--format", "json").stdout)
        assert doc["error"]["message"] == message


def test_an_option_given_again_overrides_as_on_every_command_line(fx, run, tmp_path):
    """Not an option that changes nothing: the last wins (POSIX, git's --no-X), so a
    script or alias can override a default it set."""
    out = tmp_path / "o.safetensors"
    result = run("normalize", fx["plain"], out, "--dtype", "float16", "--dtype", "bfloat16",
                 "--verify", "--no-verify")
    assert result.exit_code == 0, result.stderr
    from safetensors.torch import load_file

    assert {str(t.dtype) for t in load_file(out).values() if t.is_floating_point()} == {
        "torch.bfloat16"}


def test_the_python_api_refuses_an_option_given_twice(fx):
    """``load_state_dict``'s keywords and ``options`` name the same step: one would be
    dropped without a word."""
    from ckptport import NormalizeOptions, OptionError, load_state_dict

    with pytest.raises(OptionError, match="^keep: given both as a keyword and in options"):
        load_state_dict(fx["plain"], options=NormalizeOptions(keep=("a*",)), keep=["b*"])
    with pytest.raises(OptionError, match="^dequantize: given both"):
        load_state_dict(fx["plain"], options=NormalizeOptions(dequantize="float32"),
                        dequantize="bfloat16")


def test_read_options_with_a_checkpoint_read_already_are_errors(fx):
    """``diff``, ``manifest`` and ``inspect`` take a ``Checkpoint``: the options of a read
    would be ignored for it."""
    import ckptport

    read = ckptport.read(fx["plain"])
    already = "only with a path to read, not a Checkpoint (read already)"
    for attempt, named in ((lambda: ckptport.diff(read, read, trust=True), "trust"),
                           (lambda: ckptport.manifest(read, max_expansion=4.0),
                            "max_expansion"),
                           (lambda: ckptport.inspect(read, tag="global_step1"), "tag")):
        with pytest.raises(ckptport.OptionError) as caught:
            attempt()
        assert str(caught.value) == f"{named} acts {already}"
    assert ckptport.diff(read, fx["plain"], max_expansion=4.0).equal  # one side is read here


@pytest.mark.parametrize("command", ["inspect", "diff", "manifest"])
def test_a_folder_of_checkpoints_is_listed_with_what_fits_the_command(fx, run, tmp_path,
                                                                      command):
    """Not one checkpoint: the message lists what the folder holds and names one to pick;
    it suggests nothing the command cannot do."""
    for name in ("b.pth", "a.pth"):
        (tmp_path / name).write_bytes(fx["plain"].read_bytes())
    args = (tmp_path, fx["plain"]) if command == "diff" else (tmp_path,)
    result = run(command, *args)
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert "it holds a.pth, b.pth (2 entries)" in result.stderr
    assert f"Name a file in it (e.g. {tmp_path / 'a.pth'})" in result.stderr
    assert "to a folder DST" not in result.stderr


DEEP = "[" * 100_000 + "]" * 100_000  # JSON nested past the interpreter's recursion limit


def _deep_files(folder: Path) -> dict[str, Path]:
    """Every JSON a command parses from its input, nested 100,000 deep."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})
    body = header.encode()
    model = folder / "hf"
    model.mkdir()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * 4)
    (model / "config.json").write_text('{"tie_word_embeddings": true, "x": ' + DEEP + "}")
    deep_header = ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "x": '
                   + DEEP + "}").encode()
    (folder / "deep.safetensors").write_bytes(struct.pack("<Q", len(deep_header)) + deep_header
                                              + b"\0" * 4)
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}, "x": ' + DEEP + "}")
    (folder / "manifest.json").write_text('{"schema": ' + DEEP + "}")
    (folder / "recipe.json").write_text('{"steps": ' + DEEP + "}")
    return {"hf": model, "header": folder / "deep.safetensors",
            "index": folder / "model.safetensors.index.json",
            "manifest": folder / "manifest.json", "recipe": folder / "recipe.json"}


def test_json_nested_past_the_recursion_limit_is_never_an_internal_error(run, tmp_path, fx):
    """A config.json the model folder carries is ignored (it declares nothing readable);
    a header, an index, a manifest or a recipe is refused in one line, exit 2."""
    deep = _deep_files(tmp_path)
    for args, code in [
        (("inspect", deep["hf"]), 0), (("manifest", deep["hf"]), 0),
        (("inspect", deep["header"]), 2), (("inspect", deep["index"]), 2),
        (("check", fx["ddp_cuda3"], "--against-manifest", deep["manifest"]), 2),
        (("diff", deep["manifest"], fx["ddp_cuda3"]), 2),
        (("normalize", fx["ddp_cuda3"], tmp_path / "o.pth", "--map", deep["recipe"]), 2),
    ]:
        result = run(*args)
        assert result.exit_code == code, (args, result.stderr)
        assert "internal error" not in result.stderr and "Traceback" not in result.stderr
        if code == 2:
            assert result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "o.pth").exists()


@pytest.mark.parametrize(("args", "option"), [
    (("--strip-prefix", "nope"), "--strip-prefix nope."), (("--keep", "zzz*"), "--keep zzz*"),
    (("--rename", "^zzz", "y"), "--rename '^zzz'"), (("--subtree", "nope"), "--subtree nope"),
])
def test_diff_refuses_an_option_that_matches_neither_file(fx, run, args, option):
    result = run("diff", fx["plain"], fx["plain"], *args)
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert f"{option}: matches no key in A or B (A: " in result.stderr


def test_diff_keeps_an_option_that_matches_one_file(fx, run, tmp_path):
    """A prefix only one side carries is what a diff of a wrapped and a clean file needs."""
    wrapped = tmp_path / "wrapped.pth"
    torch.save({f"net.{k}": v for k, v in torch.load(fx["plain"], weights_only=True).items()},
               wrapped)
    result = run("diff", wrapped, fx["plain"], "--strip-prefix", "net")
    assert result.exit_code == 0, result.output
