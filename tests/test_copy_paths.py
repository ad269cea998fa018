"""The fast write paths give exactly the bytes the plain ones give, and fail plainly.

A contiguous source tensor is copied file to file by the kernel
(``copy_file_range``) and the output's space is reserved up front
(``fallocate``); the same run with the kernel copy refused must write the
same bytes, and a zip's CRCs (computed from a separate read of the source)
must match what the kernel copied.
"""

from __future__ import annotations

import errno
import io
import os
import threading
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ckptport import normalize_file
from ckptport.errors import InputError, OutputError
from ckptport.readers import open_checkpoint
from ckptport.rules import NormalizeOptions, apply_rules
from ckptport.sources import open_source
from ckptport.writers import copy as copy_module
from ckptport.writers.pth import write_pth

SOURCES = ["ddp_cuda3", "ddp_cuda3_legacy", "slice", "views", "noncontig", "tied", "dtypes",
           "protocol4"]


def _count_kernel_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.copy_file_range

    def counted(*args: int) -> int:
        done = real(*args)
        calls.append(done)
        return done

    monkeypatch.setattr(copy_module.os, "copy_file_range", counted)
    return calls


def _refuse_kernel_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: int) -> int:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(copy_module.os, "copy_file_range", refuse)


@pytest.mark.parametrize("suffix", ["pth", "safetensors"])
@pytest.mark.parametrize("name", SOURCES)
def test_kernel_copy_writes_the_bytes_plain_writes_write(fx, tmp_path, monkeypatch, name,
                                                         suffix):
    copied, plain = tmp_path / f"copied.{suffix}", tmp_path / f"plain.{suffix}"
    with monkeypatch.context() as patch:
        calls = _count_kernel_copies(patch)
        normalize_file(fx[name], copied)
    with monkeypatch.context() as patch:
        _refuse_kernel_copies(patch)
        normalize_file(fx[name], plain)  # verified, like the copied one
    if name == "noncontig":  # a transposed view is gathered in memory, then written
        assert calls == []
    else:
        assert calls and sum(calls) > 0  # the kernel did copy
    assert copied.read_bytes() == plain.read_bytes()
    if suffix == "pth":
        with zipfile.ZipFile(copied) as archive:  # reads every record and checks its CRC
            assert archive.testzip() is None
        state = torch.load(copied, weights_only=True)
        again = torch.load(plain, weights_only=True)
    else:
        state, again = load_file(copied), load_file(plain)
    tensors = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.numel()]
    assert tensors
    for key in tensors:
        assert state[key].dtype == again[key].dtype
        assert torch.equal(state[key].reshape(-1).view(torch.uint8),
                           again[key].reshape(-1).view(torch.uint8))


def test_preallocated_file_ends_where_the_archive_ends(fx, tmp_path):
    """Space reserved up front is given back: the file is the archive, no zero tail."""
    out = tmp_path / "o.pth"
    normalize_file(fx["ddp_cuda3"], out)
    tree = apply_rules(open_checkpoint(fx["ddp_cuda3"]), NormalizeOptions(), lazy=True)
    memory = io.BytesIO()  # no descriptor: neither preallocated nor copied by the kernel
    write_pth(tree.checkpoint.tree, memory, "cpu", lambda n: None)
    assert out.read_bytes() == memory.getvalue()


def test_pth_streams_into_a_pipe_as_before(fx):
    """A stream that cannot seek is neither preallocated nor copied into: plain writes."""
    tree = apply_rules(open_checkpoint(fx["ddp_cuda3"]), NormalizeOptions(), lazy=True)
    memory = io.BytesIO()
    write_pth(tree.checkpoint.tree, memory, "cpu", lambda n: None)
    read_end, write_end = os.pipe()
    received: list[bytes] = []

    def drain() -> None:
        with open(read_end, "rb") as pipe:
            received.append(pipe.read())

    reader = threading.Thread(target=drain)
    reader.start()
    with open(write_end, "wb") as pipe:
        write_pth(tree.checkpoint.tree, pipe, "cpu", lambda n: None)
    reader.join()
    assert received == [memory.getvalue()]


def test_source_cut_during_kernel_copy_is_an_input_error(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 4096)
    source = open_source(src)
    try:
        os.truncate(src, 1000)
        with open(tmp_path / "out.bin", "wb") as out:
            with pytest.raises(InputError) as caught:
                copy_module.RangeCopier(out).copy(source, 0, 4096)
    finally:
        source.close()
    assert "truncated" in str(caught.value) and str(src) in caught.value.line()


def test_kernel_copy_of_nothing_leaves_it_to_the_caller(tmp_path):
    """Zero bytes copied at the start (a source cut to nothing, or a filesystem whose
    copy_file_range copies nothing): the caller's own read decides what it is."""
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 4096)
    source = open_source(src)
    try:
        os.truncate(src, 0)
        with open(tmp_path / "out.bin", "wb") as out:
            copier = copy_module.RangeCopier(out)
            assert copier.copy(source, 0, 4096) is False
            assert copier.fd is None
        with pytest.raises(InputError, match="truncated"):
            source.read(0, 4096)
    finally:
        source.close()


def test_kernel_copy_refused_falls_back_to_writing(tmp_path, monkeypatch):
    _refuse_kernel_copies(monkeypatch)
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 16)
    source = open_source(src)
    try:
        with open(tmp_path / "out.bin", "wb") as out:
            copier = copy_module.RangeCopier(out)
            assert copier.copy(source, 0, 4096) is False
            assert copier.fd is None  # not tried again
    finally:
        source.close()
    assert Path(tmp_path / "out.bin").read_bytes() == b""


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors read in pieces of 256 bytes, so the fixtures' tensors span many pieces: the
    first is copied in line, the rest behind, on a thread, while the zip CRC reads them."""
    from ckptport import tensors

    monkeypatch.setattr(tensors.chunks, "__defaults__", (256,))


@pytest.mark.parametrize("name", ["ddp_cuda3", "tied", "protocol4", "ddp_cuda3_legacy"])
def test_copies_behind_the_crc_give_the_plain_bytes(fx, tmp_path, monkeypatch, small_pieces,
                                                    name):
    copied, plain = tmp_path / "copied.pth", tmp_path / "plain.pth"
    with monkeypatch.context() as patch:
        calls = _count_kernel_copies(patch)
        threads = []
        start = threading.Thread.start

        def counted_start(thread: threading.Thread) -> None:
            threads.append(thread.name)
            start(thread)

        patch.setattr(threading.Thread, "start", counted_start)
        normalize_file(fx[name], copied)
    assert "ckptport-copy" in threads and sum(calls) > 0
    with monkeypatch.context() as patch:
        _refuse_kernel_copies(patch)
        normalize_file(fx[name], plain)
    assert copied.read_bytes() == plain.read_bytes()
    with zipfile.ZipFile(copied) as archive:
        assert archive.testzip() is None  # every CRC matches the bytes the kernel copied


def _copy_once_then(monkeypatch: pytest.MonkeyPatch, error: OSError) -> list[tuple[int, ...]]:
    """The kernel copies one range (a tensor's first piece), then raises ``error``."""
    real, calls = os.copy_file_range, []

    def once(*args: int) -> int:
        calls.append(args)
        if len(calls) > 1:
            raise error
        return real(*args)

    monkeypatch.setattr(copy_module.os, "copy_file_range", once)
    return calls


def test_a_copy_behind_the_kernel_declines_is_written_instead(fx, tmp_path, monkeypatch,
                                                              small_pieces):
    """The kernel copied a tensor's first piece, then declined the rest (another
    filesystem's limits): the rest is written from the source, the same bytes."""
    copied, plain = tmp_path / "copied.pth", tmp_path / "plain.pth"
    with monkeypatch.context() as patch:
        calls = _copy_once_then(patch, OSError(errno.EXDEV, "Invalid cross-device link"))
        normalize_file(fx["ddp_cuda3"], copied)
    with monkeypatch.context() as patch:
        _refuse_kernel_copies(patch)
        normalize_file(fx["ddp_cuda3"], plain)
    assert len(calls) == 2  # one copied in line, one declined behind, then plain writes
    assert copied.read_bytes() == plain.read_bytes()


def test_a_copy_behind_that_fails_fails_the_write_and_leaves_nothing(fx, tmp_path,
                                                                      monkeypatch, small_pieces):
    """A real error of the copy on its thread (here EIO) reaches the caller: exit 2, no DST."""
    _copy_once_then(monkeypatch, OSError(errno.EIO, "Input/output error"))
    out = tmp_path / "o.pth"
    with pytest.raises(OutputError) as caught:
        normalize_file(fx["ddp_cuda3"], out)
    assert "Input/output error" in str(caught.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []
