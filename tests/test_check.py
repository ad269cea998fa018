"""``ckptport check``: the CI gate, its codes, formats and exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ckptport.commands.check import CODES, check
from ckptport.render import formats_for, formatter

GOLDEN = Path(__file__).with_name("golden") / "check_dp_in_ddp.json"
CHECK_FORMATS = formats_for("check")


def _codes(result) -> list[str]:
    return [f["code"] for f in json.loads(result.stdout)["files"][0]["findings"]]


@pytest.fixture(scope="module")
def normalized(fx, tmp_path_factory) -> Path:
    from ckptport.commands.normalize import normalize_file as convert

    out = tmp_path_factory.mktemp("normalized") / "clean.pth"
    convert(fx["ddp_cuda3"], out)
    return out


def test_raw_ddp_cuda3_has_device_prefix_and_globals_findings(fx, run):
    result = run("check", fx["ddp_cuda3"], "--format", "json")
    assert result.exit_code == 1
    codes = _codes(result)
    assert {"CKP001", "CKP002", "CKP004"} <= set(codes) and "CKP003" not in codes
    findings = json.loads(result.stdout)["files"][0]["findings"]
    assert {"code": "CKP001", "severity": "warning", "key": None,
            "message": "15 storages recorded on cuda:3; torch.load without map_location "
                       "fails without that device"} in findings
    assert any(f["key"] == "args" and "argparse.Namespace" in f["message"] for f in findings)


def test_normalized_output_passes(normalized, run):
    result = run("check", normalized)
    assert result.exit_code == 0, result.stdout
    assert result.stdout.startswith("ckptport check: 1 files pass")


def test_check_json_golden(fx, run):
    result = run("check", fx["dp_in_ddp"], "--format", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    doc["ckptport"] = "<version>"
    for entry in doc["files"]:
        entry["path"] = Path(entry["path"]).name
    if os.environ.get("CKPTPORT_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(doc, indent=2) + "\n")
    assert doc == json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", ["os_system_zip", "os_system_legacy", "dotted_name_zip",
                                  "call_subprocess_Popen_legacy", "malicious_zip"])
def test_dangerous_global_is_a_finding_naming_it(fx, run, sentinel, name):
    result = run("check", fx[name])
    assert result.exit_code == 1, result.stdout
    assert "CKP003 [error]" in result.stdout and "dangerous global" in result.stdout
    assert "posix.system" in result.stdout or "os.system" in result.stdout \
        or "subprocess.Popen" in result.stdout
    assert not sentinel.exists()


@pytest.mark.parametrize("name", ["truncated", "empty", "memo_bomb_zip", "storage_short_zip"])
def test_unreadable_is_exit_2(fx, run, name):
    result = run("check", fx[name], "--format", "json")
    assert result.exit_code == 2
    assert _codes(result) == ["CKP008"]


def test_directories_are_searched_recursively(fx, run, normalized, tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "raw.pth").write_bytes(fx["ddp_cuda3"].read_bytes())
    (tmp_path / "a" / "clean.pth").write_bytes(normalized.read_bytes())
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    doc = json.loads(run("check", tmp_path, "--format", "json").stdout)
    assert sorted(Path(f["path"]).name for f in doc["files"]) == ["clean.pth", "raw.pth"]
    assert doc["exit_code"] == 1


def test_select_and_ignore(fx, run):
    assert set(_codes(run("check", fx["ddp_cuda3"], "--codes", "CKP001,CKP004",
                          "--format", "json"))) == {"CKP001", "CKP004"}
    result = run("check", fx["ddp_cuda3"], "--ignore", "CKP001", "--ignore", "CKP002,CKP004")
    assert result.exit_code == 0
    bad = run("check", fx["ddp_cuda3"], "--codes", "CKP999")
    assert bad.exit_code == 2 and "unknown check code CKP999" in bad.stderr


NEEDING = [(c, code.needs) for c, code in CODES.items() if code.needs is not None]


@pytest.mark.parametrize(("code", "needs"), NEEDING)
def test_a_code_asked_for_without_its_input_is_an_error(fx, run, code, needs):
    """Every code that needs an option's input (declared in CODES), asked for without it:
    one line naming the code and the option, a JSON error under --format json."""
    message = f"--codes: {code} runs only with {needs}: pass it too"
    result = run("check", fx["plain"], "--codes", f"CKP001,{code.lower()}", "--format", "json")
    assert (result.exit_code, result.stderr) == (2, f"ckptport: error: {message}\n")
    assert json.loads(result.stdout)["error"] == {"message": message, "path": None,
                                                  "kind": "OptionError"}


def test_codes_that_need_inputs_are_named_together(fx, run):
    result = run("check", fx["plain"], "--codes", "CKP009", "--codes", "CKP006")
    assert result.stderr == ("ckptport: error: --codes: CKP006 runs only with --finite (or "
                             "--finite-all), CKP009 runs only with --against REF: pass them "
                             "too\n")


@pytest.mark.parametrize(("args", "message"), [
    (("--finite", "--codes", "CKP001"),
     "--finite (or --finite-all) is CKP006's input, but --codes leaves CKP006 out"),
    (("--require-format", "torch-zip", "--ignore", "CKP007"),
     "--require-format is CKP007's input, but --ignore leaves CKP007 out"),
    (("--against", "REF", "--codes", "CKP004"),
     "--against REF is CKP009's input, but --codes leaves CKP009 out"),
])
def test_an_input_whose_code_is_left_out_is_an_error(fx, run, args, message):
    """An input given for a code that does not run would be silently unread."""
    args = tuple(str(fx["plain"]) if a == "REF" else a for a in args)
    result = run("check", fx["plain"], *args)
    assert (result.exit_code, result.stderr) == (
        2, f"ckptport: error: {message}: it would change nothing\n")


def test_a_signature_and_its_keys_go_together(fx, run, tmp_path):
    keys = "--public-key, --certificate-chain or --sigstore-identity"
    alone = run("check", fx["plain"], "--public-key", tmp_path / "k.pem")
    assert alone.stderr == f"ckptport: error: {keys} acts only with --verify-signature FILE\n"
    unkeyed = run("check", fx["plain"], "--verify-signature", tmp_path / "m.sig")
    assert (unkeyed.exit_code, unkeyed.stderr) == (
        2, f"ckptport: error: --verify-signature FILE acts only with {keys}\n")


def test_finite(fx, run):
    assert "CKP006" not in _codes(run("check", fx["dtypes"], "--format", "json"))
    result = run("check", fx["dtypes"], "--finite", "--format", "json")
    finding = next(f for f in json.loads(result.stdout)["files"][0]["findings"]
                   if f["code"] == "CKP006")
    assert finding["key"] == "nan_and_negzero"
    assert finding["message"] == "2 of 4 values are NaN or infinite"


def test_require_format(fx, run, tmp_path):
    from ckptport.commands.normalize import normalize_file as convert

    st = tmp_path / "w.safetensors"
    convert(fx["plain"], st)
    assert run("check", st, "--require-format", "safetensors").exit_code == 0
    result = run("check", fx["plain"], "--require-format", "safetensors", "--format", "json")
    assert _codes(result) == ["CKP007"]


def test_storage_bloat(fx, run):
    result = run("check", fx["slice"], "--format", "json")
    finding = json.loads(result.stdout)["files"][0]["findings"][0]
    assert finding["code"] == "CKP005" and finding["key"] == "small"


def test_against_reference(fx, run, normalized):
    assert run("check", normalized, "--against", fx["ddp_cuda3"]).exit_code == 0
    result = run("check", fx["plain"], "--against", fx["ddp_cuda3"], "--format", "json")
    assert result.exit_code == 1
    assert set(_codes(result)) == {"CKP009"}
    assert run("check", fx["plain"], "--against", fx["truncated"]).exit_code == 2


def test_github_annotations(fx, run):
    result = run("check", fx["os_system_zip"], fx["ddp_cuda3"], "--format", "github")
    lines = result.stdout.splitlines()
    assert f"::error file={fx['os_system_zip']},title=CKP003 <root>::dangerous global " \
           "os.system: loading this file with full unpickling runs it (nothing was run)" in lines
    assert any(line.startswith(f"::warning file={fx['ddp_cuda3']},title=CKP001::")
               for line in lines)
    assert lines[-1] == "ckptport check: 8 findings in 2 files"


def test_every_format_renders_check(fx):
    report = check([fx["ddp_cuda3"], fx["truncated"]])
    assert report.exit_code == 2
    for fmt in CHECK_FORMATS:
        assert "CKP001" in formatter(fmt).check(report)


def test_rules_are_documented():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for code, rule in CODES.items():
        assert code == rule.code and rule.finds and rule.why and rule.fix
        assert rule.severity in ("error", "warning")
        assert f"| `{code}` | {rule.name} | {rule.severity} | {rule.finds} |" in readme
