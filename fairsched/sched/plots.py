"""Pictures of scheduling: score lines over waiting time, and waits over a simulated trace.

matplotlib is an optional extra (`pip install 'fairsched[plot]'`); it is imported only here,
only when a plot is asked for.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from fairsched import core
from fairsched.errors import FairschedError, path_name
from fairsched.sched.explain import on_demand_crossover, priority_crossovers

INSTALL_HINT = "install matplotlib (pip install 'fairsched[plot]') to draw plots"


class PlotUnavailable(FairschedError):
    """matplotlib is not installed."""


def require(path: str | Path) -> None:
    """PlotUnavailable now, before the work a plot would show is done, if it cannot be drawn;
    FairschedError if `path` is a folder or in a folder that is missing or not writable."""
    _pyplot()
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        problem = f"{path_name(path)} is a folder"
    elif not folder.is_dir():
        problem = (f"no folder {path_name(folder)}" if not folder.exists()
                   else f"{path_name(folder)} is not a folder")
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = f"folder {path_name(folder)} is not writable"
    else:
        return
    raise FairschedError(f"cannot write plot {path_name(path)}: {problem}")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(INSTALL_HINT) from None
    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, plt, path: str | Path) -> Path:
    path = Path(path)
    try:
        if path.is_dir():  # matplotlib would write <folder>.png beside it
            raise IsADirectoryError(f"{path_name(path)} is a folder")
        # A name without a suffix gets a PNG of exactly that name; matplotlib would write
        # NAME.png beside it instead, and the command would name a file it never wrote.
        fig.savefig(path, dpi=110, format=None if path.suffix else "png")
    except (OSError, ValueError) as exc:
        raise FairschedError(f"cannot write plot {path_name(path)}: {exc}") from None
    finally:
        plt.close(fig)
    return path


def plot_score_lines(weights: core.Weights, path: str | Path) -> Path:
    """Score against waiting time for queued priorities 0/5/10 and a priority-0 on-demand job.

    The lines cross where the explain tables say: a gap of g levels after g x W_p / W_a
    seconds, the on-demand line and the queued priority-0 line after B_od / W_a seconds.
    """
    plt = _pyplot()
    w = weights
    crossover = on_demand_crossover(w)
    gap5 = priority_crossovers(w, [5])[0][1]
    horizon = max(x for x in (2 * crossover, 1.5 * gap5, 60.0) if math.isfinite(x))
    ages = [horizon * k / 200 for k in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5))
    for priority in (10, 5, 0):
        ax.plot(ages, [priority * w.priority + a * w.age for a in ages],
                label=f"queued, priority {priority}")
    ax.plot(ages, [w.on_demand + a * (w.age + w.on_demand_age) for a in ages], "--",
            label="on-demand, priority 0")
    ax.axhline(w.on_demand, color="grey", linewidth=0.8, linestyle=":")
    if math.isfinite(crossover) and crossover <= horizon:
        ax.axvline(crossover, color="grey", linewidth=0.8, linestyle=":")
        ax.plot([crossover], [w.on_demand], "o", color="grey")  # p0 meets a fresh request
        ax.annotate(f"queued p0 passes a fresh on-demand job: {crossover:g} s",
                    (crossover, w.on_demand), textcoords="offset points", xytext=(6, -14))
    if math.isfinite(gap5) and gap5 <= horizon:
        ax.axvline(gap5, color="grey", linewidth=0.8, linestyle=":")
        ax.plot([gap5], [5 * w.priority], "o", color="grey")  # where the two lines cross
        ax.annotate(f"p0 passes a fresh p5 job: {gap5:g} s", (gap5, 5 * w.priority),
                    textcoords="offset points", xytext=(6, 6))
    ax.set_xlabel("seconds waited (age)")
    ax.set_ylabel("score (points, rarity bonus left out)")
    ax.set_title(f"fairsched scores: W_p={w.priority:g} W_a={w.age:g} B_od={w.on_demand:g} "
                 f"W_od={w.on_demand_age:g}")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    return _save(fig, plt, path)


def plot_waits(trace, results, path: str | Path, bins: int = 200) -> Path:
    """Longest and median wait of the jobs arriving in each time bin, one line per policy."""
    plt = _pyplot()
    start, end = trace.at[0], trace.at[-1]
    width = (end - start) / bins or 1.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for result in results:
        per_bin: list[list[float]] = [[] for _ in range(bins + 1)]
        for j, at in enumerate(trace.at):
            per_bin[min(bins, int((at - start) / width))].append(result.starts[j] - at)
        xs, longest, median = [], [], []
        for b, waits in enumerate(per_bin):
            if waits:
                waits.sort()
                xs.append(start + (b + 0.5) * width)
                longest.append(waits[-1])
                median.append(waits[(len(waits) - 1) // 2])
        top.plot(xs, longest, label=result.policy)
        bottom.plot(xs, median, label=result.policy)
    top.set_yscale("symlog", linthresh=1.0)
    top.set_ylabel("longest wait (s)")
    bottom.set_ylabel("median wait (s)")
    bottom.set_xlabel("arrival time (s)")
    top.set_title(f"waits over {Path(trace.path).name}, by arrival time")
    top.legend(loc="upper left")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return _save(fig, plt, path)
