"""Parallel ranged reads (``--connections N``) against the local object server with each
connection's bandwidth capped, as a real link caps one stream.

What is asserted is what the server saw (how many bodies it sent at once)
and that the bytes are the local copy's, bit for bit; speed is measured in
``bench/bench_remote.py``, never here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from fixtures.servers import ObjectServer
from tests.helpers import same_bits

RATE = 40e6  # bytes per second per connection: a 2 MiB range takes ~50 ms


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ObjectServer, Path]]:
    g = torch.Generator().manual_seed(7)
    state = {"big.weight": torch.randn(2048, 1024, generator=g),  # 8 MiB: one read, split
             "small.bias": torch.randn(16, generator=g)}
    path = tmp_path_factory.mktemp("capped") / "model.safetensors"
    save_file(state, path)
    server = ObjectServer()
    server.objects["/model.safetensors"] = path
    yield server, path
    server.close()


@pytest.fixture
def server(capped: tuple[ObjectServer, Path]) -> ObjectServer:
    made = capped[0]
    made.reset()
    made.rate = RATE
    return made


def _manifest(run, server: ObjectServer, connections: int, out: Path) -> dict:
    result = run("--connections", connections, "manifest", server.url + "/model.safetensors",
                 "-o", out, "--overwrite", "--jobs", "1", "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_read_goes_over_several_connections(server, capped, run, tmp_path):
    out = tmp_path / "manifest.json"
    one = _manifest(run, server, 1, out)
    assert server.stats.most_in_flight == 1
    server.reset()
    server.rate = RATE
    four = _manifest(run, server, 4, out)
    assert 3 <= server.stats.most_in_flight <= 4
    assert four["digest"] == one["digest"] == _local_digest(run, capped[1], out)
    moved = four["transferred"]
    assert moved["connections"] == 4 and one["transferred"]["connections"] == 1
    assert capped[1].stat().st_size <= moved["bytes"] <= server.stats.bytes_sent
    assert moved["requests"] > one["transferred"]["requests"]
    assert moved["seconds"] > 0 and moved["throughput"] == pytest.approx(
        moved["bytes"] / moved["seconds"], rel=0.01)


def _local_digest(run, path: Path, out: Path) -> str:
    result = run("manifest", path, "-o", out, "--overwrite", "--format", "json")
    return str(json.loads(result.stdout)["digest"])


def test_each_range_is_retried_on_its_own(server, capped, run, tmp_path):
    server.faults["error_500"] = 2  # two of the parallel ranges fail once each
    out = tmp_path / "model.safetensors"
    result = run("--connections", "4", "normalize", server.url + "/model.safetensors", out,
                 "-q", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert run("normalize", capped[1], tmp_path / "local.safetensors", "-q").exit_code == 0
    assert out.read_bytes() == (tmp_path / "local.safetensors").read_bytes()
    assert server.stats.most_in_flight >= 3


def test_connections_must_be_positive(run, monkeypatch):
    result = run("--connections", "0", "inspect", "x.pth")
    assert result.exit_code == 2 and "--connections" in result.stderr
    monkeypatch.setenv("CKPTPORT_REMOTE_CONNECTIONS", "many")
    result = run("inspect", "https://127.0.0.1:1/x.pth")
    assert result.exit_code == 2
    assert "CKPTPORT_REMOTE_CONNECTIONS='many'" in result.stderr


def test_small_tensors_are_fetched_in_whole_pieces(tmp_path, run):
    """A writer reading many small tensors one after another (biases, norms) moves the
    read-ahead window a few bytes at a time: it is topped up a whole piece at a time, so the
    requests stay a few per ``AHEAD_PIECE`` of the file, not one per tensor."""
    from ckptport.remote.objects import AHEAD_PIECE

    g = torch.Generator().manual_seed(11)
    state = {}
    for i in range(150):
        state[f"l{i:03d}.bias"] = torch.randn(1024, generator=g)       # 4 KiB
        state[f"l{i:03d}.weight"] = torch.randn(64, 256, generator=g)  # 64 KiB
    path = tmp_path / "model.safetensors"
    save_file(state, path)
    served = ObjectServer()
    served.objects["/model.safetensors"] = path
    try:
        out = tmp_path / "out.safetensors"
        # one connection: a read-ahead window of 4 MiB, well within the file's 10 MiB
        result = run("--connections", 1, "normalize", served.url + "/model.safetensors", out,
                     "-q")
        assert result.exit_code == 0, result.stderr
        requests = served.stats.requests
    finally:
        served.close()
    written = load_file(out)
    assert list(written) == list(state)
    assert all(same_bits(written[k], v) for k, v in state.items())
    # the file's pieces, and a few more: its header, its tail, a hash's catch-up
    assert requests <= path.stat().st_size // AHEAD_PIECE + 12, requests
