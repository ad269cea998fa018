"""Benchmark folder mode: a zoo of 40 small checkpoints, 1 worker against 2.

The zoo mixes what a model zoo holds: DDP and torch.compile state dicts in
torch zip files, legacy (pre-1.6) files, FSDP-style keys in ``.bin`` files,
safetensors files, shard sets and DCP folders; each a few MB. Each command
is a fresh process, run ``--runs`` times into a fresh output folder (best
wall time kept). Run from the repository root:

    python -m bench.bench_folder [--files 40] [--runs 2]

Data goes under bench/out/ (gitignored) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import OrderedDict
from pathlib import Path

import torch

import ckptport
from bench.timing import best

OUT = Path(__file__).with_name("out")


def _state(seed: int) -> OrderedDict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    widths = [512 + 128 * (seed % 5), 1024, 1024, 512]  # 6-8 MB: a small real model
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    for i, (a, b) in enumerate(zip(widths, widths[1:], strict=False)):
        state[f"layers.{i}.weight"] = torch.randn(b, a, generator=generator)
        state[f"layers.{i}.bias"] = torch.randn(b, generator=generator)
        state[f"norms.{i}.running_mean"] = torch.zeros(b)
    return state


def make_zoo(root: Path, files: int) -> Path:
    kinds = ["ddp", "compile", "legacy", "fsdp", "safetensors", "shards", "dcp", "ddp"]
    for index in range(files):
        kind = kinds[index % len(kinds)]
        state = _state(index)
        folder = root / f"family{index % 5}" / f"run{index:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "ddp":
            torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()},
                        "epoch": index}, folder / "checkpoint.pth.tar")
        elif kind == "compile":
            torch.save({f"_orig_mod.{k}": v for k, v in state.items()}, folder / "model.pt")
        elif kind == "legacy":
            torch.save(state, folder / "model.pth", _use_new_zipfile_serialization=False)
        elif kind == "fsdp":
            torch.save({"model": {f"_fsdp_wrapped_module.{k}": v for k, v in state.items()}},
                       folder / "pytorch_model.bin")
        else:
            src = folder / "tmp.pth"
            torch.save(state, src)
            target = {"safetensors": folder / "model.safetensors",
                      "shards": folder / "sharded"}.get(kind, folder / "dcp")
            ckptport.normalize_file(src, target, to="dcp" if kind == "dcp" else None,
                                    max_shard_size=600_000 if kind == "shards" else None)
            src.unlink()
    return root




def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    zoo, out = OUT / "zoo", OUT / "zoo_out"
    shutil.rmtree(zoo, ignore_errors=True)
    try:
        make_zoo(zoo, args.files)
        size = sum(p.stat().st_size for p in zoo.rglob("*") if p.is_file())
        print(f"zoo: {args.files} checkpoints, {size / 1e6:.0f} MB\n")
        ck = [sys.executable, "-m", "ckptport"]
        single_src = next(zoo.rglob("checkpoint.pth.tar"))
        single = best([*ck, "normalize", str(single_src), str(OUT / "single.pth"), "-q",
                       "--overwrite"], args.runs)
        folder = [*ck, "normalize", str(zoo), str(out), "-q", "--jobs"]
        one = best([*folder, "1"], args.runs, clean=out)
        two = best([*folder, "2"], args.runs, clean=out)
        resume = best([*folder, "2"], args.runs)
        print("| command | wall s | |")
        print("|---|---:|---|")
        print(f"| one `ckptport normalize FILE` (start-up included) | {single:.2f} | |")
        print(f"| `normalize ZOO OUT --jobs 1` | {one:.2f} | {one / args.files:.3f} s per file |")
        print(f"| `normalize ZOO OUT --jobs 2` | {two:.2f} | {two / one:.2f}× --jobs 1 |")
        print(f"| `normalize ZOO OUT --jobs 2`, all done before (resume) | {resume:.2f} | |")
    finally:
        shutil.rmtree(zoo, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        (OUT / "single.pth").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
