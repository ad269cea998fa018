"""Benchmark consolidating a ZeRO-3 checkpoint: ``ckptport normalize`` against ``zero_to_fp32``.

A real DeepSpeed ZeRO-3 checkpoint of about ``--size-gb`` of fp32 master
weights at world size ``--world`` (CPU, gloo, bf16; the model is built
partitioned under ``deepspeed.zero.Init``, so making it costs no more memory
than the checkpoint's share per rank) is generated once under bench/out/.
Then, one fresh process each, best of ``--runs``:

- ``ckptport normalize DIR out.safetensors`` (streams each parameter from the
  rank files' byte ranges, verifies the output);
- DeepSpeed's own ``zero_to_fp32.py DIR OUT --safe_serialization`` (loads
  every rank file with ``torch.load``, concatenates the partitions).

Wall time, and peak private (anonymous) memory sampled from /proc, as
``bench/run.py`` measures it. Targets (issue 20): ckptport at most 0.5x
zero_to_fp32's wall time and 0.1x its peak memory. Run from the repository
root (needs deepspeed):

    python -m bench.bench_zero --size-gb 2 --world 4

The checkpoint is kept for reruns (``--clean`` removes it).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from bench.run import OUT, best_of, launch_ranks

LAYER = 4096  # square Linear layers of LAYER x LAYER fp32: 64 MiB each


def _worker(folder: Path, layers: int) -> None:
    """One rank: build the model partitioned, initialize the engine, save (no step: the
    optimizer's moments would triple the files without changing what is consolidated)."""
    import deepspeed
    import deepspeed.comm.torch as ds_torch
    import torch

    ds_torch.build_shm_op = lambda: None  # the shm all-reduce kernel: not needed, slow
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "bf16": {"enabled": True},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}}}
    with deepspeed.zero.Init(config_dict_or_path=config):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(LAYER, LAYER, bias=True)
                                      for _ in range(layers)))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    engine.save_checkpoint(str(folder))


def generate(folder: Path, size_gb: float, world: int) -> None:
    layers = max(1, round(size_gb * (1 << 30) / (LAYER * LAYER * 4)))
    launch_ranks("bench.bench_zero", [str(folder), str(layers)], world, DS_ACCELERATOR="cpu")


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _worker(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--clean", action="store_true")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    folder = OUT / f"zero3_{args.size_gb:g}gb_ws{args.world}"
    if args.clean:
        shutil.rmtree(folder, ignore_errors=True)
    if not (folder / "latest").is_file():
        generate(folder, args.size_gb, args.world)
    files = sorted(folder.rglob("*.pt"))
    print(f"ZeRO-3 checkpoint: {folder} ({len(files)} rank files, "
          f"{sum(f.stat().st_size for f in files) / (1 << 30):.2f} GiB)")
    target = OUT / "zero3.safetensors"
    theirs = OUT / "zero3_zero_to_fp32"
    rows = {
        "ckptport normalize": [sys.executable, "-m", "ckptport", "normalize", str(folder),
                               str(target), "--overwrite"],
        "zero_to_fp32.py": [sys.executable, "-m", "deepspeed.utils.zero_to_fp32",
                            str(folder), str(theirs), "--safe_serialization"],
    }
    def clean() -> None:
        target.unlink(missing_ok=True)
        shutil.rmtree(theirs, ignore_errors=True)

    results = {}
    for name, argv in rows.items():
        results[name] = best = best_of(name, argv, args.runs, clean)
        print(f"{name:20s} wall {best.wall:7.2f} s   peak private {best.private_mb:8.0f} MiB   "
              f"peak RSS {best.rss_mb:8.0f} MiB")
    mine, ref = results["ckptport normalize"], results["zero_to_fp32.py"]
    print(f"ratio: wall {mine.wall / ref.wall:.2f}x (target <= 0.5x), peak private "
          f"{mine.private_mb / max(ref.private_mb, 1):.3f}x (target <= 0.1x)")
    target.unlink(missing_ok=True)
    shutil.rmtree(theirs, ignore_errors=True)


if __name__ == "__main__":
    main()
