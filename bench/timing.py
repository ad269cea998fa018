"""Timing fresh processes for the benchmarks: the best of several runs of one command."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path


def best(command: list[str], runs: int, *, clean: Path | None = None,
         ok: tuple[int, ...] = (0, 1)) -> float:
    """The smallest wall time of ``runs`` fresh processes; ``clean`` is removed before each."""
    times = []
    for _ in range(runs):
        if clean is not None:
            shutil.rmtree(clean, ignore_errors=True)
        start = time.perf_counter()
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - start)
        if done.returncode not in ok:
            raise SystemExit(f"{' '.join(command)} failed: {done.stderr.decode()[-2000:]}")
    return min(times)
