"""Plot a comparison: throughput, TTFT, TPOT and p90 end-to-end latency against load, one line per column.

Each point is the mean over launches, with its 95% interval as an error bar when there are two launches or more;
the x ticks are the measured levels only. matplotlib is an optional extra (``pip install campaign[plot]``) and is
imported only when a plot is drawn, with the Agg backend so it works without a display.
"""

from __future__ import annotations

from pathlib import Path

from campaign.comparison import Comparison, metric_key
from campaign.errors import UsageError
from campaign.records import PLOTTED_METRICS, unit_of

_TITLES = {
    "output_throughput": "output throughput",
    "ttft.median": "median time to first token",
    "tpot.median": "median time per output token",
    "e2e.p90": "p90 end-to-end latency",
}


def plot(c: Comparison, path: str | Path) -> Path:
    """Draw ``c`` to an image file at ``path`` (format from its suffix, e.g. .png) and return the path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError as e:
        raise UsageError("--plot needs matplotlib, which is not installed", hint="pip install 'campaign[plot]'") from e
    if not c.series:
        raise UsageError("nothing to plot: none of the compared variants has a bench result")
    out = Path(path)
    fig, grid = plt.subplots(2, 2, figsize=(11, 8))
    axes = {s.axis for s in c.series}
    xlabel = (
        "concurrency" if axes == {"concurrency"} else "request rate (req/s)" if axes == {"request_rate"} else "load"
    )
    measured = sorted({p.x for s in c.series for p in s.points})
    # Levels spread over a wide range (1, 8, 32, 128) read better on a log axis, still ticked at measured levels only.
    log_x = measured[0] > 0 and measured[-1] / measured[0] >= 8
    for ax, metric in zip(grid.flat, PLOTTED_METRICS, strict=True):
        key = metric_key(metric)
        for s in c.series:
            xs = [p.x for p in s.points]
            ys = [p.values.get(key) for p in s.points]
            errs = [p.errors.get(key) or 0.0 for p in s.points]
            ax.errorbar(
                xs, [float("nan") if y is None else y for y in ys], yerr=errs, marker="o", capsize=3, label=s.key
            )
        ax.set_title(_TITLES[metric])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(unit_of(metric))
        if log_x:
            ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(measured))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{x:g}" for x in measured])
        ax.grid(True, alpha=0.3)
    handles, labels = grid.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize="small")
    fig.text(0.99, 0.99, "error bars: 95% interval over launches", ha="right", va="top", fontsize="small")
    fig.tight_layout(rect=(0, 0.06, 1, 0.97))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot write the plot to {out}: {e}") from e
    finally:
        plt.close(fig)
    return out
