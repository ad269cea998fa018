"""``normalize SRC_DIR DST_DIR``: a folder of checkpoints, in parallel, resumable, in parts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import ckptport
from ckptport.commands.normalize.folder import JOURNAL_DIR, FolderOptions, normalize_folder
from ckptport.writers.staging import TEMP_SUFFIX


def _zoo(fx: dict[str, Path], root: Path) -> Path:
    """A model zoo: every container, wrappers, odd names, a corrupt and a hostile file."""
    zoo = root / "zoo"
    (zoo / "vision" / "resnet").mkdir(parents=True)
    (zoo / "nlp").mkdir()
    (zoo / "old").mkdir()
    shutil.copy(fx["ddp_cuda3"], zoo / "vision" / "resnet" / "best.pth.tar")
    shutil.copy(fx["ddp_cuda3_legacy"], zoo / "old" / "model.PT")
    shutil.copy(fx["compile_ddp"], zoo / "vision" / "compiled.pt")
    shutil.copy(fx["fsdp_style"], zoo / "nlp" / "fsdp.bin")
    ckptport.normalize_file(fx["tied"], zoo / "nlp" / "tied.safetensors")
    ckptport.normalize_file(fx["ddp_cuda3"], zoo / "nlp" / "sharded", max_shard_size=1000)
    ckptport.normalize_file(fx["ddp_cuda3"], zoo / "dcp_run", to="dcp")
    shutil.copy(fx["truncated"], zoo / "old" / "broken.pth")
    shutil.copy(fx["malicious_zip"], zoo / "old" / "hostile.pth")
    (zoo / "README.md").write_text("# models\n")
    return zoo


CONVERTED = {"vision/resnet/best.pth.tar": "vision/resnet/best.pth",
             "old/model.PT": "old/model.pth", "vision/compiled.pt": "vision/compiled.pth",
             "nlp/fsdp.bin": "nlp/fsdp.pth", "nlp/tied.safetensors": "nlp/tied.pth",
             "nlp/sharded/model.safetensors.index.json": "nlp/sharded/model.pth",
             "dcp_run": "dcp_run.pth"}


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if TEMP_SUFFIX in p.name]


def test_every_checkpoint_is_converted_and_failures_are_named(fx, tmp_path, run, sentinel):
    zoo = _zoo(fx, tmp_path)
    out = tmp_path / "out"
    result = run("normalize", zoo, out, "--jobs", "2", "--format", "json")
    assert result.exit_code == 1, result.stderr  # two files failed, the rest were done
    doc = json.loads(result.stdout)
    by_source = {f["source"]: f for f in doc["files"]}
    assert {s: f["output"] for s, f in by_source.items() if f["status"] == "converted"} == \
        CONVERTED
    assert by_source["old/broken.pth"]["status"] == "failed"
    assert "truncated" in by_source["old/broken.pth"]["reason"]
    assert ".system" in by_source["old/hostile.pth"]["reason"]
    assert doc["counts"] == {"converted": 7, "skipped": 0, "failed": 2, "planned": 0,
                             "no weights": 0}
    assert not sentinel.exists() and not _leftovers(out)
    for source, output in CONVERTED.items():  # each as a single normalize writes it
        single = tmp_path / "single" / output
        single.parent.mkdir(parents=True, exist_ok=True)
        ckptport.normalize_file(zoo / source, single)
        assert (out / output).read_bytes() == single.read_bytes(), output
        torch.load(out / output, weights_only=True)


def test_a_second_run_resumes(fx, tmp_path):
    zoo = _zoo(fx, tmp_path)
    out = tmp_path / "out"
    first = normalize_folder(zoo, out, FolderOptions(jobs=1))
    assert first.counts["converted"] == 7
    again = normalize_folder(zoo, out, FolderOptions(jobs=1))
    assert again.counts == {"converted": 0, "skipped": 7, "failed": 2, "planned": 0,
                            "no weights": 0}
    source = zoo / "old" / "model.PT"
    os.utime(source, ns=(1, 1))  # touched, same bytes: still done
    (out / "vision" / "compiled.pth").unlink()  # an output gone: redone
    shutil.copy(fx["plain"], zoo / "vision" / "resnet" / "best.pth.tar")  # other bytes: redone
    third = normalize_folder(zoo, out, FolderOptions(jobs=1))
    redone = {f.source for f in third.files if f.status == "converted"}
    assert redone == {"vision/compiled.pt", "vision/resnet/best.pth.tar"}
    cast = normalize_folder(zoo, out, FolderOptions(jobs=1, options=ckptport.NormalizeOptions(
        dtype="bfloat16")))
    assert cast.counts["converted"] == 7  # other options: everything again


def test_parts_cover_the_folder_once(fx, tmp_path, run):
    zoo = _zoo(fx, tmp_path)
    parts = []
    for index in (1, 2, 3):
        result = run("normalize", zoo, tmp_path / "out", "--part", f"{index}/3", "--dry-run",
                     "--format", "json")
        assert result.exit_code == 0, result.stderr
        parts.append({f["source"] for f in json.loads(result.stdout)["files"]})
    everything = {f["source"] for f in json.loads(run(
        "normalize", zoo, tmp_path / "out", "--dry-run", "--format", "json").stdout)["files"]}
    assert set().union(*parts) == everything and sum(map(len, parts)) == len(everything)
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_parts_run_apart_and_resume_together(fx, tmp_path):
    zoo = _zoo(fx, tmp_path)
    out = tmp_path / "out"
    for index in (1, 2):
        normalize_folder(zoo, out, FolderOptions(jobs=1, part=(index, 2)))
    journals = sorted(p.name for p in (out / JOURNAL_DIR).iterdir())
    assert journals == ["part-1-of-2.jsonl", "part-2-of-2.jsonl"]
    whole = normalize_folder(zoo, out, FolderOptions(jobs=1))
    assert whole.counts["skipped"] == 7 and whole.counts["converted"] == 0


def test_dst_inside_src_and_links_out_are_refused(fx, tmp_path, run):
    zoo = _zoo(fx, tmp_path)
    inside = run("normalize", zoo, zoo / "out")
    assert inside.exit_code == 2 and "inside one another" in inside.stderr
    outside = tmp_path / "secret.pth"
    shutil.copy(fx["plain"], outside)
    (zoo / "link.pth").symlink_to(outside)
    result = run("normalize", zoo, tmp_path / "out", "--dry-run", "--format", "json")
    assert "link.pth" not in {f["source"] for f in json.loads(result.stdout)["files"]}


INTERRUPTED_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from ckptport.cli import main
sys.argv = ["ckptport", *sys.argv[1:]]
main()
"""


def test_ctrl_c_keeps_finished_files_and_resumes(fx, tmp_path):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for index in range(12):
        shutil.copy(fx["ddp_cuda3"], zoo / f"m{index:02d}.pth")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_CHILD, "normalize", str(zoo),
                             str(out), "--jobs", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    journal = out / JOURNAL_DIR / "all.jsonl"
    deadline = time.monotonic() + 60
    while not (journal.exists() and journal.read_text().count("\n") >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "run again to resume" in stderr
    assert not _leftovers(out)
    done = [json.loads(line)["output"] for line in journal.read_text().splitlines()]
    assert 2 <= len(done) < 12
    for name in done:
        torch.load(out / name, weights_only=True)
    rest = normalize_folder(zoo, out, FolderOptions(jobs=2))
    assert rest.counts["skipped"] == len(done)
    assert rest.counts["converted"] == 12 - len(done)


def _tree_bytes(out: Path) -> dict[str, bytes]:
    """Every file an output folder holds, by relative name; the resume journal left out."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and JOURNAL_DIR not in p.relative_to(out).parts}


def test_jobs_give_the_same_outputs(fx, tmp_path):
    zoo = _zoo(fx, tmp_path)
    trees = {}
    for jobs in (1, 2):
        report = normalize_folder(zoo, tmp_path / f"out{jobs}", FolderOptions(jobs=jobs))
        assert report.counts == {"converted": 7, "skipped": 0, "failed": 2, "planned": 0,
                                 "no weights": 0}
        trees[jobs] = _tree_bytes(tmp_path / f"out{jobs}")
    assert sorted(trees[1]) == sorted(CONVERTED.values())
    assert trees[2] == trees[1]  # byte for byte, not only the names
    for source, output in CONVERTED.items():  # and each as a single normalize writes it
        single = tmp_path / "single" / output
        single.parent.mkdir(parents=True, exist_ok=True)
        ckptport.normalize_file(zoo / source, single)
        assert trees[2][output] == single.read_bytes(), output
