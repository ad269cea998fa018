"""Benchmark assembling a DTensor split by columns: as costly as reading the whole tensor.

Two real DTensor rank files (torch 2.13, gloo, two processes:
``distribute_tensor(full, mesh, [Shard(1)])`` of a uint8 ``(--rows, 2)``
tensor, each rank ``torch.save``-ing its column) and the same tensor saved
whole are generated once under bench/out/. Then, one fresh process each,
best of ``--runs``:

- ``ckptport normalize RANKS/ out.safetensors``: assembled from the two
  columns (every row of the output interleaves the two files);
- ``ckptport normalize whole.pt out.safetensors``: the same bytes, one piece.

Target (issues 26 and 27): assembling costs no more than one pass over the
bytes: at most 2x the whole file's wall time (the whole file is written by a
kernel copy, the assembled one by one strided copy per piece per 16 MiB read)
and its peak private memory plus 32 MiB. Before the strided assembly (one
Python object per row) the default 6e6 rows took 58 s and 1.9 GB peak RSS; measured
here: 0.77 s and 54 MiB private (0.69x and +3 MiB of the whole file's), at
6e7 rows 3.6 s and 80 MiB (1.88x, +15 MiB). Run from the repository root:

    python -m bench.bench_columns --rows 6000000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.run import OUT, best_of, launch_ranks


def _full(rows: int) -> object:
    import torch

    return (torch.arange(rows * 2, dtype=torch.int64) % 251).to(torch.uint8).reshape(rows, 2)


def _worker(folder: Path, rows: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    state = {"w": distribute_tensor(_full(rows), mesh, [Shard(1)])}
    torch.save(state, folder / f"state_rank{dist.get_rank()}.pt")
    dist.barrier()
    dist.destroy_process_group()


def generate(folder: Path, rows: int) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    launch_ranks("bench.bench_columns", [str(folder), str(rows)], 2, OMP_NUM_THREADS="1")
    whole = folder.parent / f"{folder.name}_whole.pt"
    torch.save({"w": _full(rows)}, whole)
    return whole


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _worker(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=6_000_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    folder = OUT / f"columns_{args.rows}"
    whole = folder.parent / f"{folder.name}_whole.pt"
    if not (whole.is_file() and (folder / "state_rank1.pt").is_file()):
        whole = generate(folder, args.rows)
    target = OUT / "columns.safetensors"
    rows = {"assembled from 2 column shards": folder, "the same tensor whole": whole}
    results = {}
    for name, source in rows.items():
        argv = [sys.executable, "-m", "ckptport", "normalize", str(source), str(target),
                "--overwrite", "-q"]
        results[name] = best = best_of(name, argv, args.runs)
        print(f"{name:32s} wall {best.wall:6.2f} s   peak private {best.private_mb:7.0f} MiB   "
              f"peak RSS {best.rss_mb:7.0f} MiB")
    mine, ref = results["assembled from 2 column shards"], results["the same tensor whole"]
    print(f"ratio: wall {mine.wall / ref.wall:.2f}x (target <= 2x), peak private "
          f"+{mine.private_mb - ref.private_mb:.0f} MiB (target <= +32 MiB)")
    target.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
