"""FSDP1 ``SHARDED_STATE_DICT`` rank files whose rows split unevenly, at world sizes 2 and 4.

torch 2.13's FSDP1 chunks each parameter's rows over the ranks: a parameter
of one row is held whole by rank 0 and recorded with an
``EnumerableShardingSpec`` (a ``ShardedTensor`` of one shard), one of three
rows over four ranks leaves rank 3 without a shard. The files are FSDP's own
(``fixtures/distributed.py``, gloo, ``Uneven``), the truth FSDP's own
``FULL_STATE_DICT`` of the same model; every output is loaded back with
``torch.load(weights_only=True)`` and compared bit for bit.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from fixtures.distributed import uneven_class
from fixtures.hostile import system
from tests.helpers import refused, repickle, same_bits

SPEC = b"torch.distributed._shard.sharding_spec.api\nEnumerableShardingSpec\n"


def _folder(dist: Path, world: int) -> Path:
    return dist / "fsdp1_uneven" / f"ws{world}"


def _truth(dist: Path, world: int) -> dict[str, torch.Tensor]:
    return torch.load(dist / "truth" / f"ws{world}" / "fsdp1_uneven.pt", weights_only=True)


def _pickle(path: Path) -> bytes:
    with zipfile.ZipFile(path) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))


def _copy(dist: Path, world: int, tmp_path: Path) -> Path:
    return Path(shutil.copytree(_folder(dist, world), tmp_path / "fsdp"))


@pytest.mark.parametrize("world", [2, 4])
def test_uneven_rows_match_fsdps_full_state_dict(dist, run, tmp_path, world):
    folder = _folder(dist, world)
    assert all(SPEC in _pickle(p) for p in folder.glob("*.pt"))  # what torch really wrote
    result = run("normalize", folder, tmp_path / "out.pth")
    assert result.exit_code == 0, result.stderr
    got, want = torch.load(tmp_path / "out.pth", weights_only=True), _truth(dist, world)
    assert list(got) == list(want)
    assert all(same_bits(got[k], want[k]) for k in want)
    uneven_class()().load_state_dict(got, strict=True)


@pytest.mark.parametrize("world", [2, 4])
def test_every_command_reads_them_as_data(dist, run, tmp_path, world):
    folder = _folder(dist, world)
    shown = run("inspect", folder)
    assert shown.exit_code == 0 and "DANGEROUS" not in shown.stdout
    assert f"world_size: {world}" in shown.stdout and f"rank_files: {world}" in shown.stdout
    checked = run("check", folder, "--ignore", "CKP002")
    # no false CKP003 (the spec), no CKP013 (rank 3 holds no shard of up.weight: not stale)
    assert checked.exit_code == 0 and ": CKP" not in checked.stdout, checked.stdout
    truth = dist / "truth" / f"ws{world}" / "fsdp1_uneven.pt"
    assert run("diff", folder, truth).exit_code == 0
    digests = [json.loads(run("manifest", p).stdout)["digest"] for p in (folder, truth)]
    assert digests[0] == digests[1]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])


@pytest.mark.parametrize(("spoil", "words", "code"), [
    (lambda f: (f / "model_rank3.pt").unlink(), ("rank 3 of 4 is missing",), "CKP013"),
    (lambda f: shutil.copy(f / "model_rank2.pt", f / "model_rank02.pt"),
     ("model_rank02.pt", "model_rank2.pt"), "CKP013"),
    (lambda f: shutil.copy(f / "model_rank0.pt", f / "model_rank3.pt"),  # the group's rank
     ("model_rank3.pt", "rank 0's shard"), "CKP013"),
    (lambda f: _truncate(f / "model_rank1.pt"), ("model_rank1.pt",), "model_rank1.pt: CKP008"),
], ids=["missing", "two-spellings", "another-ranks-copy", "truncated"])
def test_a_broken_rank_set_is_refused_naming_the_file(dist, run, tmp_path, spoil, words, code):
    """Rank 3 (which holds no shard of up.weight) missing or a copy of rank 0's file, rank 2
    under two spellings, rank 1 cut short: refused naming it; check names the cause."""
    folder = _copy(dist, 4, tmp_path)
    spoil(folder)
    refused(run, folder, tmp_path / "out.safetensors", *words)
    checked = run("check", folder)
    assert checked.exit_code in (1, 2) and code in checked.stdout, checked.stdout
    assert words[0] in checked.stdout


def test_lying_shard_metadata_is_refused(dist, run, tmp_path):
    """Every rank's metadata moves out.weight's last shard (rows 4..5 of 5) up a row: it
    overlaps the shard before it and leaves row 4 held by none."""
    folder = _copy(dist, 4, tmp_path)
    for path in sorted(folder.glob("*.pt")):
        repickle(_folder(dist, 4) / path.name, path, b"(K\x04K\x00e", b"(K\x03K\x00e")
    line = refused(run, folder, tmp_path / "out.safetensors", "out.weight")
    assert "model_rank" in line
    checked = run("check", folder)
    assert checked.exit_code == 1 and "CKP013" in checked.stdout, checked.stdout


@pytest.mark.parametrize(("pattern", "lie", "cause"), [
    (rb"(X\x06\x00\x00\x00shardsq.)h.s", b"]s", "EnumerableShardingSpec lists other"),
    (rb"(X\x0a\x00\x00\x00local_rankq.)K\x01", b"K\x07", "ProcessGroupState of ranks"),
], ids=["spec-lists-no-shards", "rank-7-of-4"])
def test_lying_sharded_tensor_records_are_refused(dist, run, tmp_path, pattern, lie, cause):
    """Rank 1's EnumerableShardingSpec listing no shards where its metadata lists one, or
    its process group state placing it at rank 7 of 4."""
    folder = _copy(dist, 4, tmp_path)
    victim = folder / "model_rank1.pt"
    match = re.search(pattern, _pickle(victim), re.S)  # the record to rewrite
    assert match is not None
    repickle(_folder(dist, 4) / victim.name, victim, match[0], match[1] + lie, 1)
    refused(run, folder, tmp_path / "out.safetensors", victim.name, cause)
    checked = run("check", folder)
    assert checked.exit_code == 2 and f"{victim}: CKP008" in checked.stdout, checked.stdout


def _payload(target: Path) -> Any:
    """A key of the EnumerableShardingSpec's state whose value runs ``touch target``."""
    return b"X\x01\x00\x00\x00x" + system(target) + b"s"


def test_a_payload_in_the_sharding_spec_never_runs(dist, run, tmp_path):
    folder = _copy(dist, 2, tmp_path)
    victim, target = folder / "model_rank1.pt", tmp_path / "PWNED"
    key = b"X\x06\x00\x00\x00shards"  # the spec's dict: {'shards': ...}
    repickle(_folder(dist, 2) / victim.name, victim, key, _payload(target) + key, 1)
    subprocess.run([sys.executable, "-c", "import sys, torch\ntry:\n    torch.load(sys.argv[1]"
                    ", weights_only=False)\nexcept RuntimeError:\n    pass", str(victim)],
                   check=True, capture_output=True)
    assert target.exists()  # full unpickling runs it (then wants a process group)
    target.unlink()
    line = refused(run, folder, tmp_path / "out.safetensors", victim.name)
    assert "os.system" in line
    checked = run("check", folder)
    assert checked.exit_code == 1 and f"{victim}: CKP003" in checked.stdout, checked.stdout
    assert "DANGEROUS" in run("inspect", folder).stdout
    assert not target.exists()
