"""The container sniff judges what a file is from bounded reads, whatever its bytes."""

from __future__ import annotations

import json
import struct

import torch
from safetensors.torch import load_file, save, save_file

import ckptport
from ckptport import sources
from ckptport.unpickle.scan import MAX_TEXT


def _safetensors_starting_with(byte: int, path, megabytes: int = 3):
    """A valid safetensors file whose header length's low byte is ``byte`` (``P``: a pickle
    PERSID opcode, whose text argument ends at a newline) and whose tensor bytes hold no
    newline, so that "line" runs to the end of the file."""
    tensors = {"w": torch.zeros(megabytes << 18)}  # float zeros: no 0x0A byte anywhere
    for pad in range(256):  # the padding found in memory, the file written once
        data = save(tensors, metadata={"pad": "x" * pad})
        if data[0] == byte:
            (length,) = struct.unpack("<Q", data[:8])
            assert json.loads(data[8:8 + length])["w"]
            save_file(tensors, path, metadata={"pad": "x" * pad})
            assert path.read_bytes() == data
            return tensors
    raise AssertionError("no padding gives that first byte")


def test_a_safetensors_file_that_starts_like_a_pickle_line_reads_with_bounded_reads(
        tmp_path, monkeypatch):
    src = tmp_path / "looks_like_persid.safetensors"
    tensors = _safetensors_starting_with(ord("P"), src)
    reads: list[int] = []
    real = sources.SourceFile.read

    def counted(self, offset: int, n: int) -> bytes:
        reads.append(n)
        return real(self, offset, n)

    monkeypatch.setattr(sources.SourceFile, "read", counted)
    assert ckptport.inspect(src).format == "safetensors"
    assert max(reads) <= MAX_TEXT + 64  # the sniff never holds the 3 MiB "line" at once
    monkeypatch.undo()
    out = tmp_path / "out.safetensors"
    ckptport.normalize_file(src, out)
    assert torch.equal(load_file(out)["w"], tensors["w"])


def test_discovery_finds_what_the_readers_read(tmp_path):
    """A safetensors header may open with any JSON whitespace: folder searches (check DIR,
    folder mode) use the readers' own sniff, so they list it as a checkpoint."""
    header = b'\n{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    header += b" " * (-len(header) % 8)
    (tmp_path / "tab.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0))
    assert torch.equal(load_file(tmp_path / "tab.safetensors")["w"], torch.tensor([1.0, 2.0]))
    report = ckptport.check(tmp_path)
    assert [f.path.name for f in report.files] == ["tab.safetensors"] and not report.skipped
