"""The writing thread's cpu seconds of ``normalize → .pth``, A/B against another checkout.

On a loaded machine wall time measures the queue; the cpu seconds the
command's main thread spends (``time.thread_time``) do not depend on the
load, and bound its critical path from below: what other threads do (the
kernel copy, verification workers, the import of torch since issue 30)
overlaps it when a core is free. Each run is a fresh process normalizing
the bench source in-process; runs go ABBA (this checkout, the baseline,
the baseline, this checkout) so a drift in load hits both alike.

    python -m bench.bench_critical --baseline /tmp/base --rounds 3

``/tmp/base`` holds another checkout's ``ckptport`` package (for example
``git archive COMMIT ckptport | tar -x -C /tmp/base``). The source is
``bench/out/ddp_cuda0_<SIZE>gib.pth``, made by ``bench/run.py --keep``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

_CHILD = (
    "import resource,sys,time\n"
    "t=time.perf_counter()\n"
    "from ckptport import normalize_file\n"
    "normalize_file(sys.argv[1],sys.argv[2],overwrite=True)\n"
    "u=resource.getrusage(resource.RUSAGE_SELF)\n"
    "print(time.thread_time(),u.ru_utime+u.ru_stime,time.perf_counter()-t)\n"
)


def _one(checkout: Path, src: Path, dst: Path) -> tuple[float, float, float]:
    """Main-thread cpu, process cpu and wall seconds of one run importing ``checkout``."""
    dst.unlink(missing_ok=True)
    os.sync()
    # run in the checkout: ``-c`` puts the working folder first on sys.path
    done = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(dst)], check=True,
                          capture_output=True, text=True, cwd=checkout,
                          env={**os.environ, "PYTHONPATH": str(checkout)})
    dst.unlink(missing_ok=True)
    main, process, wall = (float(x) for x in done.stdout.split())
    return main, process, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout's root")
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds (4 runs each)")
    args = ap.parse_args()
    src = OUT / f"ddp_cuda0_{f'{args.size_gb:g}'.replace('.', 'p')}gib.pth"
    if not src.exists():
        raise SystemExit(f"{src} is missing: run bench/run.py --size-gb {args.size_gb:g} --keep")
    src = src.resolve()
    runs: dict[str, list[tuple[float, float, float]]] = {"this": [], "baseline": []}
    where = {"this": HERE.parent, "baseline": args.baseline.resolve()}
    with open("/proc/loadavg") as f:
        print(f"load average at start: {' '.join(f.read().split()[:3])}", flush=True)
    for _ in range(args.rounds):
        for name in ("this", "baseline", "baseline", "this"):
            run = _one(where[name], src, OUT / "critical.pth")
            runs[name].append(run)
            print(f"  {name:<8} main thread {run[0]:.2f} cpu s, process {run[1]:.2f} cpu s, "
                  f"wall {run[2]:.2f} s", flush=True)
    with open("/proc/loadavg") as f:
        print(f"load average at end: {' '.join(f.read().split()[:3])}")
    print("\n| checkout | main-thread cpu s | process cpu s | wall s |\n|---|---:|---:|---:|")
    for name, done in runs.items():
        print(f"| {name} (`{where[name]}`) | "
              + " | ".join(f"{statistics.median(r[i] for r in done):.2f}" for i in range(3))
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
