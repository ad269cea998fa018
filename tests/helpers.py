"""Assertions shared by the test modules: real outcomes, loaded back with public APIs."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from fixtures.hostile import PROTO2, STOP, system, write_zip


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_output(path: Path) -> dict[str, torch.Tensor]:
    """What a user on a CPU-only machine gets: no map_location, no allow-list."""
    if path.suffix == ".safetensors":
        return load_file(path)
    return torch.load(path, weights_only=True)


def load_trusted(path: Path) -> Any:
    """Our own fixture, unpickled fully to get the ground truth (never on untrusted files)."""
    return torch.load(path, weights_only=False, map_location="cpu")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                            b.contiguous().reshape(-1).view(torch.uint8)))


def refused(run: Any, src: Path, dst: Path, *words: str) -> str:
    """``normalize src dst`` refused: exit 2, one stderr line naming every word, nothing
    written, the source untouched; the line."""
    before = {p: p.read_bytes() for p in src.rglob("*") if p.is_file()}
    result = run("normalize", src, dst)
    assert result.exit_code == 2, result.stdout
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert all(word in line for word in words), line
    assert not dst.exists()
    assert {p: p.read_bytes() for p in src.rglob("*") if p.is_file()} == before
    return line


def hostile_member(run: Any, folder: Path, victim: Path, sentinel: Path, dst: Path,
                   named: str) -> str:
    """``victim``, a member file of the checkpoint ``folder``, replaced by a pickle whose
    payload would create ``sentinel``: ``normalize folder dst`` refused (one line naming
    ``os.system`` and ``named``), ``check`` exits 1 with CKP003 on the member file, and the
    payload never ran; check's stdout."""
    victim.unlink()
    write_zip(victim, PROTO2 + system(sentinel) + STOP, ())
    assert "os.system" in refused(run, folder, dst, named)
    checked = run("check", folder)
    assert checked.exit_code == 1 and f"{victim}: CKP003" in checked.stdout
    assert not sentinel.exists()
    return str(checked.stdout)


def repickle(src: Path, dst: Path, old: bytes, new: bytes, count: int = -1) -> Path:
    """``src`` with bytes of its pickle replaced (the first ``count`` times), written by
    torch's own zip writer: a real file's record made to lie."""
    with zipfile.ZipFile(src) as archive:
        records = {n.split("/", 1)[1]: archive.read(n) for n in archive.namelist()}
    assert old in records["data.pkl"]
    writer = torch._C.PyTorchFileWriter(str(dst))
    for name, record in records.items():
        record = record.replace(old, new, count) if name == "data.pkl" else record
        writer.write_record(name, record, len(record))
    writer.write_end_of_file()
    return dst
