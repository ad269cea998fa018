"""Benchmark a pickle-heavy checkpoint: a few tensors beside a million small objects.

Real checkpoints carry vocabularies, label maps, per-sample metadata and
objects of the training repo's own classes (openff-nagl's ``.pt`` holds a
6 MB ``data.pkl`` of about 1.5 M opcodes). ckptport reads such a pickle
with its own unpickler (nothing from the file runs); this compares it with
``torch.load(weights_only=False)`` of the same file, which runs the file's
classes. Every command is a fresh process, run ``--runs`` times (best
wall time kept); the classes live in ``bench/heavy_classes.py`` so torch
can import them. Run from the repository root:

    python -m bench.bench_pickle_heavy [--objects 1200000] [--runs 3]

Data goes under bench/out/ (gitignored) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.heavy_classes import Atom, Entry
from bench.timing import best

OUT = Path(__file__).with_name("out")


def make(path: Path, objects: int) -> Path:
    """8 tensors; a vocabulary, per-sample records, class instances; ~``objects`` objects."""
    generator = torch.Generator().manual_seed(0)
    state = {f"model.layers.{i}.weight": torch.randn(256, 256, generator=generator)
             for i in range(8)}
    share = objects // 4
    checkpoint = {
        "state_dict": state,
        "vocab": {f"token_{i}": i for i in range(share)},
        "samples": [{"id": i, "smiles": f"C{i % 97}O", "charge": (i % 7) * 0.125}
                    for i in range(share // 4)],
        "atoms": [Atom(i % 118, (i % 5) - 2, [0.1 * i, 0.2, 0.3]) for i in range(share // 4)],
        "lookup": [Entry(f"k{i}", i, i * 0.5) for i in range(share // 4)],
        "epoch": 3,
    }
    with path.open("wb") as f:
        torch.save(checkpoint, f)
    return path




def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=1_200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    src, dst = OUT / "pickle_heavy.pt", OUT / "pickle_heavy_out.pth"
    try:
        make(src, args.objects)
        size = src.stat().st_size
        print(f"source: {src.name}, {size / 1e6:.1f} MB, ~{args.objects:,} small objects, "
              "8 tensors\n")
        py = sys.executable
        rows = [
            ("python -c 'import torch' (start-up floor)", [py, "-c", "import torch"]),
            ("torch.load(weights_only=False)",
             [py, "-c", "import sys, torch; import bench.heavy_classes; "
                        "torch.load(sys.argv[1], weights_only=False)", str(src)]),
            ("ckptport inspect", [py, "-m", "ckptport", "inspect", str(src)]),
            ("ckptport check", [py, "-m", "ckptport", "check", str(src)]),
            ("ckptport normalize → .pth",
             [py, "-m", "ckptport", "normalize", str(src), str(dst), "-q", "--overwrite"]),
        ]
        measured = {label: best(command, args.runs) for label, command in rows}
        torch_load = measured["torch.load(weights_only=False)"]
        print("| command | wall s | × torch.load |")
        print("|---|---:|---:|")
        for label, seconds in measured.items():
            print(f"| {label} | {seconds:.2f} | {seconds / torch_load:.2f}× |")
    finally:
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
