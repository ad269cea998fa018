"""Per-tensor costs do not grow with the number of views of one storage (issue 26, item 3).

A file of N one-element tensors that are all views of one storage once stalled
``inspect``, ``check`` and ``normalize`` for minutes at N = 300,000: some step
cost each tensor in proportion to its storage. Timing that is the bench's job
(``bench/bench_views.py``); here the class is held by counting work, which is
deterministic: the Python calls a command makes for each tensor it gains must
be the same whether the tensors share one storage or each has its own, and
the bytes a command reads must not grow with the size of the storage a view
is cut from.
"""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import ckptport

SMALL, LARGE = 150, 600  # 4x the tensors: a quadratic step would cost 16x


def _files(folder: Path, n: int) -> dict[str, Path]:
    """N one-element tensors: views of one storage of N elements, views 1000 elements
    apart of one storage of 1000 N, and tensors with storages of their own."""
    base, wide = torch.arange(n, dtype=torch.float32), torch.zeros(1000 * n)
    made = {kind: folder / f"{kind}{n}.pth" for kind in ("views", "wide", "own")}
    torch.save({f"w.{i}": base[i:i + 1] for i in range(n)}, made["views"])
    torch.save({f"w.{i}": wide[1000 * i:1000 * i + 1] for i in range(n)}, made["wide"])
    torch.save({f"w.{i}": torch.tensor([float(i)]) for i in range(n)}, made["own"])
    return made


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Path]]:
    folder = tmp_path_factory.mktemp("views")
    return {n: _files(folder, n) for n in (SMALL, LARGE)}


def _bytes_read(monkeypatch: pytest.MonkeyPatch, work: Callable[[], Any]) -> int:
    """The bytes ``work`` reads from source files (every read goes through these two)."""
    from ckptport.sources import SourceFile

    total = [0]
    read, read_into = SourceFile.read, SourceFile.read_into

    def counted_read(self: SourceFile, offset: int, n: int) -> bytes:
        total[0] += n
        return read(self, offset, n)

    def counted_read_into(self: SourceFile, offset: int, buffer: memoryview) -> None:
        total[0] += len(buffer)
        read_into(self, offset, buffer)

    with monkeypatch.context() as patch:
        patch.setattr(SourceFile, "read", counted_read)
        patch.setattr(SourceFile, "read_into", counted_read_into)
        work()
    return total[0]


def _calls(work: Callable[[], Any]) -> int:
    profile = cProfile.Profile()
    profile.enable()
    try:
        work()
    finally:
        profile.disable()
    return int(pstats.Stats(profile).total_calls)  # type: ignore[attr-defined]


COMMANDS = {
    "inspect": lambda src, out: ckptport.inspect(src),
    "check": lambda src, out: ckptport.check(src),
    # one job: the profile counts the calling thread's work only
    "normalize": lambda src, out: ckptport.normalize_file(src, out, overwrite=True, jobs=1),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_tensor_costs_the_same_with_one_storage_or_its_own(files, tmp_path, command,
                                                             monkeypatch):
    run = COMMANDS[command]
    out = tmp_path / "out.safetensors"
    run(files[SMALL]["own"], out)  # imports and caches: not the tensors' cost
    growth = {}
    for kind in ("own", "views", "wide"):
        small = _calls(lambda kind=kind: run(files[SMALL][kind], out))
        large = _calls(lambda kind=kind: run(files[LARGE][kind], out))
        growth[kind] = (large - small) / (LARGE - SMALL)  # calls per added tensor
    assert growth["views"] <= 1.2 * growth["own"] + 5, growth
    assert growth["wide"] <= 1.2 * growth["own"] + 5, growth
    read = _bytes_read(monkeypatch, lambda: run(files[LARGE]["wide"], out))
    assert read <= 4 * files[LARGE]["wide"].stat().st_size  # never the storage per view
    if command == "normalize":  # and the views came out as tensors of their own
        written = load_file(out)
        assert len(written) == LARGE
        assert all(t.untyped_storage().nbytes() == 4 for t in written.values())
