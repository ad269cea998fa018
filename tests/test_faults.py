"""Bad days: signals mid-write, a source rewritten while read, racing writers, lost folders.

Promise under test: DST is the complete verified file or absent, no temp
file remains, the source is untouched, the exit code and message say what
happened.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ckptport.writers.staging import TEMP_SUFFIX
from tests.helpers import sha256

# A child that runs the CLI with a writer that pauses after half the data,
# announcing the pause by creating MARK; what happens then is up to the test.
PAUSING_CHILD = """
import os, signal, sys, time
from pathlib import Path
# a shell running the suite in the background starts it with SIGINT ignored, and Python
# keeps that; a user's terminal does not
signal.signal(signal.SIGINT, signal.default_int_handler)
import ckptport.writers.pth as pth
real = pth.write_pth
def paused(tree, file, anchor, advance, *rest):
    file.write(b"x" * 4096)
    file.flush()
    Path(os.environ["MARK"]).touch()
    action = os.environ.get("ACTION")
    if action == "touch-source":
        with open(os.environ["SOURCE"], "ab") as f:
            f.write(b"changed")
    else:
        time.sleep(30)
    file.seek(0)
    file.truncate()
    real(tree, file, anchor, advance, *rest)
pth.write_pth = paused
from ckptport.cli import main
sys.argv = ["ckptport", *sys.argv[1:]]
main()
"""


def _spawn(tmp_path: Path, src: Path, dst: Path, action: str = "sleep") -> subprocess.Popen:
    env = {**os.environ, "MARK": str(tmp_path / "MARK"), "ACTION": action, "SOURCE": str(src)}
    return subprocess.Popen([sys.executable, "-c", PAUSING_CHILD, "normalize", str(src),
                             str(dst)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=os.getcwd())


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "child never reached the pause"
        time.sleep(0.05)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX))


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")])
def test_signal_mid_write_leaves_no_output_and_no_temp_file(fx, tmp_path, sig, code, word):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dst = out_dir / "model.pth"
    before = sha256(fx["ddp_cuda3"])
    proc = _spawn(tmp_path, fx["ddp_cuda3"], dst)
    _wait_for(tmp_path / "MARK", proc)
    assert _leftovers(out_dir), "the temp file should exist while writing"
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert stderr.strip() == f"ckptport: error: {word}; nothing was written"
    assert list(out_dir.iterdir()) == []
    assert sha256(fx["ddp_cuda3"]) == before


def test_source_rewritten_while_read_is_not_published(fx, tmp_path):
    src = tmp_path / "src.pth"
    src.write_bytes(fx["ddp_cuda3"].read_bytes())
    dst = tmp_path / "out.pth"
    proc = _spawn(tmp_path, src, dst, action="touch-source")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert stderr.strip() == (f"ckptport: error: {src}: changed while it was read; "
                              "nothing was written, run again")
    assert not dst.exists() and not _leftovers(tmp_path)


def _race(fx, tmp_path: Path, n: int, *extra: str) -> tuple[list[int], Path]:
    dst = tmp_path / "shared.safetensors"
    procs = [subprocess.Popen([sys.executable, "-m", "ckptport", "normalize",
                               str(fx["ddp_cuda3"]), str(dst), "-q", *extra],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    codes = [p.wait(timeout=120) for p in procs]
    return codes, dst


def test_racing_writers_without_overwrite_one_wins(fx, tmp_path):
    codes, dst = _race(fx, tmp_path, 4)
    assert sorted(codes)[0] == 0 and all(c in (0, 2) for c in codes)
    assert codes.count(0) >= 1
    assert not _leftovers(tmp_path)
    from safetensors.torch import load_file

    assert len(load_file(dst)) == 9  # one complete file, whoever won


def test_racing_writers_with_overwrite_all_succeed_and_the_file_is_whole(fx, tmp_path):
    codes, dst = _race(fx, tmp_path, 4, "--overwrite")
    assert codes == [0, 0, 0, 0]
    assert not _leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.safetensors"]
    import ckptport

    assert ckptport.diff(dst, fx["ddp_cuda3"]).equal


def test_output_folder_vanishing_mid_write(fx, run, tmp_path, monkeypatch):
    import shutil

    from ckptport.writers import pth

    out_dir = tmp_path / "gone"
    out_dir.mkdir()
    real = pth.write_pth

    def write_then_lose_folder(*args, **kwargs):
        real(*args, **kwargs)
        shutil.rmtree(out_dir)

    monkeypatch.setattr(pth, "write_pth", write_then_lose_folder)
    result = run("normalize", fx["plain"], out_dir / "m.pth")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"ckptport: error: {out_dir / 'm.pth'}: ")
    assert not out_dir.exists()


def test_read_only_output_folder(fx, run, tmp_path, monkeypatch):
    """The OS refusing to create the temp file (root ignores modes, so it is injected)."""
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    result = run("normalize", fx["plain"], tmp_path / "m.pth")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"ckptport: error: {tmp_path}: permission denied "
                                     "creating a file in this folder")


def test_safetensors_output_loads_even_when_hash_is_slow(fx, tmp_path, monkeypatch):
    """The header's sha256 placeholder is patched before the file is synced and verified."""
    import ckptport
    import ckptport.writers.provenance as provenance

    real = provenance.sha256_files

    def slow(paths):
        time.sleep(0.5)
        return real(paths)

    monkeypatch.setattr(provenance, "sha256_files", slow)
    out = tmp_path / "m.safetensors"
    report = ckptport.normalize_file(fx["ddp_cuda3"], out)
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        assert f.metadata()["ckptport.source_sha256"] == report.source_sha256 == \
            sha256(fx["ddp_cuda3"])
        assert torch.equal(f.get_tensor("bn.weight"), ckptport.read(out).tree["bn.weight"])


def test_check_in_parallel_reports_what_a_serial_run_reports(fx, tmp_path):
    """Many `ckptport check` processes at once give each file the report one process gives."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    names = ["ddp_cuda3", "ddp_cuda3_legacy", "plain", "slice", "tied", "dtypes", "truncated",
             "malicious_zip"]
    paths = [str(fx[n]) for n in names]

    def check(*files: str) -> dict:
        proc = subprocess.run([sys.executable, "-m", "ckptport", "check", *files, "--format",
                               "json"], capture_output=True, text=True, timeout=120)
        return json.loads(proc.stdout)

    serial = {f["path"]: f for f in check(*paths)["files"]}
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = [doc["files"][0] for doc in pool.map(check, paths)]
    assert {f["path"]: f for f in parallel} == serial
    assert {f["path"] for f in parallel} == set(paths)
