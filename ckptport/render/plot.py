"""A picture of drift: per-tensor max relative error, in model order, on a log scale.

After a cast, a quantization or a migration, the question is *which layers
moved*; a table of 300 rows hides the shape that a plot shows at a glance.
matplotlib is an optional extra (``pip install 'ckptport[plot]'``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..analysis.diffing import DiffReport
from ..errors import OutputError

__all__ = ["DriftSeries", "drift_series", "plot_drift"]


@dataclass(frozen=True)
class DriftSeries:
    """What the plot draws: one point per tensor compared by value."""

    keys: tuple[str, ...]
    max_rel: tuple[float, ...]
    tolerance: float | None  # the rtol line; None when comparing exactly


def drift_series(report: DiffReport) -> DriftSeries:
    deltas = {d.key: d.max_rel for d in (*report.value_mismatches, *report.within_tolerance)}
    return DriftSeries(keys=report.compared,
                       max_rel=tuple(deltas.get(key, 0.0) for key in report.compared),
                       tolerance=report.tolerance.rtol or None)


def plot_drift(report: DiffReport, path: str | os.PathLike[str]) -> DriftSeries:
    """Draw ``report`` into a PNG at ``path`` (atomically); return the data drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        raise OutputError("--plot needs matplotlib: pip install 'ckptport[plot]'", path) from None
    from ..writers.staging import os_error, staged_file

    series = drift_series(report)
    finite = [v for v in series.max_rel if 0 < v < math.inf]
    floor = min(finite, default=1e-8) / 10  # where exact matches sit on a log axis
    ceiling = max(finite, default=1.0) * 10
    values = [floor if v == 0 else ceiling if v == math.inf else v for v in series.max_rel]
    figure, axes = plt.subplots(figsize=(max(6.0, min(24.0, len(values) / 8)), 4), dpi=100)
    xs = range(len(values))
    axes.semilogy(xs, values, marker=".", linestyle="-", linewidth=0.6)
    axes.axhline(floor, color="grey", linewidth=0.5, linestyle=":")
    axes.annotate("exactly equal", (0, floor), fontsize=7, color="grey")
    if series.tolerance is not None:
        axes.axhline(series.tolerance, color="red", linestyle="--",
                     label=f"rtol {series.tolerance:g}")
        axes.legend(loc="upper right", fontsize=8)
    step = max(1, len(values) // 20)
    axes.set_xticks(list(xs)[::step])
    axes.set_xticklabels(series.keys[::step], rotation=60, ha="right", fontsize=6)
    axes.set_ylabel("max relative error |a-b|/|a|")
    axes.set_title(report.summary(), fontsize=8)
    figure.tight_layout()
    target = Path(path)
    try:
        with staged_file(target, overwrite=True) as out:
            figure.savefig(out.file, format="png")
            out.sync()
            out.publish()
    except OSError as exc:
        raise os_error(exc, target) from exc
    finally:
        plt.close(figure)
    return series
