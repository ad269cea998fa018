"""Benchmark ``ckptport diff`` against reading the files and against the naive script.

Makes a ``.pth`` recorded on ``cuda:0`` with ``module.`` keys and its
``.safetensors`` twin (clean keys, one element changed), then times three
child processes and reads each one's peak RSS from ``/usr/bin/time``:

- read: ``cat A B`` to /dev/null (the floor: the bytes must be read once);
- startup only: ``import torch`` and ckptport, the fixed cost of any torch tool;
- ckptport: ``ckptport diff A B -q``;
- naive: ``torch.load`` both fully, strip ``module.``, ``torch.equal`` each.

Targets: ckptport within 2x the read time, faster than naive, peak RSS at
most a quarter of one file. Run from the repository root:

    python -m bench.bench_diff --size-gb 2

Data goes under bench/out/ (gitignored) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from fixtures.make_fixtures import recorded_on

OUT = Path(__file__).with_name("out")
COLUMNS = 4096
TENSOR_BYTES = 64 << 20

NAIVE = """
import sys, torch
from safetensors.torch import load_file
a = torch.load(sys.argv[1], map_location="cpu", weights_only=True)
b = load_file(sys.argv[2])
a = {k.removeprefix("module."): v for k, v in a.items()}
same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
print("equal" if same else "different")
"""


def make_pair(size_gb: float, out: Path) -> tuple[Path, Path]:
    """A DDP-style ``.pth`` recorded on cuda:0 and its safetensors twin, one element off."""
    out.mkdir(parents=True, exist_ok=True)
    count = max(1, round(size_gb * (1 << 30) / TENSOR_BYTES))
    rows = max(1, round(size_gb * (1 << 30) / count / 4 / COLUMNS))
    generator = torch.Generator().manual_seed(0)
    state = {}
    for i in range(count):
        state[f"module.layers.{i}.weight"] = torch.rand(rows, COLUMNS, generator=generator)
        state[f"module.layers.{i}.bias"] = torch.rand(COLUMNS, generator=generator)
    pth, safetensors = out / "bench_a.pth", out / "bench_b.safetensors"
    with recorded_on("cuda:0"), pth.open("wb") as f:
        torch.save(state, f)
    twin = {key.removeprefix("module."): value for key, value in state.items()}
    twin[f"layers.{count // 2}.weight"][rows // 2, 7] += 1e-3
    save_file(twin, str(safetensors))
    return pth, safetensors


def measure(command: list[str], scratch: Path) -> tuple[float, float, str]:
    """Wall seconds, peak RSS in MiB (``/usr/bin/time``), first line of stdout of one run.

    ``/usr/bin/time`` rather than ``os.wait4``: a child forked from this process
    would count this process's pages in its peak RSS until it execs.
    """
    report = scratch / "time.txt"
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), *command],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    rss_kib = int(report.read_text().split()[-1])
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    return wall, rss_kib / 1024, lines[0] if lines else f"exit {done.returncode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=2.0, help="size of each file")
    parser.add_argument("--out", type=Path, default=OUT, help="where the files are written")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per command; the median wall time is reported")
    args = parser.parse_args()
    pth, safetensors = make_pair(args.size_gb, args.out)
    try:
        file_mib = pth.stat().st_size / (1 << 20)
        subprocess.run(["cat", pth, safetensors], stdout=subprocess.DEVNULL, check=True)
        runs = {
            "read (cat A B)": ["sh", "-c", 'cat "$0" "$1" > /dev/null', str(pth),
                               str(safetensors)],
            "startup only": [sys.executable, "-c",
                             "import torch, ckptport.cli, ckptport.analysis.diffing"],
            "ckptport diff": [sys.executable, "-m", "ckptport", "diff", str(pth),
                              str(safetensors), "-q"],
            "naive torch.load": [sys.executable, "-c", NAIVE, str(pth), str(safetensors)],
        }
        results = {}
        for name, command in runs.items():
            trials = [measure(command, args.out) for _ in range(args.repeat)]
            results[name] = (statistics.median(t[0] for t in trials),
                             max(t[1] for t in trials), trials[0][2])
        print(f"files: {pth.name} {file_mib:.0f} MiB, {safetensors.name} "
              f"{safetensors.stat().st_size / (1 << 20):.0f} MiB")
        print(f"median of {args.repeat} runs, peak RSS the highest of them")
        print(f"{'':18} {'wall s':>8} {'peak RSS MiB':>13} {'RSS/file':>9}  output")
        for name, (wall, rss, line) in results.items():
            print(f"{name:18} {wall:8.2f} {rss:13.0f} {rss / file_mib:9.2f}  {line[:70]}")
        read_s, startup_s, diff_s, naive_s = (results[n][0] for n in runs)
        diff_rss = results["ckptport diff"][1]
        print(f"targets: diff/read {diff_s / read_s:.2f} (<= 2; without the startup "
              f"{(diff_s - startup_s) / read_s:.2f}), diff/naive {diff_s / naive_s:.2f} (< 1), "
              f"RSS/file {diff_rss / file_mib:.2f} (<= 0.25)")
    finally:
        for path in (pth, safetensors, args.out / "time.txt"):
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
