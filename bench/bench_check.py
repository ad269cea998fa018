"""Benchmark ``ckptport check`` and ``ckptport inspect`` on a ~2 GB checkpoint.

Neither command needs tensor bytes (without ``--finite``/``--against``),
so neither imports torch (``readers.describe``): both should cost well under
``import torch`` (the baseline printed), whatever the size of the file. Two
files are timed: a DDP-style ``.pth`` recorded on ``cuda:0`` (read by the
weights-only fast path when torch reads it) and the same saved with pickle
protocol 4 plus an ``argparse.Namespace`` (ckptport's restricted unpickler).
Run from the repository root:

    python -m bench.bench_check --size-gb 2

Data goes under bench/out/ (gitignored) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.timing import best
from fixtures.make_fixtures import recorded_on

OUT = Path(__file__).with_name("out")
TENSOR_BYTES = 64 << 20
BASELINE = 'python -c "import torch"'


def make(path: Path, size_gb: float, protocol: int) -> Path:
    count = max(1, int(size_gb * (1 << 30) / TENSOR_BYTES))
    state = {f"module.layer{i}.weight": torch.full((TENSOR_BYTES // 4,), float(i))
             for i in range(count)}
    checkpoint = {"state_dict": state, "epoch": 1, "args": argparse.Namespace(lr=0.1)}
    with recorded_on("cuda:0"), path.open("wb") as f:
        torch.save(checkpoint, f, pickle_protocol=protocol)
    return path




def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    files = {"fast path (protocol 2)": OUT / "check_p2.pth",
             "restricted (protocol 4)": OUT / "check_p4.pth"}
    try:
        for (label, path), protocol in zip(files.items(), (2, 4), strict=True):
            make(path, args.size_gb, protocol)
            print(f"{label}: {path.stat().st_size / (1 << 30):.2f} GiB")
        baseline = best([sys.executable, "-c", "import torch"], args.runs)
        print(f"{BASELINE:45s} {baseline:6.2f} s")
        for label, path in files.items():
            for command in (["check", str(path)], ["inspect", str(path)]):
                seconds = best([sys.executable, "-m", "ckptport", *command], args.runs)
                print(f"{'ckptport ' + command[0] + ' — ' + label:45s} {seconds:6.2f} s")
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
