"""Benchmark per-tensor costs against many views of one storage (issue 26, item 3).

Two files of ``--tensors`` one-element tensors: a hostile one where every
tensor is a view of one storage (``base[i:i+1]``, the shape that once
stalled ``inspect``, ``check`` and ``normalize`` for minutes), and a real
``torch.save`` where each tensor has its own storage. If a per-tensor cost
grew with the views of its storage, the first would be quadratic and the
second linear; both should cost about the same per tensor, and ``check``
should cost less than ``torch.load`` of the same file (which builds every
tensor). Every command is a fresh process, best of ``--runs``, wall and CPU
seconds (on a shared machine the CPU figure is the steadier one). Run from the
repository root:

    python -m bench.bench_views [--tensors 300000] [--runs 1]

Data goes under bench/out/ (gitignored) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

OUT = Path(__file__).with_name("out") / "views"


def make(folder: Path, n: int) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    base = torch.arange(n, dtype=torch.float32)
    made = {"one storage": folder / "views.pth", "own storages": folder / "real.pth"}
    torch.save({f"w.{i}": base[i:i + 1] for i in range(n)}, made["one storage"])
    torch.save({f"w.{i}": torch.tensor([float(i)]) for i in range(n)}, made["own storages"])
    return made


def timed(command: list[str], runs: int) -> tuple[float, float]:
    """The best wall and CPU seconds (user + system) of ``runs`` fresh processes: on a shared
    machine the CPU time is the steadier figure."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(command)} failed: {done.stderr.decode()[-2000:]}")
    return min(walls), min(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    made = make(OUT, args.tensors)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    os.environ.update(env)
    ckptport = [sys.executable, "-m", "ckptport"]
    print(f"| {args.tensors:,} one-element tensors | file MB | inspect s | check s | "
          "normalize s | torch.load s |  (wall / cpu)")
    print("|---|---:|---:|---:|---:|---:|")
    try:
        for name, path in made.items():
            out = OUT / "out.pth"
            row = [timed([*ckptport, "inspect", str(path)], args.runs),
                   timed([*ckptport, "check", str(path)], args.runs),
                   timed([*ckptport, "normalize", str(path), str(out), "-q", "--overwrite"],
                         args.runs),
                   timed([sys.executable, "-c", "import sys, torch; "
                          "torch.load(sys.argv[1], weights_only=True)", str(path)], args.runs)]
            print(f"| {name} | {path.stat().st_size / 1e6:.1f} | "
                  + " | ".join(f"{wall:.1f} / {cpu:.1f}" for wall, cpu in row) + " |",
                  flush=True)
    finally:
        shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    main()
