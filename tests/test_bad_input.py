"""Bad input and bad destinations: one stderr line, exit 2, nothing written."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ckptport.writers import staging as atomic
from tests.helpers import sha256

CASES = [
    ("truncated", "corrupt or truncated"),
    ("random", "not a PyTorch or safetensors checkpoint"),
    ("empty", "empty file (0 bytes)"),
    ("directory", "is a directory"),
    ("malicious_zip", "refused: the file needs globals outside the weights-only allowlist: "
                      "posix.system"),
    ("malicious_legacy", "refused: the file needs globals outside the weights-only "
                         "allowlist: posix.system"),
]


@pytest.mark.parametrize("ext", ["pth", "safetensors"])
@pytest.mark.parametrize(("name", "message"), CASES)
def test_unreadable_input(fx, run, tmp_path, sentinel, name, message, ext):
    src = fx[name]
    before = sha256(src) if src.is_file() else None
    out = tmp_path / f"out.{ext}"
    result = run("normalize", src, out)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ckptport: error: {src}: ")
    assert message in lines[0] and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []
    assert not sentinel.exists()
    assert (sha256(src) if src.is_file() else None) == before


def test_missing_file(run, tmp_path):
    result = run("normalize", tmp_path / "nope.pth", tmp_path / "o.pth")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"ckptport: error: {tmp_path / 'nope.pth'}: no such file"


def test_source_without_read_permission(fx, run, tmp_path, monkeypatch):
    """The OS refusing to open the source (root reads everything, so the refusal is injected)."""
    src = tmp_path / "locked.pth"
    shutil.copy(fx["plain"], src)
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if Path(path) == src:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    result = run("normalize", src, tmp_path / "o.pth")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"ckptport: error: {src}: permission denied"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locked.pth"]


def test_corrupt_safetensors_header(run, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes((20).to_bytes(8, "little") + b'{"a": {"dtype": "F32"')
    result = run("normalize", bad, tmp_path / "o.pth")
    assert result.exit_code == 2 and "not valid JSON" in result.stderr
    lying = tmp_path / "lying.safetensors"
    header = b'{"a":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}'
    lying.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    result = run("normalize", lying, tmp_path / "o.pth")
    assert result.exit_code == 2 and "past the end of the data" in result.stderr


def test_existing_destination_needs_overwrite(fx, run, tmp_path):
    out = tmp_path / "o.pth"
    out.write_bytes(b"keep me")
    result = run("normalize", fx["plain"], out)
    assert result.exit_code == 2 and "exists; pass --overwrite" in result.stderr
    assert out.read_bytes() == b"keep me"
    assert run("normalize", fx["plain"], out, "--overwrite").exit_code == 0
    assert out.read_bytes() != b"keep me"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_device_or_pipe_as_output_is_refused_never_replaced(fx, run, tmp_path):
    """``-o /dev/null`` as root once replaced the device with a regular file (the rename that
    publishes every output); a FIFO stands in for the device here."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for args in (("normalize", fx["plain"], pipe, "--to", "pth", "--overwrite"),
                 ("manifest", fx["plain"], "-o", pipe, "--overwrite")):
        result = run(*args)
        assert result.exit_code == 2, args
        assert "is a device, pipe or socket" in result.stderr and str(pipe) in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_destination_that_is_the_source_under_any_spelling(fx, run, tmp_path):
    src = tmp_path / "src.pth"
    shutil.copy(fx["plain"], src)
    before = sha256(src)
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.pth"
    link.symlink_to(src)
    hard = tmp_path / "hard.pth"
    os.link(src, hard)
    for dst in (src, tmp_path / "sub" / ".." / "src.pth", link, hard):
        result = run("normalize", src, dst, "--overwrite")
        assert result.exit_code == 2, dst
        assert "is the source file" in result.stderr
    assert sha256(src) == before


def test_unknown_extension_asks_for_to(fx, run, tmp_path):
    result = run("normalize", fx["plain"], tmp_path / "o.weights")
    assert result.exit_code == 2 and "pass --to" in result.stderr
    assert run("normalize", fx["plain"], tmp_path / "o.weights", "--to", "pth").exit_code == 0


def test_missing_output_folder(fx, run, tmp_path):
    result = run("normalize", fx["plain"], tmp_path / "no" / "o.pth")
    assert result.exit_code == 2 and "folder does not exist" in result.stderr


def test_interrupt_mid_write_leaves_nothing(fx, run, tmp_path, monkeypatch):
    from ckptport.writers import pth

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pth, "write_pth", boom)
    result = run("normalize", fx["plain"], tmp_path / "o.pth")
    assert result.exit_code == 130 and "interrupted" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_disk_full_leaves_nothing(fx, tmp_path):
    """RLIMIT_FSIZE makes writes fail like a full disk (EFBIG) in a child process."""
    code = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048)); "
            "from ckptport.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code, "normalize", str(fx["ddp_cuda3"]),
                           str(tmp_path / "o.pth")], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "cannot write: File too large" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not any(p.name.endswith(atomic.TEMP_SUFFIX) or p.name == "o.pth"
                   for p in tmp_path.iterdir())


def test_lying_string_length_is_refused_before_allocating(run, tmp_path):
    """Found by the fuzzer: a legacy pickle whose 8-byte string length claims exabytes."""
    import struct

    bad = tmp_path / "lying.pth"
    bad.write_bytes(b"\x80\x02\x8d" + struct.pack("<Q", 2**62) + b"x" * 16)
    result = run("normalize", bad, tmp_path / "o.pth")
    assert result.exit_code == 2
    assert "declares 4611686018427387904 bytes, past the end of the data" in result.stderr
